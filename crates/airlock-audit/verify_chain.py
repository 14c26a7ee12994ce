#!/usr/bin/env python3
"""Checks an airlock audit database's hash chain without airlock.

An independent implementation of the scheme in airlock-audit's crate
documentation, from the standard library alone. Usage:

    python3 verify_chain.py AUDIT.sqlite3

Prints `intact N HEAD_SEQ:HEAD_HASH` and exits 0, or prints
`broken SEQ REASON` and exits 1.
"""

import hashlib
import sqlite3
import struct
import sys

GENESIS = "0" * 64


def text(value):
    data = value.encode("utf-8")
    return struct.pack(">Q", len(data)) + data


def entry_hash(seq, prev_hash, run_id, recorded_at, started_at, status, principal, record):
    parts = [b"airlock-audit-entry/1\n", struct.pack(">Q", seq)]
    parts += [text(v) for v in (prev_hash, run_id, recorded_at, started_at, status)]
    parts.append(b"\x00" if principal is None else b"\x01" + text(principal))
    parts.append(text(record))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def verify(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT seq, run_id, recorded_at, started_at, status, principal, hash_version,"
        " prev_hash, entry_hash, record FROM runs ORDER BY seq"
    )
    last_seq, last_hash = 0, GENESIS
    for seq, run_id, recorded_at, started_at, status, principal, version, prev, stored, record in rows:
        if seq != last_seq + 1:
            return f"broken {last_seq + 1} missing"
        if version != 1:
            return f"broken {seq} unknown hash version {version}"
        if prev != last_hash:
            return f"broken {seq} link"
        if entry_hash(seq, prev, run_id, recorded_at, started_at, status, principal, record) != stored:
            return f"broken {seq} content"
        last_seq, last_hash = seq, stored
    head = db.execute("SELECT seq, entry_hash FROM chain_head WHERE id = 1").fetchone()
    if head is None:
        return f"broken {last_seq + 1} head missing"
    if head[0] > last_seq:
        return f"broken {last_seq + 1} tail missing"
    if head[0] < last_seq:
        return f"broken {head[0] + 1} beyond head"
    if head[1] != last_hash:
        return f"broken {last_seq} head mismatch"
    return f"intact {last_seq} {last_seq}:{last_hash}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    result = verify(sys.argv[1])
    print(result)
    sys.exit(0 if result.startswith("intact") else 1)
