//! cgroup v2 from systemd, the way crun's and podman's systemd cgroup
//! manager get theirs: on a systemd host an ordinary user sits in a session
//! scope they may not write to, and root in a unit whose cgroup holds
//! processes (so it may not hand controllers to children). airlock asks the
//! caller's systemd instance (the user's own, or the system's for root) over
//! D-Bus for a transient scope with `Delegate=yes`, and nests each run's
//! cgroup in it.
//!
//! A scope needs a process to exist, and one scope serves every run of this
//! process: its first process is a holder, `airlock-init hold`, which reads
//! a pipe whose other end only this process has. When this process ends,
//! however it ends, the holder reads end-of-file and exits; the runs' own
//! processes die with their supervisor; the scope is then empty and systemd
//! removes it with everything below it. Nothing here runs per run: the
//! D-Bus exchange happens once, when the backend first looks at the host.
//!
//! Inside the scope, the holder moves to a leaf of its own (`hold`): a
//! cgroup with processes may not enable controllers for its children, the
//! rule that keeps airlock out of the cgroup it was started in.
//!
//! An ordinary user's airlock moves into the scope too, beside the holder
//! (as podman moves itself into a user scope): the kernel lets a process
//! start a child in a cgroup (clone3's CLONE_INTO_CGROUP, which each run's
//! helper does) only if it could write the `cgroup.procs` of the cgroup
//! both have in common, and above the scope that is the user's slice, which
//! is root's. Root may write anywhere, and stays where it was started.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{CONTROLLERS, write};

/// The helper's argument that makes it a scope's holder.
pub const HOLD_ARG: &str = "hold";

/// The leaf the holder lives in, beside the runs' cgroups.
const HOLD_LEAF: &str = "hold";

/// How long systemd may take to start the scope.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A scope this process holds.
#[derive(Debug)]
pub struct Scope {
    /// The scope's directory in the unified hierarchy.
    pub dir: PathBuf,
    /// `airlock-<pid>-<start>.scope`.
    pub unit: String,
    /// Whose systemd made it: the user's own instance, or the system's.
    pub user_manager: bool,
    /// Our end of the holder's pipe: closed only when this process ends.
    _holder_pipe: OwnedFd,
}

/// The scope of this process, made on first use: one per process, however
/// many backends ask.
pub fn scope(mount: &Path, mount_root: &str, helper: Option<&Path>) -> Result<&'static Scope, String> {
    static SCOPE: OnceLock<Result<Scope, String>> = OnceLock::new();
    SCOPE.get_or_init(|| make_scope(mount, mount_root, helper)).as_ref().map_err(Clone::clone)
}

/// Whether systemd is this host's init (what `sd_booted` checks).
pub fn booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn make_scope(mount: &Path, mount_root: &str, helper: Option<&Path>) -> Result<Scope, String> {
    let root = rustix::process::geteuid().is_root();
    let manager = if root { "the system's systemd" } else { "this user's systemd instance" };
    let helper = helper.ok_or_else(|| {
        format!("the sandbox helper airlock-init, which holds the cgroup {manager} would delegate, was not found")
    })?;
    let address = bus_address(root)?;
    let unit =
        format!("airlock-{}-{}.scope", std::process::id(), super::process_start_time(std::process::id()).unwrap_or(0));
    let (holder, pipe) = spawn_holder(helper)?;
    let fail = |why: String| {
        // The holder must not outlive a scope that did not come to be.
        if let Some(pid) = rustix::process::Pid::from_raw(holder as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        why
    };
    let members = if root { vec![holder] } else { vec![holder, std::process::id()] };
    start_transient_scope(&address, &unit, &members)
        .map_err(|e| fail(format!("{manager} refused a delegated scope ({address}): {e}")))?;
    let cgroup = wait_for_placement(&members, &unit).map_err(fail)?;
    let dir = super::join_beneath(mount, mount_root, &cgroup).map_err(fail)?;
    prepare(&dir, &members, root).map_err(fail)?;
    Ok(Scope { dir, unit, user_manager: !root, _holder_pipe: pipe })
}

/// The bus of the systemd instance that manages this user's processes.
fn bus_address(root: bool) -> Result<String, String> {
    if root {
        if let Some(address) = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok().filter(|a| !a.is_empty()) {
            return Ok(address);
        }
        let socket = Path::new("/run/dbus/system_bus_socket");
        return if socket.exists() {
            Ok(format!("unix:path={}", socket.display()))
        } else {
            Err("the system bus is not running (no /run/dbus/system_bus_socket): install and start dbus \
                 (apt-get install dbus), or name a cgroup delegated to airlock in AIRLOCK_CGROUP"
                .to_owned())
        };
    }
    // The user manager's own bus first: a session bus started some other way
    // (dbus-launch) has no systemd behind it.
    let uid = rustix::process::getuid().as_raw();
    let runtime_dirs = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from(format!("/run/user/{uid}"))]);
    for dir in runtime_dirs {
        let socket = dir.join("bus");
        if socket.exists() {
            return Ok(format!("unix:path={}", socket.display()));
        }
    }
    if let Some(address) = std::env::var("DBUS_SESSION_BUS_ADDRESS").ok().filter(|a| !a.is_empty()) {
        return Ok(address);
    }
    Err(format!(
        "this user (uid {uid}) has no systemd user instance with a bus (no /run/user/{uid}/bus): log in through \
         a session that starts one (pam_systemd), or keep one running with `sudo loginctl enable-linger $USER`, \
         and install its bus with `apt-get install dbus-user-session`"
    ))
}

/// Starts `airlock-init hold` with a pipe on its standard input.
fn spawn_holder(helper: &Path) -> Result<(u32, OwnedFd), String> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("cannot make the holder's pipe: {e}"))?;
    let child = Command::new(helper)
        .arg(HOLD_ARG)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the scope's holder {} {HOLD_ARG}: {e}", helper.display()))?;
    // Never waited for: it ends with this process (or is killed above).
    Ok((child.id(), write))
}

/// The holder's `main`: waits for the supervisor's end of the pipe to close.
pub fn hold() -> ! {
    let _ = crate::sys::close_from_except(3, -1);
    let mut buf = [0u8; 64];
    loop {
        match rustix::io::read(rustix::stdio::stdin(), &mut buf) {
            Ok(0) => std::process::exit(0),
            Err(rustix::io::Errno::INTR) | Ok(_) => continue,
            Err(_) => std::process::exit(0),
        }
    }
}

/// Asks systemd for `unit`, a scope holding `pids`, delegated to us.
fn start_transient_scope(address: &str, unit: &str, pids: &[u32]) -> Result<(), String> {
    // On a thread of its own, with a runtime that ends with the exchange: a
    // runtime may not start on a thread that already drives one (a server's),
    // and none is left running in the supervisor afterwards.
    let (address, unit, pids) = (address.to_owned(), unit.to_owned(), pids.to_vec());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the D-Bus client: {e}"))?;
        // The timeout is made inside the runtime: its timer needs the
        // runtime's context from the moment it exists.
        runtime
            .block_on(async {
                tokio::time::timeout(START_TIMEOUT, call_start_transient_unit(&address, &unit, pids)).await
            })
            .map_err(|_| format!("no answer within {START_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the D-Bus client panicked".to_owned())?
}

async fn call_start_transient_unit(address: &str, unit: &str, pids: Vec<u32>) -> zbus::Result<()> {
    use zbus::zvariant::{OwnedObjectPath, Value};
    let connection = zbus::connection::Builder::address(address)?.build().await?;
    let properties: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from(format!("airlock sandboxes of process {}", std::process::id()))),
        ("PIDs", Value::from(pids)),
        ("Delegate", Value::from(true)),
        // Removed even if it ends failed, so no unit is left behind.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let auxiliary: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    let reply = connection
        .call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.systemd1.Manager"),
            "StartTransientUnit",
            &(unit, "fail", properties, auxiliary),
        )
        .await?;
    let _job: OwnedObjectPath = reply.body().deserialize()?;
    Ok(())
}

/// Waits until systemd has moved every one of `members` into its scope, and
/// returns the scope's cgroup path. The start job moves them; watching
/// where they are needs no signal subscription.
fn wait_for_placement(members: &[u32], unit: &str) -> Result<String, String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut placed = None;
    for pid in members {
        loop {
            let membership = fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .map_err(|e| format!("pid {pid}, to be placed in the scope, is gone: {e}"))?;
            if let Some(path) = membership.lines().find_map(|l| l.strip_prefix("0::")) {
                if path.ends_with(&format!("/{unit}")) {
                    placed = Some(path.to_owned());
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(format!("systemd did not start the scope {unit} with pid {pid} within {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    placed.ok_or_else(|| format!("nothing was to be placed in the scope {unit}"))
}

/// Moves the scope's members (the holder, and an ordinary user's airlock)
/// to their leaf and hands the controllers to the scope's children, or says
/// which controller systemd did not delegate and how to fix that.
fn prepare(dir: &Path, members: &[u32], root: bool) -> Result<(), String> {
    let available = fs::read_to_string(dir.join("cgroup.controllers"))
        .map_err(|e| format!("cannot read {}/cgroup.controllers: {e}", dir.display()))?;
    let missing: Vec<&str> =
        CONTROLLERS.iter().copied().filter(|c| !available.split_whitespace().any(|a| a == *c)).collect();
    if !missing.is_empty() {
        return Err(if root {
            format!("systemd delegated a scope without the {} controllers", missing.join(", "))
        } else {
            format!(
                "this user's systemd instance delegates only `{}`, not {}: delegate them to every user with \
                 `sudo mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nDelegate=cpu memory \
                 pids\\n' | sudo tee /etc/systemd/system/user@.service.d/delegate.conf && sudo systemctl \
                 daemon-reload`, then log in again",
                available.trim(),
                missing.join(", ")
            )
        });
    }
    let leaf = dir.join(HOLD_LEAF);
    fs::create_dir(&leaf).map_err(|e| format!("cannot create {}: {e}", leaf.display()))?;
    for pid in members {
        write(&leaf.join("cgroup.procs"), pid.to_string()).map_err(|e| e.to_string())?;
    }
    let request: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
    write(&dir.join("cgroup.subtree_control"), request.join(" ")).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The D-Bus exchange ends in an answer, never a panic: a real bus
    /// (dbus-daemon) without systemd behind it answers that no such service
    /// exists. (The first run on a systemd host once panicked here, "no
    /// reactor running".)
    #[test]
    fn a_bus_without_systemd_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("bus");
        let address = format!("unix:path={}", socket.display());
        let daemon = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--nopidfile", &format!("--address={address}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut daemon) = daemon else {
            panic!("dbus-daemon is needed for this test: apt-get install dbus-daemon");
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let outcome = start_transient_scope(&address, "airlock-test.scope", &[std::process::id()]);
        let _ = daemon.kill();
        let _ = daemon.wait();
        let error = outcome.expect_err("no systemd on this bus, no scope");
        assert!(!error.contains("panicked"), "{error}");
        assert!(error.contains("systemd1"), "the answer names the missing service: {error}");
    }
}
