//! The worker (`airlock-wasm-worker --guest`): a fresh, single-threaded
//! process the supervisor starts with fork+exec for each guest, never a fork
//! of the supervisor, which may be a multi-threaded server.
//!
//! Its standard input is a socket to the supervisor carrying one plan (see
//! `protocol`). It makes the process that runs the guest, then stays outside
//! it as its parent, out of its reach, to report how it ended and to kill it
//! if the supervisor goes away. The guest's process is built in the order
//! below, which is the security argument; every step is the Linux backend's
//! own (`airlock_linux::confine`):
//!
//! 1. with namespaces: join the sandbox's user and mount namespaces, then
//!    clone into fresh PID, mount, network, IPC, UTS and cgroup namespaces
//!    (born into the run's cgroup); become the sandbox's user; the program
//!    on a tmpfs of its own at /.airlock, with an empty report file the
//!    supervisor reads afterwards; pivot_root into the stage, so the
//!    worker sees only /work, /tmp, the interpreter and five devices;
//!    without: a plain child, as the sandbox's own reserved-range host id when the supervisor is root;
//! 2. rlimits; capabilities dropped and no_new_privs; Landlock (writes only
//!    to /work, /tmp and the report file; without a mount namespace, reads
//!    only of the stage and the interpreter too);
//! 3. the compiled module mapped from the descriptor the supervisor opened,
//!    the store built, the folders opened; then the open-file limit, which
//!    counts the worker's own descriptors, and seccomp last;
//! 4. the guest runs; the worker reports how it ended and exits.

use std::convert::Infallible;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use airlock_core::driver::{PROGRAM_DIR, REPORT_FILE};
use airlock_linux::confine;
use airlock_linux::protocol::{self, CgroupEntry, Failure};
use airlock_policy::Layer;
use rustix::fs::{Mode, OFlags};
use wasmtime::Module;

use crate::engine;
use crate::guest::{self, GuestSpec};
use crate::protocol::{FIXED_FDS, GuestPlan, WorkerReply, decode_filter};

/// The namespaces each guest's process gets, on top of the sandbox's user
/// and mount namespaces (the mount namespace is copied, so mounts stay per
/// run): the Linux backend's own set.
const GUEST_NAMESPACES: u64 = (libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// The descriptors a plan comes with.
struct PlanFds {
    stdout: OwnedFd,
    stderr: OwnedFd,
    stdin: OwnedFd,
    module: OwnedFd,
    namespaces: Option<(OwnedFd, OwnedFd)>,
    cgroup: Vec<OwnedFd>,
}

impl PlanFds {
    fn take(plan: &GuestPlan, fds: Vec<OwnedFd>) -> Result<PlanFds, Failure> {
        let expected = FIXED_FDS + if plan.namespaces { 2 } else { 0 } + plan.cgroup_fds;
        if fds.len() != expected {
            return Err(Failure::plain(
                "read the plan",
                format!("expected {expected} descriptors, received {}", fds.len()),
            ));
        }
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(|| Failure::plain("read the plan", "a descriptor is missing"));
        let (stdout, stderr, stdin, module) = (next()?, next()?, next()?, next()?);
        let namespaces = if plan.namespaces { Some((next()?, next()?)) } else { None };
        Ok(PlanFds { stdout, stderr, stdin, module, namespaces, cgroup: fds.collect() })
    }
}

/// The worker's `main` in guest mode.
pub fn main() -> ! {
    let socket = match confine::take_socket() {
        Ok(socket) => socket,
        // No supervisor to tell: it gave us no socket.
        Err(_) => std::process::exit(125),
    };
    let outcome = match protocol::recv_request::<GuestPlan>(socket.as_fd()) {
        Ok((plan, fds)) => PlanFds::take(&plan, fds).and_then(|fds| start(&plan, fds, socket.as_fd())),
        Err(e) => Err(Failure::plain("read the plan", e.to_string())),
    };
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(failure) => {
            let _ = protocol::send(socket.as_fd(), &WorkerReply::Failed(failure), &[]);
            std::process::exit(125);
        }
    }
}

/// Makes the guest's process and stays its parent until it ends.
fn start(plan: &GuestPlan, fds: PlanFds, socket: BorrowedFd<'_>) -> Result<(), Failure> {
    confine::die_with_parent(Some(plan.supervisor_pid))?;
    // Into the run's cgroup before the guest's process exists.
    let into_cgroup = match plan.cgroup {
        CgroupEntry::None => None,
        CgroupEntry::EnterTasks => {
            confine::enter_cgroup_v1(&fds.cgroup)?;
            None
        }
        CgroupEntry::CloneInto => {
            Some(fds.cgroup.first().ok_or_else(|| Failure::plain("enter the cgroup", "no cgroup directory"))?)
        }
    };
    let mut flags = 0;
    if let Some((user_ns, mount_ns)) = &fds.namespaces {
        confine::drop_supplementary_groups()?;
        confine::join_sandbox(user_ns, mount_ns)?;
        flags = GUEST_NAMESPACES;
    }
    // The guest's process learns whether this one, its parent, still lives
    // from the far end of this pipe: the worker holds the write end.
    let (alive_read, alive_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new("start the guest's process", "pipe", &e.into()))?;
    // SAFETY: the worker is single-threaded (a fresh exec that starts no threads).
    match unsafe { confine::clone_with_namespaces(flags, into_cgroup.map(AsFd::as_fd)) }
        .map_err(|e| Failure::new("start the guest's process", "clone3", &e))?
    {
        confine::Forked::Child => {
            drop(alive_write);
            let Err(failure) = guest_process(plan, fds, socket, alive_read);
            let _ = protocol::send(socket, &WorkerReply::Failed(failure), &[]);
            std::process::exit(125);
        }
        confine::Forked::Parent { pid, pidfd } => {
            drop(fds);
            let pidfd = pidfd.ok_or_else(|| Failure::plain("start the guest's process", "no pidfd"))?;
            protocol::send(socket, &WorkerReply::Started { pid }, &[pidfd.as_fd()])
                .map_err(|e| Failure::new("report the guest's process", "", &e))?;
            let (code, signal) = wait_for_guest(pid, &pidfd, socket);
            let _ = protocol::send(socket, &WorkerReply::Reaped { code, signal }, &[]);
            drop(alive_write);
            Ok(())
        }
    }
}

/// Waits for the guest's process; if the supervisor goes away first, kills
/// it. Returns its exit code or the signal that ended it.
fn wait_for_guest(pid: i32, pidfd: &OwnedFd, socket: BorrowedFd<'_>) -> (Option<i32>, Option<i32>) {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [PollFd::new(pidfd, PollFlags::IN), PollFd::new(&socket, PollFlags::empty())];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        if fds[1].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
            break;
        }
        if fds[0].revents().contains(PollFlags::IN) {
            break;
        }
    }
    let status = rustix::process::Pid::from_raw(pid)
        .and_then(|pid| rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()).ok().flatten());
    match status {
        Some((_, status)) => (status.exit_status(), status.terminating_signal()),
        None => (None, None),
    }
}

/// The process that runs the guest: confined step by step, then the guest.
fn guest_process(
    plan: &GuestPlan,
    fds: PlanFds,
    socket: BorrowedFd<'_>,
    parent_alive: OwnedFd,
) -> Result<Infallible, Failure> {
    report_panics_on(socket);
    let PlanFds { stdout, stderr, stdin, module, namespaces, cgroup } = fds;
    drop((namespaces, cgroup));
    let mut layers = vec![Layer::Wasm, Layer::Rlimits, Layer::NoNewPrivs];
    if plan.seccomp.is_some() {
        layers.push(Layer::Seccomp);
    }
    let program = if plan.namespaces {
        // Before anything is made: all of it belongs to the sandbox's user.
        confine::become_sandbox_user()?;
        let program = into_stage(plan)?;
        layers.extend(confine::NAMESPACE_LAYERS);
        program
    } else {
        if let Some((uid, gid)) = plan.run_as {
            become_user(uid, gid)?;
        }
        plain_program(plan)?
    };
    // After any change of user, which clears it; and if the worker died
    // before, the pipe says so. Either way no guest runs unwatched.
    confine::die_with_parent(None)?;
    confine::exit_if_parent_gone(parent_alive)?;
    confine::apply_rlimits(&plan.rlimits)?;
    if plan.namespaces || plan.drop_capabilities {
        // With no_new_privs.
        confine::drop_capabilities()?;
        if !plan.namespaces {
            layers.push(Layer::CapabilitiesDropped);
        }
    } else {
        rustix::thread::set_no_new_privs(true).map_err(|e| Failure::new("set no_new_privs", "", &e.into()))?;
    }
    if let Some(landlock) = &plan.landlock {
        let enforced = if plan.namespaces {
            confine::landlock(landlock)?
        } else {
            confine::landlock_reads_too(landlock, &plan.readable)?
        };
        if enforced != confine::LandlockEnforced::Not {
            layers.push(Layer::Landlock);
        }
    }
    ignore_file_size_signal()?;

    let step = "load the interpreter";
    let engine = engine::engine().map_err(|e| Failure::plain(step, e.to_string()))?;
    // SAFETY: the supervisor opened this descriptor on the compiled-module
    // cache after checking the file against the record written when it was
    // compiled (its identity stamp, or its whole SHA-256; see `cache.rs`),
    // so it holds native code wasmtime made for this engine configuration.
    // The cache is only ever replaced by rename, never written in place, so
    // the mapped file cannot change under the module.
    let module = unsafe { Module::deserialize_open_file(&engine, File::from(module)) }
        .map_err(|e| Failure::plain(step, format!("wasmtime refused the compiled interpreter: {e:#}")))?;
    let spec = GuestSpec {
        argv: plan.argv.clone(),
        env: plan.env.clone(),
        stdin: read_all(stdin).map_err(|e| Failure::new(step, "standard input", &e))?,
        stdout: File::from(stdout),
        stderr: File::from(stderr),
        preopens: plan.preopens.clone(),
        memory_bytes: plan.memory_bytes,
    };
    let mut prepared = guest::prepare(&engine, &module, spec).map_err(|detail| Failure::plain(step, detail))?;
    let seccomp = match &plan.seccomp {
        Some(text) => Some(decode_filter(text).ok_or_else(|| Failure::plain("seccomp", "the filter is not BPF"))?),
        None => None,
    };

    protocol::send(socket, &WorkerReply::Ready { layers, landlock_abi: confine::landlock_abi() }, &[program.as_fd()])
        .map_err(|e| Failure::new("report readiness", "", &e))?;
    drop(program);
    // Everything is open: the descriptors the guest may add are counted on
    // top of the worker's own from here.
    prepared.set_fd_limit(limit_open_files(plan.open_files)?);
    if let Some(seccomp) = &seccomp {
        confine::install_seccomp(seccomp).map_err(|e| Failure::new("seccomp", "", &e))?;
    }

    let _ = protocol::send(socket, &WorkerReply::Ended(prepared.run()), &[]);
    std::process::exit(0);
}

/// The supervisor's socket, for the panic hook.
static SOCKET: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// A panic in the guest's process (a bug of ours, or wasmtime's) is told to
/// the supervisor, which would otherwise see only an exit status: the
/// worker's own stderr goes nowhere.
fn report_panics_on(socket: BorrowedFd<'_>) {
    SOCKET.store(socket.as_raw_fd(), std::sync::atomic::Ordering::SeqCst);
    std::panic::set_hook(Box::new(|info| {
        let fd = SOCKET.load(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: the supervisor's socket is open for the whole life of the
        // process: nothing closes it, and the process exits after a panic.
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let failure = Failure::plain("run the guest", format!("the worker panicked: {info}"));
        let _ = protocol::send(socket, &WorkerReply::Failed(failure), &[]);
    }));
}

/// With namespaces, still in the sandbox's mount namespace (its stage at
/// `confine::STAGE`): the program on a tmpfs of its own at /.airlock, then
/// pivot_root into the stage. Returns the program folder.
fn into_stage(plan: &GuestPlan) -> Result<OwnedFd, Failure> {
    use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
    let step = "write the program";
    // The run's mounts stay in the run's copy of the namespace.
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| Failure::new("make mounts private", "/", &e.into()))?;
    // Unlocked for pivot_root, as the Linux backend's run root is.
    confine::bind_stage_onto_itself()?;
    let dir = Path::new(confine::STAGE).join(PROGRAM_DIR.trim_start_matches('/'));
    // Room for the program and for the report, whose cap the supervisor
    // enforces again when it reads it.
    let program: usize = plan.program_files.iter().map(|(_, c)| c.len().div_ceil(4096) * 4096).sum();
    let options = format!("size={},nr_inodes=16,mode=0755", program + plan.report_bytes + (64 << 10));
    let options_c = std::ffi::CString::new(options.clone()).map_err(|_| Failure::plain(step, "bad mount options"))?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    mount("tmpfs", &dir, "tmpfs", flags, Some(options_c.as_c_str()))
        .map_err(|e| Failure::new(step, format!("mount a tmpfs ({options})"), &e.into()))?;
    let folder = program_folder(&dir, &plan.program_files)?;
    confine::pivot_into_stage()?;
    Ok(folder)
}

/// Without namespaces: the program in the host stage's program folder,
/// emptied first (only the worker ever writes there, before Landlock).
/// Returns the folder.
fn plain_program(plan: &GuestPlan) -> Result<OwnedFd, Failure> {
    let dir = Path::new(&plan.program_dir);
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Failure::new("write the program", "empty the program folder", &e)),
    }
    fs::create_dir(dir).map_err(|e| Failure::new("write the program", "make the program folder", &e))?;
    program_folder(dir, &plan.program_files)
}

/// Writes the program's files (read-only) and an empty report file into
/// `dir`, and opens `dir` for the supervisor, which reads the report from it
/// once the guest is gone. The report is a plain file: WASI preview 1 writes
/// files at an offset, which a FIFO refuses.
fn program_folder(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<OwnedFd, Failure> {
    let step = "write the program";
    let fail = |what: &str, e: std::io::Error| Failure::new(step, what, &e);
    for (name, content) in files {
        if name.contains('/') || name.starts_with('.') || name == REPORT_FILE {
            return Err(Failure::plain(step, format!("bad program file name {name:?}")));
        }
        let path = dir.join(name);
        fs::write(&path, content)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o444)))
            .map_err(|e| fail(name, e))?;
    }
    // Made now, so that Landlock can name it as the one file the guest may write.
    fs::write(dir.join(REPORT_FILE), b"").map_err(|e| fail("the report file", e))?;
    rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())
        .map_err(|e| fail("open the program folder", e.into()))
}

/// Becomes host `uid` and `gid` with no supplementary groups (root, without
/// namespaces, runs the guest as the sandbox's own reserved-range id).
fn become_user(uid: u32, gid: u32) -> Result<(), Failure> {
    let step = "become the sandbox's user";
    rustix::thread::set_thread_groups(&[]).map_err(|e| Failure::new(step, "setgroups", &e.into()))?;
    let gid = rustix::process::Gid::from_raw(gid);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| Failure::new(step, "setresgid", &e.into()))?;
    let uid = rustix::process::Uid::from_raw(uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| Failure::new(step, "setresuid", &e.into()))
}

/// A write past RLIMIT_FSIZE fails with EFBIG, which the guest sees as an
/// error, instead of killing the worker with SIGXFSZ.
fn ignore_file_size_signal() -> Result<(), Failure> {
    // SAFETY: SIG_IGN installs no handler code; the process is single-threaded
    // here, so nothing races the change of disposition.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        return Err(Failure::new("ignore SIGXFSZ", "", &std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets RLIMIT_NOFILE so that the guest may hold `open_files` descriptors
/// besides those the worker holds now; returns the limit. Descriptors are
/// numbered from the lowest free one, and the limit bounds their numbers.
fn limit_open_files(open_files: u32) -> Result<u64, Failure> {
    let step = "set the open-file limit";
    let lowest_free =
        rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 0).map_err(|e| Failure::new(step, "dup", &e.into()))?;
    let first_unused = lowest_free.as_raw_fd() as u64;
    drop(lowest_free);
    // Gaps below it would be the guest's too.
    let gaps = first_unused - guest::open_descriptors(first_unused);
    let limit = first_unused + u64::from(open_files).saturating_sub(gaps);
    let rlimit = rustix::process::Rlimit { current: Some(limit), maximum: Some(limit) };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, rlimit)
        .map_err(|e| Failure::new(step, format!("RLIMIT_NOFILE {limit}"), &e.into()))?;
    Ok(limit)
}

fn read_all(fd: OwnedFd) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    File::from(fd).read_to_end(&mut data)?;
    Ok(data)
}
