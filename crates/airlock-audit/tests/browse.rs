//! What the console reads: pages both ways with every filter and text in
//! the code, contents kept beside the chain and checked, an entry's links,
//! and a version 1 store (made with the version 1 schema) read as it is,
//! or brought up to date by a writer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_audit::{
    APPLICATION_ID, AuditError, AuditStore, Browse, EntryFields, GENESIS_HASH, Position, SCHEMA_VERSION,
};
use airlock_policy::{RunRecord, Status};
use base64::Engine as _;
use common::{record, temp_db};
use rusqlite::Connection;

fn run(id: &str, status: Status, code: &str, started_at: &str) -> RunRecord {
    let mut record = record(id, status);
    record.code = code.to_owned();
    record.code_sha256 = airlock_core::sha256_hex(code.as_bytes());
    record.started_at = started_at.to_owned();
    record
}

/// 30 runs: alice's even, bob's odd; every third failed; one a day.
fn store_of_thirty() -> (tempfile::TempDir, AuditStore) {
    let (dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    for n in 1..=30u32 {
        let status = if n % 3 == 0 { Status::Failed } else { Status::Ok };
        let code = format!("\n# run {n}\nimport pandas as pd\nprint(pd.Series([{n}]).Sum())\n");
        let record = run(&format!("r{n}"), status, &code, &format!("2026-11-{n:02}T10:00:00Z"));
        store.append(&record, Some(if n % 2 == 0 { "alice" } else { "bob" })).unwrap();
    }
    (dir, store)
}

fn ids(store: &AuditStore, browse: &Browse) -> (Vec<String>, Option<u64>, Option<u64>) {
    let page = store.browse(browse).unwrap();
    (page.runs.iter().map(|run| run.summary.run_id.clone()).collect(), page.older, page.newer)
}

#[test]
fn pages_go_both_ways_newest_first() {
    let (_dir, store) = store_of_thirty();
    let (first, older, newer) = ids(&store, &Browse { limit: 12, ..Browse::default() });
    assert_eq!(first.first().map(String::as_str), Some("r30"));
    assert_eq!((first.len(), older, newer), (12, Some(19), None));
    let (second, older, newer) = ids(&store, &Browse { limit: 12, from: Position::Before(19), ..Browse::default() });
    assert_eq!((second.first().unwrap().as_str(), second.last().unwrap().as_str()), ("r18", "r7"));
    assert_eq!((older, newer), (Some(7), Some(18)));
    let (last, older, _) = ids(&store, &Browse { limit: 12, from: Position::Before(7), ..Browse::default() });
    assert_eq!((last.len(), older), (6, None));
    // Back from the second page: the first again, exactly.
    let (back, _, newer) = ids(&store, &Browse { limit: 12, from: Position::After(18), ..Browse::default() });
    assert_eq!((back, newer), (first, None));
    let (middle, older, newer) = ids(&store, &Browse { limit: 12, from: Position::After(6), ..Browse::default() });
    assert_eq!((middle.first().unwrap().as_str(), middle.last().unwrap().as_str()), ("r18", "r7"));
    assert_eq!((older, newer), (Some(7), Some(18)));
}

#[test]
fn filters_combine_and_the_first_line_is_the_first_that_is_not_blank() {
    let (_dir, store) = store_of_thirty();
    let browse = Browse {
        status: Some(Status::Failed),
        principal: Some("alice".to_owned()),
        since: Some("2026-11-10".to_owned()),
        until: Some("2026-11-25T00:00:00Z".to_owned()),
        ..Browse::default()
    };
    assert_eq!(ids(&store, &browse).0, ["r24", "r18", "r12"]);
    let page = store.browse(&Browse { limit: 1, ..Browse::default() }).unwrap();
    assert_eq!(page.runs[0].first_line, "# run 30");
    let bad = store.browse(&Browse { since: Some("yesterday".to_owned()), ..Browse::default() }).unwrap_err();
    assert!(matches!(bad, AuditError::BadFilter { field: "since", .. }), "{bad}");
}

#[test]
fn text_in_the_code_is_found_ignoring_case_and_text_too_short_or_too_long_is_refused() {
    let (_dir, store) = store_of_thirty();
    let found = |text: &str| ids(&store, &Browse { code_contains: Some(text.to_owned()), ..Browse::default() }).0;
    assert_eq!(found("# RUN 2\n"), ["r2"], "a substring across a line break, any case");
    assert_eq!(found("run 2"), ["r29", "r28", "r27", "r26", "r25", "r24", "r23", "r22", "r21", "r20", "r2"]);
    assert_eq!(found("[7]"), ["r7"], "punctuation is text too");
    assert_eq!(found("\"quoted\" OR x").len(), 0, "the search is a phrase, never FTS syntax");
    assert_eq!(found("").len(), 30, "empty: no filter");
    for (refused, limit) in
        [("30".to_owned(), "at least 3"), ("x".repeat(65), "at most 64"), ("é".repeat(65), "at most 64")]
    {
        let error = store.browse(&Browse { code_contains: Some(refused), ..Browse::default() }).unwrap_err();
        assert!(matches!(error, AuditError::BadFilter { field: "code_contains", .. }), "{error}");
        assert!(error.to_string().contains(limit), "the error names the limit: {error}");
    }
    assert_eq!(found(&"x".repeat(64)).len(), 0, "64 characters is a search");
    let both = Browse { code_contains: Some("run 2".to_owned()), status: Some(Status::Failed), ..Browse::default() };
    assert_eq!(ids(&store, &both).0, ["r27", "r24", "r21"]);
}

#[test]
fn contents_are_kept_once_by_hash_and_checked_when_read() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let png = b"\x89PNG\r\n\x1a\nnot really, but bytes".to_vec();
    let sha = airlock_core::sha256_hex(&png);
    let mut first = record("r1", Status::Ok);
    first.figures[0].sha256 = sha.clone();
    first.figures[0].png_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&png));
    // The artefact's recorded hash does not match its content: not kept.
    let lying = first.artifacts[0].sha256.clone().unwrap();
    store.append(&first, None).unwrap();
    let mut second = first.clone();
    second.id = "r2".to_owned();
    store.append(&second, None).unwrap();

    assert_eq!(store.content(&sha).unwrap(), Some(png));
    assert_eq!(store.content(&lying).unwrap(), None);
    let stored = store.get("r1").unwrap().unwrap();
    assert_eq!(stored.record.figures[0].png_base64, None, "the record itself keeps only the hash");
    let raw = Connection::open(&path).unwrap();
    let kept: i64 = raw.query_row("SELECT count(*) FROM contents", [], |row| row.get(0)).unwrap();
    assert_eq!(kept, 1, "two runs, one figure");

    raw.execute("UPDATE contents SET bytes = x'89504e470d0a1a0a3c7363726970743e'", []).unwrap();
    let altered = store.content(&sha).unwrap_err();
    assert!(matches!(altered, AuditError::ContentAltered { .. }), "{altered}");
    assert!(store.verify().unwrap().is_intact(), "contents are outside the chain");
}

#[test]
fn an_entry_knows_its_neighbours_links() {
    let (_dir, store) = store_of_thirty();
    let middle = store.get("r2").unwrap().unwrap();
    let links = store.neighbours(middle.entry.seq).unwrap();
    let previous = links.previous.unwrap();
    let next = links.next.unwrap();
    assert_eq!((previous.seq, next.seq), (1, 3));
    assert_eq!(previous.entry_hash, middle.entry.prev_hash);
    assert_eq!(next.prev_hash, middle.entry.entry_hash);
    let first = store.neighbours(1).unwrap();
    assert!(first.previous.is_none() && first.next.is_some());
    assert!(store.neighbours(30).unwrap().next.is_none());
}

/// The schema as airlock 0.1 (schema version 1) wrote it: main's
/// `crates/airlock-audit/src/store.rs` before version 2, verbatim.
const SCHEMA_V1: &str = "
CREATE TABLE schema_version (
    format     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_at TEXT NOT NULL
) STRICT;

CREATE TABLE runs (
    seq          INTEGER PRIMARY KEY NOT NULL CHECK (seq >= 1),
    run_id       TEXT NOT NULL UNIQUE,
    recorded_at  TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    status       TEXT NOT NULL,
    principal    TEXT,
    hash_version INTEGER NOT NULL,
    prev_hash    TEXT NOT NULL,
    entry_hash   TEXT NOT NULL,
    record       TEXT NOT NULL
) STRICT;
CREATE INDEX runs_by_started_at ON runs (started_at);
CREATE INDEX runs_by_status ON runs (status, seq);
CREATE INDEX runs_by_principal ON runs (principal, seq);

CREATE TABLE chain_head (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    seq        INTEGER NOT NULL,
    entry_hash TEXT NOT NULL
) STRICT;
";

/// A version 1 store, made as airlock 0.1 made one, with `runs` entries.
fn version_1_store(runs: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, path) = temp_db();
    let raw = Connection::open(&path).unwrap();
    raw.pragma_update_and_check(None, "journal_mode", "wal", |_| Ok(())).unwrap();
    raw.execute_batch(SCHEMA_V1).unwrap();
    raw.execute(
        "INSERT INTO schema_version (format, version, created_at) VALUES ('airlock-audit', 1, '2026-11-01T00:00:00Z')",
        [],
    )
    .unwrap();
    raw.execute("INSERT INTO chain_head (id, seq, entry_hash) VALUES (1, 0, ?1)", [GENESIS_HASH]).unwrap();
    raw.pragma_update(None, "application_id", APPLICATION_ID).unwrap();
    for n in 1..=runs {
        append_as_version_1(&raw, n);
    }
    (dir, path)
}

/// Entry `n` appended as airlock 0.1 appends: the row and the head, no index.
fn append_as_version_1(raw: &Connection, n: u32) {
    let (head_seq, prev_hash): (i64, String) =
        raw.query_row("SELECT seq, entry_hash FROM chain_head", [], |row| Ok((row.get(0)?, row.get(1)?))).unwrap();
    let seq = head_seq + 1;
    let code = format!("print('old run {n}')\n");
    let stored = serde_json::to_string(
        &run(&format!("old{n}"), Status::Ok, &code, "2026-11-02T10:00:00.000Z").without_contents(),
    )
    .unwrap();
    let (run_id, recorded_at, started_at) = (format!("old{n}"), "2026-11-02T10:00:01.000Z", "2026-11-02T10:00:00.000Z");
    let fields = EntryFields {
        seq: seq as u64,
        prev_hash: &prev_hash,
        run_id: &run_id,
        recorded_at,
        started_at,
        status: "ok",
        principal: Some("alice"),
        record: &stored,
    };
    let entry_hash = fields.hash();
    raw.execute(
        "INSERT INTO runs (seq, run_id, recorded_at, started_at, status, principal, hash_version, prev_hash, entry_hash, record)
         VALUES (?1, ?2, ?3, ?4, 'ok', 'alice', 1, ?5, ?6, ?7)",
        rusqlite::params![seq, run_id, recorded_at, started_at, prev_hash, entry_hash, stored],
    )
    .unwrap();
    raw.execute("UPDATE chain_head SET seq = ?1, entry_hash = ?2", rusqlite::params![seq, entry_hash]).unwrap();
}

fn schema_version(path: &std::path::Path) -> i64 {
    let raw = Connection::open(path).unwrap();
    raw.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap()
}

fn searching(text: &str) -> Browse {
    Browse { code_contains: Some(text.to_owned()), ..Browse::default() }
}

#[test]
fn readers_leave_a_version_1_store_as_it_is() {
    let (_dir, path) = version_1_store(3);
    let store = AuditStore::open_existing(&path).unwrap();
    assert_eq!(schema_version(&path), 1, "opening to read migrated nothing");
    assert!(!store.is_current());
    assert!(store.verify().unwrap().is_intact(), "verify works on it");
    assert_eq!(store.get("old2").unwrap().unwrap().record.code, "print('old run 2')\n", "show works on it");
    assert_eq!(store.browse(&Browse::default()).unwrap().runs.len(), 3, "list works on it");
    let refused = store.browse(&searching("old run")).unwrap_err();
    assert!(matches!(refused, AuditError::OldSchema { found: 1, .. }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains("searching the code") && message.contains("migrate"), "names the fix: {message}");
    assert!(!store.has_content(&"a".repeat(64)).unwrap());
    let append = store.append(&run("new", Status::Ok, "print(1)\n", "2026-11-03T10:00:00Z"), None).unwrap_err();
    assert!(matches!(append, AuditError::OldSchema { .. }), "a reader does not write a version 1 store: {append:?}");
    drop(store);
    assert_eq!(schema_version(&path), 1);
}

#[test]
fn a_writer_migrates_and_indexes_what_an_older_writer_appended_since() {
    let (_dir, path) = version_1_store(3);
    let store = AuditStore::open(&path).unwrap();
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    assert_eq!(store.browse(&searching("old run 2")).unwrap().runs.len(), 1, "runs recorded before are searchable");
    drop(store);
    // An airlock 0.1 that had the file open before the migration goes on
    // appending, without indexing.
    let raw = Connection::open(&path).unwrap();
    append_as_version_1(&raw, 4);
    drop(raw);
    let store = AuditStore::open(&path).unwrap();
    let found = store.browse(&searching("old run 4")).unwrap();
    assert_eq!(found.runs.iter().map(|run| run.summary.run_id.as_str()).collect::<Vec<_>>(), ["old4"], "healed");
    assert_eq!(store.browse(&searching("old run")).unwrap().runs.len(), 4, "each indexed once");
    assert!(store.verify().unwrap().is_intact());
    drop(store);
    drop(AuditStore::open(&path).unwrap());
    assert_eq!(AuditStore::open(&path).unwrap().browse(&searching("old run")).unwrap().runs.len(), 4);
}
