//! The security suite on both backends, the way gVisor runs its system-call
//! tests natively and under runsc: every case must be safe on each backend,
//! and a case that cannot apply (a fork bomb where there are no processes)
//! must show a clear refusal.

use std::time::Duration;

use std::sync::Arc;

use airlock::audit::{AuditStore, ListFilter};
use airlock::{Audit, BackendKind, Limit, Output, Policy, RunError, RunRecord, RunRequest, SandboxPath, Status};
use airlock_tests::sandbox_on;

airlock_tests::on_both_backends!(
    host_files_stay_out_of_reach,
    writes_never_reach_the_host,
    the_environment_holds_only_what_was_given,
    no_connection_leaves,
    a_fork_bomb_is_contained_or_refused,
    a_memory_bomb_is_a_memory_limit,
    an_endless_loop_and_a_long_sleep_end_at_the_deadline,
    filling_the_disk_and_the_inodes_is_stopped,
    a_flood_of_output_is_cut,
    copy_out_never_follows_a_planted_link,
    copy_in_stays_under_work,
    the_open_file_limit_holds_and_is_reported,
    cpu_time_is_limited_and_measured,
    the_kill_switch_stops_a_run_at_once,
    an_audited_run_is_in_the_store_and_one_the_store_refuses_fails,
    nothing_of_a_run_outlives_it,
);

fn run(backend: BackendKind, policy: Policy, code: &str) -> RunRecord {
    let _guard = airlock_tests::shared();
    sandbox_on(backend, policy).run(code)
}

fn quick(seconds: u64) -> Policy {
    let mut policy = Policy::default();
    policy.limits.wall_time = Duration::from_secs(seconds);
    policy
}

fn host_files_stay_out_of_reach(backend: BackendKind) {
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let record = run(
        backend,
        Policy::default(),
        r#"
import os
seen = []
for path in ["/etc/passwd", "/etc/shadow", "/root/.bashrc", "/proc/1/environ", "/proc/self/root/etc/passwd", "../../../../etc/passwd"]:
    try:
        with open(path) as f:
            seen.append(f.read())
    except OSError:
        pass
print("\n".join(seen))
"#,
    );
    assert_eq!(record.status, Status::Ok, "{record:?}");
    let first_host_line = host_passwd.lines().next().unwrap();
    assert!(!record.stdout.contains(first_host_line), "the host's /etc/passwd leaked: {}", record.stdout);
}

fn writes_never_reach_the_host(backend: BackendKind) {
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("planted");
    let code = format!(
        "hits = []\nfor p in ['{}', '/etc/planted', '/usr/planted', '/planted']:\n    try:\n        open(p, 'w').write('x')\n        hits.append(p)\n    except OSError:\n        pass\nprint(hits)",
        target.display()
    );
    let record = run(backend, Policy::default(), &code);
    assert!(!target.exists(), "a file appeared on the host: {record:?}");
    assert!(!std::path::Path::new("/etc/planted").exists() && !std::path::Path::new("/planted").exists());
}

fn the_environment_holds_only_what_was_given(backend: BackendKind) {
    let mut policy = Policy::default();
    policy.env.insert("GIVEN".into(), "yes".into());
    let record = run(backend, policy, "import os\nprint(sorted(os.environ))");
    let out = record.stdout.trim();
    assert!(out.contains("'GIVEN'"), "{out}");
    for leaked in ["CARGO", "RUST", "SSH", "USER'", "PWD'", "OLDPWD"] {
        assert!(!out.contains(leaked), "{leaked} crossed in: {out}");
    }
}

fn no_connection_leaves(backend: BackendKind) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    s = socket.socket()\n    s.settimeout(2)\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\nexcept Exception as e:\n    print('refused', type(e).__name__)"
    );
    let record = run(backend, Policy::default(), &code);
    assert!(record.stdout.starts_with("refused"), "{record:?}");
    assert!(listener.accept().is_err(), "a connection reached the host");
    // And a policy that allows hosts is refused on a backend without a way out.
    if backend == BackendKind::Wasm {
        let mut policy = Policy::default();
        policy.network.allow = vec![airlock::HostRule::parse("example.com").unwrap()];
        policy.backend = backend;
        let err =
            airlock::Sandbox::with_backend(airlock_tests::wasm(), policy, airlock::Runtime::default()).unwrap_err();
        assert!(err.to_string().contains("network"), "{err}");
    }
}

fn a_fork_bomb_is_contained_or_refused(backend: BackendKind) {
    let record = run(backend, quick(3), "import os\nwhile True:\n    os.fork()");
    match backend {
        BackendKind::Linux => assert!(record.limits_hit.contains(&Limit::Pids), "{record:?}"),
        BackendKind::Wasm => {
            let error = record.error.expect("a clear refusal");
            assert!(error.message.contains("fork"), "{error:?}");
            assert_eq!(record.status, Status::Failed);
        }
    }
    // Threads and subprocesses: contained on Linux, refused with a Python error on wasm.
    let record = run(backend, quick(5), "import subprocess\nprint(subprocess.run(['true']).returncode)");
    match backend {
        BackendKind::Linux => assert_eq!(record.stdout.trim(), "0"),
        BackendKind::Wasm => assert!(record.error.is_some(), "{record:?}"),
    }
}

fn a_memory_bomb_is_a_memory_limit(backend: BackendKind) {
    let mut policy = quick(20);
    policy.limits.memory_bytes = 128 << 20;
    let record = run(backend, policy, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))");
    assert_eq!(record.status, Status::MemoryLimit, "{record:?}");
    assert!(record.limits_hit.contains(&Limit::Memory));
}

fn an_endless_loop_and_a_long_sleep_end_at_the_deadline(backend: BackendKind) {
    for code in ["while True:\n    pass", "import time\ntime.sleep(10**6)"] {
        let started = std::time::Instant::now();
        let record = run(backend, quick(2), code);
        assert_eq!(record.status, Status::Timeout, "{code}: {record:?}");
        assert!(started.elapsed() < Duration::from_secs(6), "{code}: took {:?}", started.elapsed());
    }
}

fn filling_the_disk_and_the_inodes_is_stopped(backend: BackendKind) {
    let mut policy = quick(10);
    policy.limits.disk_bytes = 4 << 20;
    let record = run(
        backend,
        policy,
        "try:\n    f = open('/work/big', 'wb')\n    while True:\n        f.write(b'x' * 65536)\n        f.flush()\nexcept OSError as e:\n    print('stopped')",
    );
    assert!(record.limits_hit.contains(&Limit::Disk), "{record:?}");
    let mut policy = quick(10);
    policy.limits.disk_inodes = 100;
    let record = run(
        backend,
        policy,
        "try:\n    for i in range(100000):\n        open(f'/work/f{i}', 'w').close()\nexcept OSError as e:\n    print('stopped')",
    );
    assert!(record.limits_hit.contains(&Limit::Inodes), "{record:?}");
}

fn a_flood_of_output_is_cut(backend: BackendKind) {
    let mut policy = quick(10);
    policy.limits.output_bytes = 10_000;
    let record = run(
        backend,
        policy,
        "import sys\nfor i in range(100000):\n    print('x' * 100)\n    print('y' * 100, file=sys.stderr)",
    );
    assert!(record.stdout_truncated && record.stderr_truncated, "{:?}", record.status);
    assert!(record.stdout.len() <= 10_000 && record.stderr.len() <= 10_000);
    assert!(record.limits_hit.contains(&Limit::Output));
}

fn copy_out_never_follows_a_planted_link(backend: BackendKind) {
    let _guard = airlock_tests::shared();
    let mut sb = sandbox_on(backend, Policy::default());
    let out = |p: &str| Output { path: SandboxPath::parse(p).unwrap(), save_to: None, inline: true };
    let record = sb.run_request(&RunRequest {
        outputs: vec![out("rel"), out("abs"), out("dir")],
        ..RunRequest::python(
            "import os\nos.symlink('../../../../../etc/passwd', '/work/rel')\ntry:\n    os.symlink('/etc/passwd', '/work/abs')\nexcept OSError:\n    pass\nos.mkdir('/work/dir')",
        )
    });
    for artifact in &record.artifacts {
        assert!(artifact.error.is_some() && artifact.content_base64.is_none(), "{artifact:?}");
    }
    assert!(sb.read("/work/rel").is_err());
}

fn copy_in_stays_under_work(backend: BackendKind) {
    let _guard = airlock_tests::shared();
    let mut sb = sandbox_on(backend, Policy::default());
    for bad in ["../x", "/etc/x", "/work/../x", ""] {
        assert!(sb.write(bad, b"x").is_err(), "{bad:?}");
    }
    sb.write("/work/in/data.txt", b"fine").unwrap();
    let record = sb.run("print(open('/work/in/data.txt').read())");
    assert_eq!(record.stdout.trim(), "fine", "{record:?}");
}

fn the_open_file_limit_holds_and_is_reported(backend: BackendKind) {
    let mut policy = quick(20);
    policy.limits.open_files = 64;
    // Opened until the kernel refuses (EMFILE; the wasm guest sees EIO,
    // wasmtime's word for it), held a moment (the Linux backend samples
    // every 10 ms), then let go.
    let record = run(
        backend,
        policy,
        "import time\nheld = []\ntry:\n    while True:\n        held.append(open('/dev/null'))\nexcept OSError as e:\n    n = len(held)\ntime.sleep(0.3)\nheld.clear()\nprint(n < 64, n > 40)",
    );
    assert_eq!(record.stdout.trim(), "True True", "{record:?}");
    assert!(record.limits_hit.contains(&Limit::OpenFiles), "{:?}", record.limits_hit);
}

fn cpu_time_is_limited_and_measured(backend: BackendKind) {
    let mut policy = quick(20);
    policy.limits.cpu_time = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let record = run(backend, policy, "while True:\n    pass");
    assert_eq!(record.status, Status::CpuLimit, "{record:?}");
    assert!(record.limits_hit.contains(&Limit::CpuTime));
    assert!(record.usage.cpu_ms.is_some_and(|ms| ms >= 1000), "{:?}", record.usage);
    assert!(started.elapsed() < Duration::from_secs(10), "stopped near the CPU limit, not the wall limit");
    // Sleeping is not CPU.
    let record = run(backend, quick(20), "import time\ntime.sleep(1.2)\nprint('slept')");
    assert_eq!((record.status, record.stdout.trim()), (Status::Ok, "slept"), "{record:?}");
    assert!(record.usage.cpu_ms.is_some_and(|ms| ms < 1000), "{:?}", record.usage);
}

fn the_kill_switch_stops_a_run_at_once(backend: BackendKind) {
    let _guard = airlock_tests::shared();
    let mut sb = sandbox_on(backend, quick(30));
    let kill = sb.kill_switch();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        kill.kill();
    });
    let started = std::time::Instant::now();
    let record = sb.run("while True:\n    pass");
    killer.join().unwrap();
    assert_eq!(record.status, Status::InternalError, "{record:?}");
    assert!(record.message.unwrap_or_default().contains("stopped on request"));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

fn an_audited_run_is_in_the_store_and_one_the_store_refuses_fails(backend: BackendKind) {
    let _guard = airlock_tests::shared();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(AuditStore::open(&dir.path().join("audit.sqlite3")).unwrap());
    let mut sb = sandbox_on(backend, quick(20));
    sb.set_audit(Some(Audit { store: store.clone(), principal: Some("both".into()) }));
    let record = sb.run("print('recorded')");
    assert_eq!(record.status, Status::Ok, "{record:?}");
    let stored = store.get(&record.id).unwrap().expect("the run is in the store");
    assert_eq!((stored.record.stdout.as_str(), stored.entry.principal.as_deref()), ("recorded\n", Some("both")));
    assert_eq!(stored.record.isolation.backend, backend.to_string());
    // A store that cannot take the run fails it, and the record is kept whole.
    sb.set_audit(Some(Audit { store: store.clone(), principal: Some("bad\nname".into()) }));
    match sb.run_checked(&RunRequest::python("print('not recorded')")).map_err(|e| *e) {
        Err(RunError::Unrecorded { record, .. }) => assert_eq!(record.stdout, "not recorded\n"),
        other => panic!("a run the store refused was handed out: {other:?}"),
    }
    assert_eq!(store.list(&ListFilter::default()).unwrap().runs.len(), 1);
    assert!(store.verify().unwrap().is_intact());
}

fn nothing_of_a_run_outlives_it(backend: BackendKind) {
    let _alone = airlock_tests::exclusive();
    let temp_before = airlock_temp_dirs();
    {
        let mut sb = sandbox_on(backend, quick(2));
        sb.write("/work/in.txt", b"x").unwrap();
        assert_eq!(sb.run("print(open('/work/in.txt').read())").stdout.trim(), "x");
        assert_eq!(sb.run("while True:\n    pass").status, Status::Timeout);
        assert_eq!(sb.run("import time\ntime.sleep(100)").status, Status::Timeout);
    }
    // No cgroup, no mount, no process of the runs is left, and nothing of
    // the sandbox was ever on the host's disk.
    airlock_tests::assert_nothing_left("");
    assert_eq!(airlock_temp_dirs(), temp_before, "the sandbox left folders in the host's temporary directory");
}

/// What airlock made in the host's temporary directory.
fn airlock_temp_dirs() -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("airlock-wasm"))
        .collect();
    found.sort();
    found
}
