#!/usr/bin/env bash
# Time from the start of `airlock run` to the first allowed byte, against a
# run without network doing everything else the same, paired:
#   none     no --allow-host; the code imports urllib.request and stops
#   allowed  --allow-host 127.0.0.1:PORT; the same import, then a GET through
#            the proxy to a server on the host's loopback, reading one byte
# The difference is what allowing a host costs a run: the proxy's listener in
# the sandbox, the proxy's start in the supervisor, the connection it checks
# and dials, and the first byte back.
#
# usage: bench/net_first_byte.sh [ROUNDS]   (needs a release build: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-40}
airlock=$PWD/target/release/airlock
[ -x "$airlock" ] || { echo "build first: cargo build --release" >&2; exit 1; }
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
"$airlock" image build python-data >&2
port=18765
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$(mktemp -d)" >/dev/null 2>&1 &
server=$!
trap 'kill $server' EXIT
sleep 0.5
fetch="import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/').read(1)"
python3 bench/paired.py --rounds "$rounds" --names none,allowed --json bench/results/net-first-byte.json \
  "$airlock run -c 'import urllib.request'" \
  "$airlock run --allow-host 127.0.0.1:$port -c \"$fetch\""
