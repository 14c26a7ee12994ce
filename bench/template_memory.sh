#!/usr/bin/env bash
# The memory an idle forked pool's template holds (issue 15): starts
# `airlock serve` with a forked pool of 1, waits until it is ready and
# settled, and prints the pool's memory gauges from /metrics. Run it more
# than once: the first server after a build also charges the page cache it
# warms. Results: bench/results/pool.md ("Memory held, ready").
#
# usage: bench/template_memory.sh [PROFILE]   (release by default; the
#   image python-data in AIRLOCK_HOME, built on first use)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
airlock=$PWD/target/$profile/airlock
export AIRLOCK_HOME=${AIRLOCK_HOME:-$PWD/target/airlock-bench-home}
[ -d "$AIRLOCK_HOME/images" ] || "$airlock" image build python-data >&2
work=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
token=bench-token
sha=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
cat > "$work/airlock.toml" <<TOML
listen = "127.0.0.1:0"
audit_db = "$work/audit.sqlite3"
[pool]
size = 1
mode = "forked"
[[tokens]]
name = "bench"
sha256 = "$sha"
TOML
"$airlock" serve --config "$work/airlock.toml" 2> "$work/server.log" &
server=$!
metrics() { curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/metrics"; }
port=
for _ in $(seq 600); do
  port=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/server.log" | head -n1 | cut -d: -f3) || true
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "airlock serve did not say where it listens" >&2; exit 1; }
for _ in $(seq 600); do
  metrics | grep -q '^airlock_pool_ready 1$' && break
  sleep 0.1
done
metrics | grep -q '^airlock_pool_ready 1$' || { echo "the pool did not fill in 60 s" >&2; exit 1; }
sleep 1
metrics | grep -E '^airlock_pool_(ready|memory_bytes|template_memory_bytes) '
