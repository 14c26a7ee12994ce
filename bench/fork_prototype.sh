#!/usr/bin/env bash
# The forked-mode prototype (bench/fork_prototype.py): the weighted-median
# job forked from a template that imported numpy, pandas and matplotlib, in
# fresh namespaces with every layer the prototype applies, against bare cold
# Python running the same script; paired A B A B, order swapped each round.
# Both use a clean venv of the python-data image's interpreter with the
# image's packages (never the global pyenv python, whose .pth hook imports
# extra modules). Needs root or unprivileged user namespaces, and a built
# debug tree (for the default seccomp filter, compiled by build.rs).
#
# usage: bench/fork_prototype.sh [ROUNDS]
# Results go to bench/results/fork-prototype.json and to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
home=${AIRLOCK_HOME:-$PWD/target/tmp/airlock-test-home}
image_venv=$(ls -d "$home"/images/*/venv | head -n1)
base=$(sed -n 's/^home = //p' "$image_venv/pyvenv.cfg")
# The image's venv names its interpreter by its path inside the sandbox;
# outside, the same packages beside the host's copy of that interpreter.
interpreter=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["python"]["executable"])' \
  "$(dirname "$image_venv")/manifest.json")
seccomp=$(ls -t target/debug/build/airlock-linux-*/out/default-seccomp.bpf | head -n1)
work=$(mktemp -d -p /var/tmp)  # not below /tmp or /work: a fork mounts over both
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/venv/bin" "$work/venv/lib/python3.11"
ln -s "$interpreter" "$work/venv/bin/python"
ln -s "$image_venv/lib/python3.11/site-packages" "$work/venv/lib/python3.11/site-packages"
printf 'home = %s\ninclude-system-site-packages = false\n' "$(dirname "$interpreter")" > "$work/venv/pyvenv.cfg"
echo "image venv: $image_venv (sandbox interpreter $base)" >&2
cp examples/sales.csv "$work/"
sed "s#/work/#$work/#g" examples/weighted_median.py > "$work/bare_weighted_median.py"
"$work/venv/bin/python" -I bench/fork_prototype.py bench "$rounds" "$work/venv/bin/python" \
  "$work/bare_weighted_median.py" "$work/sales.csv" examples/weighted_median.py "$seccomp" \
  bench/results/fork-prototype.json
echo "reproduce: bench/fork_prototype.sh $rounds" >&2
