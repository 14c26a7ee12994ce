//! Every front door records its runs, on both backends: the library's audit
//! hook, `airlock run --audit`, `airlock serve` and `airlock mcp`, checked
//! through the store and `airlock audit`; and a store that cannot take a run
//! fails it at every door.

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

// Each door on both backends (the library's own hook on both is in both.rs).

airlock_tests::on_both_backends!(
    the_command_records_an_audited_run_and_fails_one_it_cannot_record,
    the_server_records_every_run_and_refuses_one_it_cannot_record,
    mcp_records_every_run_and_refuses_one_it_cannot_record,
);

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use airlock::BackendKind;
use serde_json::{Value, json};

/// The `airlock run` arguments that pick `backend` (the host's Python on linux).
fn backend_args(backend: BackendKind) -> Vec<&'static str> {
    match backend {
        BackendKind::Linux => vec!["--python", "python3"],
        BackendKind::Wasm => vec!["--backend", "wasm"],
    }
}

/// A data folder on a disk of `size` of its own (a tmpfs in a mount
/// namespace of the command's: this needs root), sharing the test home's
/// wasm interpreter. Runs `command` there with `AIRLOCK_HOME` set to it.
fn on_a_small_disk(size: &str, command: Command) -> Command {
    let home = tempfile::tempdir().unwrap().keep();
    let interpreters = airlock_tests::test_home().join("backends");
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size={size},mode=0755 auditdisk \"$0\" && ln -s \"$1\" \"$0/backends\" && shift && exec \"$@\""
        ))
        .arg(&home)
        .arg(&interpreters)
        .arg(command.get_program())
        .args(command.get_args())
        .envs(command.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))))
        .env("AIRLOCK_HOME", &home);
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

fn the_command_records_an_audited_run_and_fails_one_it_cannot_record(backend: BackendKind) {
    let home = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(airlock_tests::test_home().join("backends"), home.path().join("backends")).unwrap();
    let run = |extra: &[&str], env: Option<&str>| {
        let mut command = airlock_command();
        command.env("AIRLOCK_HOME", home.path()).args(["run", "--json"]).args(backend_args(backend)).args(extra);
        match env {
            Some(value) => command.env("AIRLOCK_AUDIT", value),
            None => command.env_remove("AIRLOCK_AUDIT"),
        };
        command.output().unwrap()
    };
    let flagged = run(&["--audit", "-c", "print('flag')"], None);
    assert!(flagged.status.success(), "{}", String::from_utf8_lossy(&flagged.stderr));
    let by_env = run(&["-c", "print('env')"], Some("1"));
    assert!(by_env.status.success(), "{}", String::from_utf8_lossy(&by_env.stderr));
    let store = AuditStore::open_existing(&home.path().join("audit.sqlite3")).unwrap();
    for output in [&flagged, &by_env] {
        let record: Value = serde_json::from_slice(&output.stdout).unwrap();
        let stored = store.get(record["id"].as_str().unwrap()).unwrap().expect("the run is in the store");
        assert_eq!(stored.record.isolation.backend, backend.to_string());
        assert_eq!(stored.record.stdout, record["stdout"].as_str().unwrap());
    }
    assert!(store.verify().unwrap().is_intact());

    // A store on a disk too small for the record: the run is shown, and the
    // command fails.
    let mut command = airlock_command();
    command.env("AIRLOCK_AUDIT", "1").args(["run", "--json"]).args(backend_args(backend));
    command.args(["-c", "print('x' * 900_000)"]);
    let output = on_a_small_disk("400k", command).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("NOT recorded in the audit store"), "{stderr}");
    let record: Value = serde_json::from_slice(&output.stdout).expect("the run is still shown");
    assert_eq!(record["status"], "ok");
}

/// A running `airlock serve` for `backend`, killed when dropped.
struct Server {
    child: std::process::Child,
    address: String,
}

const TOKEN: &str = "door-token-3b1f";

impl Server {
    fn start(backend: BackendKind, audit_db: &Path, small_disk: bool) -> Server {
        let dir = tempfile::tempdir().unwrap().keep();
        let config = dir.join("airlock.toml");
        std::fs::write(&config, server_config(backend, audit_db)).unwrap();
        let mut command = airlock_command();
        command.arg("serve").arg("--config").arg(&config);
        if small_disk {
            command = on_a_small_disk("3m", command);
        }
        let mut child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (found, address) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("airlock: serving http://") {
                    let _ = found.send(rest.split(' ').next().unwrap_or_default().to_owned());
                }
            }
        });
        let address = address.recv_timeout(Duration::from_secs(120)).expect("the server starts");
        Server { child, address }
    }

    fn run(&self, code: &str) -> (reqwest::StatusCode, Value) {
        let response = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap()
            .post(format!("http://{}/v1/runs", self.address))
            .bearer_auth(TOKEN)
            .json(&json!({ "code": code }))
            .send()
            .unwrap();
        (response.status(), response.json().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server config that runs `backend` and records into `audit_db` (where
/// it is empty: `$AIRLOCK_HOME/audit.sqlite3`).
fn server_config(backend: BackendKind, audit_db: &Path) -> String {
    let mut config = String::from("listen = \"127.0.0.1:0\"\n");
    if !audit_db.as_os_str().is_empty() {
        config.push_str(&format!("audit_db = {audit_db:?}\n"));
    }
    // The host's Python on linux, which spares the server building the
    // default image at start; the wasm backend refuses one (its interpreter
    // is built in).
    if backend == BackendKind::Linux {
        config.push_str("python = \"python3\"\n");
    }
    config.push_str(&format!("[[tokens]]\nname = \"door\"\nsha256 = \"{}\"\n", airlock_server::token_sha256(TOKEN)));
    if backend == BackendKind::Wasm {
        config.push_str("[defaults]\nbackend = \"wasm\"\n[ceiling]\nbackend = \"wasm\"\n");
    }
    config
}

fn the_server_records_every_run_and_refuses_one_it_cannot_record(backend: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.sqlite3");
    {
        let server = Server::start(backend, &db, false);
        let (status, record) = server.run("print('served')");
        assert_eq!(status, reqwest::StatusCode::OK, "{record}");
        let store = AuditStore::open_existing(&db).unwrap();
        let stored = store.get(record["id"].as_str().unwrap()).unwrap().expect("the run is in the store");
        assert_eq!(stored.record.isolation.backend, backend.to_string());
        assert_eq!(stored.entry.principal.as_deref(), Some("door"));
    }
    // On a 3 MiB disk a few records of 900 KB fill it: the run that cannot
    // be recorded is not returned.
    let server = Server::start(backend, Path::new(""), true);
    let mut refused = None;
    for _ in 0..12 {
        match server.run("print('x' * 900_000)") {
            (reqwest::StatusCode::OK, _) => {}
            (status, answer) => {
                refused = Some((status, answer));
                break;
            }
        }
    }
    let (status, answer) = refused.expect("the disk filled within 12 runs");
    assert_eq!(status, reqwest::StatusCode::INSUFFICIENT_STORAGE, "{answer}");
    assert_eq!(answer["error"]["code"], "audit_disk_full", "{answer}");
}

/// Runs the official MCP client over stdio against `airlock mcp`, started
/// by `command`, with `calls`.
fn mcp_session(command: Command, calls: &Value) -> Value {
    // The SDK passes the server almost no environment: `env` carries ours.
    let mut args: Vec<String> = command
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    args.push(command.get_program().to_string_lossy().into_owned());
    args.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    let mode: Vec<&str> = ["stdio", "env"].into_iter().chain(args.iter().map(String::as_str)).collect();
    airlock_tests::mcp_sdk_client(&mode, calls).unwrap_or_else(|error| panic!("the MCP client failed: {error}"))
}

fn mcp_records_every_run_and_refuses_one_it_cannot_record(backend: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.sqlite3");
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, server_config(backend, &db)).unwrap();
    let mut command = airlock_command();
    command.arg("mcp").arg("--config").arg(&config).args(["--principal", "mcp-agent"]);
    let session = mcp_session(command, &json!([{"name": "run_python", "arguments": {"code": "print('tooled')"}}]));
    let result = &session["results"][0];
    assert_eq!(result["isError"], false, "{result:#}");
    let id = result["structuredContent"]["run_id"].as_str().unwrap();
    let store = AuditStore::open_existing(&db).unwrap();
    let stored = store.get(id).unwrap().expect("the run is in the store");
    assert_eq!(stored.record.isolation.backend, backend.to_string());
    assert_eq!(stored.entry.principal.as_deref(), Some("mcp-agent"));

    let small = dir.path().join("small.toml");
    std::fs::write(&small, server_config(backend, Path::new(""))).unwrap();
    let mut command = airlock_command();
    command.arg("mcp").arg("--config").arg(&small);
    let loud: Vec<Value> =
        (0..8).map(|_| json!({"name": "run_python", "arguments": {"code": "print('x' * 900_000)"}})).collect();
    let session = mcp_session(on_a_small_disk("3m", command), &Value::Array(loud));
    let refused = session["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["isError"] == true)
        .unwrap_or_else(|| panic!("the disk never filled: {session:#}"));
    let text = refused["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("could not be recorded in the audit store"), "{text}");
}
