//! The wasm backend's second boundary, attacked: the guest's host runs in a
//! worker process of its own, confined, never in the supervisor; its caps
//! hold at the byte; one guest cannot stop another; a guest that exhausts
//! memory costs the supervisor nothing; the worker dies with its supervisor;
//! and a host without namespaces runs it in a plain worker only when the
//! policy says so.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock::{BackendKind, Layer, Limit, Policy, RunRecord, Status};
use airlock_tests::{airlock_command, exclusive, sandbox_on, shared};
use serde_json::Value;

fn wasm_policy(seconds: u64) -> Policy {
    let mut policy = Policy::default();
    policy.limits.wall_time = Duration::from_secs(seconds);
    policy
}

fn run(policy: Policy, code: &str) -> RunRecord {
    let _guard = shared();
    sandbox_on(BackendKind::Wasm, policy).run(code)
}

/// The processes below `root` that host a guest: workers in a PID namespace
/// of their own (NSpid lists two pids).
fn guest_processes(root: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let nested = status.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() > 2);
        let worker = status.lines().next().is_some_and(|l| l.contains("airlock-wasm-wo"));
        if nested && worker && descends_from(pid, root) {
            found.push(pid);
        }
    }
    found
}

fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        if pid == root {
            return true;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return false };
        match after.split(' ').nth(1).and_then(|p| p.parse().ok()) {
            Some(parent) if parent > 1 => pid = parent,
            _ => return false,
        }
    }
    false
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_default().trim().to_owned()
}

fn wait_for_guest(root: u32) -> u32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = guest_processes(root).first() {
            return *pid;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no worker hosting a guest appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_guest_is_hosted_by_a_confined_worker_not_the_supervisor() {
    // Alone: it inspects the one worker below this process, which another
    // test's worker (with other limits) must not be taken for.
    let _alone = exclusive();
    let me = std::process::id();
    let runner = std::thread::spawn(|| {
        sandbox_on(BackendKind::Wasm, wasm_policy(30)).run("import time\ntime.sleep(3)\nprint('done')")
    });
    let pid = wait_for_guest(me);
    assert_ne!(pid, me);
    // Once the guest runs: a filter, no way to gain privilege, no
    // capability, one thread.
    let started = Instant::now();
    while status_field(pid, "Seccomp:") != "2" {
        assert!(started.elapsed() < Duration::from_secs(30), "the worker never installed its filter");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(pid, "Threads:"), "1");
    // Namespaces of its own, none of the supervisor's.
    for ns in ["user", "mnt", "pid", "net", "ipc", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(theirs, ours, "the worker shares the supervisor's {ns} namespace");
    }
    // Its root is the sandbox's stage: nothing of the host's.
    let mut root: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    root.sort();
    assert_eq!(root, [".airlock", "dev", "interpreter", "tmp", "work"]);
    // In the run's own cgroup, with its own open-file limit.
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups.contains(&format!("airlock-{me}-")), "{cgroups}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!((256..300).contains(&nofile), "the guest's 256 files and the worker's own, got {nofile}");
    let record = runner.join().unwrap();
    assert_eq!((record.status, record.stdout.as_str()), (Status::Ok, "done\n"), "{record:?}");
    assert!(guest_processes(me).is_empty() || !guest_processes(me).contains(&pid), "the worker outlived its run");
}

#[test]
fn a_single_huge_write_stops_at_the_disk_cap() {
    let mut policy = wasm_policy(60);
    policy.limits.disk_bytes = 16 << 20;
    policy.limits.memory_bytes = 1024 << 20;
    // 120 MiB in one write (wasmtime refuses one host call that copies more
    // than 128 MiB): with the cap measured every 100 ms, all of it once
    // reached the host's temporary folder before the run was stopped.
    let record = run(
        policy,
        r#"
import os
data = b"x" * (120 << 20)
try:
    with open("/work/big", "wb") as f:
        f.write(data)
    print("wrote it all")
except OSError as e:
    print("refused", e.errno)
print(os.path.getsize("/work/big"))
"#,
    );
    let lines: Vec<&str> = record.stdout.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("refused")), "{record:?}");
    let size: u64 = lines.get(1).and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
    // The tmpfs holds the cap and the stage's own layout (256 KiB), no more.
    assert!(size <= (16 << 20) + (256 << 10), "{size} bytes reached /work past a 16 MiB cap");
    assert!(record.limits_hit.contains(&Limit::Disk), "{:?}", record.limits_hit);
}

#[test]
fn many_concurrent_runs_near_their_open_file_caps_do_not_stop_each_other() {
    let _guard = shared();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(|| {
                let mut policy = wasm_policy(60);
                policy.limits.open_files = 64;
                sandbox_on(BackendKind::Wasm, policy).run(
                    "import os, time\nos.makedirs('/work/d')\nheld = [open(f'/work/d/{i}', 'w') for i in range(48)]\n\
                     time.sleep(1.5)\nprint(len(held))",
                )
            })
        })
        .collect();
    for handle in runs {
        let record = handle.join().unwrap();
        assert_eq!((record.status, record.stdout.trim()), (Status::Ok, "48"), "{record:?}");
        assert!(!record.limits_hit.contains(&Limit::OpenFiles), "one run's files stopped another: {record:?}");
    }
}

/// This process's peak resident memory, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

#[test]
fn a_guest_that_exhausts_memory_is_a_memory_limit_and_the_supervisor_does_not_grow() {
    // Alone, so that no other run of this binary moves the peak.
    let _alone = exclusive();
    let before = peak_rss();
    let mut policy = wasm_policy(60);
    policy.limits.memory_bytes = 1024 << 20;
    let record =
        sandbox_on(BackendKind::Wasm, policy).run("chunks = []\nwhile True:\n    chunks.append(b'x' * (32 << 20))");
    assert_eq!(record.status, Status::MemoryLimit, "{record:?}");
    assert!(record.limits_hit.contains(&Limit::Memory));
    let grown = peak_rss().saturating_sub(before);
    assert!(grown < 256 << 20, "the supervisor grew by {} MiB for a guest's 1 GiB", grown >> 20);
    // And it goes on serving.
    let record = sandbox_on(BackendKind::Wasm, wasm_policy(30)).run("print(6 * 7)");
    assert_eq!(record.stdout, "42\n", "{record:?}");
}

#[test]
fn a_worker_dies_with_its_supervisor() {
    let _alone = exclusive();
    let mut child = airlock_command()
        .args(["run", "--backend", "wasm", "-c", "import time\ntime.sleep(1000)"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let supervisor = child.id();
    let guest = wait_for_guest(supervisor);
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = Instant::now();
    while Path::new(&format!("/proc/{guest}")).exists() {
        assert!(gone.elapsed() < Duration::from_secs(5), "the guest's worker outlived its supervisor");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The dead supervisor's cgroup is removed by the next start.
    let next = airlock_command().args(["run", "--backend", "wasm", "-c", "print(1)"]).output().unwrap();
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    let stale = airlock_tests::leftovers_of(supervisor, "");
    assert!(stale.is_empty(), "{stale:?}");
}

/// `airlock run --backend wasm --json ARGS` where no user namespace can be
/// made: inside one whose own limit of nested namespaces is 0 (and where
/// root cannot take airlock's reserved ids either).
fn run_without_user_namespaces(args: &[&str]) -> (Option<i32>, String, Option<Value>) {
    let inner = airlock_command();
    let envs: BTreeMap<String, String> = inner
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned())))
        .collect();
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"")
        .arg("sh")
        .arg(airlock_tests::airlock_bin())
        .args(["run", "--backend", "wasm", "--json"])
        .args(args)
        .envs(envs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stderr, serde_json::from_slice(&output.stdout).ok())
}

#[test]
fn without_namespaces_a_plain_worker_runs_only_when_the_policy_accepts_it() {
    let _guard = shared();
    let (code, stderr, _) = run_without_user_namespaces(&["-c", "print('ran')"]);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("user_namespace is required"), "{stderr}");
    assert!(stderr.contains("--allow-degraded user_namespace"), "names the explicit way out: {stderr}");

    let code = "import os\nprint(sorted(os.listdir('/')))\ntry:\n    open('/work/big', 'wb').write(b'x' * (8 << 20))\nexcept OSError as e:\n    print('refused', e.errno)\nprint(os.path.getsize('/work/big'))";
    let (status, stderr, record) =
        run_without_user_namespaces(&["--allow-degraded", "user_namespace", "--disk", "4", "-c", code]);
    let record = record.unwrap_or_else(|| panic!("no record: {stderr}"));
    assert_eq!(status, Some(0), "{record:#}");
    let lines: Vec<&str> = record["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines[0], "['.airlock', 'tmp', 'work']");
    // RLIMIT_FSIZE holds one file to the cap even where no tmpfs can.
    assert!(lines[1].starts_with("refused"), "{lines:?}");
    assert!(lines[2].parse::<u64>().unwrap() <= 4 << 20, "{lines:?}");
    let isolation = &record["isolation"];
    let layers: Vec<&str> = isolation["layers"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(layers.contains(&"wasm") && layers.contains(&"seccomp") && layers.contains(&"rlimits"), "{layers:?}");
    for absent in [Layer::UserNamespace, Layer::PidNamespace, Layer::MountNamespace, Layer::NetworkNamespace] {
        assert!(!layers.contains(&absent.name()), "{absent} cannot have been in force: {layers:?}");
    }
    assert_eq!(isolation["degraded"], serde_json::json!(["user_namespace"]));
    assert!(isolation["details"]["worker"].as_str().unwrap().contains("plain process"), "{isolation:#}");
    assert!(isolation["details"]["disk"].as_str().unwrap().contains("measured"), "{isolation:#}");
}
