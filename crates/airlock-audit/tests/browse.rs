//! What the console reads: pages both ways with every filter and text in
//! the code, contents kept beside the chain and checked, an entry's links,
//! and a version 1 store brought up to date.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_audit::{AuditError, AuditStore, Browse, Position, SCHEMA_VERSION};
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
fn text_in_the_code_is_found_ignoring_case_and_text_too_short_to_index_is_refused() {
    let (_dir, store) = store_of_thirty();
    let found = |text: &str| ids(&store, &Browse { code_contains: Some(text.to_owned()), ..Browse::default() }).0;
    assert_eq!(found("# RUN 2\n"), ["r2"], "a substring across a line break, any case");
    assert_eq!(found("run 2"), ["r29", "r28", "r27", "r26", "r25", "r24", "r23", "r22", "r21", "r20", "r2"]);
    assert_eq!(found("[7]"), ["r7"], "punctuation is text too");
    assert_eq!(found("\"quoted\" OR x").len(), 0, "the search is a phrase, never FTS syntax");
    assert_eq!(found("").len(), 30, "empty: no filter");
    for refused in ["30".to_owned(), "x".repeat(501)] {
        let error = store.browse(&Browse { code_contains: Some(refused), ..Browse::default() }).unwrap_err();
        assert!(matches!(error, AuditError::BadFilter { field: "code_contains", .. }), "{error}");
    }
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

/// A store as airlock 0.1 wrote it: schema 1, no contents, no index.
fn downgrade_to_version_1(path: &std::path::Path) {
    let raw = Connection::open(path).unwrap();
    raw.execute_batch("DROP TABLE contents; DROP TABLE code_search; UPDATE schema_version SET version = 1;").unwrap();
}

#[test]
fn a_version_1_store_is_brought_up_to_date_and_its_code_indexed() {
    let (dir, store) = store_of_thirty();
    let path = store.path().to_owned();
    let head = store.head().unwrap();
    drop(store);
    downgrade_to_version_1(&path);

    let store = AuditStore::open_existing(&path).unwrap();
    let raw = Connection::open(&path).unwrap();
    let version: i64 = raw.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let found = store.browse(&Browse { code_contains: Some("# run 17\n".to_owned()), ..Browse::default() }).unwrap();
    assert_eq!(found.runs.len(), 1, "runs recorded before are searchable");
    assert_eq!(store.head().unwrap(), head);
    assert!(store.verify().unwrap().is_intact());
    // Opening again is a no-op.
    drop(AuditStore::open(&path).unwrap());
    drop(dir);
}
