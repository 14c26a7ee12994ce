//! airlock run by an ordinary user, not root: the same sandbox through user
//! namespaces; without a cgroup it may write to, a clear refusal unless the
//! caller lowers the policy; with a delegated cgroup, every limit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_tests::users::{Delegated, NOBODY, nobody_command, parse_record, user_home};
use airlock_tests::{airlock_bin, exclusive, helper};
use serde_json::Value;

/// `airlock run ARGS` as user nobody, using the system's Python (the test
/// account cannot read root's), optionally first entering `cgroups`.
fn as_nobody(home: &Path, cgroups: &[PathBuf], args: &[&str]) -> Command {
    let mut command = nobody_command(home, cgroups);
    command.args(["run", "--json", "--python", "/usr/bin/python3"]).args(args);
    command
}

fn run_as_nobody(home: &Path, cgroups: &[PathBuf], args: &[&str]) -> Output {
    as_nobody(home, cgroups, args).output().unwrap()
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

/// As an ordinary user the sandbox's user is the caller, who owns the
/// driver's folder on the host: only the read-only mount keeps a run from
/// changing what every later run starts from. Every way to change a folder
/// is tried from inside; the host's copy and the next run are checked.
#[test]
fn as_nobody_no_run_can_change_the_driver_every_run_shares() {
    let home = user_home();
    let lowered = ["--allow-degraded", "cgroups", "-c"];
    let output = run_as_nobody(home.path(), &[], &[&lowered[..], &[airlock_tests::CHANGE_THE_DRIVER]].concat());
    let attack = record(&output);
    assert_eq!(attack["status"], "ok", "{attack}");
    assert_eq!(attack["stdout"], "True True True True []\n", "{attack}");
    let folders: Vec<PathBuf> =
        std::fs::read_dir(home.path().join("cache/driver")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    for (name, source) in airlock_core::driver::DRIVER_FILES {
        assert_eq!(std::fs::read_to_string(folders[0].join(name)).unwrap(), source, "{name} changed");
    }
    let output = run_as_nobody(home.path(), &[], &[&lowered[..], &["print('fine')\n6 * 7"]].concat());
    let next = record(&output);
    assert_eq!((&next["stdout"], &next["value"]), (&Value::from("fine\n"), &Value::from("42")), "{next}");
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
fn root_where_its_host_ids_do_not_exist_is_refused_never_run_as_root() {
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
    assert!(stderr.contains("airlock's host ids") && stderr.contains("do not exist"), "{stderr}");
    assert!(stderr.contains("AIRLOCK_HOST_IDS"), "names the fix: {stderr}");
}

/// Subordinate ids for user nobody in /etc/subuid and /etc/subgid, as an
/// administrator would grant them (`usermod --add-subuids`), for as long as
/// this lives; the files are put back as they were.
struct SubordinateIds(Vec<(PathBuf, Option<Vec<u8>>)>);

/// nobody's subordinate ids in these tests: far from airlock's own range.
const SUBORDINATE_FIRST: u32 = 3_000_000;

impl SubordinateIds {
    fn grant() -> SubordinateIds {
        let mut saved = Vec::new();
        for file in ["/etc/subuid", "/etc/subgid"] {
            let path = PathBuf::from(file);
            let before = std::fs::read(&path).ok();
            let mut text = String::from_utf8_lossy(before.as_deref().unwrap_or_default()).into_owned();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("nobody:{SUBORDINATE_FIRST}:65536\n"));
            std::fs::write(&path, text).unwrap();
            saved.push((path, before));
        }
        SubordinateIds(saved)
    }
}

impl Drop for SubordinateIds {
    fn drop(&mut self) {
        for (path, before) in &self.0 {
            match before {
                Some(content) => std::fs::write(path, content).unwrap(),
                None => std::fs::remove_file(path).unwrap(),
            }
        }
    }
}

#[test]
fn with_subordinate_ids_each_sandbox_is_a_user_of_its_own() {
    assert!(
        Path::new("/usr/bin/newuidmap").exists() && Path::new("/usr/bin/newgidmap").exists(),
        "this test needs newuidmap and newgidmap: apt-get install uidmap"
    );
    let _alone = exclusive();
    let _granted = SubordinateIds::grant();
    let home = user_home();
    let input = home.path().join("in.txt");
    std::fs::write(&input, "copied in").unwrap();
    std::os::unix::fs::chown(&input, Some(NOBODY), Some(NOBODY)).unwrap();

    // A run that takes every pipe page its host user may have, and holds them.
    let marker = airlock_tests::marker("subordinate-hog");
    let hog = format!(
        "import fcntl, os, subprocess\nprint(open('/proc/self/uid_map').read().split()[1])\npipes = []\n\
         while True:\n    r, w = os.pipe()\n    pipes.append((r, w))\n    if fcntl.fcntl(w, 1032) < 65536:\n        \
         break\n    try:\n        fcntl.fcntl(w, 1031, 1 << 20)\n    except OSError:\n        pass\n\
         subprocess.run(['{marker}', '60'], executable='/bin/sleep')"
    );
    let holder = as_nobody(home.path(), &[], &["--allow-degraded", "cgroups", "--timeout", "60", "-c", &hog])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let sleeper = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find(|e| {
            // The sleep, whose argv[0] is the marker (not the code that names it).
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.starts_with(marker.as_bytes()))
        });
        if let Some(entry) = found {
            break entry.file_name().to_string_lossy().parse::<i32>().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the hog never took its pipe pages");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };

    // Meanwhile, another sandbox, of a process with another data directory
    // (before, the lock that keeps ids apart was in the data directory when
    // no XDG_RUNTIME_DIR was set, and both took the first id): its own host
    // id, full-sized pipes, and the file copied in is its user's, as the
    // code's own would be.
    let home = user_home();
    let input = home.path().join("in.txt");
    std::fs::write(&input, "copied in").unwrap();
    std::os::unix::fs::chown(&input, Some(NOBODY), Some(NOBODY)).unwrap();
    let code = "import fcntl, os\nprint(open('/proc/self/uid_map').read().split()[1])\nr, w = os.pipe()\n\
                print(fcntl.fcntl(w, 1032))\nst = os.stat('/work/in.txt')\nprint(st.st_uid, st.st_gid)\n\
                open('/work/out.txt', 'w').write('made inside')\nos.chmod('/work/out.txt', 0o600)";
    let output = run_as_nobody(
        home.path(),
        &[],
        &[
            "--allow-degraded",
            "cgroups",
            "--file",
            input.to_str().unwrap(),
            "--out",
            "/work/out.txt:out.txt",
            "-c",
            code,
        ],
    );
    // SAFETY: kill(2) on a pid this test found; it touches no memory.
    unsafe { libc::kill(sleeper, libc::SIGKILL) };
    let held = holder.wait_with_output().unwrap();
    let r = record(&output);
    assert_eq!(r["status"], "ok", "{r}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    let hog_record = record(&held);
    let hog_uid = hog_record["stdout"].as_str().unwrap().lines().next().unwrap_or_default().to_owned();
    let range = SUBORDINATE_FIRST..SUBORDINATE_FIRST + 65536;
    for uid in [lines[0], hog_uid.as_str()] {
        assert!(range.contains(&uid.parse::<u32>().unwrap()), "{uid} is not of nobody's subordinate ids");
    }
    assert_ne!(lines[0], hog_uid, "two live sandboxes share a host id");
    assert_eq!(lines[1], "65536", "the neighbour's pipes shrank: the hog's budget was its");
    assert_eq!(lines[2], "1000 1000", "copied in as the sandbox's user");
    // Copied out through the sandbox's user, though the caller could not read it.
    assert_eq!(std::fs::read_to_string(home.path().join("out.txt")).unwrap(), "made inside");
    let ids = r["isolation"]["details"]["host_ids"].as_str().unwrap();
    assert!(ids.contains("subordinate") && ids.contains(lines[0]), "{ids}");
}

#[test]
fn as_an_ordinary_user_the_filter_and_the_masks_hold_too() {
    let home = user_home();
    let code = r#"
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def read(path):
    try:
        return open(path, "rb").read().decode(errors="replace")
    except OSError as e:
        return type(e).__name__
ctypes.set_errno(0)
print("inotify", libc.inotify_init1(0), errno.errorcode.get(ctypes.get_errno()))
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    print("mptcp created")
except OSError as e:
    print("mptcp", errno.errorcode[e.errno])
print("cmdline", read("/proc/cmdline"))
print("init", read("/proc/1/cmdline"))
print(read("/proc/self/mountinfo"))
"#;
    let output = run_as_nobody(home.path(), &[], &["--allow-degraded", "cgroups", "-c", code]);
    let r = record(&output);
    assert_eq!(r["status"], "ok", "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("inotify -1 ENOSYS"), "{out}");
    assert!(out.contains("mptcp EPROTONOSUPPORT"), "{out}");
    assert!(out.contains("cmdline PermissionError"), "{out}");
    assert!(out.contains("init airlock-init\u{0}"), "{out}");
    for needle in [home.path().display().to_string(), helper().parent().unwrap().display().to_string()] {
        assert!(!out.contains(&needle), "{needle} shows through:\n{out}");
    }
    assert!(out.contains(" /usr ") && out.contains("overlay airlock"), "{out}");
}
