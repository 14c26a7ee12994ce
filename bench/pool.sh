#!/usr/bin/env bash
# The weighted-median job (4,000-row CSV in, JSON out) in a pooled sandbox
# through the library (airlock::Pool, preload numpy, pandas, matplotlib),
# against bare cold Python running the same script: the python-data
# image's own venv (a clean venv of the same interpreter, with the same
# pandas; never the global pyenv python, whose .pth hook imports extra
# modules at start-up). Paired A B A B, order swapped each round, in one
# process (crates/airlock/examples/pool_bench.rs). Goal: pooled <= 0.1x bare.
#
# usage: bench/pool.sh [ROUNDS]      (builds the example, the command and its helper in release;
#                                     PROFILE=debug uses the debug build instead)
# Results go to bench/results/pool-pandas.json and are summarised on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-30}
profile=${PROFILE:-release}
flag=--release
[ "$profile" = debug ] && flag=
# The command's build puts the helper beside it (crates/airlock-build).
cargo build $flag -q -p airlock-cli
cargo build $flag -q -p airlock --example pool_bench
export AIRLOCK_INIT=$PWD/target/$profile/airlock-init
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
if [ ! -d "$AIRLOCK_HOME/images" ]; then
  target/$profile/airlock image build python-data >&2
fi
work=$(mktemp -d)
# Bare Python: the image's interpreter and packages, outside any sandbox.
source bench/bare_venv.sh
trap 'rm -rf "$work" "$bare_venv"' EXIT
# Bare Python reads /work/sales.csv in the sandbox; outside, the same script
# reads the copy in $work (paths rewritten, nothing else).
cp examples/sales.csv "$work/"
sed "s#/work/#$work/#g" examples/weighted_median.py > "$work/bare_weighted_median.py"
target/$profile/examples/pool_bench "$rounds" "$bare_python" "$work/bare_weighted_median.py" \
  examples/weighted_median.py examples/sales.csv bench/results/pool-pandas.json
echo "reproduce: PROFILE=$profile bench/pool.sh $rounds   (AIRLOCK_HOME=$AIRLOCK_HOME)"
