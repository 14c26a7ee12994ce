#!/usr/bin/env bash
# airlock run against bare Python (the same interpreter and packages, no
# sandbox), paired A B A B, on three jobs:
#   trivial  print(1+1)
#   import   a script that imports a large module (pandas)
#   pandas   the weighted-median job of the README (4,000-row CSV in, JSON out)
# and bubblewrap (namespaces only) on the trivial job, for context.
# Goals: trivial <= 1.3x bare (issue 15; 1.15x before), pandas <= 1.03x bare.
#
# usage: bench/startup.sh [ROUNDS]     (needs the README's build: scripts/build)
#   BASE=/path/to/older/airlock bench/startup.sh 40   also runs an older build
#   (its airlock-init beside it) in the same rounds, as `base`;
#   ONLY=trivial stops after the trivial job.
# Results go to bench/results/startup-*.json and are summarised on stdout,
# with the CPU time of each command (every process of it) when perf is here.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-40}
airlock=$PWD/target/bin/airlock
[ -x "$airlock" ] || { echo "build first: scripts/build" >&2; exit 1; }
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
"$airlock" image build python-data >&2
work=$(mktemp -d)
# Bare Python: the image's interpreter and packages, outside any sandbox.
source bench/bare_venv.sh
trap 'rm -rf "$work" "$bare_venv"' EXIT
bare=$bare_venv
python=$bare_python
cp examples/sales.csv examples/weighted_median.py "$work/"
# Bare Python reads /work/sales.csv in the sandbox; outside, the same script
# reads the copy in $work (paths rewritten, nothing else).
sed "s#/work/#$work/#g" examples/weighted_median.py > "$work/bare_weighted_median.py"
cd "$work"

echo "== trivial: print(1+1)"
bwrap_cmd="bwrap --unshare-all --die-with-parent --tmpfs /tmp --ro-bind /usr /usr --ro-bind $base $base --ro-bind $AIRLOCK_HOME $AIRLOCK_HOME --ro-bind $bare $bare --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev $python -c 'print(1+1)'"
names=bare,airlock
trivial=("$python -c 'print(1+1)'" "$airlock run -c 'print(1+1)'")
if [ -n "${BASE:-}" ]; then trivial+=("$BASE run -c 'print(1+1)'"); names=$names,base; fi
if command -v bwrap >/dev/null; then trivial+=("$bwrap_cmd"); names=$names,bubblewrap; fi
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names "$names" --json "$OLDPWD/bench/results/startup-trivial.json" \
  "${trivial[@]}"
if command -v perf >/dev/null; then
  echo "== trivial: CPU time (perf stat task-clock, every process of the command, mean of $rounds runs)"
  IFS=, read -ra labels <<< "$names"
  for i in "${!trivial[@]}"; do
    perf stat -x, -o "$work/perf.csv" -e task-clock -r "$rounds" -- sh -c "${trivial[$i]}" >/dev/null 2>&1
    printf '%-10s %8s ms CPU\n' "${labels[$i]}" "$(grep task-clock "$work/perf.csv" | cut -d, -f1)"
  done
fi

[ "${ONLY:-}" = trivial ] && exit 0

echo "== import: import pandas"
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names bare,airlock --json "$OLDPWD/bench/results/startup-import.json" \
  "$python -c 'import pandas'" "$airlock run -c 'import pandas'"

echo "== pandas: the weighted-median job"
job=("$python bare_weighted_median.py" "$airlock run weighted_median.py --file sales.csv --out /work/out.json:out.json")
names=bare,airlock
if [ -n "${BASE:-}" ]; then
  job+=("$BASE run weighted_median.py --file sales.csv --out /work/out.json:out.json"); names=$names,base
fi
python3 "$OLDPWD/bench/paired.py" --rounds "$rounds" --names "$names" --json "$OLDPWD/bench/results/startup-pandas.json" \
  "${job[@]}"
