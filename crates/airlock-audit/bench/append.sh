#!/bin/sh
# What recording a run costs: the audit store's append against a plain SQLite
# insert of the same record, paired rounds (A B C A B C ...). Arguments go to
# the benchmark (--dir DIR --rounds N --appends N --stdout-bytes N); the
# database files go in --dir, /tmp by default: put them on the disk the
# server's data directory will use, since the cost is mostly its fsync.
set -eu
cd "$(dirname "$0")/../../.."
cargo build --release -q -p airlock-audit --example bench_append
exec target/release/examples/bench_append "$@"
