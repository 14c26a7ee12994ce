#!/usr/bin/env bash
# The fuzzer in CI: Schemathesis (every check, a bounded number of examples
# per operation, a fixed seed) against a real `airlock serve`, then the MCP
# tools' input schemas through a JSON Schema validator and the strict-schema
# transformation agent SDKs apply. Fails on any finding.
#
#   tests/fuzz/run.sh VENV_PYTHON AIRLOCK_BINARY
#
# The venv needs schemathesis, jsonschema and mcp (scripts/test makes it).
set -euo pipefail
# Absolute, without resolving links (the venv's python is one).
absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
python="$(absolute "$1")"
airlock="$(absolute "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

token="fuzz-token-$RANDOM$RANDOM"
hash="$(printf %s "$token" | sha256sum | cut -d' ' -f1)"
cat > "$work/airlock.toml" <<TOML
listen = "127.0.0.1:0"
audit_db = "$work/audit.sqlite3"
python = "python3"
concurrency = 2
queue = 32
max_body_bytes = 1048576
grace_period_s = 2
[defaults]
timeout_s = 5
cpu_time_s = 5
[ceiling]
timeout_s = 5
cpu_time_s = 5
[[tokens]]
name = "fuzzer"
sha256 = "$hash"
TOML

"$airlock" serve --config "$work/airlock.toml" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 600); do
    address="$(sed -n 's/^airlock: serving http:\/\/\([^ ]*\).*/\1/p' "$work/server.log")"
    [ -n "$address" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; exit 1; }
    sleep 0.1
done
[ -n "$address" ] || { echo "the server did not start"; cat "$work/server.log"; exit 1; }

started=$(date +%s)
# From the scratch folder: Schemathesis keeps its example database in the
# working directory.
cd "$work"
"$(dirname "$python")/st" --config-file "$here/schemathesis.toml" run "http://$address/openapi.json" \
    --checks all --max-examples "${AIRLOCK_FUZZ_EXAMPLES:-25}" --seed 14 --workers 2 \
    --request-timeout 30 --header "Authorization: Bearer $token" --report-dir "$work/report"
echo "fuzz: schemathesis took $(( $(date +%s) - started )) s"

"$python" "$here/strict_schemas.py" "http://$address/mcp" "$token"
