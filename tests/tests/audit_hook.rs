//! Every front door can record its runs: the library's audit hook and
//! `airlock run --audit`, checked through the store and `airlock audit`.

use std::sync::Arc;

use airlock::audit::{AuditStore, ListFilter};
use airlock::{Audit, Policy, RunError, RunRequest, Status};
use airlock_tests::{airlock_command, sandbox};

#[test]
fn the_library_records_every_run_when_given_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap());
    let mut sb = sandbox(Policy::default());
    sb.set_audit(Some(Audit { store: store.clone(), principal: Some("library-user".into()) }));
    let first = sb.run("print('one')\n1 + 1");
    let second = sb.run_request(&RunRequest::shell("echo two; exit 4"));
    assert_eq!((first.status, second.status), (Status::Ok, Status::Failed));
    assert!(first.message.is_none(), "{:?}", first.message);
    let stored = store.get(&first.id).unwrap().expect("the first run is recorded");
    assert_eq!(stored.entry.principal.as_deref(), Some("library-user"));
    assert_eq!(stored.record.stdout, "one\n");
    assert_eq!(stored.record.value.as_deref(), Some("2"));
    let page = store.list(&ListFilter::default()).unwrap();
    let ids: Vec<&str> = page.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, vec![second.id.as_str(), first.id.as_str()]);
    assert!(store.verify().unwrap().is_intact());
}

#[test]
fn a_run_that_cannot_be_recorded_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap());
    let mut sb = sandbox(Policy::default());
    // A principal the store refuses: the append fails after the run.
    sb.set_audit(Some(Audit { store: store.clone(), principal: Some("bad\nname".into()) }));
    match sb.run_checked(&RunRequest::python("print('ran')")).map_err(|e| *e) {
        Err(RunError::Unrecorded { record, error }) => {
            assert_eq!(record.stdout, "ran\n", "the record is kept whole");
            assert!(error.to_string().contains("principal"), "{error}");
        }
        other => panic!("recorded with a bad principal: {other:?}"),
    }
    let record = sb.run_request(&RunRequest::python("print('again')"));
    assert_eq!(record.status, Status::Ok);
    let message = record.message.unwrap_or_default();
    assert!(message.contains("NOT recorded in the audit store"), "{message}");
    assert!(store.list(&ListFilter::default()).unwrap().runs.is_empty());
}

#[test]
fn airlock_run_records_with_audit_or_the_environment() {
    let home = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], env: Option<&str>| {
        let mut command = airlock_command();
        command.env("AIRLOCK_HOME", home.path()).args(["run", "--python", "python3", "--json"]).args(extra);
        match env {
            Some(value) => command.env("AIRLOCK_AUDIT", value),
            None => command.env_remove("AIRLOCK_AUDIT"),
        };
        command.output().unwrap()
    };
    let output = run(&["-c", "print('not recorded')"], None);
    assert!(output.status.success());
    assert!(!home.path().join("audit.sqlite3").exists(), "no store without --audit");
    let flagged = run(&["--audit", "-c", "print('flag')"], None);
    assert!(flagged.status.success(), "{}", String::from_utf8_lossy(&flagged.stderr));
    let by_env = run(&["-c", "print('env')"], Some("1"));
    assert!(by_env.status.success());
    let bad = run(&["-c", "1"], Some("maybe"));
    assert_eq!(bad.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("AIRLOCK_AUDIT"));

    let db = home.path().join("audit.sqlite3");
    let store = AuditStore::open_existing(&db).unwrap();
    let page = store.list(&ListFilter::default()).unwrap();
    assert_eq!(page.runs.len(), 2);
    let id: serde_json::Value = serde_json::from_slice(&flagged.stdout).unwrap();
    let id = id["id"].as_str().unwrap();
    let shown = airlock_command().env("AIRLOCK_HOME", home.path()).args(["audit", "show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("print('flag')") && shown.contains("flag\n"), "{shown}");
    let verified = airlock_command().env("AIRLOCK_HOME", home.path()).args(["audit", "verify"]).output().unwrap();
    assert!(verified.status.success());
    assert!(String::from_utf8_lossy(&verified.stdout).contains("2 entries"));
    let missing = airlock_command().args(["audit", "--db", "/nonexistent/audit.sqlite3", "verify"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/audit.sqlite3"));
    let unknown = airlock_command().env("AIRLOCK_HOME", home.path()).args(["audit", "show", "nope"]).output().unwrap();
    assert_eq!(unknown.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nope"));
}
