#!/usr/bin/env bash
# airlock run against bare Python (the same interpreter and packages, no
# sandbox), paired A B A B, on three jobs:
#   trivial  print(1+1)
#   import   a script that imports a large module (pandas)
#   pandas   the weighted-median job of the README (4,000-row CSV in, JSON out)
# and bubblewrap (namespaces only) on the trivial job, for context.
# Goals: trivial <= 1.15x bare, pandas <= 1.03x bare.
#
# usage: bench/startup.sh [ROUNDS]     (needs a release build: cargo build --release)
# Results go to bench/results/startup.json and are summarised on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-40}
airlock=$PWD/target/release/airlock
[ -x "$airlock" ] || { echo "build first: cargo build --release" >&2; exit 1; }
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
"$airlock" image build python-data >&2
venv=$(ls -d "$AIRLOCK_HOME"/images/*/venv | head -n1)
python=$venv/bin/python
base=$(python3 -c "import json,glob; print(json.load(open(glob.glob('$AIRLOCK_HOME/images/*/manifest.json')[0]))['python']['base_prefix'])")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp examples/sales.csv examples/weighted_median.py "$work/"
# Bare Python reads /work/sales.csv in the sandbox; outside, the same script
# reads the copy in $work (paths rewritten, nothing else).
sed "s#/work/#$work/#g" examples/weighted_median.py > "$work/bare_weighted_median.py"
cd "$work"

echo "== trivial: print(1+1)"
bwrap_cmd="bwrap --unshare-all --die-with-parent --tmpfs /tmp --ro-bind /usr /usr --ro-bind $base $base --ro-bind $AIRLOCK_HOME $AIRLOCK_HOME --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev $python -c 'print(1+1)'"
extra=()
names=bare,airlock
if command -v bwrap >/dev/null; then extra=("$bwrap_cmd"); names=$names,bubblewrap; fi
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names "$names" --json "$OLDPWD/bench/results/startup-trivial.json" \
  "$python -c 'print(1+1)'" "$airlock run -c 'print(1+1)'" "${extra[@]}"

echo "== import: import pandas"
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names bare,airlock --json "$OLDPWD/bench/results/startup-import.json" \
  "$python -c 'import pandas'" "$airlock run -c 'import pandas'"

echo "== pandas: the weighted-median job"
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names bare,airlock --json "$OLDPWD/bench/results/startup-pandas.json" \
  "$python bare_weighted_median.py" \
  "$airlock run weighted_median.py --file sales.csv --out /work/out.json:out.json"
