//! Opening, appending, reading back, listing and showing runs.

// Test code: a failed unwrap is a failed test. Clippy allows that inside
// #[test] functions only, not in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use airlock_audit::{APPLICATION_ID, AuditError, AuditStore, ListFilter, Problem, SCHEMA_VERSION};
use airlock_policy::Status;
use common::{record, temp_db};
use rusqlite::Connection;

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_new_store_is_private_write_ahead_logged_and_marked_as_airlocks() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("fresh/airlock");
    let path = folder.join("audit.sqlite3");
    let store = AuditStore::open(&path).unwrap();
    store.append(&record("r1", Status::Ok), None).unwrap();

    assert_eq!(mode(&folder), 0o700);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&folder.join("audit.sqlite3-wal")), 0o600, "the log holds the records too");
    let raw = Connection::open(&path).unwrap();
    let journal: String = raw.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(journal, "wal");
    let application_id: i32 = raw.pragma_query_value(None, "application_id", |r| r.get(0)).unwrap();
    assert_eq!(application_id, APPLICATION_ID);
    let (format, version): (String, i64) =
        raw.query_row("SELECT format, version FROM schema_version", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert_eq!((format.as_str(), version), ("airlock-audit", airlock_audit::SCHEMA_VERSION));
}

#[test]
fn an_existing_file_keeps_its_permissions_and_its_chain() {
    let (_dir, path) = temp_db();
    let first = AuditStore::open(&path).unwrap().append(&record("r1", Status::Ok), None).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let store = AuditStore::open(&path).unwrap();
    let second = store.append(&record("r2", Status::Ok), None).unwrap();
    assert_eq!(mode(&path), 0o640);
    assert_eq!(second.seq, 2);
    assert_eq!(second.prev_hash, first.entry_hash);
    assert!(store.verify().unwrap().is_intact());
}

#[test]
fn refuses_files_that_are_not_airlock_audit_databases_and_leaves_them_alone() {
    let (dir, _) = temp_db();

    let text = dir.path().join("notes.txt");
    fs::write(&text, "not a database at all, but long enough to have a header.....\n".repeat(20)).unwrap();
    let before = fs::read(&text).unwrap();
    let error = AuditStore::open(&text).unwrap_err();
    assert!(matches!(error, AuditError::NotAuditDatabase { .. }), "{error}");
    assert!(error.to_string().contains("notes.txt"), "{error}");
    assert_eq!(fs::read(&text).unwrap(), before);

    let other = dir.path().join("other.sqlite3");
    Connection::open(&other).unwrap().execute_batch("CREATE TABLE invoices (id INTEGER)").unwrap();
    let before = fs::read(&other).unwrap();
    let error = AuditStore::open(&other).unwrap_err();
    assert!(error.to_string().contains("invoices"), "{error}");
    assert_eq!(fs::read(&other).unwrap(), before, "not even switched to WAL");

    let foreign = dir.path().join("foreign.sqlite3");
    Connection::open(&foreign).unwrap().pragma_update(None, "application_id", 7).unwrap();
    let error = AuditStore::open(&foreign).unwrap_err();
    assert!(error.to_string().contains("application id is 0x00000007"), "{error}");

    let folder = dir.path().join("a-folder");
    fs::create_dir(&folder).unwrap();
    let error = AuditStore::open(&folder).unwrap_err();
    assert!(matches!(error, AuditError::Create { .. }), "{error}");
}

#[test]
fn refuses_a_database_from_a_newer_airlock() {
    let (_dir, path) = temp_db();
    drop(AuditStore::open(&path).unwrap());
    Connection::open(&path).unwrap().execute("UPDATE schema_version SET version = 99", []).unwrap();
    let error = AuditStore::open(&path).unwrap_err();
    assert!(matches!(error, AuditError::NewerSchema { found: 99, supported: SCHEMA_VERSION, .. }), "{error}");
    assert!(error.to_string().contains("newer"), "{error}");
}

#[test]
fn a_run_reads_back_as_recorded_without_artefact_or_figure_contents() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let original = record("run-1", Status::Failed);
    let entry = store.append(&original, Some("ci-bot")).unwrap();
    assert_eq!(entry.seq, 1);
    assert_eq!(entry.prev_hash, airlock_audit::GENESIS_HASH);
    assert_eq!(entry.principal.as_deref(), Some("ci-bot"));

    let stored = store.get("run-1").unwrap().expect("the run is recorded");
    assert_eq!(stored.entry, entry);
    assert!(stored.hash_matches);
    let mut expected = original.clone();
    expected.artifacts[0].content_base64 = None;
    expected.figures[0].png_base64 = None;
    assert_eq!(stored.record, expected);
    assert_eq!(stored.record.artifacts[0].sha256, original.artifacts[0].sha256);
    assert_eq!(stored.record.figures[0].sha256, original.figures[0].sha256);

    drop(store);
    let file = fs::read(&path).unwrap();
    let contains = |needle: &str| file.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(contains("division by zero"), "the record is in the file");
    assert!(!contains("QVJURUZBQ1RDT05URU5U") && !contains("RklHVVJFUE5HQ09OVEVOVA"), "contents were stored");
    assert!(AuditStore::open(&path).unwrap().get("run-2").unwrap().is_none());
}

#[test]
fn a_run_is_recorded_once() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    store.append(&record("same", Status::Ok), None).unwrap();
    let error = store.append(&record("same", Status::Failed), None).unwrap_err();
    assert!(matches!(error, AuditError::Duplicate { seq: 1, .. }), "{error}");
    let report = store.verify().unwrap();
    assert!(report.is_intact());
    assert_eq!(report.entries_checked, 1);
    assert_eq!(store.get("same").unwrap().unwrap().record.status, Status::Ok);
}

#[test]
fn refuses_principals_that_are_not_names_and_records_without_ids() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let long = "x".repeat(201);
    for bad in ["", "tok\nen", "\u{1b}[31m", long.as_str()] {
        let error = store.append(&record("r", Status::Ok), Some(bad)).unwrap_err();
        assert!(matches!(error, AuditError::BadPrincipal { .. }), "{bad:?}: {error}");
    }
    let error = store.append(&record("", Status::Ok), None).unwrap_err();
    assert!(matches!(error, AuditError::BadRecord { .. }), "{error}");
    assert_eq!(store.head().unwrap(), None, "nothing was written");
    let entry = store.append(&record("r", Status::Ok), Some("alice@example.org (laptop)")).unwrap();
    assert_eq!(store.head().unwrap().map(|head| head.entry_hash), Some(entry.entry_hash));
}

#[test]
fn lists_newest_first_with_filters_and_stable_cursors() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let statuses = [Status::Ok, Status::Failed, Status::Timeout];
    for n in 1..=12u32 {
        let mut run = record(&format!("r{n}"), statuses[n as usize % 3]);
        // One hour apart from 00:00 UTC, written in a +02:00 offset for half of them.
        run.started_at = if n % 2 == 0 {
            format!("2026-11-29T{:02}:30:00+02:00", n + 2)
        } else {
            format!("2026-11-29T{n:02}:30:00.000Z")
        };
        let principal = if n % 4 == 0 { Some("alice") } else { Some("bob") };
        store.append(&run, principal).unwrap();
    }
    let ids = |filter: ListFilter| -> Vec<String> {
        store.list(&filter).unwrap().runs.into_iter().map(|run| run.run_id).collect()
    };

    assert_eq!(ids(ListFilter::default()).first().map(String::as_str), Some("r12"));
    assert_eq!(ids(ListFilter { status: Some(Status::Timeout), ..Default::default() }), ["r11", "r8", "r5", "r2"]);
    assert_eq!(ids(ListFilter { principal: Some("alice".into()), ..Default::default() }), ["r12", "r8", "r4"]);
    let window = ListFilter {
        since: Some("2026-11-29T04:30:00Z".into()),
        until: Some("2026-11-29T09:00:00+02:00".into()),
        ..Default::default()
    };
    assert_eq!(ids(window), ["r6", "r5", "r4"], "since inclusive, until exclusive, offsets honoured");
    assert_eq!(ids(ListFilter { since: Some("2026-11-30".into()), ..Default::default() }), Vec::<String>::new());

    let summary = &store.list(&ListFilter { limit: Some(1), ..Default::default() }).unwrap().runs[0];
    assert_eq!(summary.started_at, "2026-11-29T12:30:00.000Z", "stored in UTC");
    assert_eq!(summary.status, Status::Ok);
    assert_eq!(summary.principal.as_deref(), Some("alice"));
    assert_eq!(summary.language, Some(airlock_policy::Language::Python));
    assert_eq!(summary.exit_code, Some(0));
    assert_eq!(summary.wall_ms, Some(1234));
    assert_eq!(summary.code_sha256.as_deref(), Some(record("r12", Status::Ok).code_sha256.as_str()));

    // Page through 5 at a time while runs keep arriving: each run once, none skipped.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list(&ListFilter { limit: Some(5), cursor: cursor.clone(), ..Default::default() }).unwrap();
        seen.extend(page.runs.iter().map(|run| run.run_id.clone()));
        store.append(&record(&format!("late{}", seen.len()), Status::Ok), None).unwrap();
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let expected: Vec<String> = (1..=12).rev().map(|n| format!("r{n}")).collect();
    assert_eq!(seen, expected);
}

#[test]
fn bad_filters_name_the_field() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let cases = [
        (ListFilter { limit: Some(0), ..Default::default() }, "limit"),
        (ListFilter { limit: Some(5000), ..Default::default() }, "limit"),
        (ListFilter { cursor: Some("abc".into()), ..Default::default() }, "cursor"),
        (ListFilter { since: Some("last tuesday".into()), ..Default::default() }, "since"),
        (ListFilter { until: Some("2026-02-30".into()), ..Default::default() }, "until"),
    ];
    for (filter, field) in cases {
        let error = store.list(&filter).unwrap_err();
        assert!(matches!(error, AuditError::BadFilter { field: f, .. } if f == field), "{error}");
    }
    let unknown = serde_json::from_str::<ListFilter>(r#"{"statuss": "ok"}"#).unwrap_err();
    assert!(unknown.to_string().contains("statuss"), "{unknown}");
    let parsed: ListFilter = serde_json::from_str(r#"{"status": "memory_limit", "limit": 3}"#).unwrap();
    assert_eq!(parsed.status, Some(Status::MemoryLimit));
}

#[test]
fn show_puts_the_numbered_code_above_its_output_and_defuses_escape_sequences() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    let mut run = record("shown", Status::Failed);
    run.stdout = "hello\n\u{1b}]0;pwned\u{7}\u{1b}[2Jcleared\n".to_owned();
    run.value = Some("42".to_owned());
    store.append(&run, Some("alice")).unwrap();
    let text = airlock_audit::render(&store.get("shown").unwrap().unwrap());

    for needle in [
        "run         shown (entry 1,",
        "asked by alice",
        "status      failed (exit code 1)",
        "limits hit  output",
        "usage       wall 1.234 s, cpu 0.800 s, peak memory 45 MiB",
        "timeout 20 s",
        "memory 512 MiB",
        "network     example.com",
        "isolation   linux: user_namespace, pid_namespace, seccomp (running without: landlock)",
        "input       /work/data.csv (12 B, sha256 aaaa",
        "artefact    /work/out.bin (6 B, sha256 bbbb",
        "figure      figure-1.png (640x480 PNG",
        "connection  example.com:443 allowed",
        "(matches its content)",
        " 1 | import sys\n",
        ">4 | 1 / 0\n",
        "--- value ---\n42\n",
        "--- error: ZeroDivisionError at line 4 ---\ndivision by zero\n",
        "\\u{1b}[2Jcleared",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let code_at = text.find("--- code").unwrap();
    let stdout_at = text.find("--- stdout").unwrap();
    let stderr_at = text.find("--- stderr").unwrap();
    assert!(code_at < stdout_at && stdout_at < stderr_at, "code, then stdout, then stderr:\n{text}");
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "raw control characters reach the terminal");
}

#[test]
fn show_says_when_an_entry_no_longer_matches_its_hash() {
    let (_dir, path) = temp_db();
    let store = AuditStore::open(&path).unwrap();
    store.append(&record("edited", Status::Failed), None).unwrap();
    Connection::open(&path).unwrap().execute("UPDATE runs SET status = 'ok' WHERE seq = 1", []).unwrap();
    let run = store.get("edited").unwrap().unwrap();
    assert!(!run.hash_matches);
    assert!(airlock_audit::render(&run).contains("DOES NOT match its content"));
    let report = store.verify().unwrap();
    assert!(matches!(report.first_break.map(|b| b.problem), Some(Problem::ContentEdited { .. })));
}

#[test]
fn reading_commands_do_not_create_a_store_at_a_wrong_path() {
    let (dir, path) = temp_db();
    let wrong = dir.path().join("typo/audit.sqlite3");
    let error = AuditStore::open_existing(&wrong).unwrap_err();
    assert!(matches!(error, AuditError::Missing { .. }), "{error}");
    assert!(error.to_string().contains("typo/audit.sqlite3"), "{error}");
    assert!(!dir.path().join("typo").exists(), "nothing was created");
    AuditStore::open(&path).unwrap().append(&record("r1", Status::Ok), None).unwrap();
    let store = AuditStore::open_existing(&path).unwrap();
    assert!(store.get("r1").unwrap().is_some());
}
