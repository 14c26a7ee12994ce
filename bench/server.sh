#!/usr/bin/env bash
# Runs per second of `print(1+1)` through `airlock serve`'s HTTP API, against
# the library called directly, on the same machine at the same concurrency,
# in pairs (library, HTTP, library, HTTP...); and the server's own memory at
# rest and under load.
#
#   bench/server.sh [RUNS] [THREADS] [ROUNDS]      # defaults: 100 2 6
#
# Each round runs the three arms once, in an order that rotates from round
# to round (so every arm is first, second and third equally often and a
# machine that slows down or speeds up during the run favours none); the
# summary is the median over rounds of each round's ratio.
#
# The library arm records every run in an audit store as the server does
# ("direct-audit"); a third arm without any store ("direct") shows what the
# audit trail itself costs. All three use the host's python3, no image.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-100}
THREADS=${2:-2}
ROUNDS=${3:-6}

cargo build --release -q -p airlock-cli -p airlock-linux
cargo build --release -q -p airlock-server --example bench
BIN=$PWD/target/release
BENCH=$BIN/examples/bench
export AIRLOCK_INIT=$BIN/airlock-init
WORK=$(mktemp -d)
export AIRLOCK_HOME=$WORK/home
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

TOKEN=bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
cat > "$WORK/airlock.toml" <<TOML
listen = "127.0.0.1:0"
python = "python3"
concurrency = $THREADS
queue = 256
audit_db = "$WORK/server-audit.sqlite3"
[[tokens]]
name = "bench"
sha256 = "$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)"
TOML

"$BIN/airlock" serve --config "$WORK/airlock.toml" 2> "$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 100); do grep -q "serving http://" "$WORK/server.log" && break; sleep 0.1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/server.log" | head -1)
kib() { awk -v key="$1:" '$1 == key {print $2}' "/proc/$SERVER_PID/status"; }

echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg), $RUNS runs per trial, $THREADS threads, $ROUNDS rounds"
echo "server RSS at start: $(kib VmRSS) KiB"
# Warm-up: the first runs probe the host and fill caches on both sides.
"$BENCH" http 10 "$THREADS" "$URL" "$TOKEN" > /dev/null
"$BENCH" direct 10 "$THREADS" > /dev/null
echo "server RSS at rest after warm-up: $(kib VmRSS) KiB"
arm() {
    case $1 in
        direct-audit) "$BENCH" direct-audit "$RUNS" "$THREADS" "$WORK/direct-audit-$2.sqlite3" ;;
        http) "$BENCH" http "$RUNS" "$THREADS" "$URL" "$TOKEN" ;;
        direct) "$BENCH" direct "$RUNS" "$THREADS" ;;
    esac
}
ARMS=(direct-audit http direct)
for round in $(seq "$ROUNDS"); do
    for slot in 0 1 2; do
        name=${ARMS[$(( (slot + round) % 3 ))]}
        echo "round=$round $(arm "$name" "$round")"
    done
done | tee "$WORK/trials.txt"
echo "server RSS after the trials: $(kib VmRSS) KiB (peak so far $(kib VmHWM) KiB)"
# Each round's ratios, then their medians.
ratios() {
    awk -v num="$1" -v den="$2" '{ split($6, kv, "="); rate[$1, $2] = kv[2]; rounds[$1] = 1 }
        END { for (r in rounds) printf "%.4f\n", rate[r, num] / rate[r, den] }' "$WORK/trials.txt" | sort -n
}
median() { awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f (min %.3f, max %.3f, %d rounds)", m, v[1], v[NR], NR }'; }
echo "http / direct-audit: median $(ratios http direct-audit | median)"
echo "direct-audit / direct: median $(ratios direct-audit direct | median)"
# Under the load the issue names: 16 clients against the same slots.
"$BENCH" http "$RUNS" 16 "$URL" "$TOKEN"
echo "server RSS after 16 clients: $(kib VmRSS) KiB, peak $(kib VmHWM) KiB"
sleep 2
echo "server RSS at rest after load: $(kib VmRSS) KiB"
