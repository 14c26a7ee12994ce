//! airlock run by an ordinary user, not root: the same sandbox through user
//! namespaces; without a cgroup it may write to, a clear refusal unless the
//! caller lowers the policy; with a delegated cgroup, every limit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_tests::users::{Delegated, nobody_command, parse_record, user_home};
use airlock_tests::{airlock_bin, exclusive, helper};
use serde_json::Value;

/// `airlock run ARGS` as user nobody, using the system's Python (the test
/// account cannot read root's), optionally first entering `cgroups`.
fn run_as_nobody(home: &Path, cgroups: &[PathBuf], args: &[&str]) -> Output {
    nobody_command(home, cgroups).args(["run", "--json", "--python", "/usr/bin/python3"]).args(args).output().unwrap()
}

fn record(output: &Output) -> Value {
    parse_record(output)
}

#[test]
fn without_a_cgroup_of_its_own_the_run_is_refused_with_the_fix() {
    let home = user_home();
    let output = run_as_nobody(home.path(), &[], &["-c", "print('ran')"]);
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cgroups is required"), "{stderr}");
    assert!(stderr.contains("delegate a cgroup"), "names the fix: {stderr}");
    assert!(stderr.contains("--allow-degraded cgroups"), "names the explicit way out: {stderr}");
}

#[test]
fn lowered_explicitly_it_runs_in_the_same_namespaces_and_says_so() {
    let home = user_home();
    let code = r#"
import os, socket
print(os.getuid(), sorted(os.listdir("/proc/self/fd")), sorted(os.environ))
print([l for l in open("/proc/self/status") if l.startswith(("CapEff", "NoNewPrivs", "Seccomp:"))])
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("1.1.1.1", 80)); print("connected")
except OSError as e:
    print(type(e).__name__)
for d in ["/home", "/root", "/etc/shadow"]:
    print(d, os.path.exists(d))
"#;
    let output = run_as_nobody(home.path(), &[], &["--allow-degraded", "cgroups", "-c", code]);
    let record = record(&output);
    assert_eq!(record["status"], "ok", "{record}");
    let stdout = record["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("1000 ['0', '1', '2', '3']"), "{stdout}");
    assert!(
        stdout.contains("CapEff:\\t0000000000000000")
            && stdout.contains("NoNewPrivs:\\t1")
            && stdout.contains("Seccomp:\\t2"),
        "{stdout}"
    );
    assert!(stdout.contains("OSError") && !stdout.contains("connected"), "{stdout}");
    assert!(
        stdout.contains("/home False") && stdout.contains("/root False") && stdout.contains("/etc/shadow False"),
        "{stdout}"
    );
    assert_eq!(record["isolation"]["degraded"], serde_json::json!(["cgroups"]));
    let layers = record["isolation"]["layers"].as_array().unwrap();
    assert!(layers.contains(&Value::from("user_namespace")) && layers.contains(&Value::from("landlock")));
    assert!(!layers.contains(&Value::from("cgroups")));
    // Without a cgroup, a timeout still ends the whole tree.
    let output = run_as_nobody(
        home.path(),
        &[],
        &["--allow-degraded", "cgroups", "--timeout", "1", "--lang", "sh", "-c", "sleep 100 & sleep 100"],
    );
    assert_eq!(record_status(&output), "timeout");
}

fn record_status(output: &Output) -> String {
    record(output)["status"].as_str().unwrap().to_owned()
}

#[test]
fn with_a_delegated_cgroup_every_limit_holds() {
    let _alone = exclusive();
    let delegated = Delegated::new();
    let home = user_home();
    let output = run_as_nobody(home.path(), &delegated.0, &["-c", "print('ran')"]);
    let r = record(&output);
    assert_eq!(r["status"], "ok", "{r}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(r["isolation"]["layers"].as_array().unwrap().contains(&Value::from("cgroups")), "{r}");
    let output = run_as_nobody(
        home.path(),
        &delegated.0,
        &["--memory", "64", "-c", "x = []\nwhile True: x.append(bytearray(8 << 20))"],
    );
    assert_eq!(record_status(&output), "memory_limit");
    let output = run_as_nobody(
        home.path(),
        &delegated.0,
        &["--lang", "sh", "--timeout", "3", "-c", "f() { f | f & }; f; sleep 5"],
    );
    let r = record(&output);
    assert!(r["limits_hit"].as_array().unwrap().contains(&Value::from("pids")), "{r}");
    // The runs' cgroups are gone; only the delegated ones remain, empty.
    for dir in &delegated.0 {
        let children: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.path().is_dir()).collect();
        assert!(children.is_empty(), "{children:?}");
    }
}

#[test]
fn root_where_nobody_does_not_exist_is_refused_never_run_as_root() {
    // Root in a user namespace that maps only itself (`unshare -r`): airlock
    // would have to run the code as that root, so it refuses and says why.
    let home = tempfile::tempdir().unwrap();
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--"])
        .arg(airlock_bin())
        .args(["run", "--python", "/usr/bin/python3", "-c", "print('ran')"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AIRLOCK_HOME", home.path())
        .env("AIRLOCK_INIT", helper())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("ran"));
    assert!(stderr.contains("65534 (nobody) does not exist"), "{stderr}");
}
