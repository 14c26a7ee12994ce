//! The security suite, part two: runs that cannot harm or watch each other or
//! the host without escaping. Each sandbox is a host user of its own (so no
//! per-user kernel budget is shared), everything a run makes the kernel
//! hold is bounded by the run, nothing of the host shows through /proc or
//! the mount table, and the filter is an allowlist down to ioctl requests
//! and socket protocols.
//!
//! As root. The same attacks as an ordinary user are in users.rs.

use std::time::{Duration, Instant};

use airlock::{Limit, Policy, Status};
use airlock_tests::{marker, python, quick_policy, sandbox};

fn ok_stdout(record: &airlock::RunRecord) -> &str {
    assert_eq!(record.status, Status::Ok, "stderr: {}\nmessage: {:?}", record.stderr, record.message);
    record.stdout.trim()
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// The uid the sandbox's user 1000 is on the host, as the code reads it.
const HOST_UID: &str = "print(open('/proc/self/uid_map').read().split()[1])";

#[test]
fn each_live_sandbox_is_a_host_user_of_its_own_and_never_an_account() {
    let mut first = sandbox(Policy::default());
    let mut second = sandbox(Policy::default());
    let a = ok_stdout(&first.run(HOST_UID)).to_owned();
    let b = ok_stdout(&second.run(HOST_UID)).to_owned();
    let detail = first.run(HOST_UID).isolation.details.get("host_ids").cloned().unwrap_or_default();
    if !is_root() {
        // An ordinary user without subordinate ids maps itself, and says what that shares.
        assert_eq!(a, b);
        assert!(detail.contains("share"), "{detail}");
        return;
    }
    assert_ne!(a, b, "two live sandboxes share host uid {a}");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for uid in [&a, &b] {
        assert_ne!(uid.as_str(), "65534", "nobody's uid, which host services share");
        assert_ne!(uid.as_str(), "0");
        assert!(!passwd.lines().any(|l| l.split(':').nth(2) == Some(uid.as_str())), "{uid} is an account");
    }
    assert!(detail.contains(&a) && detail.contains("reserved range"), "{detail}");
    // A dropped sandbox gives its id back; the live one keeps its own.
    drop(first);
    let again: Vec<String> = (0..3).map(|_| ok_stdout(&sandbox(Policy::default()).run(HOST_UID)).to_owned()).collect();
    assert!(again.iter().all(|uid| *uid != b), "{again:?} reuses the live sandbox's {b}");
    assert_eq!(ok_stdout(&second.run(HOST_UID)), b);
}

/// Starts a run of `hog` that takes a per-user budget and then holds it
/// (it signals the host by starting `sleep` with `marker` in its command
/// line, and keeps the budget until that sleep is killed), runs `probe`
/// in a second sandbox meanwhile, and returns the probe's record and what
/// the hog printed.
fn while_a_neighbour_holds(name: &str, hog: &str, probe: &str) -> (airlock::RunRecord, airlock::RunRecord) {
    while_a_neighbour_holds_then(name, hog, || sandbox(Policy::default()).run(probe))
}

/// As [`while_a_neighbour_holds`], with `meanwhile` for the probe.
fn while_a_neighbour_holds_then<T>(name: &str, hog: &str, meanwhile: impl FnOnce() -> T) -> (T, airlock::RunRecord) {
    let marker = marker(&format!("hog-{name}"));
    let hog = format!(
        "{hog}\nimport subprocess\nsubprocess.run(['{marker}', '60'], executable='/bin/sleep')\nprint('held')",
    );
    let holder = std::thread::spawn(move || sandbox(quick_policy(60)).run(&hog));
    // Until the hog holds its budget: its sleep is running.
    let deadline = Instant::now() + Duration::from_secs(40);
    let sleeper = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find(|e| {
            // The sleep, whose argv[0] is the marker (not the code that names it).
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.starts_with(marker.as_bytes()))
        });
        if let Some(entry) = found {
            break entry.file_name().to_string_lossy().parse::<i32>().unwrap();
        }
        assert!(Instant::now() < deadline, "the hog never took its budget");
        std::thread::sleep(Duration::from_millis(50));
    };
    let probed = meanwhile();
    // SAFETY: kill(2) on a pid this test found; it touches no memory.
    unsafe { libc::kill(sleeper, libc::SIGKILL) };
    (probed, holder.join().unwrap())
}

#[test]
fn a_run_that_takes_every_pending_signal_leaves_its_neighbour_and_the_host_theirs() {
    if !is_root() {
        return; // an ordinary user's runs share its signal budget, as the record says
    }
    // Real-time signals queue one entry each against the user's
    // RLIMIT_SIGPENDING budget, which the kernel keeps per host user.
    let hog = r#"
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
queued = 0
while libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0:
    queued += 1
print("queued", queued, "then errno", ctypes.get_errno())
"#;
    let probe = r#"
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
print("sent" if libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0 else f"errno {ctypes.get_errno()}")
"#;
    let (probed, hog) = while_a_neighbour_holds("signals", hog, probe);
    assert_eq!(ok_stdout(&probed), "sent", "the neighbour could not queue one signal");
    // Nor could this test process, root on the host, before: the budget was
    // root's, the namespaces' creator's.
    assert!(hog.stdout.contains("queued"), "{}\n{}", hog.stdout, hog.stderr);
}

/// A run's five devices are nodes of its own, as root: a lock it takes on
/// one (`flock`, the lock /proc/locks would have shown, and that survives
/// the masking) is on an inode that neither the host nor another sandbox
/// holds, so it is no channel between runs of the same time and stalls no
/// host program that locks /dev/null. (Before, they were the host's nodes,
/// bound in, and both the host's flock and the neighbour's were refused.)
#[test]
fn a_lock_a_run_takes_on_its_devices_is_neither_the_hosts_nor_its_neighbours() {
    if !is_root() {
        return; // an ordinary user cannot make device nodes: its runs bind the host's, as README says
    }
    let devices = ["null", "zero", "full", "random", "urandom"];
    let hog = format!(
        "import fcntl\nheld = [open('/dev/' + name) for name in {devices:?}]\n\
         for f in held:\n    fcntl.flock(f, fcntl.LOCK_EX)\nprint('locked')"
    );
    let probe = format!(
        "import fcntl\nfor name in {devices:?}:\n    with open('/dev/' + name) as f:\n\
         \x20       try:\n            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n            print(name, 'free')\n\
         \x20       except OSError as e:\n            print(name, 'held', e.errno)"
    );
    let ((neighbour, host), hog) = while_a_neighbour_holds_then("device-locks", &hog, || {
        let neighbour = sandbox(Policy::default()).run(&probe);
        let host: Vec<String> = devices
            .iter()
            .map(|name| {
                use std::os::fd::AsRawFd;
                let file = std::fs::File::open(format!("/dev/{name}")).unwrap();
                // SAFETY: flock(2) on a descriptor this test holds open; it touches no memory.
                let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
                format!("{name} {}", if locked { "free" } else { "held" })
            })
            .collect();
        (neighbour, host)
    });
    assert!(hog.stdout.contains("locked"), "{}\n{}", hog.stdout, hog.stderr);
    let free: Vec<String> = devices.iter().map(|name| format!("{name} free")).collect();
    assert_eq!(ok_stdout(&neighbour).lines().collect::<Vec<_>>(), free, "the neighbour found a lock of the hog's");
    assert_eq!(host, free, "the host found a lock of the hog's");
}

#[test]
fn a_run_that_takes_every_pipe_page_leaves_its_neighbour_full_pipes() {
    // fs.pipe-user-pages-soft: past it, every new pipe of that host user
    // gets two pages instead of sixteen, and cannot grow.
    let hog = r#"
import fcntl, os
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
# Grow pipes to 1 MiB until the budget refuses, then make default ones until
# a new pipe comes out shrunk: the budget is spent.
pipes = []
while True:
    r, w = os.pipe()
    pipes.append((r, w))
    if fcntl.fcntl(w, F_GETPIPE_SZ) < 65536:
        break
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass
print("pipes", len(pipes))
"#;
    let probe = "import fcntl, os\nr, w = os.pipe()\nprint(fcntl.fcntl(w, 1032))";
    if !is_root() {
        return; // an ordinary user without subordinate ids shares its pipe budget, as the record says
    }
    let (probed, hog) = while_a_neighbour_holds("pipes", hog, probe);
    assert_eq!(ok_stdout(&probed), "65536", "the neighbour's pipes shrank to one page: {}", hog.stdout);
}

#[test]
fn kernel_interfaces_that_draw_on_host_wide_pools_or_watch_shared_files_are_refused() {
    let aio_before = std::fs::read_to_string("/proc/sys/fs/aio-nr").unwrap();
    let record = python(
        Policy::default(),
        r#"
import ctypes, errno, fcntl, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": {"io_setup": 206, "fanotify_init": 300}, "aarch64": {"io_setup": 0, "fanotify_init": 262}}[platform.machine()]
def result(r):
    return errno.errorcode.get(ctypes.get_errno(), "OK") if r == -1 else "OK"
def call(nr, *args):
    ctypes.set_errno(0)
    return result(libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]))
def libc_call(name, *args):
    ctypes.set_errno(0)
    return result(getattr(libc, name)(*args))
ctx = ctypes.c_ulong(0)
out = {
    # Every AIO context comes from the host's one fs.aio-max-nr.
    "io_setup": call(NR["io_setup"], 65536, ctypes.addressof(ctx)),
    # Watching what the sandbox shares with the host and other runs.
    "inotify_init1": libc_call("inotify_init1", 0),
    "fanotify_init": call(NR["fanotify_init"], 0, 0),
    # POSIX message queues: a per-user byte budget.
    "mq_open": libc_call("mq_open", b"/q", os.O_CREAT | os.O_RDWR, 0o600, None),
}
# sync would flush the host's disks; it does nothing, successfully.
os.sync()
out["sync"] = "OK"
d = os.open("/usr", os.O_RDONLY)
try:
    fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
    out["dnotify"] = "OK"
except OSError as e:
    out["dnotify"] = errno.errorcode[e.errno]
f = os.open("/tmp/mine", os.O_CREAT | os.O_RDWR)
try:
    fcntl.fcntl(f, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    out["lease"] = "OK"
except OSError as e:
    out["lease"] = errno.errorcode[e.errno]
print(sorted(out.items()))
"#,
    );
    let out = ok_stdout(&record);
    assert_eq!(
        out,
        "[('dnotify', 'EPERM'), ('fanotify_init', 'EPERM'), ('inotify_init1', 'ENOSYS'), ('io_setup', 'ENOSYS'), \
         ('lease', 'EPERM'), ('mq_open', 'ENOSYS'), ('sync', 'OK')]"
    );
    assert_eq!(std::fs::read_to_string("/proc/sys/fs/aio-nr").unwrap(), aio_before);
}

#[test]
fn socket_buffers_count_against_the_memory_cap() {
    let hierarchy = airlock_linux::Hierarchy::detect(None).unwrap();
    if hierarchy.version() != "v1" {
        // cgroup v2 counts socket buffers in memory.current with the rest.
        eprintln!("socket_buffers_count_against_the_memory_cap: this host has cgroup v2; the v1 check does not apply");
        return;
    }
    let mut policy = quick_policy(30);
    policy.limits.memory_bytes = 64 << 20;
    // Loopback TCP connections inside the run, written to and never read:
    // hundreds of MiB of socket buffers, none of it the process's own memory.
    let record = python(
        policy,
        r#"
import socket, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(512)
peers, queued = [], 0
for _ in range(100):
    c = socket.create_connection(server.getsockname())
    s, _ = server.accept()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    c.setblocking(False)
    peers += [c, s]
    chunk = b"x" * (1 << 20)
    try:
        while True:
            queued += c.send(chunk)
    except BlockingIOError:
        pass
print("queued", queued >> 20, "MiB")
time.sleep(2)
"#,
    );
    assert_eq!(record.status, Status::MemoryLimit, "{}\n{}\n{:?}", record.stdout, record.stderr, record.message);
    assert!(record.limits_hit.contains(&Limit::Memory));
    assert!(record.message.as_deref().unwrap_or_default().contains("socket buffers"), "{:?}", record.message);
}

#[test]
fn nothing_of_the_host_shows_through_proc_or_the_mount_table() {
    let record = python(
        Policy::default(),
        r#"
import os, sys
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError as e:
        return f"<{type(e).__name__}>"
print(repr(read("/proc/cmdline")))
print(repr(read("/proc/sys/kernel/random/boot_id")))
print(repr(read("/proc/1/cmdline")))
print(repr(read("/proc/1/environ")))
print(repr(read("/proc/locks")))
print(sys.executable, sys.prefix, sys.base_prefix)
print("MOUNTS")
print(read("/proc/self/mountinfo"))
print(read("/proc/self/mounts"))
print(read("/proc/self/maps"))
"#,
    );
    let out = ok_stdout(&record);
    let lines: Vec<&str> = out.lines().collect();
    // Masked: unreadable, as the other masked entries of /proc are.
    assert_eq!(lines[0], "'<PermissionError>'", "the host's kernel command line");
    assert_eq!(lines[1], "'<PermissionError>'", "the host's boot id");
    // The init is a fork of its helper, named airlock-init; a helper started
    // ahead of its run says so in an argument. No path either way.
    assert!(
        ["'airlock-init\\x00'", "'airlock-init\\x00run-spare\\x00'"].contains(&lines[2]),
        "the helper's path on the host: {}",
        lines[2]
    );
    assert_eq!(lines[3], "'<PermissionError>'", "the init's environment");
    assert_eq!(lines[4], "'<PermissionError>'", "locks taken anywhere on the host");
    // The interpreter's sandbox path: its installation's, or its venv's when
    // `python3` is a venv's (as under scripts/test).
    assert!(
        lines[5].starts_with("/opt/airlock/python/bin/python") || lines[5].starts_with("/opt/airlock/venv/bin/python"),
        "{}",
        lines[5]
    );
    // No host path, device or account: the data directory, the interpreter's
    // prefix, the build tree the helper lives in, the root's block device.
    let host_python = airlock::interpreter::Interpreter::resolve("python3").unwrap();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    let root_device = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|rest| rest.split(' ').nth(1))
        .unwrap()
        .to_owned();
    let helper = airlock_tests::helper();
    let forbidden = [
        host_python.base_prefix.display().to_string(),
        host_python.prefix.display().to_string(),
        airlock_tests::test_home().display().to_string(),
        helper.parent().unwrap().display().to_string(),
        root_device,
    ];
    for needle in forbidden.iter().filter(|n| !n.starts_with("/usr")) {
        assert!(!out.contains(needle.as_str()), "{needle} shows through:\n{out}");
    }
    assert!(!cmdline.trim().is_empty() && !out.contains(cmdline.trim()), "the host's command line shows");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert!(!out.contains(boot_id.trim()));
    assert!(!record.isolation.details.contains_key("mount_table"), "{:?}", record.isolation.details);
}

#[test]
fn the_image_shows_only_sandbox_paths_too() {
    let image = airlock_tests::data_image();
    let mut sb = airlock::Sandbox::with_backend(airlock_tests::linux(), Policy::default(), image).unwrap();
    let record = sb.run(
        "import sys, numpy, pandas\nprint(sys.executable, numpy.__file__)\nprint(open('/proc/self/mountinfo').read())",
    );
    let out = ok_stdout(&record);
    assert!(out.starts_with("/opt/airlock/image/bin/python /opt/airlock/image/lib/"), "{out}");
    let home = airlock_tests::test_home().display().to_string();
    assert!(!out.contains(&home), "the data directory shows:\n{out}");
}

#[test]
fn the_filter_is_an_allowlist_down_to_ioctl_requests_and_socket_protocols() {
    let code = r#"
import fcntl, os, platform, socket
out = {}
f = os.open("/tmp/file", os.O_CREAT | os.O_RDWR)
buf = ctypes.create_string_buffer(64)
# Requests nobody in the stack uses, on descriptors whose drivers would answer.
ioctl = libc.ioctl
ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
def request(fd, nr):
    ctypes.set_errno(0)
    return "OK" if ioctl(fd, nr, ctypes.addressof(buf)) == 0 else errno.errorcode[ctypes.get_errno()]
out["FS_IOC_GETFLAGS"] = request(f, 0x80086601)
out["FS_IOC_FSGETXATTR"] = request(f, 0x801c581f)
r, w = os.pipe()
out["FIONREAD"] = request(r, 0x541B)
out["TIOCGWINSZ"] = request(w, 0x5413)
s = socket.socket()
s.setblocking(False)
out["FIONBIO"] = "OK" if not s.getblocking() else "no"
os.set_inheritable(f, True)
out["FIONCLEX"] = "OK" if os.get_inheritable(f) else "no"
def sock(*args):
    try:
        socket.socket(*args).close()
        return "OK"
    except OSError as e:
        return errno.errorcode[e.errno]
out["mptcp"] = sock(socket.AF_INET, socket.SOCK_STREAM, 262)
out["udplite"] = sock(socket.AF_INET6, socket.SOCK_DGRAM, 136)
out["sctp"] = sock(socket.AF_INET, socket.SOCK_SEQPACKET, 132)
out["tcp"] = sock(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC, 0)
out["udp"] = sock(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
out["unix"] = sock(socket.AF_UNIX, socket.SOCK_SEQPACKET)
# A number no kernel has yet: ENOSYS, as on an older kernel, never EPERM.
out["nr_1000"] = call(1000)
out["nr_470"] = call(470)
# Calls that would act on the sandbox's init (pid 1), and the same on itself.
import resource
def attempt(name, f):
    try:
        f()
        out[name] = "OK"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("prlimit_init", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (16, 16)))
attempt("prlimit_self", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE))
attempt("setpriority_init", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("setpriority_user", lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt("nice_self", lambda: os.nice(1))
attempt("affinity_init", lambda: os.sched_setaffinity(1, {0}))
attempt("affinity_self", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
attempt("sched_idle_init", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)))
ioprio_set = {"x86_64": 251, "aarch64": 30}[platform.machine()]
out["ioprio_init"] = call(ioprio_set, 1, 1, 0x6000)
print(sorted(out.items()))
"#;
    let record = python(Policy::default(), &format!("{}{code}", airlock_tests::PY_SYSCALL));
    let out = ok_stdout(&record);
    for (name, want) in [
        ("FS_IOC_GETFLAGS", "ENOTTY"),
        ("FS_IOC_FSGETXATTR", "ENOTTY"),
        ("FIONREAD", "OK"),
        ("TIOCGWINSZ", "ENOTTY"),
        ("FIONBIO", "OK"),
        ("FIONCLEX", "OK"),
        ("mptcp", "EPROTONOSUPPORT"),
        ("udplite", "EPROTONOSUPPORT"),
        ("sctp", "EPROTONOSUPPORT"),
        ("tcp", "OK"),
        ("udp", "OK"),
        ("unix", "OK"),
        ("nr_1000", "ENOSYS"),
        ("nr_470", "ENOSYS"),
        ("prlimit_init", "EPERM"),
        ("prlimit_self", "OK"),
        ("setpriority_init", "EPERM"),
        ("setpriority_user", "EPERM"),
        ("nice_self", "OK"),
        ("affinity_init", "EPERM"),
        ("affinity_self", "OK"),
        ("sched_idle_init", "EPERM"),
        ("ioprio_init", "EPERM"),
    ] {
        assert!(out.contains(&format!("('{name}', '{want}')")), "{name} should be {want}: {out}");
    }
}
