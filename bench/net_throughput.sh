#!/usr/bin/env bash
# Download throughput through airlock's egress proxy against the same download
# direct, on loopback, in paired rounds; and time to the first byte with a
# proxy started for the request against a direct request. Prints markdown.
#
#   bench/net_throughput.sh                      # 512 MiB, 8 rounds, a 1 Gbit/s paced run, 200 first-byte samples
#   bench/net_throughput.sh --mib 64 --rounds 2  # quick look
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p airlock-net --example net_throughput
echo "<!-- $(date -u +%FT%TZ), $(nproc) CPUs, load average: $(cut -d' ' -f1-3 /proc/loadavg) -->"
exec ./target/release/examples/net_throughput --mib 512 --rounds 8 --first-byte-samples 200 --pace-mbit 1000 "$@"
