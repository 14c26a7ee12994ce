//! The harness the security suite and the end-to-end tests share: real
//! sandboxes, the real helper and command, and checks that nothing was left
//! behind on the host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use airlock::image::ImageStore;
use airlock::{Policy, RunRecord, RunRequest, Runtime, Sandbox};
use airlock_linux::LinuxBackend;

pub mod users;

/// The folder cargo put this build's binaries in (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    // target/debug/deps/<test>-<hash>
    exe.parent().and_then(Path::parent).expect("test binaries live in target/<profile>/deps").to_owned()
}

/// The sandbox helper of this build.
pub fn helper() -> PathBuf {
    let path = bin_dir().join("airlock-init");
    assert!(path.is_file(), "{} is missing: run the tests with `cargo test --workspace`", path.display());
    path
}

/// The `airlock` command of this build.
pub fn airlock_bin() -> PathBuf {
    let path = bin_dir().join("airlock");
    assert!(path.is_file(), "{} is missing: run the tests with `cargo test --workspace`", path.display());
    path
}

/// airlock's data directory for tests: shared by every test and kept between
/// runs, so the python-data image is built once.
pub fn test_home() -> PathBuf {
    // target/tmp/airlock-test-home: where the wasm crate's own tests keep theirs too.
    let home = bin_dir().parent().expect("target/").join("tmp/airlock-test-home");
    std::fs::create_dir_all(&home).expect("create the test home");
    home
}

/// The Linux backend, with this build's helper.
pub fn linux() -> &'static LinuxBackend {
    static BACKEND: OnceLock<LinuxBackend> = OnceLock::new();
    BACKEND.get_or_init(|| LinuxBackend::with_helper(helper()))
}

/// The host's own Python, without an image: fast, for the security suite.
pub fn host_python() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| airlock::interpreter::Interpreter::resolve("python3").expect("python3 on PATH").runtime())
        .clone()
}

/// The python-data image (numpy, pandas, matplotlib, scipy), built on first use.
pub fn data_image() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let store = ImageStore::at(test_home().join("images")).with_backend(linux());
            let image = store
                .get_or_build_default("python-data", &mut |e| eprintln!("building python-data: {e:?}"))
                .expect("build the python-data image");
            image.runtime()
        })
        .clone()
}

/// A sandbox with `policy` on the host's Python.
pub fn sandbox(policy: Policy) -> Sandbox {
    Sandbox::with_backend(linux(), policy, host_python()).expect("create a sandbox")
}

/// The default policy with a shorter wall clock, for tests that expect to end early.
pub fn quick_policy(seconds: u64) -> Policy {
    let mut policy = Policy::default();
    policy.limits.wall_time = std::time::Duration::from_secs(seconds);
    policy
}

/// Tests in one binary run on parallel threads of one process, so their
/// cgroups share a name prefix. Ordinary runs share this lock; a test that
/// checks what was left behind takes it alone ([`exclusive`]), so that it
/// sees only its own run's leftovers.
static RUNS: RwLock<()> = RwLock::new(());

thread_local! {
    static HOLDS_EXCLUSIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Holds off every other run of this test binary while alive.
#[derive(Debug)]
pub struct Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

impl Drop for Exclusive {
    fn drop(&mut self) {
        HOLDS_EXCLUSIVE.with(|h| h.set(false));
    }
}

/// Takes the run lock alone: other tests' runs wait until it is dropped.
pub fn exclusive() -> Exclusive {
    let guard = RUNS.write().unwrap_or_else(|e| e.into_inner());
    HOLDS_EXCLUSIVE.with(|h| h.set(true));
    Exclusive(guard)
}

/// Holds the run lock with the other ordinary runs (see [`exclusive`]).
pub fn shared() -> Option<RwLockReadGuard<'static, ()>> {
    // The thread holding the exclusive lock runs under it.
    if HOLDS_EXCLUSIVE.with(|h| h.get()) {
        return None;
    }
    Some(RUNS.read().unwrap_or_else(|e| e.into_inner()))
}

/// Runs Python code in a fresh sandbox with `policy`.
pub fn python(policy: Policy, code: &str) -> RunRecord {
    let _guard = shared();
    sandbox(policy).run(code)
}

/// Runs shell code in a fresh sandbox with `policy`.
pub fn shell(policy: Policy, code: &str) -> RunRecord {
    let _guard = shared();
    sandbox(policy).run_request(&RunRequest::shell(code))
}

/// The `airlock` command, with this build's helper and the test home.
pub fn airlock_command() -> Command {
    let mut cmd = Command::new(airlock_bin());
    cmd.env("AIRLOCK_INIT", helper()).env("AIRLOCK_HOME", test_home());
    cmd
}

/// Runs the official MCP Python SDK's client (tests/mcp/client.py) with
/// `args` (`stdio COMMAND [ARG...]` or `http URL TOKEN`) and `calls` on its
/// stdin, with this build's helper and the test home in its environment:
/// its JSON output, or its error output when it failed.
pub fn mcp_sdk_client(args: &[&str], calls: &serde_json::Value) -> Result<serde_json::Value, String> {
    use std::io::Write;
    use std::process::Stdio;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/client.py");
    let probe = Command::new("python3").args(["-c", "import mcp"]).output().map_err(|e| format!("python3: {e}"))?;
    assert!(probe.status.success(), "the MCP Python SDK is missing: pip install 'mcp==2.3.0'");
    let mut child = Command::new("python3")
        .arg(script)
        .args(args)
        .env("AIRLOCK_INIT", helper())
        .env("AIRLOCK_HOME", test_home())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the MCP client: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(calls.to_string().as_bytes()).map_err(|e| format!("writing the calls: {e}"))?;
    }
    let output = child.wait_with_output().map_err(|e| format!("waiting for the MCP client: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("the MCP client's output is not JSON: {e}"))
}

/// Everything this test process made that could outlive a run: cgroups
/// named for this process, and processes whose command line holds `marker`.
pub fn leftovers(marker: &str) -> Vec<String> {
    leftovers_of(std::process::id(), marker)
}

/// Everything process `pid` (this one, or an `airlock serve` it started)
/// made that could outlive a run: cgroups named for it, airlock mounts, and
/// processes whose command line holds `marker`.
pub fn leftovers_of(pid: u32, marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let prefix = format!("airlock-{pid}-");
    for line in std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("");
        if fstype == "cgroup" || fstype == "cgroup2" {
            let Some(mount) = fields.get(4) else { continue };
            walk_cgroups(Path::new(mount), &prefix, &mut found);
        }
        if line.contains("airlock") && fstype != "cgroup" && fstype != "cgroup2" {
            found.push(format!("mount: {line}"));
        }
    }
    if !marker.is_empty() {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(format!(
                    "process {}: {}",
                    entry.file_name().to_string_lossy(),
                    String::from_utf8_lossy(&cmdline)
                ));
            }
        }
    }
    found
}

/// The cgroups this process made since [`leftovers`] gave `before`: a
/// sandbox's, made while it was built, when no other test made one meanwhile.
pub fn cgroups_made_since(before: &[String]) -> Vec<PathBuf> {
    leftovers("")
        .iter()
        .filter(|found| !before.contains(found))
        .filter_map(|found| found.strip_prefix("cgroup: "))
        .map(PathBuf::from)
        .collect()
}

fn walk_cgroups(dir: &Path, prefix: &str, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(prefix) {
                found.push(format!("cgroup: {}", entry.path().display()));
            } else if dir.components().count() < 12 {
                walk_cgroups(&entry.path(), prefix, found);
            }
        }
    }
}

/// Asserts nothing of the run outlived it. Call it while holding
/// [`exclusive`], taken before the run.
pub fn assert_nothing_left(marker: &str) {
    // The kernel finishes tearing down a killed tree asynchronously; give it a moment.
    for _ in 0..50 {
        if leftovers(marker).is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left = leftovers(marker);
    assert!(left.is_empty(), "left behind on the host: {left:#?}");
}

/// Python for the security suite's probes: `call(nr, *args)` makes a raw
/// system call and returns "OK" or the errno's name.
pub const PY_SYSCALL: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return errno.errorcode.get(ctypes.get_errno(), "OK") if r == -1 else "OK"
"#;

/// A unique marker for a test's processes.
pub fn marker(name: &str) -> String {
    format!("airlock-test-{name}-{}", std::process::id())
}

/// The WebAssembly backend, with its interpreter in the test home (the first
/// use installs and compiles it: a few minutes, once).
pub fn wasm() -> &'static airlock_wasm::WasmBackend {
    static BACKEND: OnceLock<airlock_wasm::WasmBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let worker = bin_dir().join(airlock_wasm::WORKER_NAME);
        assert!(worker.is_file(), "{} is missing: run the tests with `cargo test --workspace`", worker.display());
        let backend = airlock_wasm::WasmBackend::with_worker(test_home(), worker);
        backend.prepare(&mut airlock_wasm::progress_on_stderr).expect("the wasm interpreter installs");
        backend
    })
}

/// A sandbox on `backend` with `policy`: the host's Python on Linux, the
/// built-in interpreter on wasm.
pub fn sandbox_on(backend: airlock::BackendKind, mut policy: Policy) -> Sandbox {
    policy.backend = backend;
    match backend {
        airlock::BackendKind::Linux => sandbox(policy),
        airlock::BackendKind::Wasm => {
            Sandbox::with_backend(wasm(), policy, Runtime::default()).expect("a wasm sandbox")
        }
    }
}

/// Generates one test per backend for each case: `mod case { fn linux(); fn
/// wasm(); }`, each calling `case(backend)` from the module around them.
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[test]
                fn linux() {
                    super::$case(airlock::BackendKind::Linux)
                }
                #[test]
                fn wasm() {
                    super::$case(airlock::BackendKind::Wasm)
                }
            }
        )*
    };
}

/// Code that leaves what an exit must see to: a file it never closed, a
/// thread still running, an atexit function, objects with finalizers, one in
/// a reference cycle. [`assert_ended_as_an_exit_does`] checks what it printed
/// and wrote.
pub const ENDS_WITH_WORK_LEFT: &str = r#"
import atexit, threading, time
f = open("/work/unclosed.txt", "w")
f.write("kept" * 1000)
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self):
        print("cycle finalized")
Cycle()
class Goodbye:
    def __del__(self):
        print("finalized")
bye = Goodbye()
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.3)
    open("/work/thread.txt", "w").write("thread finished")
threading.Thread(target=late).start()
print("main done")
"#;

/// A run of [`ENDS_WITH_WORK_LEFT`] ended as a normal exit would: its own
/// line, then the atexit function's, then its objects' finalizers, the
/// cycle's included (in either order: CPython promises none at exit); the
/// file it left open flushed, its thread's work done.
pub fn assert_ended_as_an_exit_does(stdout: &str, sandbox: &mut Sandbox) {
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 2, "{stdout}");
    assert_eq!(lines[..2], ["main done", "atexit ran"], "{stdout}");
    let mut finalized = lines[2..].to_vec();
    finalized.sort_unstable();
    assert_eq!(finalized, ["cycle finalized", "finalized"], "{stdout}");
    assert_eq!(sandbox.read("/work/unclosed.txt").expect("the unclosed file"), "kept".repeat(1000).into_bytes());
    assert_eq!(sandbox.read("/work/thread.txt").expect("the thread's file"), b"thread finished");
}

/// Code that tries every way to change the driver's folder every run shares
/// (`/.airlock-driver`) from inside: each file appended to, truncated,
/// chmod-ed, touched, unlinked and renamed; a file, a folder and a link
/// created; the mount remounted, bound over and detached. Prints whether
/// the mount is read-only, nosuid, nodev and noexec, then what it changed.
pub const CHANGE_THE_DRIVER: &str = r#"
import ctypes, os
d = "/.airlock-driver"
changed = []
def attempt(what, action):
    try:
        action()
        changed.append(what)
    except OSError:
        pass
flags = os.statvfs(d).f_flag
for name in sorted(os.listdir(d)):
    path = d + "/" + name
    attempt("append " + name, lambda: open(path, "a").write("raise SystemExit(99)\n"))
    attempt("truncate " + name, lambda: os.truncate(path, 0))
    attempt("chmod " + name, lambda: os.chmod(path, 0o777))
    attempt("utime " + name, lambda: os.utime(path, (0, 0)))
    attempt("unlink " + name, lambda: os.unlink(path))
    attempt("rename " + name, lambda: os.rename(path, path + ".old"))
attempt("create", lambda: open(d + "/planted.py", "w").write("x"))
attempt("mkdir", lambda: os.mkdir(d + "/__pycache__"))
attempt("symlink", lambda: os.symlink("/work", d + "/link"))
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND = 32, 4096
if libc.mount(None, d.encode(), None, MS_REMOUNT | MS_BIND, None) == 0:
    changed.append("remount read-write")
if libc.mount(b"/work", d.encode(), None, MS_BIND, None) == 0:
    changed.append("bind over")
if libc.umount2(d.encode(), 2) == 0:
    changed.append("detach")
print(bool(flags & os.ST_RDONLY), bool(flags & os.ST_NOSUID), bool(flags & os.ST_NODEV), bool(flags & os.ST_NOEXEC), changed)
"#;

/// Pools of each of multiprocessing's start methods. Spawn and forkserver
/// (3.14's default) start each child by running `__main__`'s file again;
/// with no file there, every worker died as it started and the Pool made
/// new ones until the wall limit. Each child computes `HERE` from its
/// `__file__` as the run does; its results are objects of a class of the
/// code's, unpickled in the run; and the code ends with an expression that
/// names what only the run's `__main__` block made.
pub const POOLS_OF_EACH_START_METHOD: &str = r#"import multiprocessing as mp
import os
HERE = os.path.dirname(os.path.abspath(__file__))
class Square:
    def __init__(self, x):
        self.value, self.here = x * x, HERE
def square(x):
    return Square(x)
if __name__ == "__main__":
    sums = []
    for method in ("spawn", "forkserver", "fork"):
        with mp.get_context(method).Pool(2) as pool:
            squares = pool.map(square, range(10))
        sums.append(f"{method} {sum(s.value for s in squares)} {all(s.here == HERE for s in squares)}")
    print(" ".join(sums), __file__, HERE)
len(sums)
"#;
/// What [`POOLS_OF_EACH_START_METHOD`] prints before `__file__`.
pub const EACH_START_METHOD_SUMS: &str = "spawn 285 True forkserver 285 True fork 285 True";
