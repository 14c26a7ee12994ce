//! The security suite: code that tries to get out, run for real in the
//! Linux sandbox, with the outcome checked inside and on the host.

use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;

use airlock::{Layer, Policy, Status};
use airlock_tests::{assert_nothing_left, exclusive, marker, python, quick_policy, shell};

fn ok_stdout(record: &airlock::RunRecord) -> &str {
    assert_eq!(record.status, Status::Ok, "stderr: {}\nmessage: {:?}", record.stderr, record.message);
    record.stdout.trim()
}

#[test]
fn writes_to_host_files_go_nowhere() {
    let _alone = exclusive();
    let host_dir = tempfile::tempdir().unwrap();
    let target = host_dir.path().join("planted");
    let code = format!(
        r#"
import os
hits = []
for path in ["/etc/passwd", "/usr/bin/planted", "/root/planted", "/planted", "{target}", "/proc/sys/kernel/hostname"]:
    try:
        with open(path, "a") as f:
            f.write("x")
        hits.append(path)
    except OSError as e:
        pass
print(hits)
"#,
        target = target.display()
    );
    let record = python(Policy::default(), &code);
    assert_eq!(ok_stdout(&record), "[]");
    assert!(!target.exists());
    assert_nothing_left("");
}

#[test]
fn host_folders_are_not_visible() {
    let record = python(
        Policy::default(),
        r#"
import os
for d in ["/home", "/root", "/srv", "/var", "/run", "/etc", "/mnt", "/boot", "/sys"]:
    try:
        print(d, sorted(os.listdir(d)))
    except OSError as e:
        print(d, "absent")
"#,
    );
    let out = ok_stdout(&record);
    for absent in ["/home", "/srv", "/var", "/run", "/mnt", "/boot", "/sys"] {
        assert!(out.contains(&format!("{absent} absent")), "{absent} must not exist:\n{out}");
    }
    // /etc is airlock's own, nothing from the host's.
    assert!(out.contains("/etc ['group', 'hostname', 'hosts', 'nsswitch.conf', 'passwd']"), "{out}");
    // Not even the path to a Python installation under /root: it is at /opt/airlock/python.
    assert!(out.contains("/root absent"), "{out}");
}

#[test]
fn host_files_are_out_of_reach_through_proc_and_leaked_descriptors() {
    // A secret the test process holds open, without close-on-exec: a leak
    // waiting to happen if any descriptor crossed into the sandbox.
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, "the host's secret").unwrap();
    let file = std::fs::File::open(&secret).unwrap();
    let raw = file.as_raw_fd();
    // SAFETY: clearing FD_CLOEXEC on a descriptor this test owns.
    unsafe { libc::fcntl(raw, libc::F_SETFD, 0) };
    let code = format!(
        r#"
import os
found = []
for fd in range(3, 256):
    try:
        os.fstat(fd)
        found.append(("fd", fd))
    except OSError:
        pass
for path in ["/proc/1/root{secret}", "/proc/self/root{secret}", "/proc/1/cwd", "{secret}"]:
    try:
        with open(path) as f:
            found.append((path, f.read()))
    except OSError:
        pass
try:
    found.append(("1/root", os.listdir("/proc/1/root")))
except OSError:
    pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            for fd in os.listdir(f"/proc/{{pid}}/fd"):
                target = os.readlink(f"/proc/{{pid}}/fd/{{fd}}")
                if "secret" in target:
                    found.append((pid, target))
        except OSError:
            pass
print(found)
"#,
        secret = secret.display()
    );
    let record = python(Policy::default(), &code);
    drop(file);
    assert_eq!(ok_stdout(&record), "[]");
}

/// The driver's folder is the one thing every run of an interpreter shares:
/// bound read-only from the host into each sandbox, so that no run copies
/// the driver in. A run that could change it would run its own code in every
/// later run. Everything that changes a folder is tried from inside, and the
/// host's copy and the next run are checked. (With the folder bound writable
/// and Landlock off, as on a kernel without it, the run rewrote driver.py
/// and created files there.)
#[test]
fn no_run_can_change_the_driver_every_run_shares() {
    let runtime = airlock_tests::host_python();
    let folder = runtime.driver_dir.clone().expect("the host's Python has a driver folder");
    let before = files_in(&folder);
    let record = python(Policy::default(), airlock_tests::CHANGE_THE_DRIVER);
    assert_eq!(ok_stdout(&record), "True True True True []");
    let after = files_in(&folder);
    assert!(before == after, "the host's driver folder changed");
    // And the next run's driver is the one every run gets.
    let record = python(Policy::default(), "print('fine')\n6 * 7");
    assert_eq!(ok_stdout(&record), "fine");
    assert_eq!(record.value.as_deref(), Some("42"));
}

/// A driver folder changed or removed on the host after a runtime took it
/// (a long-lived server's) is not bound: the sandbox's runs bring the
/// driver themselves, and run it. (Before the check at each sandbox's
/// making, the changed driver ran, and a removed folder failed every run.)
#[test]
fn a_driver_folder_changed_or_removed_after_the_runtime_took_it_is_not_bound() {
    let mut runtime = airlock_tests::host_python();
    let original = runtime.driver_dir.clone().expect("the host's Python has a driver folder");
    let copy = tempfile::tempdir().unwrap();
    let folder = copy.path().join("driver");
    std::fs::create_dir(&folder).unwrap();
    for (name, content) in files_in(&original) {
        std::fs::write(folder.join(name), content).unwrap();
    }
    std::fs::set_permissions(&folder, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    runtime.driver_dir = Some(folder.clone());
    let run = |runtime: &airlock::Runtime| {
        let _guard = airlock_tests::shared();
        let mut sandbox = airlock::Sandbox::with_backend(airlock_tests::linux(), Policy::default(), runtime.clone())
            .expect("create a sandbox");
        sandbox.run("import os\nprint(os.path.isdir('/.airlock-driver'))\n6 * 7")
    };
    let record = run(&runtime);
    assert_eq!(ok_stdout(&record), "True", "the copy, whole, is bound");

    let start = folder.join("driver_start.py");
    let text = std::fs::read_to_string(&start).unwrap();
    std::fs::write(&start, format!("print('TAMPERED')\n{text}")).unwrap();
    let record = run(&runtime);
    assert_eq!(ok_stdout(&record), "False", "a changed folder is not bound: {}", record.stdout);
    assert_eq!(record.value.as_deref(), Some("42"));

    std::fs::remove_dir_all(&folder).unwrap();
    let record = run(&runtime);
    assert_eq!(ok_stdout(&record), "False", "a removed folder is not bound");
}

/// Each file of `folder`, by name, with its content.
fn files_in(folder: &std::path::Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn only_three_descriptors_are_open() {
    let record = shell(Policy::default(), "ls /proc/self/fd");
    // `ls` opens the directory it lists: 3 is its own.
    assert_eq!(ok_stdout(&record).split_whitespace().collect::<Vec<_>>(), ["0", "1", "2", "3"]);
    // Python's listdir opens the directory too: 3 is its own.
    let record = python(Policy::default(), "import os\nprint(sorted(int(x) for x in os.listdir('/proc/self/fd')))");
    assert_eq!(ok_stdout(&record), "[0, 1, 2, 3]");
}

#[test]
fn dev_holds_five_devices() {
    let record = python(
        Policy::default(),
        r#"
import os
print(sorted(os.listdir("/dev")))
opened = []
for d in ["/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/tty", "/dev/console", "/dev/ptmx", "/dev/net/tun"]:
    try:
        open(d, "rb").close()
        opened.append(d)
    except OSError:
        pass
try:
    os.mknod("/tmp/mem", 0o600 | 0o020000, os.makedev(1, 1))
    opened.append("mknod")
except OSError:
    pass
with open("/dev/null", "w") as f:
    f.write("fine")
print(opened, open("/dev/zero", "rb").read(4), len(open("/dev/urandom", "rb").read(16)))
"#,
    );
    let out = ok_stdout(&record);
    assert!(
        out.starts_with("['fd', 'full', 'null', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']"),
        "{out}"
    );
    assert!(out.ends_with("[] b'\\x00\\x00\\x00\\x00' 16"), "{out}");
}

#[test]
fn no_capabilities_no_new_privileges_and_seccomp() {
    let record =
        shell(Policy::default(), "grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/self/status; id -u; id -g");
    let out = ok_stdout(&record);
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(out.contains(&format!("{set}:\t0000000000000000")), "{set} not empty:\n{out}");
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(out.ends_with("1000\n1000"), "runs as an unprivileged uid and gid: {out}");
    for layer in [
        Layer::UserNamespace,
        Layer::PidNamespace,
        Layer::NetworkNamespace,
        Layer::Seccomp,
        Layer::Landlock,
        Layer::Cgroups,
    ] {
        assert!(record.isolation.layers.contains(&layer), "{layer} not in force: {:?}", record.isolation);
    }
}

/// The run's init (PID 1, the reaper the code cannot signal) gives up every
/// capability before it seals the run's root, so that the code never runs
/// beside an init holding one; its filter follows. No test here can catch
/// the order itself (the init's last steps take microseconds, the code's
/// start milliseconds): this one holds the state the code finds.
#[test]
fn the_init_beside_the_code_holds_no_capability() {
    let record = shell(Policy::default(), "grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/1/status");
    let out = ok_stdout(&record);
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(out.contains(&format!("{set}:\t0000000000000000")), "the init's {set} is not empty:\n{out}");
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
}

#[test]
fn denied_system_calls_fail() {
    let code = r#"
import ctypes, os
results = {
    "unshare_user": call(272, 0x10000000),
    "unshare_net": call(272, 0x40000000),
    "clone3": call(435, 0, 0),
    "io_uring_setup": call(425, 8, 1),
    "bpf": call(321, 0, 0, 0),
    # An unknown operation: the kernel would answer EOPNOTSUPP.
    "keyctl": call(250, 12345, 0),
    "add_key": call(248, 0, 0, 0, 0, 0),
    "ptrace_attach_1": call(101, 16, 1, 0, 0),
    "setns": call(308, 0, 0),
    # A bad pointer: the kernel would answer EFAULT; EPERM can only be the filter.
    "mount": call(165, 1, 1, 1, 0, 1),
    "pivot_root": call(155, 0, 0),
    "perf_event_open": call(298, 0, 0, -1, -1, 0),
    "userfaultfd": call(323, 0),
    "init_module": call(175, 0, 0, 0),
    "kexec_load": call(246, 0, 0, 0, 0),
    "reboot": call(169, 0, 0, 0, 0),
    "swapon": call(167, 0, 0),
    "acct": call(163, 0),
    "iopl": call(172, 3),
    "personality_exec": call(135, 0x0400000),
    "netlink_socket": call(41, 16, 3, 0),
    "packet_socket": call(41, 17, 3, 0),
    "process_vm_readv": call(310, 1, 0, 0, 0, 0, 0),
}
print(sorted(results.items()))
"#;
    let record = python(Policy::default(), &format!("{}{code}", airlock_tests::PY_SYSCALL));
    let out = ok_stdout(&record);
    assert!(out.contains("('clone3', 'ENOSYS')"), "{out}");
    assert!(out.contains("('netlink_socket', 'EAFNOSUPPORT')"), "{out}");
    assert!(out.contains("('packet_socket', 'EAFNOSUPPORT')"), "{out}");
    assert!(!out.contains("'OK'"), "a denied call succeeded: {out}");
    // EPERM where the kernel alone would give another answer: the filter's.
    for name in ["unshare_user", "io_uring_setup", "keyctl", "mount"] {
        assert!(out.contains(&format!("('{name}', 'EPERM')")), "{name} not refused by the filter: {out}");
    }
    // The same from the shell's own tools.
    let record = shell(Policy::default(), "unshare -U true; echo $?; unshare -n true 2>/dev/null; echo $?");
    assert_eq!(ok_stdout(&record), "1\n1");
}

#[test]
fn terminal_injection_is_refused_before_the_tty_layer() {
    // TIOCSTI on the code's stdout (a pipe): the kernel would answer ENOTTY;
    // EPERM shows the filter refused it first, high bits or not.
    let record = python(
        Policy::default(),
        r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
out = []
for request in (0x5412, 0x541C, 0xdead00005412):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(16), ctypes.c_long(1), ctypes.c_ulong(request), ctypes.c_char_p(b"x"))
    out.append(errno.errorcode.get(ctypes.get_errno(), "OK"))
print(out)
"#,
    );
    assert_eq!(ok_stdout(&record), "['EPERM', 'EPERM', 'EPERM']");
}

#[test]
fn the_environment_holds_only_what_was_given() {
    let mut policy = Policy::default();
    policy.env.insert("GIVEN".to_owned(), "yes".to_owned());
    let record = python(policy, "import os\nprint(sorted(os.environ.items()))");
    let out = ok_stdout(&record);
    let runtime = airlock_tests::host_python();
    let python_bin = runtime.python.parent().unwrap().display().to_string();
    // A shared interpreter outside /usr finds libpython at its sandbox path.
    let loader = match runtime.env.get("LD_LIBRARY_PATH") {
        Some(path) => format!("('LD_LIBRARY_PATH', '{path}'), "),
        None => String::new(),
    };
    assert_eq!(
        out,
        format!(
            "[('GIVEN', 'yes'), ('HOME', '/tmp'), ('LANG', 'C.UTF-8'), {loader}('MKL_NUM_THREADS', '1'), \
             ('MPLBACKEND', 'module://airlock_inline_backend'), ('MPLCONFIGDIR', '/tmp/.config/matplotlib'), \
             ('NUMEXPR_NUM_THREADS', '1'), ('OMP_NUM_THREADS', '1'), ('OPENBLAS_NUM_THREADS', '1'), \
             ('PATH', '{python_bin}:/usr/local/bin:/usr/bin:/bin'), ('TMPDIR', '/tmp')]"
        )
    );
    // Nothing of this test process's environment (HOME, PATH, CARGO_*) crossed.
    assert!(!out.contains("CARGO"), "{out}");
}

#[test]
fn the_network_has_only_loopback() {
    // A listener on the host's loopback: nothing from the sandbox may reach it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        r#"
import socket
out = []
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("169.254.169.254", 80), ("10.0.0.1", 80), ("::1", {port})]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        out.append((host, "connected"))
    except OSError as e:
        out.append((host, type(e).__name__))
try:
    socket.getaddrinfo("example.com", 80)
    out.append(("dns", "resolved"))
except OSError as e:
    out.append(("dns", "failed"))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("8.8.8.8", 53))
    out.append(("udp", "sent"))
except OSError as e:
    out.append(("udp", "failed"))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    out.append(("raw", "opened"))
except OSError:
    out.append(("raw", "refused"))
print(out)
"#
    );
    let record = python(Policy::default(), &code);
    let out = ok_stdout(&record);
    assert!(
        !out.contains("connected") && !out.contains("resolved") && !out.contains("'sent'") && !out.contains("opened"),
        "{out}"
    );
    assert!(listener.accept().is_err(), "a connection reached the host");
}

#[test]
fn an_abstract_socket_on_the_host_is_unreachable() {
    let name = format!("airlock-test-abstract-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{name}')\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)"
    );
    let record = python(Policy::default(), &code);
    assert_eq!(ok_stdout(&record), "ConnectionRefusedError");
    assert!(listener.accept().is_err());
}

#[test]
fn a_daemon_left_behind_dies_with_the_run() {
    let _alone = exclusive();
    let marker = marker("daemon");
    let code = format!(
        r#"
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["{marker}", "1000"])
    os._exit(0)
os.wait()
for _ in range(100):
    running = [p for p in os.listdir("/proc") if p.isdigit() and b"{marker}" in open(f"/proc/{{p}}/cmdline", "rb").read()]
    if running:
        break
    time.sleep(0.02)
print("daemon running" if running else "no daemon")
"#
    );
    let record = python(Policy::default(), &code);
    assert_eq!(ok_stdout(&record), "daemon running");
    assert_nothing_left(&marker);
}

#[test]
fn ignoring_sigterm_does_not_outlive_the_timeout() {
    let _alone = exclusive();
    let marker = marker("sigterm");
    let code = format!(
        r#"
import signal, os
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execv("/bin/sleep", ["{marker}", "1000"])
while True:
    pass
"#
    );
    let started = std::time::Instant::now();
    let record = python(quick_policy(2), &code);
    let took = started.elapsed();
    assert_eq!(record.status, Status::Timeout, "{record:?}");
    assert!(record.limits_hit.contains(&airlock::Limit::WallTime));
    assert!(took < std::time::Duration::from_secs(3), "killed within a second of the limit, took {took:?}");
    assert_nothing_left(&marker);
}

#[test]
fn a_stopped_process_and_sleep_forever_end_at_the_deadline() {
    let record = shell(quick_policy(1), "sleep 1000 & kill -STOP $!; sleep infinity");
    assert_eq!(record.status, Status::Timeout);
    assert!(record.usage.wall_ms >= 1000 && record.usage.wall_ms < 2000, "{:?}", record.usage);
}

#[test]
fn read_from_the_terminal_is_impossible() {
    let record = shell(
        Policy::default(),
        "test -t 0 && echo tty || echo notty; cat /dev/tty 2>&1 | head -c 40; read x; echo \"[$x]\"",
    );
    let out = ok_stdout(&record);
    assert!(out.starts_with("notty"), "{out}");
    assert!(out.ends_with("[]"), "stdin is /dev/null: {out}");
}

#[test]
fn the_code_is_an_unprivileged_user_on_the_host_and_owns_what_is_copied_in() {
    // Root's sandboxes run as a host id of airlock's reserved range, each its
    // own (root's uid is not even mapped inside); an ordinary user's without
    // subordinate ids run as that user.
    // SAFETY: geteuid and getegid cannot fail and touch no memory.
    let (our_uid, our_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Alone: other tests check that no run of this binary is left.
    let _alone = exclusive();
    let marker = marker("host-uid");
    let mut sandbox = airlock_tests::sandbox(Policy::default());
    sandbox.write("data/in.txt", b"copied in").unwrap();
    let code = format!(
        r#"
import os, subprocess
st = os.stat("/work/data/in.txt")
with open("/work/data/in.txt", "a") as f:
    f.write(", then changed")
os.rename("/work/data/in.txt", "/work/data/moved.txt")
print(os.getuid(), os.getgid(), st.st_uid, st.st_gid, os.stat("/work/data").st_uid)
subprocess.run(["/bin/sh", "-c", "sleep 3", "{marker}"])
"#
    );
    let watcher = std::thread::spawn({
        let marker = marker.clone();
        move || {
            // The code's shell, seen from the host: its real, effective,
            // saved and filesystem ids.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while std::time::Instant::now() < deadline {
                for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                    let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    if String::from_utf8_lossy(&cmdline).contains(&marker) {
                        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
                        let ids = |key: &str| {
                            status
                                .lines()
                                .find(|l| l.starts_with(key))
                                .map(|l| l[key.len()..].split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                        };
                        if let (Some(uids), Some(gids)) = (ids("Uid:"), ids("Gid:")) {
                            return Some((uids, gids));
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            None
        }
    });
    let record = sandbox.run(&code);
    assert_eq!(ok_stdout(&record), "1000 1000 1000 1000 1000");
    assert_eq!(sandbox.read("data/moved.txt").unwrap(), b"copied in, then changed");
    let (uids, gids) = watcher.join().unwrap().expect("the code's process was seen from the host");
    let (expected, expected_gid) = if our_uid == 0 {
        let range = airlock_linux::hostid::DEFAULT_RANGE;
        let uid: u32 = uids[0].parse().unwrap();
        assert!((range.first..=range.last()).contains(&uid), "{uid} is not of airlock's range {range}");
        (uids[0].clone(), uids[0].clone())
    } else {
        (our_uid.to_string(), our_gid.to_string())
    };
    assert_eq!(uids, vec![expected; 4], "host uids of the code");
    assert_eq!(gids, vec![expected_gid; 4], "host gids of the code");
}

/// The host's `core_pattern`, piped to a handler that logs each crash it is
/// handed, for as long as this lives; the pattern is put back when dropped,
/// whatever the test did.
struct CoreHandler {
    before: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

impl CoreHandler {
    fn install() -> CoreHandler {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("crashes");
        let handler = dir.path().join("handler");
        std::fs::write(
            &handler,
            format!("#!/bin/sh\necho \"pid $1 limit $2\" >> {}\ncat > /dev/null\n", log.display()),
        )
        .unwrap();
        std::fs::set_permissions(&handler, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let before = std::fs::read_to_string(CORE_PATTERN).unwrap();
        std::fs::write(CORE_PATTERN, format!("|{} %P %c", handler.display())).unwrap();
        CoreHandler { before, log, _dir: dir }
    }

    fn crashes(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for CoreHandler {
    fn drop(&mut self) {
        let _ = std::fs::write(CORE_PATTERN, self.before.trim_end());
    }
}

/// Where `core_pattern` pipes crashes to a handler (systemd-coredump,
/// apport), the kernel starts that handler on the host, as root, for a
/// crash whose core-dump limit is 0, which is not "no core" for a pipe;
/// only a limit of 1 is. So a crash in the sandbox must never reach it,
/// nor a crash after the code tried to lower or reset the limit. Before the
/// fix the limit was 0 and every crash below started the host's handler.
#[test]
fn a_crash_never_starts_the_hosts_core_handler() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only root may point the host's core_pattern at a test handler");
        return;
    }
    let _alone = exclusive();
    let handler = CoreHandler::install();
    let code = r#"
import os, resource, sys
for name, call in [
    ("setrlimit", lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 1))),
    ("prlimit", lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 1))),
]:
    try:
        call()
        print(name, "lowered")
    except (OSError, ValueError) as e:
        print(name, "refused", e)
print("limit", resource.getrlimit(resource.RLIMIT_CORE))
sys.stdout.flush()
os.abort()
"#;
    let python = python(Policy::default(), code);
    let shell = shell(Policy::default(), "set -e; ulimit -c 0; ulimit -c unlimited 2>/dev/null || :; kill -SEGV $$");
    // The handler, had it been started, has long written its line.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(handler.crashes(), "", "the host's core handler ran for a crash in the sandbox");
    // Setting it does nothing (a script's `ulimit -c 0` goes on); setting it
    // and reading the old one back is refused.
    let refused = "setrlimit lowered\nprlimit refused [Errno 1] Operation not permitted\nlimit (1, 1)\n";
    assert_eq!((python.signal, python.stdout.as_str()), (Some(6), refused), "{python:?}");
    assert_eq!(shell.signal, Some(11), "{shell:?}");
}
