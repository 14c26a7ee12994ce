//! What the integration tests share: realistic records, and running this
//! test binary again as a child process.

#![allow(dead_code)] // Each test file uses its own part of this module.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_policy::{
    ArtifactRecord, ErrorInfo, FigureRecord, ImageRef, InputRecord, Isolation, Language, Layer, Limit, NetworkEvent,
    NetworkRecord, NetworkVerdict, Policy, PolicySpec, RECORD_SCHEMA_VERSION, RunRecord, Status, Usage,
};

/// The environment variable that turns a test binary into a child helper.
pub const CHILD_MODE: &str = "AIRLOCK_AUDIT_TEST_CHILD";

/// A record as a backend makes it, with artefact and figure contents inline.
pub fn record(id: &str, status: Status) -> RunRecord {
    let code = format!("import sys\nprint('run {id}')\nsys.stderr.write('warn\\n')\n1 / 0\n");
    RunRecord {
        schema_version: RECORD_SCHEMA_VERSION,
        id: id.to_owned(),
        started_at: "2026-11-29T09:04:05.123Z".to_owned(),
        status,
        limits_hit: if status == Status::Ok { vec![] } else { vec![Limit::Output] },
        message: None,
        exit_code: Some(if status == Status::Ok { 0 } else { 1 }),
        signal: None,
        stdout: format!("run {id}\n"),
        stderr: "warn\nTraceback (most recent call last):\nZeroDivisionError: division by zero\n".to_owned(),
        stdout_truncated: false,
        stderr_truncated: false,
        stdout_base64: None,
        stderr_base64: None,
        code_sha256: airlock_core::sha256_hex(code.as_bytes()),
        code,
        language: Language::Python,
        policy: PolicySpec { allow_hosts: Some(vec!["example.com".to_owned()]), ..Policy::default().to_spec() },
        inputs: vec![InputRecord { path: "/work/data.csv".to_owned(), bytes: 12, sha256: "a".repeat(64) }],
        artifacts: vec![ArtifactRecord {
            path: "/work/out.bin".to_owned(),
            bytes: Some(6),
            sha256: Some("b".repeat(64)),
            saved_to: None,
            content_base64: Some("QVJURUZBQ1RDT05URU5U".to_owned()),
            error: None,
        }],
        figures: vec![FigureRecord {
            name: "figure-1.png".to_owned(),
            width: 640,
            height: 480,
            bytes: 9,
            sha256: "c".repeat(64),
            saved_to: None,
            png_base64: Some("RklHVVJFUE5HQ09OVEVOVA==".to_owned()),
        }],
        value: None,
        results: Vec::new(),
        error: Some(ErrorInfo {
            kind: "ZeroDivisionError".to_owned(),
            message: "division by zero".to_owned(),
            traceback: "Traceback (most recent call last):\n  line 4\nZeroDivisionError: division by zero\n".to_owned(),
            line: Some(4),
            column: None,
        }),
        usage: Usage { wall_ms: 1234, cpu_ms: Some(800), peak_memory_bytes: Some(45 << 20), ..Usage::default() },
        isolation: Isolation {
            backend: "linux".to_owned(),
            layers: vec![Layer::UserNamespace, Layer::PidNamespace, Layer::Seccomp],
            degraded: vec![Layer::Landlock],
            details: BTreeMap::from([("cgroup".to_owned(), "v2".to_owned())]),
        },
        image: Some(ImageRef { name: "default".to_owned(), hash: "d".repeat(64) }),
        network: Some(NetworkRecord {
            allowed_hosts: vec!["example.com".to_owned()],
            connections: vec![NetworkEvent {
                host: "example.com".to_owned(),
                port: 443,
                resolved: Some("93.184.216.34".to_owned()),
                verdict: NetworkVerdict::Allowed,
                reason: None,
                bytes_out: 100,
                bytes_in: 2000,
            }],
        }),
    }
}

/// A fresh folder and the path of an audit database inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("audit.sqlite3");
    (dir, path)
}

/// This test binary, set to run only the ignored helper test `helper`, with
/// `mode` telling it what to do; started through `wrapper` (a program and
/// its arguments, such as `unshare --mount`) when that is not empty.
pub fn child(wrapper: &[&str], helper: &str, mode: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    command.args([helper, "--exact", "--ignored", "--nocapture", "--test-threads=1"]).env(CHILD_MODE, mode);
    command
}

/// The mode a helper test was started in, `None` when the test runner
/// started it directly (then it has nothing to do).
pub fn child_mode() -> Option<String> {
    std::env::var(CHILD_MODE).ok()
}

/// Runs the independent Python verifier on `db`: its one line of output.
pub fn python_verify(db: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("verify_chain.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(db)
        .output()
        .expect("python3 on PATH, to run verify_chain.py (the project's machines have it)");
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(
        output.status.code() == Some(0) || output.status.code() == Some(1),
        "verify_chain.py failed: {text} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}
