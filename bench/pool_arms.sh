#!/usr/bin/env bash
# The pool's benchmarks (issue 15), each paired against a baseline measured
# in the same run (bench/pool_arms.py, one process):
#   1. the weighted-median job (4,000-row CSV in, out.json back) pooled
#      through the library (the Python package's airlock.Pool: the Rust
#      library in-process) and POST /v1/runs, against bare cold Python
#      running the same script (goal: at most 0.1x);
#   2. print(1+1) pooled the same two ways, against bare
#      `python -c 'print(1+1)'` (goal: library at most 0.5x, HTTP at most
#      1 ms over the library);
#   3. the pandas job's sustained rate on THREADS threads for each of MODES
#      (pooled, forked, cold), and its latency p50/p99 at 50 % and 90 % of
#      that rate;
#   4. the memory a ready pool of 1 and of 8 holds, for each of MODES but cold;
#   5. (ONLY=print-rust) print(1+1) pooled through the Rust library and
#      POST /v1/runs against bare `python -c`, with no Python package in the
#      way (crates/airlock/examples/pool_print_bench.rs; needs no PYTHON;
#      POOL_MODE=forked forks both pools).
# Bare Python is the python-data image's own venv (a clean venv of the same
# interpreter, never the global pyenv python, whose .pth hook imports extra
# modules at start-up). The library-only pandas figure (no Python in the
# way) is bench/pool.sh's.
#
# usage: PYTHON=VENV/bin/python bench/pool_arms.sh [ROUNDS] [SECONDS] [THREADS]   (defaults 12 20 2)
#   PYTHON: a python with the airlock package installed (pip install ./python),
#     for every phase but print-rust;
#   PROFILE=debug: the debug airlock binary for `airlock serve`;
#   MODES="pooled cold": the throughput and memory modes (pooled, forked,
#     cold; memory skips cold); POOL_MODE=forked: the latency phase's pools
#     forked (default pooled); ONLY="latency throughput memory" (the
#     default), or any of them and print-rust.
# Results (one JSON object a line) are appended to bench/results/pool-arms.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-12}
seconds=${2:-20}
threads=${3:-2}
profile=${PROFILE:-release}
modes=${MODES:-pooled cold}
only=${ONLY:-latency throughput memory}
flag=--release
[ "$profile" = debug ] && flag=
python=
if [ "$only" = print-rust ]; then
  # The workspace's features, so the library is the one the binaries use.
  cargo build $flag -q --workspace --bins && cargo build $flag -q -p airlock-fork &&
    cargo build $flag -q -p airlock --example pool_print_bench
else
  python=${PYTHON:?PYTHON must name a python with the airlock package installed}
  # airlock-fork: the native library `airlock serve`'s forked pool loads, beside the helper.
  cargo build $flag -q -p airlock-cli -p airlock-fork
fi
export AIRLOCK=$PWD/target/$profile/airlock
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
[ -d "$AIRLOCK_HOME/images" ] || "$AIRLOCK" image build python-data >&2
venv=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ ! -x "$venv/bin/python" ]; then
  # An image copied without its interpreter link: the same venv (its
  # pyvenv.cfg, its site-packages) around the interpreter it was built with.
  interpreter=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"]["executable"])' "$venv/../manifest.json")
  mkdir -p "$work/venv/bin"
  ln -s "$interpreter" "$work/venv/bin/python"
  ln -s "$venv/lib" "$work/venv/lib"
  printf 'home = %s\ninclude-system-site-packages = false\n' "$(dirname "$interpreter")" > "$work/venv/pyvenv.cfg"
  venv=$work/venv
fi
# Bare Python reads the CSV from $work; the sandbox from /work (paths rewritten, nothing else).
cp examples/sales.csv "$work/"
sed "s#/work/#$work/#g" examples/weighted_median.py > "$work/bare_weighted_median.py"
printf 'print(1+1)\n' > "$work/print.py"
out=bench/results/pool-arms.jsonl
arms() { "$python" bench/pool_arms.py "$@" | tee -a "$out"; }
note() { echo "# $(date -u +%FT%TZ) $profile, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a "$out"; }
for what in $only; do
  case $what in
    latency)
      note "latency, the pandas job: bare, library, http (${POOL_MODE:-pooled})"
      arms latency "$rounds" examples/weighted_median.py examples/sales.csv -- \
        "$venv/bin/python" "$work/bare_weighted_median.py"
      note "latency, print(1+1): bare python -c, library, http (${POOL_MODE:-pooled})"
      arms latency "$rounds" "$work/print.py" - -- "$venv/bin/python" -c 'print(1+1)' ;;
    throughput)
      for mode in $modes; do
        note "throughput, the pandas job, $mode, $threads threads, $seconds s a phase"
        arms throughput "$mode" "$seconds" "$threads" examples/weighted_median.py examples/sales.csv
      done ;;
    memory)
      for mode in $modes; do
        [ "$mode" = cold ] && continue
        note "memory of a ready pool of 1 and of 8, $mode"
        arms memory "$mode" 1 8
      done ;;
    print-rust)
      note "latency, print(1+1), the Rust driver: bare python -c, library, http"
      # The example is built under examples/: its library finds the helper here.
      AIRLOCK_INIT=$PWD/target/$profile/airlock-init \
      "target/$profile/examples/pool_print_bench" "$rounds" python-data "$venv/bin/python" \
        "$AIRLOCK" | tee -a "$out" ;;
  esac
done
echo "reproduce: PYTHON=$python PROFILE=$profile MODES=\"$modes\" POOL_MODE=${POOL_MODE:-pooled} ONLY=\"$only\" bench/pool_arms.sh $rounds $seconds $threads   (AIRLOCK_HOME=$AIRLOCK_HOME)"
