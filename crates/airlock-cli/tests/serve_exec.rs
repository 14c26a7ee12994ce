//! `airlock serve` and `airlock mcp` run `airlock-serve` by exec, so that
//! `airlock` itself links no server: the server answers in the process the
//! client started, with the arguments it was given, and a missing
//! `airlock-serve` is said plainly. Runs no sandbox and needs no image: the
//! MCP server is configured with the host's Python and no pool.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `airlock` command of this build.
const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
/// The `airlock-serve` binary of this build, beside `airlock`.
const AIRLOCK_SERVE: &str = env!("CARGO_BIN_EXE_airlock-serve");

/// `airlock` with a data directory of its own in `home`, finding
/// `airlock-serve` beside itself.
fn airlock(home: &Path) -> Command {
    let mut command = Command::new(AIRLOCK);
    command.env("AIRLOCK_HOME", home).env_remove("AIRLOCK_SERVE");
    command
}

/// A config for `airlock mcp` that runs the host's Python as it is (no image
/// to build) and records runs in `dir`.
fn host_python_config(dir: &Path) -> PathBuf {
    let path = dir.join("airlock.toml");
    let db = dir.join("audit.sqlite3");
    std::fs::write(&path, format!("python = \"python3\"\naudit_db = {:?}\n", db.display().to_string())).unwrap();
    path
}

#[test]
fn airlock_mcp_is_answered_by_airlock_serve_in_the_process_the_client_started() {
    let dir = tempfile::tempdir().unwrap();
    let config = host_python_config(dir.path());
    let mut child = airlock(dir.path())
        .args(["mcp", "--pool", "0", "--config"])
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });

    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    writeln!(stdin, "{initialize}").unwrap();
    stdin.flush().unwrap();
    let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("initialize was not answered: {}", errors.join().unwrap());
    };
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["result"]["serverInfo"]["name"], "airlock", "{answer}");

    // The process that answered is the one spawned, now airlock-serve, given
    // the arguments airlock was given, unchanged.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, std::fs::canonicalize(AIRLOCK_SERVE).unwrap());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|&byte| byte == 0)
        .skip(1)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    assert_eq!(args, ["mcp", "--pool", "0", "--config", &config.display().to_string()]);

    // Closing standard input ends the session, and the server with it.
    drop(stdin);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("airlock mcp did not exit when its standard input closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", errors.join().unwrap());
}

/// `airlock` with AIRLOCK_SERVE naming a file that is not there.
fn airlock_without_server(home: &Path) -> Command {
    let mut command = airlock(home);
    command.env("AIRLOCK_SERVE", "/nonexistent/airlock-serve");
    command
}

/// `airlock serve` with AIRLOCK_SERVE set to `named`, refused: its stderr.
fn serve_refused_with(home: &Path, named: &str) -> String {
    let output = airlock(home)
        .env("AIRLOCK_SERVE", named)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_missing_airlock_serve_is_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    // Named by AIRLOCK_SERVE.
    let stderr = serve_refused_with(dir.path(), "/nonexistent/airlock-serve");
    assert!(stderr.starts_with("airlock: "), "{stderr}");
    assert!(stderr.contains("/nonexistent/airlock-serve"), "the error names the path: {stderr}");
    assert!(stderr.contains("AIRLOCK_SERVE"), "the error names the variable: {stderr}");
    assert!(stderr.contains("cargo build --release"), "the error says how to build it: {stderr}");

    // A relative name is refused, never looked up in PATH.
    let stderr = serve_refused_with(dir.path(), "airlock-serve");
    assert!(stderr.contains("not an absolute path"), "{stderr}");

    // Looked for beside airlock: a link to this build's airlock in a folder
    // without airlock-serve (a hard link, so that the program's path is there).
    let lone = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let airlock_there = lone.path().join("airlock");
    if std::fs::hard_link(AIRLOCK, &airlock_there).is_err() {
        std::fs::copy(AIRLOCK, &airlock_there).unwrap();
    }
    let output = Command::new(&airlock_there)
        .env("AIRLOCK_HOME", dir.path())
        .env_remove("AIRLOCK_SERVE")
        .args(["mcp", "--pool", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let looked_at = lone.path().join("airlock-serve");
    assert!(stderr.contains(&looked_at.display().to_string()), "the error names {}: {stderr}", looked_at.display());
    assert!(stderr.contains("AIRLOCK_SERVE"), "{stderr}");
}

#[test]
fn both_binaries_keep_the_exit_statuses_and_help() {
    let dir = tempfile::tempdir().unwrap();
    // `airlock serve --help` is answered by airlock itself, without the server.
    let help = airlock_without_server(dir.path()).args(["serve", "--help"]).output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("Usage: airlock serve") && text.contains("--listen <ADDR>"), "{text}");
    // Misuse is 125 in both, refused before any exec by airlock.
    let misuse = airlock_without_server(dir.path()).args(["mcp", "--bogus"]).output().unwrap();
    assert_eq!(misuse.status.code(), Some(125));
    assert!(!String::from_utf8_lossy(&misuse.stderr).contains("/nonexistent"), "refused by clap, not the exec");
    let misuse = Command::new(AIRLOCK_SERVE).args(["serve", "--bogus"]).output().unwrap();
    assert_eq!(misuse.status.code(), Some(125));
    let help = Command::new(AIRLOCK_SERVE).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("serve") && text.contains("mcp"), "{text}");
    // A server that cannot start says why, as airlock, and exits 125.
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\n").unwrap();
    let refused = airlock(dir.path()).arg("serve").arg("--config").arg(&config).output().unwrap();
    assert_eq!(refused.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.starts_with("airlock: ") && stderr.contains("[[tokens]]"), "{stderr}");
}

#[test]
fn an_airlock_serve_of_another_build_is_said_to_be_one() {
    let dir = tempfile::tempdir().unwrap();
    // An older airlock-serve refuses an argument this airlock accepts: a
    // stand-in for one is this build's, handed one argument it does not know.
    let stale = dir.path().join("airlock-serve");
    std::fs::write(&stale, format!("#!/bin/sh\nexec {AIRLOCK_SERVE:?} \"$@\" --added-by-a-later-build\n")).unwrap();
    std::fs::set_permissions(&stale, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stderr = serve_refused_with(dir.path(), stale.to_str().unwrap());
    let refused = stderr.find("--added-by-a-later-build").expect("clap's own error");
    let mismatch = stderr.find("from different builds").expect("the mismatch is named");
    assert!(refused < mismatch, "clap's own error comes first: {stderr}");
    assert!(stderr.contains(AIRLOCK), "the airlock that started it is named: {stderr}");
    assert!(stderr.contains("scripts/build") && stderr.contains("AIRLOCK_SERVE"), "the fix is said: {stderr}");

    // airlock-serve started by hand and misused says nothing of builds.
    let misuse = Command::new(AIRLOCK_SERVE).args(["mcp", "--bogus"]).env_remove(STARTED_BY).output().unwrap();
    assert_eq!(misuse.status.code(), Some(125));
    assert!(!String::from_utf8_lossy(&misuse.stderr).contains("different builds"));
}

/// What `airlock` sets in the environment of the `airlock-serve` it starts.
const STARTED_BY: &str = "AIRLOCK_SERVE_STARTED_BY";
