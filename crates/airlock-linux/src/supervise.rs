//! The supervisor's side of one run: start the helper, put it in the run's
//! cgroup before it does anything, hand it the plan, then watch: output up
//! to its caps, the wall clock, CPU time, the kill switch. When time is up,
//! kill the sandbox's init, which takes every process of the run with it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_core::KillSwitch;
use airlock_core::output::{CappedBuffer, Captured};
use airlock_policy::{Layer, Limit, OutputOverflow};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use rustix::pipe::{PipeFlags, pipe_with};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use crate::cgroup::{Placement, RunCgroup};
use crate::protocol::{self, CgroupEntry, Failure, Reply, Request, RunPlan};

/// How long the sandbox may take to be ready before the run is abandoned.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often CPU time and the kill switch are looked at.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);
const CHUNK: usize = 64 * 1024;

/// What to watch a run with.
pub struct Watch<'a> {
    pub wall_time: Duration,
    pub cpu_time: Duration,
    pub output_bytes: u64,
    pub output_overflow: OutputOverflow,
    pub report_bytes: usize,
    pub stdin: &'a [u8],
    pub kill: &'a KillSwitch,
}

/// Why the supervisor stopped a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    WallTime,
    CpuTime,
    Output,
    Requested,
    SetupTimeout,
    /// The proxy for the allowed hosts could not start: the code must not
    /// run on, finding its network broken.
    ProxyFailed,
}

/// What the supervisor saw of a run.
#[derive(Debug, Default)]
pub struct Observed {
    pub failure: Option<Failure>,
    pub killed: Option<KillReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Whether the code's exit was reported (it ran and ended by itself).
    pub exited: bool,
    pub stdout: Captured,
    pub stderr: Captured,
    pub report: Vec<u8>,
    pub report_overflow: bool,
    pub layers: Vec<Layer>,
    pub landlock_abi: Option<u32>,
    pub wall: Duration,
    pub limits_hit: Vec<Limit>,
    /// CPU time of the helper and its reaped descendants, for hosts without a cgroup.
    pub rusage_cpu: Option<Duration>,
}

/// The descriptors handed to the run that stay with the sandbox.
pub struct SandboxFds<'a> {
    pub user_ns: BorrowedFd<'a>,
    pub mount_ns: BorrowedFd<'a>,
}

/// Called once the sandbox is ready, with the proxy's listening socket when
/// the plan asked for one; returns whether the proxy started (if not, the
/// run is killed at once).
pub type ProxyStart<'a> = dyn FnMut(OwnedFd) -> bool + 'a;

/// Starts the helper with a socket to it on its standard input. A fresh
/// exec: the supervisor may be multi-threaded, so nothing is set up in its
/// fork. The helper starts with an empty environment and `args`.
pub fn spawn_helper(helper: &Path, args: &[&str]) -> io::Result<(Child, OwnedFd)> {
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    let child = Command::new(helper)
        .args(args)
        .env_clear()
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting the helper {}: {e}", helper.display())))?;
    Ok((child, ours))
}

/// Waits up to `timeout` for one reply from the helper.
pub fn recv_within(socket: BorrowedFd<'_>, timeout: Duration) -> io::Result<Option<(Reply, Vec<OwnedFd>)>> {
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    let ts = rustix::time::Timespec::try_from(timeout).map_err(|_| io::Error::other("bad timeout"))?;
    if poll(&mut fds, Some(&ts))? == 0 {
        return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no answer from the helper within {timeout:?}")));
    }
    protocol::recv(socket)
}

/// Runs `plan` and watches it. Returns `Err` only when the helper could not
/// even be started.
pub fn run(
    helper: &Path,
    plan: RunPlan,
    sandbox: SandboxFds<'_>,
    cgroup: Option<&dyn RunCgroup>,
    watch: &Watch<'_>,
    on_proxy: &mut ProxyStart<'_>,
) -> io::Result<Observed> {
    let (wants_report, wants_proxy) = (plan.report_fifo, plan.proxy_listener);
    // How the helper enters the cgroup follows from the cgroup itself, so the
    // plan and the descriptors sent with it cannot disagree.
    let placement = cgroup.map(|c| c.placement()).transpose()?;
    let mut plan = plan;
    (plan.cgroup, plan.cgroup_fds) = match &placement {
        None => (CgroupEntry::None, 0),
        Some(Placement::EnterTasks(tasks)) => (CgroupEntry::EnterTasks, tasks.len()),
        Some(Placement::CloneInto(_)) => (CgroupEntry::CloneInto, 1),
    };
    let request = Request::Run(Box::new(plan));

    // Only our ends are non-blocking: the code writes to a blocking pipe, as
    // any program expects.
    let (stdout_read, stdout_write) = pipe_with(PipeFlags::CLOEXEC)?;
    let (stderr_read, stderr_write) = pipe_with(PipeFlags::CLOEXEC)?;
    rustix::fs::fcntl_setfl(&stdout_read, rustix::fs::OFlags::NONBLOCK)?;
    rustix::fs::fcntl_setfl(&stderr_read, rustix::fs::OFlags::NONBLOCK)?;
    // stdin: the caller's bytes through a pipe, or /dev/null.
    let (stdin_read, stdin_write) = if watch.stdin.is_empty() {
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        (null, None)
    } else {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
        rustix::fs::fcntl_setfl(&w, rustix::fs::OFlags::NONBLOCK)?;
        (r, Some(w))
    };

    let (mut child, ours) = spawn_helper(helper, &[])?;
    let helper_pid = child.id();
    let mut observed = Observed::default();

    let started = (|| -> io::Result<OwnedFd> {
        let pid = Pid::from_raw(helper_pid as i32).ok_or_else(|| io::Error::other("bad helper pid"))?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
        // The helper puts the run into its cgroup itself, before the run's
        // first process exists: every process, every byte, is counted.
        let mut fds =
            vec![sandbox.user_ns, sandbox.mount_ns, stdin_read.as_fd(), stdout_write.as_fd(), stderr_write.as_fd()];
        match &placement {
            Some(Placement::EnterTasks(tasks)) => fds.extend(tasks.iter().map(AsFd::as_fd)),
            Some(Placement::CloneInto(dir)) => fds.push(dir.as_fd()),
            None => {}
        }
        protocol::send_request(ours.as_fd(), &request, &fds)?;
        Ok(pidfd)
    })();
    drop((stdin_read, stdout_write, stderr_write));
    let helper_pidfd = match started {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };

    let mut stdout = CappedBuffer::new(watch.output_bytes);
    let mut stderr = CappedBuffer::new(watch.output_bytes);
    let mut stdout_open = true;
    let mut stderr_open = true;
    let mut stdin_write = stdin_write;
    let mut stdin_sent = 0usize;
    let mut report: Option<OwnedFd> = None;
    let mut init_pidfd: Option<OwnedFd> = None;
    let spawned_at = Instant::now();
    let mut ready_at: Option<Instant> = None;
    let mut ended_at: Option<Instant> = None;
    let mut next_check = Instant::now() + CHECK_INTERVAL;

    // Kills the run; the first reason given is the one recorded.
    let kill_now = |init: &Option<OwnedFd>| {
        match init {
            // Killing PID 1 of the namespace kills every process in it.
            Some(fd) => {
                let _ = pidfd_send_signal(fd, Signal::KILL);
            }
            None => {
                let _ = pidfd_send_signal(&helper_pidfd, Signal::KILL);
            }
        }
        if let Some(cgroup) = cgroup {
            cgroup.kill_all();
        }
    };
    let kill = |observed: &mut Observed, reason: KillReason, init: &Option<OwnedFd>| {
        observed.killed.get_or_insert(reason);
        kill_now(init);
    };

    let mut helper_done = false;
    while !helper_done {
        let now = Instant::now();
        // Deadlines.
        match ready_at {
            None if now.duration_since(spawned_at) > SETUP_TIMEOUT => {
                kill(&mut observed, KillReason::SetupTimeout, &init_pidfd)
            }
            Some(ready) if ended_at.is_none() && now.duration_since(ready) >= watch.wall_time => {
                kill(&mut observed, KillReason::WallTime, &init_pidfd)
            }
            _ => {}
        }
        if now >= next_check {
            next_check = now + CHECK_INTERVAL;
            if watch.kill.is_killed() {
                kill(&mut observed, KillReason::Requested, &init_pidfd);
            }
            if let Some(used) = cgroup.and_then(|c| c.cpu_usage()) {
                if used >= watch.cpu_time {
                    kill(&mut observed, KillReason::CpuTime, &init_pidfd);
                }
            }
        }
        let wall_deadline = ready_at.map(|r| r + watch.wall_time).unwrap_or(spawned_at + SETUP_TIMEOUT);
        let wake = next_check.min(wall_deadline);
        let timeout = wake.saturating_duration_since(Instant::now());

        let mut fds = vec![PollFd::new(&ours, PollFlags::IN), PollFd::new(&helper_pidfd, PollFlags::IN)];
        let stdout_slot = stdout_open.then(|| {
            fds.push(PollFd::new(&stdout_read, PollFlags::IN));
            fds.len() - 1
        });
        let stderr_slot = stderr_open.then(|| {
            fds.push(PollFd::new(&stderr_read, PollFlags::IN));
            fds.len() - 1
        });
        let stdin_slot = stdin_write.as_ref().map(|w| {
            fds.push(PollFd::new(w, PollFlags::OUT));
            fds.len() - 1
        });
        let report_slot = report.as_ref().map(|r| {
            fds.push(PollFd::new(r, PollFlags::IN));
            fds.len() - 1
        });
        let ts = rustix::time::Timespec::try_from(timeout.max(Duration::from_millis(1)))
            .unwrap_or(rustix::time::Timespec { tv_sec: 1, tv_nsec: 0 });
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let ready = |slot: Option<usize>| slot.is_some_and(|i| !fds[i].revents().is_empty());
        let socket_ready = !fds[0].revents().is_empty();
        helper_done = !fds[1].revents().is_empty();
        let (out_ready, err_ready, in_ready, rep_ready) =
            (ready(stdout_slot), ready(stderr_slot), ready(stdin_slot), ready(report_slot));
        drop(fds);

        if out_ready {
            stdout_open = drain(&stdout_read, &mut stdout);
        }
        if err_ready {
            stderr_open = drain(&stderr_read, &mut stderr);
        }
        if (stdout.is_over() || stderr.is_over()) && watch.output_overflow == OutputOverflow::Kill && ended_at.is_none()
        {
            kill(&mut observed, KillReason::Output, &init_pidfd);
        }
        if in_ready {
            if let Some(w) = &stdin_write {
                match rustix::io::write(w, &watch.stdin[stdin_sent..]) {
                    Ok(n) => stdin_sent += n,
                    Err(rustix::io::Errno::AGAIN) => {}
                    // EPIPE: the code closed its stdin; the rest is not wanted.
                    Err(_) => stdin_sent = watch.stdin.len(),
                }
            }
            if stdin_sent >= watch.stdin.len() {
                stdin_write = None;
            }
        }
        if rep_ready {
            if let Some(r) = &report {
                read_report(r, &mut observed, watch.report_bytes);
            }
        }
        if socket_ready {
            while let Some((reply, mut fds)) = recv_nonblocking(ours.as_fd()) {
                match reply {
                    Reply::Started { .. } => init_pidfd = fds.pop(),
                    Reply::Ready { layers, landlock_abi } => {
                        ready_at = Some(Instant::now());
                        observed.layers = layers;
                        observed.landlock_abi = landlock_abi;
                        let mut fds = fds.into_iter();
                        if wants_report {
                            report = fds.next();
                        }
                        // No listener handed over counts as a proxy that did
                        // not start: the code must not run on without it.
                        if wants_proxy && !fds.next().is_some_and(&mut *on_proxy) {
                            kill(&mut observed, KillReason::ProxyFailed, &init_pidfd);
                        }
                        if observed.killed.is_some() {
                            kill_now(&init_pidfd);
                        }
                    }
                    Reply::Exited { code, signal, open_files_hit } => {
                        if open_files_hit {
                            observed.limits_hit.push(Limit::OpenFiles);
                        }
                        ended_at = Some(Instant::now());
                        observed.exited = true;
                        observed.exit_code = code;
                        observed.signal = signal;
                    }
                    Reply::Failed(failure) => {
                        observed.failure.get_or_insert(failure);
                        kill_now(&init_pidfd);
                    }
                    Reply::SetupDone => {}
                }
            }
        }
    }

    // The helper has exited, so every process of the run is gone and every
    // writer of the pipes closed: what is left in them is all there is.
    // wait4 rather than Child::wait: its rusage sums the helper and every
    // descendant it and the init reaped, the CPU time of a run without a cgroup.
    observed.rusage_cpu = crate::sys::wait4_cpu_time(helper_pid as i32).ok();
    drop(child);
    drain(&stdout_read, &mut stdout);
    drain(&stderr_read, &mut stderr);
    if let Some(r) = &report {
        read_report(r, &mut observed, watch.report_bytes);
    }
    while let Some((reply, _)) = recv_nonblocking(ours.as_fd()) {
        match reply {
            Reply::Exited { code, signal, open_files_hit } if !observed.exited => {
                if open_files_hit {
                    observed.limits_hit.push(Limit::OpenFiles);
                }
                ended_at.get_or_insert_with(Instant::now);
                observed.exited = true;
                observed.exit_code = code;
                observed.signal = signal;
            }
            Reply::Failed(failure) => {
                observed.failure.get_or_insert(failure);
            }
            _ => {}
        }
    }
    if ready_at.is_none() && observed.failure.is_none() && observed.killed.is_none() {
        observed.failure =
            Some(Failure::plain("start the sandbox", "the helper exited without setting up the sandbox"));
    }
    let end = ended_at.unwrap_or_else(Instant::now);
    observed.wall = ready_at.map(|r| end.saturating_duration_since(r)).unwrap_or_default();
    if stdout.is_over() || stderr.is_over() {
        observed.limits_hit.push(Limit::Output);
    }
    observed.stdout = stdout.finish();
    observed.stderr = stderr.finish();
    Ok(observed)
}

/// Reads what a non-blocking pipe holds; false once it reached end of file.
pub fn drain(fd: &OwnedFd, into: &mut CappedBuffer) -> bool {
    let mut buf = [0u8; CHUNK];
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                into.push(&buf[..n]);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

fn read_report(fd: &OwnedFd, observed: &mut Observed, cap: usize) {
    let mut buf = [0u8; CHUNK];
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                // Past the cap, keep reading (so the writer never blocks) but keep nothing.
                if observed.report.len() + n <= cap {
                    observed.report.extend_from_slice(&buf[..n]);
                } else {
                    observed.report_overflow = true;
                }
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
    }
}

/// One message, if one is waiting.
pub fn recv_nonblocking<T: serde::de::DeserializeOwned>(socket: BorrowedFd<'_>) -> Option<(T, Vec<OwnedFd>)> {
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&zero)) {
        Ok(n) if n > 0 && fds[0].revents().contains(PollFlags::IN) => protocol::recv(socket).ok().flatten(),
        _ => None,
    }
}
