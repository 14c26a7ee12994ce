#!/usr/bin/env bash
# Per-run cost of `sb.run("print(1+1)")` in a loop from Python against
# `airlock run -c 'print(1+1)'` in a loop from a shell, in paired rounds.
# Prints markdown.
#
#   bench/python.sh                       # 8 rounds of 20 runs each way
#   bench/python.sh --rounds 2 --runs 5   # quick look
#
# Builds the release `airlock` command and helper, and installs the Python
# package into target/bench-venv (`pip install ./python`) when it is missing
# or older than the sources. Uses target/tmp/airlock-test-home as airlock's data
# folder, so the python-data image the tests built is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p airlock-cli -p airlock-linux --bins
venv=target/bench-venv
stamp=$venv/.installed
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if [ ! -e "$stamp" ] || [ -n "$(find python crates Cargo.lock -newer "$stamp" -type f -print -quit)" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check ./python
    touch "$stamp"
fi
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/tmp/airlock-test-home}
export AIRLOCK_INIT=$PWD/target/release/airlock-init
echo "<!-- $(date -u +%FT%TZ), $(nproc) CPUs, load average: $(cut -d' ' -f1-3 /proc/loadavg) -->"
exec "$venv/bin/python" bench/python.py --airlock target/release/airlock "$@"
