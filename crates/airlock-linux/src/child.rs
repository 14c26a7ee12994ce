//! The helper (`airlock-init`): a fresh, single-threaded process the
//! supervisor starts with fork+exec for each sandbox and each run. The
//! supervisor may be a multi-threaded server or a Python process; nothing is
//! ever set up in a fork of it.
//!
//! Its standard input is a socket to the supervisor carrying one request
//! (see `protocol`). The order of the steps below is the security argument,
//! so each sits in one place and reads top to bottom.

use std::convert::Infallible;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use airlock_policy::Layer;

use crate::protocol::{self, CgroupEntry, Failure, Reply, Request, RunPlan, SetupPlan};
use crate::sys::{self, Forked};
use crate::{caps, cgroup, landlock, limits, mounts, network, probe, process, userns};

/// The namespaces each run gets, on top of the sandbox's user and mount
/// namespaces (the mount namespace is copied, so mounts stay per run).
const RUN_NAMESPACES: u64 = (libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// The helper's `main`.
pub fn main() -> ! {
    let socket = match take_socket() {
        Ok(socket) => socket,
        // No supervisor to tell: it gave us no socket.
        Err(_) => std::process::exit(125),
    };
    let outcome = match protocol::recv_request(socket.as_fd()) {
        Ok((Request::Setup(plan), _)) => setup(&plan, socket.as_fd()),
        Ok((Request::Run(plan), fds)) => run(&plan, fds, socket.as_fd()),
        Err(e) => Err(Failure::plain("read the request", e.to_string())),
    };
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(failure) => {
            let _ = protocol::send(socket.as_fd(), &Reply::Failed(failure), &[]);
            std::process::exit(125);
        }
    }
}

/// Moves the supervisor's socket off standard input and closes anything
/// else the helper may have inherited.
pub fn take_socket() -> std::io::Result<OwnedFd> {
    sys::close_from_except(3, -1)?;
    let socket = rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3)?;
    let null = rustix::fs::open("/dev/null", rustix::fs::OFlags::RDWR, rustix::fs::Mode::empty())?;
    rustix::stdio::dup2_stdin(null.as_fd())?;
    Ok(socket)
}

/// Makes a sandbox: its user and mount namespaces and the stage tmpfs with
/// /work, /tmp and the root, finished but for /proc and the program. The namespaces outlive this process
/// through the descriptors it hands back.
fn setup(plan: &SetupPlan, socket: BorrowedFd<'_>) -> Result<(), Failure> {
    process::die_with_parent(Some(plan.supervisor_pid))?;
    userns::drop_supplementary_groups()?;
    userns::enter_new()?;
    // Cloned with the caller's access to the host's files: the Python
    // installation may lie below a folder only the caller may enter.
    let trees = mounts::clone_binds(&plan.binds)?;
    userns::become_sandbox_user()?;
    // Again: the change of user cleared it.
    process::die_with_parent(Some(plan.supervisor_pid))?;
    mounts::mount_stage(plan.tmpfs_bytes, plan.tmpfs_inodes)?;
    mounts::create_layout(&plan.layout)?;
    mounts::attach_root(trees)?;
    let fds = [
        userns::open_own("user")?,
        userns::open_own("mnt")?,
        mounts::open_stage_dir("")?,
        mounts::open_stage_dir("work")?,
        mounts::open_stage_dir("tmp")?,
    ];
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    protocol::send(socket, &Reply::SetupDone, &borrowed).map_err(|e| Failure::new("hand over the sandbox", "", &e))
}

/// Runs one job: joins the sandbox, makes the run's own namespaces, and
/// stays as the parent of the sandbox's init until it ends.
fn run(plan: &RunPlan, fds: Vec<OwnedFd>, socket: BorrowedFd<'_>) -> Result<(), Failure> {
    if fds.len() < 5 {
        return Err(Failure::plain("read the request", "expected at least five descriptors"));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().ok_or_else(|| Failure::plain("read the request", "a descriptor is missing"));
    let (user_ns, mount_ns, stdin, stdout, stderr) = (next()?, next()?, next()?, next()?, next()?);
    let cgroup_fds: Vec<OwnedFd> = fds.collect();
    if cgroup_fds.len() != plan.cgroup_fds {
        return Err(Failure::plain(
            "read the request",
            format!("expected {} cgroup descriptors, received {}", plan.cgroup_fds, cgroup_fds.len()),
        ));
    }
    process::die_with_parent(Some(plan.supervisor_pid))?;
    // Into the run's cgroup before anything of the run exists.
    let into_cgroup = match plan.cgroup {
        CgroupEntry::None => None,
        CgroupEntry::EnterTasks => {
            cgroup::enter_self(&cgroup_fds)?;
            None
        }
        CgroupEntry::CloneInto => {
            Some(cgroup_fds.first().ok_or_else(|| Failure::plain("enter the cgroup", "no cgroup directory"))?)
        }
    };
    userns::drop_supplementary_groups()?;
    userns::join(&user_ns, &mount_ns)?;
    drop((user_ns, mount_ns));
    // The init learns whether this helper, its parent, still lives from the
    // far end of this pipe: the helper holds the write end until it exits.
    let (alive_read, alive_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new("create the run's namespaces", "pipe", &e.into()))?;
    // SAFETY: the helper is single-threaded (a fresh exec that starts no threads).
    match unsafe { sys::clone_with_namespaces(RUN_NAMESPACES, into_cgroup.map(AsFd::as_fd)) }
        .map_err(|e| Failure::new("create the run's namespaces", "clone3", &e))?
    {
        Forked::Child => {
            drop(alive_write);
            let Err(failure) = sandbox_init(plan, [stdin, stdout, stderr], socket, alive_read);
            let _ = protocol::send(socket, &Reply::Failed(failure), &[]);
            std::process::exit(125);
        }
        Forked::Parent { pid, pidfd } => {
            drop((stdin, stdout, stderr));
            let pidfd = pidfd.ok_or_else(|| Failure::plain("create the run's namespaces", "no pidfd"))?;
            protocol::send(socket, &Reply::Started { pid1: pid }, &[pidfd.as_fd()])
                .map_err(|e| Failure::new("report the sandbox's init", "", &e))?;
            wait_for_init(pid, &pidfd, socket);
            Ok(())
        }
    }
}

/// The helper outside waits for the sandbox's init; if the supervisor goes
/// away first, it kills the init (and with it every process of the run).
fn wait_for_init(pid: i32, pidfd: &OwnedFd, socket: BorrowedFd<'_>) {
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
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

/// PID 1 of the run's PID namespace. Builds the sandbox, starts the code,
/// reaps every process until the code exits. When it exits, the kernel kills
/// whatever the code left behind.
fn sandbox_init(
    plan: &RunPlan,
    stdio: [OwnedFd; 3],
    socket: BorrowedFd<'_>,
    parent_alive: OwnedFd,
) -> Result<Infallible, Failure> {
    // Before anything is made: all of it belongs to the sandbox's user.
    userns::become_sandbox_user()?;
    // After the change of user, which clears it.
    process::die_with_parent(None)?;
    // The death signal is set: if the helper died before that, it will not
    // come, but the pipe says so. Either way no code runs unwatched.
    process::exit_if_parent_gone(parent_alive)?;
    process::not_dumpable()?;
    rustix::system::sethostname(plan.hostname.as_bytes())
        .map_err(|e| Failure::new("set the hostname", "", &e.into()))?;
    network::loopback_up()?;
    let proxy = plan.proxy_listener.then(network::listen_proxy).transpose()?;
    let report = mounts::build_run_root(&plan.program_files, plan.report_fifo)?;
    mounts::pivot_into_stage()?;
    limits::apply(&plan.rlimits)?;
    caps::drop_all()?;
    let landlock = plan.landlock.as_ref().map(landlock::restrict).transpose()?;
    let exec = process::Exec::new(&plan.argv, &plan.env, &plan.cwd)?;

    // All of it in force from here; seccomp is installed in the code's own
    // process just before it execs.
    let mut layers = probe::NAMESPACE_LAYERS.to_vec();
    layers.extend([Layer::Seccomp, Layer::NoNewPrivs, Layer::Rlimits]);
    if matches!(landlock, Some(landlock::Enforced::Fully | landlock::Enforced::Partially)) {
        layers.push(Layer::Landlock);
    }
    let handed: Vec<BorrowedFd<'_>> = report.iter().chain(proxy.iter()).map(AsFd::as_fd).collect();
    protocol::send(socket, &Reply::Ready { layers, landlock_abi: sys::landlock_abi() }, &handed)
        .map_err(|e| Failure::new("report readiness", "", &e))?;
    drop((report, proxy));

    let code = process::spawn_code(&exec, stdio, &plan.seccomp)?;
    // The init itself also runs under the filter from here on.
    sys::install_seccomp(&plan.seccomp).map_err(|e| Failure::new("seccomp for init", "", &e))?;
    let ended = process::reap_until(code, plan.open_files);
    let reply = Reply::Exited { code: ended.code, signal: ended.signal, open_files_hit: ended.open_files_hit };
    let _ = protocol::send(socket, &reply, &[]);
    std::process::exit(0);
}
