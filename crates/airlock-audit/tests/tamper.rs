//! Editing the database behind airlock's back, and `verify` naming the first
//! broken link each time; the independent Python verifier must agree.

// Test code: a failed unwrap is a failed test. Clippy allows that inside
// #[test] functions only, not in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use airlock_audit::{AuditStore, ChainBreak, ChainHead, EntryFields, Problem};
use airlock_policy::Status;
use common::{python_verify, record, temp_db};
use rusqlite::{Connection, params};

const ENTRIES: u64 = 5;

/// A chain of five runs (odd ones failed, even ones ok; principal on entry 2 only).
fn chain() -> (tempfile::TempDir, std::path::PathBuf, Vec<String>) {
    let (dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let mut run_ids = Vec::new();
    for n in 1..=ENTRIES {
        let status = if n % 2 == 1 { Status::Failed } else { Status::Ok };
        let principal = (n == 2).then_some("alice");
        let entry = store.append(&record(&format!("run-{n}"), status), principal).unwrap();
        assert_eq!(entry.seq, n);
        run_ids.push(entry.run_id);
    }
    let report = store.verify().unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.entries_checked, ENTRIES);
    assert_eq!(python_verify(&path).split(' ').next(), Some("intact"));
    (dir, path, run_ids)
}

fn edit(path: &Path, sql: &str) {
    let connection = Connection::open(path).unwrap();
    connection.execute_batch(sql).unwrap();
}

fn first_break(path: &Path) -> ChainBreak {
    let report = AuditStore::open(path).unwrap().verify().unwrap();
    let broken = report.first_break.clone().unwrap_or_else(|| panic!("verify missed the edit: {report}"));
    assert_eq!(report.entries_checked, broken.seq - 1, "{report}");
    broken
}

/// The Python verifier's verdict: the seq it names.
fn python_break(path: &Path) -> u64 {
    let verdict = python_verify(path);
    let mut words = verdict.split(' ');
    assert_eq!(words.next(), Some("broken"), "{verdict}");
    words.next().and_then(|seq| seq.parse().ok()).unwrap_or_else(|| panic!("{verdict}"))
}

/// Recomputes entry `seq`'s own hash from its stored fields and writes it
/// back, as someone covering an edit would.
fn rehash(connection: &Connection, seq: u64) -> String {
    let (run_id, recorded_at, started_at, status, principal, prev_hash, stored): (
        String,
        String,
        String,
        String,
        Option<String>,
        String,
        String,
    ) = connection
        .query_row(
            "SELECT run_id, recorded_at, started_at, status, principal, prev_hash, record FROM runs WHERE seq = ?1",
            [seq as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
        )
        .unwrap();
    let hash = EntryFields {
        seq,
        prev_hash: &prev_hash,
        run_id: &run_id,
        recorded_at: &recorded_at,
        started_at: &started_at,
        status: &status,
        principal: principal.as_deref(),
        record: &stored,
    }
    .hash();
    connection.execute("UPDATE runs SET entry_hash = ?1 WHERE seq = ?2", params![hash, seq as i64]).unwrap();
    hash
}

#[test]
fn an_edited_status_is_caught_at_its_entry() {
    let (_dir, path, run_ids) = chain();
    edit(&path, "UPDATE runs SET status = 'ok' WHERE seq = 3");
    let broken = first_break(&path);
    assert_eq!((broken.seq, broken.run_id.as_deref()), (3, Some(run_ids[2].as_str())));
    assert!(matches!(broken.problem, Problem::ContentEdited { .. }));
    assert!(broken.to_string().contains("entry 3 (run run-3): its content was edited"), "{broken}");
    assert_eq!(python_break(&path), 3);
}

#[test]
fn edited_code_output_and_principal_are_caught() {
    for (sql, seq) in [
        ("UPDATE runs SET record = replace(record, 'print', 'PRINT') WHERE seq = 2", 2),
        ("UPDATE runs SET record = replace(record, 'division by zero', 'all fine') WHERE seq = 4", 4),
        ("UPDATE runs SET principal = NULL WHERE seq = 2", 2),
        ("UPDATE runs SET principal = 'root' WHERE seq = 1", 1),
        ("UPDATE runs SET started_at = '2020-01-01T00:00:00.000Z' WHERE seq = 5", 5),
        ("UPDATE runs SET recorded_at = '2020-01-01T00:00:00.000Z' WHERE seq = 3", 3),
    ] {
        let (_dir, path, _) = chain();
        edit(&path, sql);
        let broken = first_break(&path);
        assert_eq!(broken.seq, seq, "{sql}: {broken}");
        assert!(matches!(broken.problem, Problem::ContentEdited { .. }), "{sql}: {broken}");
        assert_eq!(python_break(&path), seq, "{sql}");
    }
}

#[test]
fn deleted_rows_are_named_by_the_first_missing_entry() {
    for (sql, seq, through) in [
        ("DELETE FROM runs WHERE seq = 3", 3, 3),
        ("DELETE FROM runs WHERE seq IN (2, 3)", 2, 3),
        ("DELETE FROM runs WHERE seq = 1", 1, 1),
    ] {
        let (_dir, path, _) = chain();
        edit(&path, sql);
        let broken = first_break(&path);
        assert_eq!(broken.seq, seq, "{sql}: {broken}");
        assert_eq!(broken.run_id, None);
        assert_eq!(broken.problem, Problem::Missing { through }, "{sql}");
        assert!(broken.to_string().contains("deleted"), "{broken}");
        assert_eq!(python_break(&path), seq, "{sql}");
    }
}

#[test]
fn swapped_contents_are_caught_at_the_first_of_the_two() {
    let (_dir, path, _) = chain();
    edit(
        &path,
        "CREATE TEMP TABLE saved AS SELECT seq, status, record FROM runs WHERE seq IN (2, 4);
         UPDATE runs SET status = (SELECT status FROM saved WHERE seq = 4),
                         record = (SELECT record FROM saved WHERE seq = 4) WHERE seq = 2;
         UPDATE runs SET status = (SELECT status FROM saved WHERE seq = 2),
                         record = (SELECT record FROM saved WHERE seq = 2) WHERE seq = 4;",
    );
    let broken = first_break(&path);
    assert_eq!(broken.seq, 2, "{broken}");
    assert!(matches!(broken.problem, Problem::ContentEdited { .. }));
    assert_eq!(python_break(&path), 2);
}

#[test]
fn renumbered_rows_break_the_chain() {
    // Delete an entry and close the gap by renumbering the rest.
    for (deleted, message) in [(3, "entry 2 hashes to"), (1, "the first entry's prev_hash must be 64 zeros")] {
        let (_dir, path, _) = chain();
        edit(
            &path,
            &format!("DELETE FROM runs WHERE seq = {deleted}; UPDATE runs SET seq = seq - 1 WHERE seq > {deleted};"),
        );
        let broken = first_break(&path);
        assert_eq!(broken.seq, deleted, "{broken}");
        assert!(matches!(broken.problem, Problem::LinkBroken { .. }), "{broken}");
        assert!(broken.to_string().contains(message), "{broken}");
        assert_eq!(python_break(&path), deleted);
    }
}

#[test]
fn an_entry_rewritten_with_its_own_hash_recomputed_breaks_the_next_link() {
    let (_dir, path, run_ids) = chain();
    let connection = Connection::open(&path).unwrap();
    connection
        .execute("UPDATE runs SET status = 'ok', record = replace(record, 'failed', 'ok') WHERE seq = 3", [])
        .unwrap();
    let forged = rehash(&connection, 3);
    drop(connection);
    let broken = first_break(&path);
    assert_eq!((broken.seq, broken.run_id.as_deref()), (4, Some(run_ids[3].as_str())));
    match &broken.problem {
        Problem::LinkBroken { previous_entry_hash, .. } => assert_eq!(previous_entry_hash, &forged),
        other => panic!("expected a broken link, got {other:?}"),
    }
    assert!(broken.to_string().contains("entry 3 was rewritten"), "{broken}");
    assert_eq!(python_break(&path), 4);
}

#[test]
fn a_rewritten_tail_is_caught_by_the_head_then_by_an_anchor() {
    let (_dir, path, _) = chain();
    let anchor = AuditStore::open(&path).unwrap().head().unwrap().unwrap();
    assert_eq!(anchor.seq, ENTRIES);
    // Rewrite entry 3 and relink every entry after it, all hashes recomputed.
    let connection = Connection::open(&path).unwrap();
    connection.execute("UPDATE runs SET status = 'ok' WHERE seq = 3", []).unwrap();
    let mut previous = rehash(&connection, 3);
    for seq in 4..=ENTRIES {
        connection.execute("UPDATE runs SET prev_hash = ?1 WHERE seq = ?2", params![previous, seq as i64]).unwrap();
        previous = rehash(&connection, seq);
    }
    let broken = first_break(&path);
    assert_eq!(broken.seq, ENTRIES, "{broken}");
    assert!(matches!(broken.problem, Problem::HeadMismatch { .. }), "{broken}");
    assert_eq!(python_break(&path), ENTRIES);

    // Move the recorded head too: the file is consistent again, and only
    // the head noted outside it tells.
    connection.execute("UPDATE chain_head SET entry_hash = ?1", [&previous]).unwrap();
    let store = AuditStore::open(&path).unwrap();
    assert!(store.verify().unwrap().is_intact(), "the documented limit of verify without an anchor");
    let report = store.verify_anchored(&anchor).unwrap();
    let broken = report.first_break.expect("the anchor catches the rewrite");
    assert_eq!(broken.seq, ENTRIES);
    assert!(matches!(broken.problem, Problem::AnchorMismatch { .. }), "{broken}");
}

#[test]
fn a_truncated_tail_is_caught_by_the_head_then_by_an_anchor() {
    let (_dir, path, _) = chain();
    let anchor = ChainHead::parse(&AuditStore::open(&path).unwrap().head().unwrap().unwrap().to_string()).unwrap();
    edit(&path, "DELETE FROM runs WHERE seq >= 4");
    let broken = first_break(&path);
    assert_eq!((broken.seq, &broken.problem), (4, &Problem::TailMissing { head_seq: ENTRIES }));
    assert!(broken.to_string().contains("deleted from the end"), "{broken}");
    assert_eq!(python_break(&path), 4);

    // The next append links to the recorded head, so the gap stays visible.
    let store = AuditStore::open(&path).unwrap();
    let entry = store.append(&record("after", Status::Ok), None).unwrap();
    assert_eq!(entry.seq, ENTRIES + 1);
    let broken = store.verify().unwrap().first_break.unwrap();
    assert_eq!((broken.seq, &broken.problem), (4, &Problem::Missing { through: ENTRIES }));

    // Cut the tail and move the head back: only the anchor tells.
    let (_dir, path, _) = chain();
    edit(
        &path,
        "DELETE FROM runs WHERE seq >= 4; UPDATE chain_head SET seq = 3, entry_hash = (SELECT entry_hash FROM runs WHERE seq = 3);",
    );
    let store = AuditStore::open(&path).unwrap();
    assert!(store.verify().unwrap().is_intact(), "the documented limit of verify without an anchor");
    let broken = store.verify_anchored(&anchor).unwrap().first_break.unwrap();
    assert_eq!(broken.seq, 4);
    assert!(matches!(broken.problem, Problem::AnchorMissing { .. }), "{broken}");
    assert!(store.verify_anchored(&store.head().unwrap().unwrap()).unwrap().is_intact());
}

#[test]
fn rows_added_or_the_head_removed_by_hand_are_caught() {
    let (_dir, path, _) = chain();
    let connection = Connection::open(&path).unwrap();
    connection
        .execute(
            "INSERT INTO runs SELECT 6, 'forged', recorded_at, started_at, status, principal, hash_version,
                    entry_hash, '', record FROM runs WHERE seq = 5",
            [],
        )
        .unwrap();
    rehash(&connection, 6);
    drop(connection);
    let broken = first_break(&path);
    assert_eq!((broken.seq, &broken.problem), (6, &Problem::BeyondHead { head_seq: ENTRIES }));
    assert_eq!(python_break(&path), 6);

    let (_dir, path, _) = chain();
    edit(&path, "DELETE FROM chain_head");
    let broken = first_break(&path);
    assert_eq!((broken.seq, &broken.problem), (ENTRIES + 1, &Problem::HeadMissing));
    assert_eq!(python_break(&path), ENTRIES + 1);

    let (_dir, path, _) = chain();
    edit(&path, "UPDATE runs SET hash_version = 2 WHERE seq = 2");
    let broken = first_break(&path);
    assert_eq!((broken.seq, &broken.problem), (2, &Problem::UnknownHashVersion { version: 2 }));
    assert_eq!(python_break(&path), 2);
}

#[test]
fn a_byte_flipped_in_the_file_itself_is_caught() {
    let (_dir, path, run_ids) = chain();
    // Closing the last connection checkpoints the log into the file, so the
    // records are in the file's own pages.
    assert!(!path.with_extension("sqlite3-wal").exists());
    let mut bytes = std::fs::read(&path).unwrap();
    let needle = b"print('run run-2')";
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("entry 2's code is in the file");
    bytes[at] = b'P';
    std::fs::write(&path, &bytes).unwrap();

    let broken = first_break(&path);
    assert_eq!((broken.seq, broken.run_id.as_deref()), (2, Some(run_ids[1].as_str())));
    assert!(matches!(broken.problem, Problem::ContentEdited { .. }));
    assert_eq!(python_break(&path), 2);
}
