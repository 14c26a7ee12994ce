//! The helper (`airlock-init`): a fresh, single-threaded process the
//! supervisor starts with fork+exec for each sandbox and each run. The
//! supervisor may be a multi-threaded server or a Python process; nothing is
//! ever set up in a fork of it.
//!
//! Its standard input is a socket to the supervisor carrying one request
//! (see `protocol`). The order of the steps below is the security argument,
//! so each sits in one place and reads top to bottom.

use std::convert::Infallible;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use airlock_core::driver::{CODE_FIFO, READY_FILE, REPORT_FILE};
use airlock_policy::Layer;
use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use crate::hostid::IdMapping;
use crate::protocol::{self, CgroupEntry, CodeSetup, Control, Failure, Reply, Request, RunPlan, SetupPlan};
use crate::sys::{self, Forked};
use crate::{caps, cgroup, copy, landlock, limits, mounts, network, observe, process, userns};

/// The namespaces each run's init is made in, on top of the sandbox's user
/// and mount namespaces (the mount namespace is copied, so mounts stay per
/// run). Its cgroup namespace it makes itself, once inside the run's cgroup,
/// so that the run sees that cgroup as its root.
const RUN_NAMESPACES: u64 =
    (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as u64;

/// The init's namespaces the code joins, as the init hands them to the
/// helper (the code is born in the first; its mount namespace, with the
/// run's root, it joins last). Descriptors of the namespaces rather than the
/// init's pidfd: setns through a pidfd asks to trace the init, which is
/// undumpable.
const JOINED_NAMESPACES: [(&str, LinkNameSpaceType); 6] = [
    ("pid", LinkNameSpaceType::ProcessID),
    ("net", LinkNameSpaceType::Network),
    ("ipc", LinkNameSpaceType::InterProcessCommunication),
    ("uts", LinkNameSpaceType::HostNameAndNISDomainName),
    ("cgroup", LinkNameSpaceType::ControlGroup),
    ("mnt", LinkNameSpaceType::Mount),
];

/// The argument of a helper started ahead of a run's request (`spare`): it
/// makes the run's network namespace while it waits (see
/// [`network::make_ahead_of_run`]).
pub const RUN_SPARE_ARG: &str = "run-spare";

/// The helper's `main`; `run_spare` when started with [`RUN_SPARE_ARG`].
pub fn main(run_spare: bool) -> ! {
    let socket = match take_socket() {
        Ok(socket) => socket,
        // No supervisor to tell: it gave us no socket.
        Err(_) => std::process::exit(125),
    };
    let own_network = run_spare && network::make_ahead_of_run();
    let outcome = match protocol::recv_request(socket.as_fd()) {
        Ok((Request::Setup(plan), _)) => setup(&plan, socket.as_fd()),
        Ok((Request::Run(plan), fds)) => run(&plan, fds, socket.as_fd(), own_network),
        Ok((Request::Open(plan), fds)) => copy::open_for_supervisor(&plan, fds, socket.as_fd()),
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
/// /work, /tmp and the root, finished but for /proc and the program. The
/// namespaces outlive this process through the descriptors it hands back.
fn setup(plan: &SetupPlan, socket: BorrowedFd<'_>) -> Result<(), Failure> {
    process::die_with_parent(Some(plan.supervisor_pid))?;
    userns::drop_supplementary_groups()?;
    let (bytes, inodes) = (plan.tmpfs_bytes, plan.tmpfs_inodes);
    let (shown, _built_in) = match plan.ids {
        // Root builds the root in a mount namespace of its own, with its
        // access to the host's files, every file of it the sandbox user's;
        // then becomes that user for good, who makes the user namespace (one
        // it owns: the kernel charges its per-user budgets to this id alone)
        // with a copy of the finished root in it. The namespace it was built
        // in is held until the sandbox is handed over, so that its teardown
        // (its mounts, an RCU grace period) comes after the hand-over, which
        // is all the supervisor waits for, not inside the unshare.
        IdMapping::Reserved { uid, gid } => {
            mounts::enter_private_namespace()?;
            let built_in = userns::open_own("mnt")?;
            let trees = mounts::hide_host_paths(mounts::clone_binds(&plan.binds, mounts::Devices::OwnNodes)?)?;
            mounts::build_root(bytes, inodes, &plan.layout, trees.trees, Some((uid, gid)))?;
            userns::become_host_ids(uid, gid)?;
            userns::enter_new(&plan.ids)?;
            userns::become_sandbox_user()?;
            (trees.host_paths_shown, Some(built_in))
        }
        // An ordinary user makes the namespace first (it needs no privilege
        // then), clones the trees with its own access to the host's files
        // (the Python installation may lie below a folder only it may
        // enter), and builds the root as the sandbox's user.
        IdMapping::Caller | IdMapping::Subordinate { .. } => {
            userns::enter_new(&plan.ids)?;
            let clones = mounts::clone_binds(&plan.binds, mounts::Devices::Hosts)?;
            userns::become_sandbox_user()?;
            let trees = mounts::hide_host_paths(clones)?;
            mounts::build_root(bytes, inodes, &plan.layout, trees.trees, None)?;
            (trees.host_paths_shown, None)
        }
    };
    // Again: the change of user cleared it.
    process::die_with_parent(Some(plan.supervisor_pid))?;
    let fds = [
        userns::open_own("user")?,
        userns::open_own("mnt")?,
        mounts::open_stage_dir("")?,
        mounts::open_stage_dir("work")?,
        mounts::open_stage_dir("tmp")?,
    ];
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    protocol::send(socket, &Reply::SetupDone { host_paths_shown: shown }, &borrowed)
        .map_err(|e| Failure::new("hand over the sandbox", "", &e))
}

/// The descriptors a run's request brings: the sandbox's namespaces, the
/// code's three streams, the native library's memfd if the plan says so, the
/// run's cgroup.
struct RunFds {
    user_ns: OwnedFd,
    mount_ns: OwnedFd,
    stdio: [OwnedFd; 3],
    native: Option<OwnedFd>,
    cgroup: Vec<OwnedFd>,
}

impl RunFds {
    fn take(plan: &RunPlan, fds: Vec<OwnedFd>) -> Result<RunFds, Failure> {
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(|| Failure::plain("read the request", "a descriptor is missing"));
        let (user_ns, mount_ns, stdin, stdout, stderr) = (next()?, next()?, next()?, next()?, next()?);
        let native = if plan.native_library { Some(next()?) } else { None };
        let cgroup: Vec<OwnedFd> = fds.collect();
        if cgroup.len() != plan.cgroup_fds || (plan.cgroup == CgroupEntry::CloneInto && cgroup.len() != 1) {
            return Err(Failure::plain(
                "read the request",
                format!("expected {} cgroup descriptors, received {}", plan.cgroup_fds, cgroup.len()),
            ));
        }
        Ok(RunFds { user_ns, mount_ns, stdio: [stdin, stdout, stderr], native, cgroup })
    }

    /// The cgroup directory the helper makes the run's processes in (v2).
    fn clone_into(&self, plan: &RunPlan) -> Option<BorrowedFd<'_>> {
        (plan.cgroup == CgroupEntry::CloneInto).then(|| self.cgroup.first().map(AsFd::as_fd)).flatten()
    }

    /// The `tasks` files the run's processes move themselves with (v1).
    fn tasks(&self, plan: &RunPlan) -> &[OwnedFd] {
        if plan.cgroup == CgroupEntry::EnterTasks { &self.cgroup } else { &[] }
    }
}

/// Runs one job, in two steps: make the sandbox ready (the run's init and
/// its root), then, when the supervisor releases it, the code. The helper
/// stays outside the run: the parent of both, which no process of the run
/// can name, signal, trace or limit; it sees how the code ends and says so.
/// Makes a run and watches it; `own_network` when this helper made the
/// run's network namespace ahead of the request and is in it.
fn run(plan: &RunPlan, fds: Vec<OwnedFd>, socket: BorrowedFd<'_>, own_network: bool) -> Result<(), Failure> {
    let fds = RunFds::take(plan, fds)?;
    process::die_with_parent(Some(plan.supervisor_pid))?;
    userns::drop_supplementary_groups()?;
    userns::join(&fds.user_ns, &fds.mount_ns)?;
    let exec = process::Exec::new(&plan.argv, &plan.env, &plan.cwd)?;

    let mut init = start_init(plan, &fds, own_network)?;
    protocol::send(socket, &Reply::Started { pid1: init.child.pid }, &[init.child.pidfd.as_fd()])
        .map_err(|e| Failure::new("report the sandbox's init", "", &e))?;
    let handed = init.wait_ready()?;
    let borrowed: Vec<BorrowedFd<'_>> = handed.iter().map(AsFd::as_fd).collect();
    protocol::send(socket, &Reply::Ready, &borrowed).map_err(|e| Failure::new("report readiness", "", &e))?;
    drop(handed);

    // The supervisor starts the proxy here (a pool of ready sandboxes would
    // hold here until a run claims one).
    if plan.hold_for_release {
        wait_for_release(socket)?;
    }
    // The init finishes the run's root after its readiness: a step that
    // failed there is its last word, sent before it exits and so before the
    // kernel ends the code's process with it. That word, not the code's
    // (a fork into a dead namespace, a setup cut short), says what happened.
    let code = start_code(plan, &exec, fds, &init, own_network)
        .map_err(|failure| init_failure(init.socket.as_fd()).unwrap_or(failure))?;
    if let Some(failure) = init_failure(init.socket.as_fd()) {
        return Err(failure);
    }
    let reply =
        Reply::CodeStarted { code_pid: code.child.pid, layers: code.layers.clone(), landlock_abi: sys::landlock_abi() };
    protocol::send(socket, &reply, &[]).map_err(|e| Failure::new("report the code's start", "", &e))?;

    let ended = observe::until_ended(code.child.pidfd.as_fd(), init.child.pidfd.as_fd(), init.socket.as_fd(), socket)?;
    let code_reaped_ns = Some(ended.code_reaped_ns);
    protocol::send(socket, &Reply::Ended { code: ended.code, init_first: ended.init_first, code_reaped_ns }, &[])
        .map_err(|e| Failure::new("report the code's end", "", &e))
}

/// The failure the init reported on `socket`, if it did (it may, after its
/// readiness, while it finishes the root); never waits.
fn init_failure(socket: BorrowedFd<'_>) -> Option<Failure> {
    match crate::supervise::recv_nonblocking::<Reply>(socket) {
        Ok(Some((Reply::Failed(failure), _))) => Some(failure),
        _ => None,
    }
}

/// Waits for the supervisor's word to start the code.
fn wait_for_release(socket: BorrowedFd<'_>) -> Result<(), Failure> {
    match protocol::recv::<Control>(socket) {
        Ok(Some((Control::Release, _))) => Ok(()),
        Ok(None) => Err(Failure::plain("wait for the code's release", "the supervisor hung up")),
        Err(e) => Err(Failure::new("wait for the code's release", "", &e)),
    }
}

/// A child of the helper, as the helper holds it.
struct Child {
    pid: i32,
    pidfd: OwnedFd,
    /// The write end of the child's lifeline, held until the helper exits.
    _alive: OwnedFd,
}

/// The run's init; its socket, on which it says it is ready and which it
/// holds until it dies; its namespaces.
struct Init {
    child: Child,
    socket: OwnedFd,
    namespaces: Vec<OwnedFd>,
    /// Where the init says its root is finished (see [`sandbox_init`]).
    seal: Option<OwnedFd>,
}

impl Init {
    /// Waits until the init is ready; keeps its namespaces and returns the
    /// descriptors it made for the supervisor.
    fn wait_ready(&mut self) -> Result<Vec<OwnedFd>, Failure> {
        let step = "make the run's root";
        match protocol::recv::<Reply>(self.socket.as_fd()) {
            Ok(Some((Reply::Ready, mut fds))) if fds.len() > JOINED_NAMESPACES.len() => {
                let handed = fds.split_off(JOINED_NAMESPACES.len() + 1);
                self.seal = fds.pop();
                self.namespaces = fds;
                Ok(handed)
            }
            Ok(Some((Reply::Ready, _))) => Err(Failure::plain(step, "the init did not hand over its namespaces")),
            Ok(Some((Reply::Failed(failure), _))) => Err(failure),
            Ok(Some((other, _))) => Err(Failure::plain(step, format!("the init said {other:?}"))),
            Ok(None) => Err(Failure::plain(step, "the init ended without a word")),
            Err(e) => Err(Failure::new(step, "", &e)),
        }
    }
}

/// Makes the run's init in new PID, mount (a copy of the sandbox's),
/// network (unless `own_network`: the helper's own, made for the run),
/// IPC and UTS namespaces, in the run's cgroup.
fn start_init(plan: &RunPlan, fds: &RunFds, own_network: bool) -> Result<Init, Failure> {
    let step = "create the run's namespaces";
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(|e| Failure::new(step, "socketpair", &e.into()))?;
    let (alive_read, alive_write) = process::lifeline()?;
    let namespaces = if own_network { RUN_NAMESPACES & !(libc::CLONE_NEWNET as u64) } else { RUN_NAMESPACES };
    // SAFETY: the helper is single-threaded (a fresh exec that starts no threads).
    match unsafe { sys::clone_with_namespaces(namespaces, fds.clone_into(plan)) }
        .map_err(|e| Failure::new(step, "clone3", &e))?
    {
        Forked::Child => {
            drop((ours, alive_write));
            let Err(failure) = sandbox_init(plan, fds.tasks(plan), theirs.as_fd(), alive_read, own_network);
            let _ = protocol::send(theirs.as_fd(), &Reply::Failed(failure), &[]);
            std::process::exit(125);
        }
        Forked::Parent { pid, pidfd } => {
            let pidfd = pidfd.ok_or_else(|| Failure::plain(step, "no pidfd"))?;
            Ok(Init {
                child: Child { pid, pidfd, _alive: alive_write },
                socket: ours,
                namespaces: Vec::new(),
                seal: None,
            })
        }
    }
}

/// PID 1 of the run's PID namespace. Makes the run's root, saying it is
/// ready halfway (see below) and sealing it once finished, then does nothing
/// but reap orphans. It watches nothing and reports nothing
/// once the code runs: the code may reach it (same user), so its death is
/// an observation, never a loss. When it dies, the kernel ends every
/// process of the run.
fn sandbox_init(
    plan: &RunPlan,
    tasks: &[OwnedFd],
    helper: BorrowedFd<'_>,
    parent_alive: OwnedFd,
    own_network: bool,
) -> Result<Infallible, Failure> {
    // Before anything is made: all of it belongs to the sandbox's user.
    userns::become_sandbox_user()?;
    // After the change of user, which clears it; then, if the helper died
    // before it was set, the lifeline says so. No code runs unwatched.
    process::die_with_parent(None)?;
    process::exit_if_parent_gone(parent_alive)?;
    cgroup::enter_self(tasks)?;
    cgroup::own_namespace()?;
    // Nothing of the helper's (its socket to the supervisor, the code's
    // streams) stays in the init. (The init never returns into the frames
    // that own them: it ends in exit or in the reaper.)
    sys::close_from_except(3, helper.as_raw_fd()).map_err(|e| Failure::new("close descriptors", "", &e))?;
    process::not_dumpable()?;
    rustix::system::sethostname(plan.hostname.as_bytes())
        .map_err(|e| Failure::new("set the hostname", "", &e.into()))?;
    if !own_network {
        network::loopback_up()?;
    }
    let proxy = plan.proxy_listener.then(network::listen_proxy).transpose()?;
    let fifos: Vec<&str> =
        [(plan.report_fifo, REPORT_FILE), (plan.ready_fifo, READY_FILE), (plan.code_fifo, CODE_FIFO)]
            .into_iter()
            .filter_map(|(wanted, name)| wanted.then_some(name))
            .collect();
    let handed_fifos = mounts::build_run_root(&plan.program_files, &fifos)?;
    let namespaces = JOINED_NAMESPACES.iter().map(|(kind, _)| userns::open_own(kind)).collect::<Result<Vec<_>, _>>()?;
    // The helper gets what it needs to make the code's process now, and the
    // rest of the root is made meanwhile: /proc and its masks (about forty
    // mounts), then the stage as the root and the old one detached (an
    // unmount, which waits for an RCU grace period). The helper's fork of
    // the code's process takes about as long, and now overlaps this instead
    // of following it. The code's process joins this mount namespace only
    // once the seal says the root is finished (see `await_seal`); a seal
    // closed unsaid (this init failed) stops it.
    let (seal_read, seal_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new("seal the run's root", "pipe", &e.into()))?;
    let handed: Vec<BorrowedFd<'_>> =
        namespaces.iter().chain([&seal_read]).chain(handed_fifos.iter()).chain(proxy.iter()).map(AsFd::as_fd).collect();
    protocol::send(helper, &Reply::Ready, &handed).map_err(|e| Failure::new("report readiness", "", &e))?;
    drop((namespaces, seal_read, handed_fifos, proxy));
    mounts::mount_run_proc()?;
    mounts::pivot_onto_stage()?;
    mounts::detach_old_root()?;
    // The root is finished: the init needs no capability from here on, and
    // gives them all up before the code's process may join it, so that no
    // code ever runs beside an init that holds one. (Its filter comes after
    // the seal: loading it takes longer, and the code's process waits.)
    caps::drop_all()?;
    rustix::io::write(&seal_write, &[ROOT_SEALED]).map_err(|e| Failure::new("seal the run's root", "", &e.into()))?;
    drop(seal_write);
    // The socket stays open until the init dies: its hanging up tells the
    // helper the init died, before the kernel ends the rest of the run.
    sys::close_from_except(3, helper.as_raw_fd()).map_err(|e| Failure::new("close descriptors", "", &e))?;
    sys::install_seccomp(&plan.seccomp).map_err(|e| Failure::new("seccomp for init", "", &e))?;
    sys::reap_orphans_forever()
}

/// The code's process as the helper holds it, with the layers it put in force.
struct Code {
    child: Child,
    layers: Vec<Layer>,
}

/// Makes the code's process, the helper's child, in the run's PID namespace,
/// and waits until it has executed the program.
fn start_code(
    plan: &RunPlan,
    exec: &process::Exec,
    fds: RunFds,
    init: &Init,
    own_network: bool,
) -> Result<Code, Failure> {
    let step = "start the code";
    // Children made from here on are born in the init's PID namespace.
    let (pid_ns, joined) = init.namespaces.split_first().ok_or_else(|| Failure::plain(step, "no namespaces"))?;
    move_into_link_name_space(pid_ns.as_fd(), Some(LinkNameSpaceType::ProcessID))
        .map_err(|e| Failure::new(step, "join the run's PID namespace", &e.into()))?;
    let (alive_read, alive_write) = process::lifeline()?;
    let (setup_read, setup_write) = process::setup_pipe()?;
    // SAFETY: the helper is single-threaded (a fresh exec that starts no threads).
    match unsafe { sys::clone_with_namespaces(0, fds.clone_into(plan)) }
        .map_err(|e| Failure::new(step, "clone3", &e))?
    {
        Forked::Child => {
            drop((alive_write, setup_read));
            let root = InitRoot { namespaces: joined, seal: init.seal.as_ref().map(AsFd::as_fd) };
            let Err(failure) = code_process(plan, exec, &fds, root, alive_read, setup_write.as_fd(), own_network);
            process::report_setup(setup_write.as_fd(), &CodeSetup::Failed(failure));
            std::process::exit(127);
        }
        Forked::Parent { pid, pidfd } => {
            drop((alive_read, setup_write, fds));
            let pidfd = pidfd.ok_or_else(|| Failure::plain(step, "no pidfd"))?;
            let landlock = process::read_setup(setup_read, &exec.argv[0])?;
            // All of it in force: seccomp was the code's last step before exec.
            let layers = process::layers_in_force(landlock);
            Ok(Code { child: Child { pid, pidfd, _alive: alive_write }, layers })
        }
    }
}

/// What the code's process joins of the init's: its namespaces but the PID
/// namespace (the process is born in that one), and the seal of its root.
struct InitRoot<'a> {
    namespaces: &'a [OwnedFd],
    seal: Option<BorrowedFd<'a>>,
}

/// The byte a run's init writes once its root is finished: /proc masked,
/// the old root detached.
const ROOT_SEALED: u8 = b'S';

/// Waits until the init has finished the root of the mount namespace the
/// code is about to join: until then its /proc is unmasked or missing and
/// the host's filesystem is reachable there. Anything but the seal (the
/// init failed, or said something else) stops the code.
fn await_seal(seal: Option<BorrowedFd<'_>>) -> Result<(), Failure> {
    let step = "join the run's namespaces";
    let seal = seal.ok_or_else(|| Failure::plain(step, "the init handed over no seal of the run's root"))?;
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(seal, &mut byte) {
            Ok(1) if byte[0] == ROOT_SEALED => return Ok(()),
            Ok(0) => return Err(Failure::plain(step, "the init ended before the run's root was sealed")),
            Ok(_) => return Err(Failure::plain(step, "the init's seal of the run's root was not the seal")),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(Failure::new(step, "read the root's seal", &e.into())),
        }
    }
}

/// The code's process, in this order; returns only if a step failed.
fn code_process(
    plan: &RunPlan,
    exec: &process::Exec,
    fds: &RunFds,
    root: InitRoot<'_>,
    parent_alive: OwnedFd,
    setup: BorrowedFd<'_>,
    own_network: bool,
) -> Result<Infallible, Failure> {
    userns::become_sandbox_user()?;
    process::die_with_parent(None)?;
    process::exit_if_parent_gone(parent_alive)?;
    cgroup::enter_self(fds.tasks(plan))?;
    // The rest of the init's namespaces, its root last. A network
    // namespace the helper made ahead is the init's and already this
    // process's (and belongs to the host's user namespace, which this
    // process could not join it through).
    // Nothing of the init's is joined before its root is finished.
    await_seal(root.seal)?;
    let joined = root.namespaces.iter().zip(&JOINED_NAMESPACES[1..]);
    for (fd, (kind, ns)) in joined.filter(|(_, (kind, _))| !(own_network && *kind == "net")) {
        move_into_link_name_space(fd.as_fd(), Some(*ns))
            .map_err(|e| Failure::new("join the run's namespaces", *kind, &e.into()))?;
    }
    limits::apply(&plan.rlimits)?;
    if plan.template {
        // A forked pool's template: its forks make their own namespaces,
        // mounts and Landlock domain (see `fork`); the plan carries the
        // template's filter, and no Landlock plan.
        caps::keep_only_sys_admin()?;
    } else {
        caps::drop_all()?;
    }
    if let Some(landlock) = plan.landlock.as_ref().filter(|_| !plan.template) {
        process::report_setup(setup, &CodeSetup::Landlock(landlock::restrict(landlock)?));
    }
    Err(process::exec_code(exec, &fds.stdio, fds.native.as_ref().map(AsFd::as_fd), setup, &plan.seccomp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal() -> (OwnedFd, OwnedFd) {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
    }

    #[test]
    fn the_code_joins_a_root_the_init_sealed() {
        let (read, write) = seal();
        rustix::io::write(&write, &[ROOT_SEALED]).unwrap();
        drop(write);
        await_seal(Some(read.as_fd())).unwrap();
    }

    #[test]
    fn a_seal_closed_unsaid_stops_the_code() {
        // The init failed (or died) between its readiness and the detach of
        // the old root: its end of the seal closes without a word.
        let (read, write) = seal();
        drop(write);
        let failure = await_seal(Some(read.as_fd())).unwrap_err();
        assert!(failure.to_string().contains("before the run's root was sealed"), "{failure}");
    }

    #[test]
    fn what_the_init_said_before_it_failed_is_what_the_helper_reports() {
        let (helper, init) =
            socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        assert!(init_failure(helper.as_fd()).is_none(), "nothing said: nothing to report, and no wait");
        let said = Failure::plain("mount /proc", "refused");
        protocol::send(init.as_fd(), &Reply::Failed(said), &[]).unwrap();
        drop(init);
        let failure = init_failure(helper.as_fd()).expect("the init's failure");
        assert!(failure.to_string().contains("mount /proc"), "{failure}");
    }

    #[test]
    fn anything_but_the_seal_stops_the_code() {
        let (read, write) = seal();
        rustix::io::write(&write, b"X").unwrap();
        let failure = await_seal(Some(read.as_fd())).unwrap_err();
        assert!(failure.to_string().contains("was not the seal"), "{failure}");
        assert!(await_seal(None).unwrap_err().to_string().contains("no seal"));
    }
}
