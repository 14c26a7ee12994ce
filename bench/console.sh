#!/usr/bin/env bash
# How long the audit console's pages take with 100,000 runs in the store,
# against the same pages over 1,000 runs in the same run (paired rounds).
#
#   bench/console.sh [--runs N] [--baseline N] [--rounds N] [--dir DIR] [--debug]
#
# The stores are made once on a RAM disk (/dev/shm/airlock-console-bench by
# default; filling 100,000 runs takes a few minutes) and kept for later runs;
# remove the folder to start again. Release build unless --debug.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=release
ARGS=()
for arg in "$@"; do
    if [ "$arg" = --debug ]; then PROFILE=debug; else ARGS+=("$arg"); fi
done
if [ "$PROFILE" = release ]; then
    cargo build --release -q -p airlock-server --example console_list
    exec target/release/examples/console_list "${ARGS[@]}"
fi
cargo build -q -p airlock-server --example console_list
exec target/debug/examples/console_list "${ARGS[@]}"
