//! The supervisor's side of one run: start the helper, hand it the plan,
//! release the code once the sandbox is ready, and watch: the wall clock,
//! CPU time, the kill switch, the output up to its caps, the limits the
//! kernel keeps no count of. When time is up, kill the run's init, which
//! takes every process of the run with it.
//!
//! [`Run`] is the run's state, with one method per event. Every turn of its
//! loop first keeps time, then does at most one bounded step per ready
//! source (see `drain`), so nothing the code does with its pipes can delay
//! a deadline by more than one turn. Once the code has started, nothing is
//! ever thrown away: a failure of airlock's own is noted beside what was
//! observed, the helper is always reaped, and the caller gets it all.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_core::KillSwitch;
use airlock_core::output::Captured;
use airlock_policy::{Layer, Limit, NetworkPolicy, OutputOverflow};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use rustix::pipe::{PipeFlags, pipe_with};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use airlock_core::driver;

use crate::cgroup::{Placement, RunCgroup};
use crate::drain::Stream;
use crate::protocol::{self, CgroupEntry, Control, Failure, ProcessEnd, Reply, Request, RunPlan};
use crate::sampler::{self, Sampler};

/// How long the sandbox may take to be ready before the run is abandoned.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often CPU time and the kill switch are looked at.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// How long the helper has to end the run after it was killed, before it is
/// killed too.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// What to watch a run with.
pub struct Watch<'a> {
    pub wall_time: Duration,
    pub cpu_time: Duration,
    pub output_bytes: u64,
    pub output_overflow: OutputOverflow,
    pub report_bytes: usize,
    pub stdin: &'a [u8],
    pub kill: &'a KillSwitch,
    /// The open-file limit, for telling whether the run reached it.
    pub open_files: u64,
    /// The stage tmpfs (/work, /tmp), for telling whether it filled.
    pub stage: BorrowedFd<'a>,
}

/// Why the supervisor stopped a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    WallTime,
    CpuTime,
    Output,
    Requested,
    SetupTimeout,
    /// The proxy for the allowed hosts could not start: the code is never
    /// released without it.
    ProxyFailed,
    /// Its socket buffers reached the memory cap (cgroup v1).
    SocketMemory,
}

/// What the supervisor saw of a run.
#[derive(Debug, Default)]
pub struct Observed {
    /// Whether the code's process executed the program.
    pub started: bool,
    /// The step that failed before the code started (it never ran).
    pub setup_failure: Option<Failure>,
    /// Failures of airlock's own after the code started.
    pub failures: Vec<String>,
    pub killed: Option<KillReason>,
    /// How the code's process ended, as the helper, its parent, saw it.
    pub code_end: Option<ProcessEnd>,
    /// How the run's init ended, when it died before the code.
    pub init_first: Option<ProcessEnd>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub report: Vec<u8>,
    pub report_overflow: bool,
    pub layers: Vec<Layer>,
    pub landlock_abi: Option<u32>,
    /// From the code's start to its end.
    pub wall: Duration,
    /// Limits seen reached: output, disk, inodes, open files.
    pub reached: BTreeSet<Limit>,
    pub notes: Vec<String>,
    /// CPU time of the helper and its reaped descendants, for hosts without a cgroup.
    pub rusage_cpu: Option<Duration>,
    /// A warm run's CPU time (the cgroup's) when its code was released: the
    /// preload's, not charged to the run.
    pub cpu_before_release: Option<Duration>,
    /// A warm run's counts of the memory and process limits reached when
    /// its preload was done: the preload's (the driver's huge-page collapse
    /// may reach a tight memory limit), not the run's.
    pub preload_limit_hits: LimitHits,
    /// From the run's request (a cold run: the helper's start) to the code's
    /// first instruction, as the driver announced it.
    pub first_instruction: Option<Duration>,
    /// A warm run's memory (bytes) and process limits, where its claim
    /// lowered them: the limits in force for the code.
    pub lowered: Lowered,
    /// The run was forked from a template (see `forked`).
    pub forked: bool,
}

/// How many times a run's cgroup counted its memory and its process limit
/// reached (see [`crate::cgroup::CgroupStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitHits {
    pub memory: u64,
    pub processes: u64,
}

/// The limits a claim set, `None` where it kept the sandbox's: its memory
/// and process limits where it lowered them, its wall and CPU time (at
/// most the sandbox's) always.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lowered {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    pub wall_time: Option<Duration>,
    pub cpu_time: Option<Duration>,
}

/// What a claim gives a warm run (its driver blocked on the code FIFO,
/// preload imported) when it releases the code. From then on the run is
/// the claim's: its clocks, its kill switch, its standard input.
pub struct Release {
    /// The bytes for the code FIFO (`driver::feed`).
    pub feed: Vec<u8>,
    /// The run's network: its proxy starts at the release where it allows
    /// hosts; otherwise the sandbox's listener is closed, and nothing
    /// listens where the proxy would.
    pub network: NetworkPolicy,
    pub stdin: Vec<u8>,
    pub wall_time: Duration,
    pub cpu_time: Duration,
    pub kill: KillSwitch,
    /// When the run was asked for: where its time to first instruction starts.
    pub requested_at: Instant,
}

/// Called once, when a warm run's driver says its preload is imported,
/// with the run as it waits ([`Waiting`]). Returns the release of the run
/// that claimed it, or `None` to end the run unclaimed.
pub type Gate<'a> = dyn FnMut(&Waiting<'_>) -> Option<Release> + 'a;

/// A warm run waiting in its gate, as the claim sees it.
pub struct Waiting<'a> {
    alive: &'a dyn Fn() -> bool,
    cgroup: Option<&'a dyn RunCgroup>,
    lowered: std::cell::Cell<Lowered>,
    forked: Option<&'a crate::forked::ForkRoot>,
}

impl Waiting<'_> {
    /// Whether the run still stands (the code's process and the helper alive).
    pub fn alive(&self) -> bool {
        (self.alive)()
    }

    /// A forked run's own /work and /tmp (a cold or pooled run's are its sandbox's).
    pub fn fork_root(&self) -> Option<&crate::forked::ForkRoot> {
        self.forked
    }

    /// The file where the kernel keeps the memory the run holds.
    pub fn memory_usage_file(&self) -> Option<std::path::PathBuf> {
        self.cgroup.map(|c| c.memory_usage_file())
    }

    /// Lowers the run's memory limit (bytes) and process limit (the code's,
    /// as the policy counts them) in its cgroup, from outside, before its
    /// code is released; refused where it already uses that much.
    pub fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String> {
        if memory_bytes.is_none() && pids.is_none() {
            return Ok(());
        }
        let cgroup = self.cgroup.ok_or("it has no cgroup whose limits could be lowered")?;
        cgroup.lower_limits(memory_bytes, pids.map(|p| p + crate::cgroup::AIRLOCK_PROCESSES))?;
        self.lowered.set(Lowered { memory_bytes, pids, ..Lowered::default() });
        Ok(())
    }
}

/// The descriptors handed to the run that stay with the sandbox.
pub struct SandboxFds<'a> {
    pub user_ns: BorrowedFd<'a>,
    pub mount_ns: BorrowedFd<'a>,
    /// The code's standard input, when it is not the caller's bytes: a
    /// template's control socket (closed here once the helper has it).
    pub stdin: Option<OwnedFd>,
    /// The native library's sealed memfd, for a driver that loads it (see
    /// `native`): the code's process has it at `native::NATIVE_FD`.
    pub native: Option<BorrowedFd<'a>>,
}

/// Called once the sandbox is ready, with the proxy's listening socket when
/// the plan asked for one, and the network to serve: the sandbox's own
/// (`None`), or a warm run's claim's; returns whether the proxy started (if
/// not, the code is not released).
pub type ProxyStart<'a> = dyn FnMut(OwnedFd, Option<&NetworkPolicy>) -> bool + 'a;

/// Starts the helper with a socket to it on its standard input. A fresh
/// exec: the supervisor may be multi-threaded, so nothing is set up in its
/// fork. The helper starts with an empty environment and `args`.
pub fn spawn_helper(helper: &Path, args: &[&str]) -> io::Result<(Child, OwnedFd)> {
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    let child = Command::new(helper)
        // The sandbox's init is a fork of the helper: its /proc/1/cmdline
        // shows this, never the helper's path on the host.
        .arg0(crate::HELPER_NAME)
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
    recv_within_as(socket, timeout)
}

/// Waits up to `timeout` for one message of type `T`.
pub fn recv_within_as<T: serde::de::DeserializeOwned>(
    socket: BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    let ts = rustix::time::Timespec::try_from(timeout).map_err(|_| io::Error::other("bad timeout"))?;
    if poll(&mut fds, Some(&ts))? == 0 {
        return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no answer from the helper within {timeout:?}")));
    }
    protocol::recv(socket)
}

/// Runs `plan` and watches it. Returns `Err` only when the helper could not
/// even be started; after that, everything is in the [`Observed`].
/// With a `gate`, the run is warm: the code's process starts at once and
/// imports the preload, and the run waits in the gate for its claim.
///
/// The run is over when the helper reports the code's end: it has reaped
/// the code and then the init, whose death the kernel completes only once
/// every other process of the run is gone. What the helper does after that
/// (closing the run's namespaces, which the kernel tears down, a mount
/// namespace after an RCU grace period) is nothing the record observes, so
/// the record does not wait for it: the helper is handed back, still
/// ending, to be reaped later ([`Ending`]). Without a cgroup the run's CPU
/// time is the helper's rusage, known only once it is reaped: then, and
/// whenever the helper ends without that report, it is waited for here.
pub(crate) fn run(
    helper: crate::spare::HelperSource<'_>,
    plan: RunPlan,
    sandbox: SandboxFds<'_>,
    cgroup: Option<&dyn RunCgroup>,
    watch: &Watch<'_>,
    on_proxy: &mut ProxyStart<'_>,
    gate: Option<&mut Gate<'_>>,
) -> io::Result<(Observed, Vec<Ending>)> {
    let mut run = Run::start(helper, plan, sandbox, cgroup, watch, on_proxy)?;
    run.gate = gate;
    let over = |run: &Run<'_, '_, '_, '_>| run.helper_done || (run.ended_at.is_some() && cgroup.is_some());
    while !over(&run) {
        run.turn();
    }
    Ok(run.finish())
}

/// Runs a fork of `template` (see `forked`): as [`run`] with a warm run's
/// gate, the template in the helper's place. The run is over when the
/// template reports the code's end, or when the template is gone.
pub(crate) fn run_forked(
    template: &crate::forked::TemplateConn,
    plan: &protocol::ForkPlan,
    cgroup: &dyn RunCgroup,
    watch: &Watch<'_>,
    gate: &mut Gate<'_>,
) -> io::Result<(Observed, Option<crate::forked::ForkRoot>)> {
    let mut no_proxy = |_: OwnedFd, _: Option<&NetworkPolicy>| false;
    let mut run = Run::start_forked(template, plan, cgroup, watch, &mut no_proxy)?;
    run.gate = Some(gate);
    while !(run.helper_done || run.ended_at.is_some()) {
        run.turn();
    }
    let root = run.forked.as_mut().and_then(|forked| forked.root.take());
    Ok((run.finish().0, root))
}

/// A helper whose work is done (a run's, once it reported the code's end;
/// a sandbox's, once it handed the sandbox over), closing what it holds.
/// Dropping it reaps it: it is killed first, so that dropping it waits for
/// nothing but the kernel.
#[derive(Debug)]
pub struct Ending(Option<Child>);

impl Ending {
    pub(crate) fn new(helper: Child) -> Self {
        Self(Some(helper))
    }

    /// Reaps it if it has exited; whether it is gone. A helper whose state
    /// cannot be read (reaped elsewhere, so its pid may be another
    /// process's by now) is gone too, and forgotten: dropping it then
    /// signals no pid.
    pub fn try_reap(&mut self) -> bool {
        let Some(helper) = &mut self.0 else { return true };
        match helper.try_wait() {
            Ok(status) => status.is_some(),
            Err(_) => {
                self.0 = None;
                true
            }
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(helper) = &mut self.0 {
            // Once `try_wait` has seen it exit, `kill` signals nothing.
            let _ = helper.kill();
            let _ = helper.wait();
        }
    }
}

/// Bytes written into a pipe as it takes them: the code's standard input,
/// a warm run's code.
struct Feed {
    fd: OwnedFd,
    bytes: Vec<u8>,
    written: usize,
}

/// The most bytes kept from the ready FIFO, which the code can write too.
const READY_BYTES: usize = 4096;

/// One run, from the supervisor's side.
struct Run<'a, 'w, 'p, 'g> {
    watch: &'a Watch<'w>,
    cgroup: Option<&'a dyn RunCgroup>,
    on_proxy: &'a mut ProxyStart<'p>,
    /// A warm run's wait for its claim; taken when the preload is imported.
    gate: Option<&'a mut Gate<'g>>,
    /// The limits and the switch in force: the watch's, or a claim's.
    wall_time: Duration,
    cpu_time: Duration,
    kill: KillSwitch,
    wants_report: bool,
    wants_ready: bool,
    wants_code: bool,
    wants_proxy: bool,
    /// A warm run's proxy listener, held until its claim: the proxy starts
    /// at the release, with the claim's clock, so that everything it
    /// serves is the run's.
    proxy_listener: Option<OwnedFd>,
    /// The helper holds the code until it is released.
    holds: bool,
    /// The run's helper; `None` for a forked run, whose template is its
    /// peer (`helper_pidfd` is then the template's).
    helper: Option<Child>,
    /// A spare helper refused for this run, ending: reaped with the helper.
    refused: Option<Ending>,
    helper_pidfd: OwnedFd,
    /// A forked run's state.
    forked: Option<crate::forked::ForkedRun<'a>>,
    /// A fork's driver said its preload is imported before its setup was
    /// checked: the gate opens once it is.
    preloaded: bool,
    helper_done: bool,
    socket: OwnedFd,
    /// The run's init: killing it ends the run.
    init: Option<OwnedFd>,
    /// The init's and the code's pids, for walking the run's processes
    /// without a cgroup.
    roots: Vec<i32>,
    spawned_at: Instant,
    started_at: Option<Instant>,
    /// `started_at` on CLOCK_MONOTONIC (ns), taken just before it: what the
    /// helper's word of the code's end is compared with.
    started_ns: Option<u64>,
    ended_at: Option<Instant>,
    killed_at: Option<Instant>,
    next_check: Instant,
    stdout: Stream,
    stderr: Stream,
    report: Option<Stream>,
    /// The driver's announcements (`driver::READY_FILE`), and how many bytes came.
    ready: Option<(OwnedFd, usize)>,
    /// The code FIFO of a warm run, held until the run is over.
    code: Option<OwnedFd>,
    /// A warm run's standard input, held until its claim gives the bytes.
    stdin_held: Option<OwnedFd>,
    /// Where the time to first instruction starts.
    requested_at: Instant,
    stdin: Option<Feed>,
    feed: Option<Feed>,
    null: OwnedFd,
    sampler: Sampler<'w>,
    observed: Observed,
}

/// Which source a poll slot belongs to.
#[derive(Clone, Copy)]
enum Source {
    Socket,
    Helper,
    Stdout,
    Stderr,
    Report,
    Ready,
    Stdin,
    Feed,
}

impl<'a, 'w, 'p, 'g> Run<'a, 'w, 'p, 'g> {
    fn start(
        helper: crate::spare::HelperSource<'_>,
        plan: RunPlan,
        sandbox: SandboxFds<'_>,
        cgroup: Option<&'a dyn RunCgroup>,
        watch: &'a Watch<'w>,
        on_proxy: &'a mut ProxyStart<'p>,
    ) -> io::Result<Run<'a, 'w, 'p, 'g>> {
        let (wants_report, wants_proxy, holds) = (plan.report_fifo, plan.proxy_listener, plan.hold_for_release);
        let (wants_ready, wants_code) = (plan.ready_fifo, plan.code_fifo);
        // How the run enters its cgroup follows from the cgroup itself, so
        // the plan and the descriptors sent with it cannot disagree.
        let placement = cgroup.map(|c| c.placement()).transpose()?;
        let mut plan = plan;
        (plan.cgroup, plan.cgroup_fds) = match &placement {
            None => (CgroupEntry::None, 0),
            Some(Placement::EnterTasks(tasks)) => (CgroupEntry::EnterTasks, tasks.len()),
            Some(Placement::CloneInto(_)) => (CgroupEntry::CloneInto, 1),
        };
        plan.native_library = sandbox.native.is_some();
        let request = Request::Run(Box::new(plan));

        // Only our ends are non-blocking: the code writes to a blocking pipe,
        // as any program expects.
        let (stdout_read, stdout_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (stderr_read, stderr_write) = pipe_with(PipeFlags::CLOEXEC)?;
        rustix::fs::fcntl_setfl(&stdout_read, rustix::fs::OFlags::NONBLOCK)?;
        rustix::fs::fcntl_setfl(&stderr_read, rustix::fs::OFlags::NONBLOCK)?;
        let open =
            |flags| rustix::fs::open("/dev/null", flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty());
        let null = open(rustix::fs::OFlags::WRONLY)?;
        // stdin: the caller's bytes through a pipe, or /dev/null; a warm
        // run's always a pipe, whose bytes (maybe none) its claim gives.
        let (stdin_read, stdin, stdin_held) = if let Some(socket) = sandbox.stdin {
            (socket, None, None)
        } else if watch.stdin.is_empty() && !wants_code {
            (open(rustix::fs::OFlags::RDONLY)?, None, None)
        } else {
            let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
            rustix::fs::fcntl_setfl(&w, rustix::fs::OFlags::NONBLOCK)?;
            if wants_code {
                (r, None, Some(w))
            } else {
                (r, Some(Feed { fd: w, bytes: watch.stdin.to_vec(), written: 0 }), None)
            }
        };

        let crate::spare::Started { mut child, socket, refused } = helper.start()?;
        let sent = (|| -> io::Result<OwnedFd> {
            let pid = Pid::from_raw(child.id() as i32).ok_or_else(|| io::Error::other("bad helper pid"))?;
            let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
            // The run's processes enter the cgroup before they do anything:
            // every process, every byte, is counted.
            let mut fds =
                vec![sandbox.user_ns, sandbox.mount_ns, stdin_read.as_fd(), stdout_write.as_fd(), stderr_write.as_fd()];
            fds.extend(sandbox.native);
            match &placement {
                Some(Placement::EnterTasks(tasks)) => fds.extend(tasks.iter().map(AsFd::as_fd)),
                Some(Placement::CloneInto(dir)) => fds.push(dir.as_fd()),
                None => {}
            }
            protocol::send_request(socket.as_fd(), &request, &fds)?;
            Ok(pidfd)
        })();
        drop((stdin_read, stdout_write, stderr_write, placement));
        let helper_pidfd = match sent {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let now = Instant::now();
        Ok(Run {
            watch,
            cgroup,
            on_proxy,
            gate: None,
            wall_time: watch.wall_time,
            cpu_time: watch.cpu_time,
            kill: watch.kill.clone(),
            wants_report,
            wants_ready,
            wants_code,
            wants_proxy,
            proxy_listener: None,
            holds,
            helper: Some(child),
            refused,
            helper_pidfd,
            forked: None,
            preloaded: false,
            helper_done: false,
            socket,
            init: None,
            roots: Vec::new(),
            spawned_at: now,
            started_at: None,
            started_ns: None,
            ended_at: None,
            killed_at: None,
            next_check: now + CHECK_INTERVAL,
            stdout: Stream::new(stdout_read, watch.output_bytes),
            stderr: Stream::new(stderr_read, watch.output_bytes),
            report: None,
            ready: None,
            code: None,
            stdin_held,
            requested_at: now,
            stdin,
            feed: None,
            null,
            sampler: Sampler::new(watch.stage, watch.open_files),
            observed: Observed::default(),
        })
    }

    /// A fork of `template`, asked for with the run's pipes (see `forked`).
    fn start_forked(
        template: &'a crate::forked::TemplateConn,
        plan: &protocol::ForkPlan,
        cgroup: &'a dyn RunCgroup,
        watch: &'a Watch<'w>,
        on_proxy: &'a mut ProxyStart<'p>,
    ) -> io::Result<Run<'a, 'w, 'p, 'g>> {
        let nonblocking = |fd: &OwnedFd| rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK);
        let (stdout_read, stdout_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (stderr_read, stderr_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (report_read, report_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (ready_read, ready_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (code_read, code_write) = pipe_with(PipeFlags::CLOEXEC)?;
        let (stdin_read, stdin_write) = pipe_with(PipeFlags::CLOEXEC)?;
        for fd in [&stdout_read, &stderr_read, &report_read, &ready_read, &code_write, &stdin_write] {
            nonblocking(fd)?;
        }
        let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        let helper_pidfd = template.fork(
            plan,
            [
                theirs.as_fd(),
                stdin_read.as_fd(),
                stdout_write.as_fd(),
                stderr_write.as_fd(),
                report_write.as_fd(),
                ready_write.as_fd(),
                code_read.as_fd(),
            ],
        )?;
        drop((theirs, stdin_read, stdout_write, stderr_write, report_write, ready_write, code_read));
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let now = Instant::now();
        Ok(Run {
            watch,
            cgroup: Some(cgroup),
            on_proxy,
            gate: None,
            wall_time: watch.wall_time,
            cpu_time: watch.cpu_time,
            kill: watch.kill.clone(),
            wants_report: true,
            wants_ready: true,
            wants_code: true,
            wants_proxy: false,
            proxy_listener: None,
            holds: false,
            helper: None,
            refused: None,
            helper_pidfd,
            forked: Some(crate::forked::ForkedRun::new(template)),
            preloaded: false,
            helper_done: false,
            socket: ours,
            init: None,
            roots: Vec::new(),
            spawned_at: now,
            started_at: None,
            started_ns: None,
            ended_at: None,
            killed_at: None,
            next_check: now + CHECK_INTERVAL,
            stdout: Stream::new(stdout_read, watch.output_bytes),
            stderr: Stream::new(stderr_read, watch.output_bytes),
            report: Some(Stream::new(report_read, watch.report_bytes as u64)),
            ready: Some((ready_read, 0)),
            code: Some(code_write),
            stdin_held: Some(stdin_write),
            requested_at: now,
            stdin: None,
            feed: None,
            null,
            sampler: Sampler::new(watch.stage, watch.open_files),
            observed: Observed { forked: true, ..Observed::default() },
        })
    }

    /// One turn: keep time, wait for the next event or deadline, take one
    /// bounded step on each source that is ready.
    fn turn(&mut self) {
        self.on_tick(Instant::now());
        let now = Instant::now();
        let mut slots: Vec<Source> = vec![Source::Socket, Source::Helper];
        let mut fds = vec![PollFd::new(&self.socket, PollFlags::IN), PollFd::new(&self.helper_pidfd, PollFlags::IN)];
        for (source, stream) in [
            (Source::Stdout, Some(&self.stdout)),
            (Source::Stderr, Some(&self.stderr)),
            (Source::Report, self.report.as_ref()),
        ] {
            if let Some(stream) = stream.filter(|s| s.wants_poll(now)) {
                slots.push(source);
                fds.push(PollFd::new(stream.fd(), PollFlags::IN));
            }
        }
        if let Some((ready, _)) = &self.ready {
            slots.push(Source::Ready);
            fds.push(PollFd::new(ready, PollFlags::IN));
        }
        for (source, feed) in [(Source::Stdin, &self.stdin), (Source::Feed, &self.feed)] {
            if let Some(feed) = feed {
                slots.push(source);
                fds.push(PollFd::new(&feed.fd, PollFlags::OUT));
            }
        }
        let timeout = self.next_wake().saturating_duration_since(now).max(Duration::from_micros(100));
        let ts = rustix::time::Timespec::try_from(timeout).unwrap_or(rustix::time::Timespec { tv_sec: 1, tv_nsec: 0 });
        let polled = poll(&mut fds, Some(&ts));
        let ready: Vec<Source> =
            slots.iter().zip(&fds).filter(|(_, fd)| !fd.revents().is_empty()).map(|(s, _)| *s).collect();
        drop(fds);
        match polled {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                // Nothing can be watched any more: end the run, helper
                // included, and keep what was seen.
                self.fail(format!("the supervisor could not watch the run (poll: {e})"));
                self.kill_helper();
                self.helper_done = true;
                return;
            }
        }
        let now = Instant::now();
        for source in ready {
            match source {
                Source::Socket => self.on_socket(),
                Source::Helper => self.helper_done = true,
                Source::Stdout => self.on_output(Source::Stdout, now),
                Source::Stderr => self.on_output(Source::Stderr, now),
                Source::Report => self.on_output(Source::Report, now),
                Source::Ready => self.on_ready_fifo(),
                Source::Stdin => self.stdin = write_some(self.stdin.take()),
                Source::Feed => self.feed = write_some(self.feed.take()),
            }
        }
    }

    /// The earliest deadline or check.
    fn next_wake(&self) -> Instant {
        let deadline = match self.started_at {
            Some(started) => started + self.wall_time,
            None => self.spawned_at + SETUP_TIMEOUT,
        };
        let mut wake = self.next_check.min(deadline);
        let resting = [self.stdout.wake_at(), self.stderr.wake_at(), self.report.as_ref().and_then(Stream::wake_at)];
        for at in resting.into_iter().chain([self.sampler.next_at(), self.killed_at.map(|k| k + KILL_GRACE)]) {
            wake = at.map_or(wake, |at| wake.min(at));
        }
        wake
    }

    /// Deadlines, the kill switch, CPU time, the sampler.
    fn on_tick(&mut self, now: Instant) {
        let running = self.ended_at.is_none();
        match self.started_at {
            None if now.duration_since(self.spawned_at) > SETUP_TIMEOUT => self.kill(KillReason::SetupTimeout),
            Some(started) if running && now.duration_since(started) >= self.wall_time => {
                self.kill(KillReason::WallTime)
            }
            _ => {}
        }
        if now >= self.next_check {
            self.next_check = now + CHECK_INTERVAL;
            if self.kill.is_killed() {
                self.kill(KillReason::Requested);
            }
            // A warm run's clock starts at its release: the preload is not its own.
            let before = self.observed.cpu_before_release.unwrap_or_default();
            let used = self.cgroup.and_then(|c| c.cpu_usage()).map(|used| used.saturating_sub(before));
            if running && self.started_at.is_some() && used.is_some_and(|used| used >= self.cpu_time) {
                self.kill(KillReason::CpuTime);
            }
            if running && self.cgroup.is_some_and(|c| c.socket_memory_exhausted()) {
                self.kill(KillReason::SocketMemory);
            }
        }
        let (cgroup, roots) = (self.cgroup, &self.roots);
        self.sampler.sample_if_due(now, || match cgroup {
            Some(cgroup) => cgroup.processes(),
            None => sampler::descendants(roots),
        });
        if self.killed_at.is_some_and(|at| now.duration_since(at) >= KILL_GRACE) {
            self.fail(format!("the helper did not end the run within {KILL_GRACE:?} of its kill"));
            self.kill_helper();
            self.killed_at = None;
        }
    }

    fn on_output(&mut self, source: Source, now: Instant) {
        let stream = match source {
            Source::Stdout => &mut self.stdout,
            Source::Stderr => &mut self.stderr,
            _ => match &mut self.report {
                Some(report) => report,
                None => return,
            },
        };
        stream.step(&self.null, now);
        let over = self.stdout.is_over() || self.stderr.is_over();
        if over && self.watch.output_overflow == OutputOverflow::Kill && self.ended_at.is_none() {
            self.kill(KillReason::Output);
        }
    }

    /// The driver's announcements: a warm run's preload is imported (its
    /// claim is waited for here), the code's first instruction runs.
    fn on_ready_fifo(&mut self) {
        let Some((fd, seen)) = &mut self.ready else { return };
        let mut buf = [0u8; 256];
        let bytes = match rustix::io::read(&*fd, &mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return,
            Err(_) => Vec::new(),
        };
        *seen += bytes.len();
        if bytes.is_empty() || *seen > READY_BYTES {
            // The code may write here too: past a few bytes, nothing more is read.
            self.ready = None;
        }
        for byte in bytes {
            match byte {
                driver::READY_PRELOADED if self.gate.is_some() => {
                    // A fork's driver may say so before its template relays
                    // its setup: the claim waits for the checks.
                    if self.forked.as_ref().is_some_and(|f| f.root.is_none()) {
                        self.preloaded = true;
                    } else {
                        self.on_preloaded();
                    }
                }
                driver::READY_CODE if self.observed.first_instruction.is_none() && self.feed_done() => {
                    self.observed.first_instruction = Some(self.requested_at.elapsed());
                }
                _ => {}
            }
        }
    }

    /// Whether the code (a warm run's) was released and written whole.
    fn feed_done(&self) -> bool {
        self.started_at.is_some() && self.feed.is_none()
    }

    /// A warm run's preload is imported: wait for the claim, then release
    /// the code to it.
    fn on_preloaded(&mut self) {
        let Some(gate) = self.gate.take() else { return };
        // Whatever the helper said meanwhile (the code's start, its end) first.
        self.on_socket();
        let (socket, helper) = (self.socket.as_fd(), self.helper_pidfd.as_fd());
        let ended = self.ended_at.is_some()
            || self.observed.killed.is_some()
            || self.observed.setup_failure.is_some()
            || !self.observed.failures.is_empty();
        let alive = || !ended && !readable(socket) && !readable(helper);
        let forked = self.forked.as_ref().and_then(|f| f.root.as_ref());
        // The preload's limit hits, read before the claim (off its clock):
        // nothing in the sandbox runs from now until the release.
        let preload = self.cgroup.map(|c| c.stats()).unwrap_or_default();
        self.observed.preload_limit_hits =
            LimitHits { memory: preload.memory_max_hits, processes: preload.pids_max_hits };
        let waiting = Waiting { alive: &alive, cgroup: self.cgroup, lowered: Default::default(), forked };
        let released = gate(&waiting);
        self.observed.lowered = waiting.lowered.get();
        let Some(release) = released else {
            self.kill(KillReason::Requested);
            return;
        };
        // From here the run is the claim's, whatever happens next: its
        // clocks and limits (what the record judges it by), its switch, the
        // preload's CPU time set apart.
        self.wall_time = release.wall_time;
        self.cpu_time = release.cpu_time;
        self.observed.lowered.wall_time = Some(release.wall_time);
        self.observed.lowered.cpu_time = Some(release.cpu_time);
        self.kill = release.kill;
        self.requested_at = release.requested_at;
        self.observed.cpu_before_release = Some(self.cgroup.and_then(|c| c.cpu_usage()).unwrap_or_default());
        // The proxy serves from the release on, with the claim's allowlist,
        // before the code's first byte: a connection the preload began
        // meanwhile waited in the listener's queue, and is served as the
        // run's, in its record. A run that allows no host gets no proxy:
        // the listener closed, its queue refused.
        let listener = self.proxy_listener.take();
        if release.network.is_enabled() {
            // No listener to serve counts as a proxy that did not start.
            if !listener.is_some_and(|listener| (self.on_proxy)(listener, Some(&release.network))) {
                self.kill(KillReason::ProxyFailed);
                return;
            }
        } else {
            drop(listener);
        }
        self.started_ns = Some(crate::sys::monotonic_ns());
        let now = Instant::now();
        self.stdin = self.stdin_held.take().map(|fd| Feed { fd, bytes: release.stdin, written: 0 });
        // Our end stays open until the run is over: a FIFO whose every end
        // is closed drops what it holds, and the driver may not have opened
        // it yet when the code is all written.
        match self.code.as_ref().map(OwnedFd::try_clone).transpose() {
            Ok(fd) => self.feed = fd.map(|fd| Feed { fd, bytes: release.feed, written: 0 }),
            Err(e) => self.fail(format!("the code could not be released (dup: {e})")),
        }
        self.started_at = Some(now);
        self.sampler.start(now);
    }

    /// The helper's messages (a handful per run).
    fn on_socket(&mut self) {
        if self.forked.is_some() {
            return self.on_template_socket();
        }
        loop {
            match recv_nonblocking::<Reply>(self.socket.as_fd()) {
                Ok(Some((reply, fds))) => self.on_reply(reply, fds),
                Ok(None) => return,
                Err(e) => {
                    self.fail(format!("a garbled message from the helper: {e}"));
                    return;
                }
            }
        }
    }

    /// A forked run's messages from its template.
    fn on_template_socket(&mut self) {
        loop {
            match recv_nonblocking::<protocol::FromTemplate>(self.socket.as_fd()) {
                Ok(Some((message, fds))) => self.on_template(message, fds),
                Ok(None) => return,
                Err(e) => {
                    self.fail(format!("a garbled message from the template: {e}"));
                    return;
                }
            }
        }
    }

    fn on_template(&mut self, message: protocol::FromTemplate, fds: Vec<OwnedFd>) {
        use protocol::FromTemplate;
        let Some(forked) = self.forked.as_mut() else { return };
        match message {
            FromTemplate::Forked { init_pid, code_pid } => {
                let adopted = forked.adopt(init_pid, code_pid, fds, self.cgroup);
                self.init = forked.init_pidfd();
                self.roots.extend(forked.host_pids());
                let released = adopted.and_then(|()| {
                    protocol::send(self.socket.as_fd(), &Control::Release, &[])
                        .map_err(|e| Failure::new("release the fork", "", &e))
                });
                if let Err(failure) = released {
                    self.observed.setup_failure.get_or_insert(failure);
                    self.kill_now();
                }
                if self.observed.killed.is_some() {
                    self.kill_now();
                }
            }
            FromTemplate::Setup { report } => match forked.check_setup(&report) {
                Ok(started) => {
                    self.observed.started = true;
                    self.observed.layers = started.layers;
                    self.observed.landlock_abi = crate::sys::landlock_abi();
                    if std::mem::take(&mut self.preloaded) {
                        self.on_preloaded();
                    }
                }
                Err(failure) => {
                    self.observed.setup_failure.get_or_insert(failure);
                    self.kill_now();
                }
            },
            FromTemplate::Ended { code, init_first } => {
                self.on_reply(Reply::Ended { code, init_first, code_reaped_ns: None }, Vec::new())
            }
            FromTemplate::Failed(failure) => self.on_reply(Reply::Failed(failure), Vec::new()),
            FromTemplate::Ready => self.fail("the template sent an unexpected message".to_owned()),
        }
    }

    fn on_reply(&mut self, reply: Reply, mut fds: Vec<OwnedFd>) {
        match reply {
            Reply::Started { pid1 } => {
                self.init = fds.pop();
                self.roots.push(pid1);
                if self.observed.killed.is_some() {
                    self.kill_now();
                }
            }
            Reply::Ready => self.on_ready(fds),
            Reply::CodeStarted { code_pid, layers, landlock_abi } => {
                self.observed.started = true;
                self.observed.layers = layers;
                self.observed.landlock_abi = landlock_abi;
                self.roots.push(code_pid);
                // A warm run's clock starts when a claim releases its code.
                if !self.wants_code {
                    self.started_ns = Some(crate::sys::monotonic_ns());
                    let now = Instant::now();
                    self.started_at = Some(now);
                    self.sampler.start(now);
                }
            }
            Reply::Ended { code, init_first, code_reaped_ns } => {
                // The wall clock stopped the run while the helper was ending
                // it, the code's process already reaped within its limit:
                // the rest took the time (its other processes dying, which
                // the code may make slow), not the code. Both times err
                // toward the limit: the start taken before the supervisor's,
                // the reaping after the helper's.
                let deadline_ns = self.started_ns.map(|ns| ns.saturating_add(self.wall_time.as_nanos() as u64));
                if self.observed.killed == Some(KillReason::WallTime)
                    && code_reaped_ns.zip(deadline_ns).is_some_and(|(reaped, deadline)| reaped < deadline)
                {
                    self.observed.killed = None;
                }
                self.ended_at = Some(Instant::now());
                self.observed.code_end = Some(code);
                self.observed.init_first = init_first;
                self.sampler.stop();
            }
            Reply::Failed(failure) => {
                if self.observed.started {
                    self.fail(format!("the helper failed: {failure}"));
                } else {
                    self.observed.setup_failure.get_or_insert(failure);
                    self.kill_now();
                }
            }
            Reply::SetupDone { .. } | Reply::Opened => self.fail("the helper sent an unexpected reply".to_owned()),
        }
    }

    /// The sandbox is ready: start the proxy on its listener, then release
    /// the code if the helper holds it, unless the run is already over.
    fn on_ready(&mut self, fds: Vec<OwnedFd>) {
        let mut fds = fds.into_iter();
        if self.wants_report {
            self.report = fds.next().map(|fd| Stream::new(fd, self.watch.report_bytes as u64));
        }
        if self.wants_ready {
            self.ready = fds.next().map(|fd| (fd, 0));
        }
        if self.wants_code {
            self.code = fds.next();
        }
        // No listener handed over counts as a proxy that did not start. A
        // warm run's starts at its release (`on_preloaded`).
        if self.wants_proxy {
            match fds.next() {
                Some(listener) if self.gate.is_some() => self.proxy_listener = Some(listener),
                Some(listener) => {
                    if !(self.on_proxy)(listener, None) {
                        self.kill(KillReason::ProxyFailed);
                    }
                }
                None => self.kill(KillReason::ProxyFailed),
            }
        }
        if self.observed.killed.is_some() {
            self.kill_now();
            return;
        }
        if !self.holds {
            return;
        }
        if let Err(e) = protocol::send(self.socket.as_fd(), &Control::Release, &[]) {
            self.observed.setup_failure.get_or_insert(Failure::new("release the code", "", &e));
            self.kill_now();
        }
    }

    /// Kills the run; the first reason given is the one recorded.
    fn kill(&mut self, reason: KillReason) {
        self.observed.killed.get_or_insert(reason);
        self.kill_now();
    }

    fn kill_now(&mut self) {
        match &self.init {
            // Killing PID 1 of the namespace kills every process in it.
            Some(fd) => {
                let _ = pidfd_send_signal(fd, Signal::KILL);
            }
            None => self.kill_helper(),
        }
        if let Some(cgroup) = self.cgroup {
            cgroup.kill_all();
        }
        self.killed_at.get_or_insert_with(Instant::now);
    }

    /// Kills the helper; a forked run's template serves other runs, so
    /// such a run is given up instead (its socket closed at the end, on
    /// which the template kills the fork).
    fn kill_helper(&mut self) {
        if self.helper.is_some() {
            let _ = pidfd_send_signal(&self.helper_pidfd, Signal::KILL);
        } else {
            self.helper_done = true;
        }
    }

    /// Airlock's own machinery failed: say so, and end the run.
    fn fail(&mut self, what: String) {
        self.observed.failures.push(what);
        self.kill_now();
    }

    /// The helper reported the code's end or exited: either way every
    /// process of the run is gone, and every writer of the pipes with it
    /// (the helper gave its copies to the code): what is left in them is
    /// all there is.
    fn finish(mut self) -> (Observed, Vec<Ending>) {
        // Reaped here only once it has exited (see `run`). wait4 rather than
        // Child::wait: its rusage sums the helper and every descendant it
        // reaped, the CPU time of a run without a cgroup.
        let helper_pid = self.helper.as_ref().map(|h| h.id() as i32);
        let helper_status = helper_pid.filter(|_| self.helper_done).map(crate::sys::wait4_cpu_time);
        self.observed.rusage_cpu = helper_status.as_ref().and_then(|s| s.as_ref().ok()).map(|(cpu, _)| *cpu);
        self.on_socket();
        for stream in [Some(&mut self.stdout), Some(&mut self.stderr), self.report.as_mut()].into_iter().flatten() {
            stream.drain_rest(&self.null);
        }
        self.sampler.sample_disk();
        let observed = &mut self.observed;
        if observed.started && observed.code_end.is_none() && observed.failures.is_empty() {
            let status = match &helper_status {
                Some(Ok((_, status))) => status.clone(),
                Some(Err(e)) => e.to_string(),
                None => "it is still running".to_owned(),
            };
            observed.failures.push(format!("the helper ended without reporting the code's end ({status})"));
        }
        if !observed.started && observed.setup_failure.is_none() && observed.killed.is_none() {
            observed.setup_failure =
                Some(Failure::plain("start the sandbox", "the helper exited without starting the code"));
        }
        if let Some(started) = self.started_at {
            observed.wall = self.ended_at.unwrap_or_else(Instant::now).saturating_duration_since(started);
        }
        if self.stdout.is_over() || self.stderr.is_over() {
            observed.reached.insert(Limit::Output);
        }
        let (seen, note) = self.sampler.finish();
        observed.reached.extend(seen);
        observed.notes.extend(note);
        if let Some(report) = self.report {
            observed.report_overflow = report.is_over();
            observed.report = report.finish().bytes;
        }
        observed.stdout = self.stdout.finish();
        observed.stderr = self.stderr.finish();
        let ending = self.helper.filter(|_| !self.helper_done).map(Ending::new);
        (self.observed, ending.into_iter().chain(self.refused).collect())
    }
}

/// Writes what the pipe takes now; the feed, or `None` once it is all written
/// (closing our end) or the reader has gone (EPIPE: the rest is not wanted).
fn write_some(feed: Option<Feed>) -> Option<Feed> {
    let mut feed = feed?;
    match rustix::io::write(&feed.fd, &feed.bytes[feed.written..]) {
        Ok(n) => feed.written += n,
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
        Err(_) => return None,
    }
    (feed.written < feed.bytes.len()).then_some(feed)
}

/// Whether `fd` has something to read (a message, a process's end) now.
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    !matches!(poll(&mut fds, Some(&zero)), Ok(0))
}

/// One message if one is waiting (a [`Reply`], or the wasm worker's).
pub fn recv_nonblocking<T: serde::de::DeserializeOwned>(
    socket: BorrowedFd<'_>,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&zero)) {
        Ok(n) if n > 0 && fds[0].revents().contains(PollFlags::IN) => protocol::recv(socket),
        _ => Ok(None),
    }
}
