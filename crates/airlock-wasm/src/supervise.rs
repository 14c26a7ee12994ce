//! The supervisor's side of one guest: start its worker, hand it the plan,
//! then watch it from outside: output up to its caps, the wall clock, CPU
//! time (the run's cgroup, or the guest's process clock), the disk (measured
//! only where no tmpfs holds it), the kill switch. When a limit is passed, kill the guest's process, which takes
//! everything of the run with it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_core::driver::REPORT_FILE;
use airlock_core::output::Captured;
use airlock_core::{ArtifactError, KillSwitch};
use airlock_linux::confine::{self, FileAccess, Placement, RunCgroup, Stream};
use airlock_linux::protocol::{self, CgroupEntry, Failure};
use airlock_policy::{Layer, OutputOverflow, SandboxPath};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use crate::files;
use crate::protocol::{GuestEnd, GuestPlan, WorkerReply};

/// The argument that starts the worker binary in guest mode (without it, it
/// is the Linux backend's helper, which makes the sandbox's stage).
pub const GUEST_MODE: &str = "--guest";
/// How long the worker may take to be ready (it maps the interpreter) before
/// the run is abandoned.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often CPU time and the kill switch are looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(20);
/// Without a tmpfs of their own, the writable folders are measured this often.
pub const DISK_INTERVAL: Duration = Duration::from_millis(100);

/// What to watch a guest with.
pub struct Watch<'a> {
    pub wall_time: Duration,
    pub cpu_time: Duration,
    pub output_bytes: u64,
    pub output_overflow: OutputOverflow,
    pub report_bytes: usize,
    pub kill: &'a KillSwitch,
    /// Folders to measure against the disk caps, where no tmpfs holds them.
    pub measured_disk: Option<MeasuredDisk>,
    /// How the report is opened as the sandbox's user.
    pub files: &'a FileAccess,
}

/// Writable folders on the host's own filesystem, and their caps.
pub struct MeasuredDisk {
    pub roots: Vec<PathBuf>,
    pub bytes: u64,
    pub inodes: u64,
}

/// Why the supervisor stopped a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    WallTime,
    CpuTime,
    Output,
    Disk,
    Inodes,
    Requested,
    SetupTimeout,
}

/// What the supervisor saw of a guest.
#[derive(Debug, Default)]
pub struct Observed {
    pub failure: Option<Failure>,
    pub stopped: Option<Stop>,
    /// The layers the worker put in force, once it was ready.
    pub layers: Option<Vec<Layer>>,
    pub landlock_abi: Option<u32>,
    /// How the guest ended, as its worker reported it.
    pub end: Option<GuestEnd>,
    /// The wait status of the guest's process, as the worker outside it saw it.
    pub reaped: Option<(Option<i32>, Option<i32>)>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub report: Vec<u8>,
    /// Why the report could not be taken (too large, not a regular file).
    pub report_refused: Option<String>,
    pub wall: Duration,
    /// CPU time of the worker and the guest's process, for hosts without a cgroup.
    pub rusage_cpu: Option<Duration>,
}

/// The descriptors sent with the plan (see `protocol`), borrowed for the call.
pub struct PlanFds<'a> {
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub stdin: BorrowedFd<'a>,
    pub module: BorrowedFd<'a>,
    pub namespaces: Option<(BorrowedFd<'a>, BorrowedFd<'a>)>,
}

/// Runs `plan` in a fresh worker and watches it. Returns `Err` only when the
/// worker could not even be started. `stdout` and `stderr` are the read ends
/// of the pipes whose write ends are in `fds`.
pub fn run(
    worker: &Path,
    plan: GuestPlan,
    fds: PlanFds<'_>,
    (stdout_read, stderr_read): (OwnedFd, OwnedFd),
    cgroup: Option<&dyn RunCgroup>,
    watch: &Watch<'_>,
) -> io::Result<Observed> {
    // How the worker enters the cgroup follows from the cgroup itself, so the
    // plan and the descriptors sent with it cannot disagree.
    let placement = cgroup.map(|c| c.placement()).transpose()?;
    let mut plan = plan;
    (plan.cgroup, plan.cgroup_fds) = match &placement {
        None => (CgroupEntry::None, 0),
        Some(Placement::EnterTasks(tasks)) => (CgroupEntry::EnterTasks, tasks.len()),
        Some(Placement::CloneInto(_)) => (CgroupEntry::CloneInto, 1),
    };
    let mut sent = vec![fds.stdout, fds.stderr, fds.stdin, fds.module];
    if let Some((user_ns, mount_ns)) = fds.namespaces {
        sent.extend([user_ns, mount_ns]);
    }
    match &placement {
        Some(Placement::EnterTasks(tasks)) => sent.extend(tasks.iter().map(AsFd::as_fd)),
        Some(Placement::CloneInto(dir)) => sent.push(dir.as_fd()),
        None => {}
    }

    // A fresh exec with an empty environment, as the Linux backend starts
    // its helper: the supervisor may be multi-threaded, so nothing is set up
    // in its fork.
    let (mut child, ours) = confine::spawn_helper(worker, &[GUEST_MODE])
        .map_err(|e| io::Error::new(e.kind(), format!("starting the wasm worker {}: {e}", worker.display())))?;
    let worker_pid = child.id() as i32;
    let started = (|| -> io::Result<OwnedFd> {
        let pid = Pid::from_raw(worker_pid).ok_or_else(|| io::Error::other("bad worker pid"))?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
        protocol::send_request(ours.as_fd(), &plan, &sent)?;
        Ok(pidfd)
    })();
    drop(sent);
    let worker_pidfd = match started {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    let null = match null {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.into());
        }
    };
    let mut watcher = Watcher::new(watch, cgroup, worker_pidfd, (stdout_read, stderr_read), null);
    watcher.watch(ours.as_fd());
    // The worker has exited, so the guest's process is gone and every writer
    // of the pipes closed: what is left in them is all there is. wait4
    // rather than Child::wait: its rusage sums the worker and the guest's
    // process it reaped, the CPU time of a run without a cgroup.
    watcher.observed.rusage_cpu = confine::wait4_cpu_time(worker_pid).ok().map(|(cpu, _)| cpu);
    drop(child);
    Ok(watcher.finish(ours.as_fd()))
}

/// The state of one watched guest.
struct Watcher<'a> {
    watch: &'a Watch<'a>,
    cgroup: Option<&'a dyn RunCgroup>,
    worker_pidfd: OwnedFd,
    /// The output pipes, drained in bounded steps (see the Linux backend's
    /// `drain`), so that no amount of output holds off the clock.
    stdout: Stream,
    stderr: Stream,
    /// /dev/null, where output past its cap is spliced.
    null: OwnedFd,
    /// The program folder, where the driver leaves its report.
    program: Option<OwnedFd>,
    /// The guest's process: its pid on the host and its pidfd.
    guest: Option<(i32, OwnedFd)>,
    spawned_at: Instant,
    ready_at: Option<Instant>,
    ended_at: Option<Instant>,
    next_check: Instant,
    next_disk_check: Instant,
    observed: Observed,
}

impl<'a> Watcher<'a> {
    fn new(
        watch: &'a Watch<'a>,
        cgroup: Option<&'a dyn RunCgroup>,
        worker_pidfd: OwnedFd,
        (stdout_read, stderr_read): (OwnedFd, OwnedFd),
        null: OwnedFd,
    ) -> Watcher<'a> {
        let now = Instant::now();
        Watcher {
            watch,
            cgroup,
            worker_pidfd,
            stdout: Stream::new(stdout_read, watch.output_bytes),
            stderr: Stream::new(stderr_read, watch.output_bytes),
            null,
            program: None,
            guest: None,
            spawned_at: now,
            ready_at: None,
            ended_at: None,
            next_check: now + CHECK_INTERVAL,
            next_disk_check: now + DISK_INTERVAL,
            observed: Observed::default(),
        }
    }

    /// Kills the guest's process (or, before it exists, the worker), and
    /// every process left in the run's cgroup.
    fn kill_now(&self) {
        match &self.guest {
            // Killing PID 1 of the guest's namespace kills all of it.
            Some((_, pidfd)) => {
                let _ = pidfd_send_signal(pidfd, Signal::KILL);
            }
            None => {
                let _ = pidfd_send_signal(&self.worker_pidfd, Signal::KILL);
            }
        }
        if let Some(cgroup) = self.cgroup {
            cgroup.kill_all();
        }
    }

    /// Stops the guest; the first reason given is the one recorded.
    fn stop(&mut self, reason: Stop) {
        self.observed.stopped.get_or_insert(reason);
        self.kill_now();
    }

    /// Polls until the worker exits. Should the poll itself fail, nothing
    /// can be watched any more: the run is ended, worker included, and what
    /// was seen is kept.
    fn watch(&mut self, socket: BorrowedFd<'_>) {
        loop {
            self.check_limits();
            let now = Instant::now();
            let wall_deadline =
                self.ready_at.map(|r| r + self.watch.wall_time).unwrap_or(self.spawned_at + SETUP_TIMEOUT);
            let mut wake = self.next_check.min(wall_deadline);
            for at in [self.stdout.wake_at(), self.stderr.wake_at()].into_iter().flatten() {
                wake = wake.min(at);
            }
            let timeout = wake.saturating_duration_since(now);
            let ts = rustix::time::Timespec::try_from(timeout.max(Duration::from_micros(100)))
                .unwrap_or(rustix::time::Timespec { tv_sec: 1, tv_nsec: 0 });
            let mut fds = vec![PollFd::new(&socket, PollFlags::IN), PollFd::new(&self.worker_pidfd, PollFlags::IN)];
            let stdout_slot = self.stdout.wants_poll(now).then(|| push(&mut fds, self.stdout.fd()));
            let stderr_slot = self.stderr.wants_poll(now).then(|| push(&mut fds, self.stderr.fd()));
            let polled = poll(&mut fds, Some(&ts));
            let ready = |slot: Option<usize>| slot.is_some_and(|i| !fds[i].revents().is_empty());
            let (socket_ready, worker_done) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
            let (out_ready, err_ready) = (ready(stdout_slot), ready(stderr_slot));
            drop(fds);
            match polled {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    self.observed.failure.get_or_insert(Failure::plain(
                        "watch the guest",
                        format!("the supervisor could not watch the run (poll: {e})"),
                    ));
                    self.kill_now();
                    let _ = pidfd_send_signal(&self.worker_pidfd, Signal::KILL);
                    return;
                }
            }
            let now = Instant::now();
            if out_ready {
                self.stdout.step(&self.null, now);
            }
            if err_ready {
                self.stderr.step(&self.null, now);
            }
            let over = self.stdout.is_over() || self.stderr.is_over();
            if over && self.watch.output_overflow == OutputOverflow::Kill && self.ended_at.is_none() {
                self.stop(Stop::Output);
            }
            if socket_ready {
                self.take_replies(socket);
            }
            if worker_done {
                return;
            }
        }
    }

    /// The clock, CPU time, descriptors, disk and kill switch.
    fn check_limits(&mut self) {
        let now = Instant::now();
        match self.ready_at {
            None if now.duration_since(self.spawned_at) > SETUP_TIMEOUT => self.stop(Stop::SetupTimeout),
            Some(ready) if self.ended_at.is_none() && now.duration_since(ready) >= self.watch.wall_time => {
                self.stop(Stop::WallTime)
            }
            _ => {}
        }
        if now < self.next_check {
            return;
        }
        self.next_check = now + CHECK_INTERVAL;
        if self.watch.kill.is_killed() {
            self.stop(Stop::Requested);
        }
        if self.ended_at.is_some() {
            return;
        }
        if self.cpu_used().is_some_and(|used| used >= self.watch.cpu_time) {
            self.stop(Stop::CpuTime);
        }
        if let Some(disk) = &self.watch.measured_disk {
            if now >= self.next_disk_check {
                self.next_disk_check = now + DISK_INTERVAL;
                if let Some(stop) = disk_over(disk) {
                    self.stop(stop);
                }
            }
        }
    }

    /// CPU time of the run so far: the cgroup's, else the guest's process's.
    fn cpu_used(&self) -> Option<Duration> {
        match self.cgroup {
            Some(cgroup) => cgroup.cpu_usage(),
            None => self.guest.as_ref().and_then(|(pid, _)| process_cpu_time(*pid)),
        }
    }

    /// Every reply waiting on the socket. One the worker garbled is its
    /// failure, and ends the run.
    fn take_replies(&mut self, socket: BorrowedFd<'_>) {
        loop {
            match confine::recv_nonblocking::<WorkerReply>(socket) {
                Ok(Some((reply, fds))) => self.on_reply(reply, fds),
                Ok(None) => return,
                Err(e) => {
                    self.observed.failure.get_or_insert(Failure::new("read the worker's reply", "", &e));
                    self.kill_now();
                    return;
                }
            }
        }
    }

    fn on_reply(&mut self, reply: WorkerReply, mut fds: Vec<OwnedFd>) {
        match reply {
            WorkerReply::Started { pid } => {
                if let Some(pidfd) = fds.pop() {
                    self.guest = Some((pid, pidfd));
                }
                if self.observed.stopped.is_some() {
                    self.kill_now();
                }
            }
            WorkerReply::Ready { layers, landlock_abi } => {
                self.ready_at = Some(Instant::now());
                self.observed.layers = Some(layers);
                self.observed.landlock_abi = landlock_abi;
                self.program = fds.pop();
                if self.observed.stopped.is_some() {
                    self.kill_now();
                }
            }
            WorkerReply::Ended(end) => {
                self.ended_at.get_or_insert_with(Instant::now);
                self.observed.end = Some(end);
            }
            WorkerReply::Reaped { code, signal } => {
                self.ended_at.get_or_insert_with(Instant::now);
                self.observed.reaped = Some((code, signal));
            }
            WorkerReply::Failed(failure) => {
                self.observed.failure.get_or_insert(failure);
                self.kill_now();
            }
        }
    }

    /// The driver's report, read from outside once the guest is gone, as
    /// any file copied out is: beneath the folder, no link followed, capped.
    fn read_report(&mut self) {
        let Some(program) = &self.program else { return };
        let Ok(name) = SandboxPath::parse(REPORT_FILE) else { return };
        match confine::copy_out(self.watch.files, program.as_fd(), &name, self.watch.report_bytes as u64) {
            Ok(bytes) => self.observed.report = bytes,
            Err(ArtifactError::NotFound { .. }) => {}
            Err(ArtifactError::TooLarge { size, cap, .. }) => {
                self.observed.report_refused =
                    Some(format!("the driver's report ({size} bytes) passed its cap of {cap} bytes and was dropped"))
            }
            Err(e) => self.observed.report_refused = Some(format!("the driver's report could not be read: {e}")),
        }
    }

    /// What is left once the worker is gone.
    fn finish(mut self, socket: BorrowedFd<'_>) -> Observed {
        self.stdout.drain_rest(&self.null);
        self.stderr.drain_rest(&self.null);
        self.read_report();
        self.take_replies(socket);
        if self.ready_at.is_none() && self.observed.failure.is_none() && self.observed.stopped.is_none() {
            self.observed.failure =
                Some(Failure::plain("start the guest", "the worker exited without setting the guest up"));
        }
        let end = self.ended_at.unwrap_or_else(Instant::now);
        self.observed.wall = self.ready_at.map(|r| end.saturating_duration_since(r)).unwrap_or_default();
        self.observed.stdout = self.stdout.finish();
        self.observed.stderr = self.stderr.finish();
        self.observed
    }
}

/// Adds `fd` to a poll set, waiting for input; returns its slot.
fn push<'a>(fds: &mut Vec<PollFd<'a>>, fd: &'a OwnedFd) -> usize {
    fds.push(PollFd::new(fd, PollFlags::IN));
    fds.len() - 1
}

/// Which disk cap the measured folders are past, if any.
pub fn disk_over(disk: &MeasuredDisk) -> Option<Stop> {
    let roots: Vec<&Path> = disk.roots.iter().map(PathBuf::as_path).collect();
    let used = files::usage(&roots, disk.bytes, disk.inodes);
    if used.bytes > disk.bytes {
        Some(Stop::Disk)
    } else if used.inodes > disk.inodes {
        Some(Stop::Inodes)
    } else {
        None
    }
}

/// User and system CPU time of process `pid` (all its threads), from
/// /proc/PID/stat, in clock ticks of 10 ms.
fn process_cpu_time(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second();
    Some(Duration::from_secs_f64((utime + stime) as f64 / ticks as f64))
}
