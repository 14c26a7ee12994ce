//! The forked mode, supervisor side (docs/design.md, "Forked starts"; the
//! forks' own half is `fork`).
//!
//! A [`LinuxTemplate`] is a sandbox made as any other, whose one run is the
//! template: its interpreter imports the preload and then serves forks on a
//! control socket, its standard input. Each fork is a run of its own
//! ([`ForkedSandbox`], a warm sandbox): the supervisor makes the run's
//! cgroup and pipes, asks the template for a fork, moves both of the fork's
//! processes into the cgroup before they make anything, and, once the code's
//! process says its sandbox is made, checks it from outside before any code
//! is released: its parent, its PID namespace, every capability set empty,
//! no_new_privs, one seccomp filter more than the template's, every
//! namespace other than the template's, its own /work. A fork that fails any
//! check is killed and its run fails before its first byte of code.
//!
//! The template holds no run's data, so what forked runs share is what the
//! template had before any run: its address layout, its hash seed, its host
//! ids (see the design's table). The template lives while any of its forks
//! does: each holds it.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use airlock_core::backend::{Claimed, Template, WarmInstance};
use airlock_core::{ArtifactError, Execution, Instance, Job, KillSwitch, SandboxError};
use airlock_policy::{Layer, Limit, Limits, SandboxPath};
use rustix::event::{PollFd, PollFlags, poll};

use crate::cgroup::{AIRLOCK_PROCESSES, CgroupLimits, RunCgroup};
use crate::instance::{LinuxInstance, Mode};
use crate::protocol::{self, Failure, ForkPlan, FromTemplate, ToTemplate};
use crate::supervise::{Gate, Watch};
use crate::warm::{WarmRun, WarmSandbox};
use crate::{copy, limits, process};

/// How long a template may take to import its preload.
const TEMPLATE_READY_TIMEOUT: Duration = Duration::from_secs(300);
/// The template's own clocks: it lives until the pool lets it go (its idle
/// expiry), so only the pool's kill ends it. Its forks have their own.
pub(crate) const TEMPLATE_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The namespaces a fork's code process must not share with its template.
const OWN_NAMESPACES: [&str; 7] = ["mnt", "net", "ipc", "uts", "cgroup", "user", "pid"];

/// A running template, as the supervisor reaches it.
#[derive(Debug)]
pub struct TemplateConn {
    /// The template's standard input; one fork request at a time.
    control: Mutex<OwnedFd>,
    /// The template's own process.
    pidfd: OwnedFd,
    host_pid: i32,
    /// Its seccomp filters (the helper's stack): a fork has one more.
    seccomp_filters: u32,
    /// Its `NSpid` depth: a fork's is one more.
    pid_depth: usize,
    /// Its namespaces (`/proc/PID/ns/*`), none of which a fork's code shares.
    namespaces: BTreeMap<&'static str, String>,
}

impl TemplateConn {
    /// Asks for one fork: `fds` are the run's socket, then the fork's
    /// stdin, stdout, stderr, report, ready and code pipes (the ends the
    /// fork keeps). Returns the template's pidfd, whose readiness says the
    /// template is gone.
    pub(crate) fn fork(&self, plan: &ForkPlan, fds: [BorrowedFd<'_>; protocol::FORK_FDS - 1]) -> io::Result<OwnedFd> {
        let body = serde_json::to_vec(plan).map_err(io::Error::other)?;
        let memfd = rustix::fs::memfd_create("airlock-fork-plan", rustix::fs::MemfdFlags::CLOEXEC)?;
        let mut file = std::fs::File::from(memfd);
        file.write_all(&body)?;
        let mut all = vec![file.as_fd()];
        all.extend(fds);
        let control = self.control.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        protocol::send(control.as_fd(), &ToTemplate::Fork, &all)?;
        self.pidfd.try_clone()
    }

    fn alive(&self) -> bool {
        !readable(self.pidfd.as_fd())
    }
}

/// What a template's thread says while it starts: where its cgroup keeps
/// its memory, or how its run ended.
type TemplateStarting = Result<Option<PathBuf>, Result<Execution, SandboxError>>;

/// A sandbox whose one run is a template.
pub struct LinuxTemplate {
    /// The template's sandbox: its policy, runtime and file access are its
    /// forks' too.
    instance: Arc<LinuxInstance>,
    conn: TemplateConn,
    kill: KillSwitch,
    thread: Mutex<Option<JoinHandle<()>>>,
    ended: Arc<AtomicBool>,
    memory_usage: Option<PathBuf>,
}

impl std::fmt::Debug for LinuxTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxTemplate").field("host_pid", &self.conn.host_pid).finish_non_exhaustive()
    }
}

impl LinuxTemplate {
    /// Starts `instance`'s template: returns once its preload is imported
    /// and it serves forks.
    pub fn start(instance: LinuxInstance, preload: &[String]) -> Result<LinuxTemplate, SandboxError> {
        let refuse = |reason: &str| SandboxError::Unsupported {
            backend: "linux",
            what: "fork runs from a template".to_owned(),
            reason: reason.to_owned(),
        };
        if instance.cgroups.is_none() {
            return Err(refuse("a fork's processes are moved into the run's cgroup, and this host gives none"));
        }
        if !instance.degraded.is_empty() {
            return Err(refuse(
                "a fork must put every layer of the policy in force; a degraded policy runs pooled or cold",
            ));
        }
        // Loaded (or refused, naming where to put it) before the template starts.
        instance.native.memfd(&instance.helper)?;
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| SandboxError::io("making the template's control socket", e.into()))?;
        let instance = Arc::new(instance);
        let kill = KillSwitch::new();
        let ended = Arc::new(AtomicBool::new(false));
        let (usage_tx, usage_rx) = std::sync::mpsc::channel();
        let thread = {
            let (instance, kill, ended, preload) = (instance.clone(), kill.clone(), ended.clone(), preload.to_vec());
            std::thread::Builder::new()
                .name("airlock-template".to_owned())
                .spawn(move || {
                    let outcome = instance.run_template(&preload, theirs, &kill, &usage_tx);
                    ended.store(true, Ordering::SeqCst);
                    let _ = usage_tx.send(Err(outcome));
                })
                .map_err(|e| SandboxError::io("starting a template's thread", e))?
        };
        let fail = |detail: String| SandboxError::Setup { step: "start the template".to_owned(), detail };
        let memory_usage = match usage_rx.recv() {
            Ok(Ok(usage)) => usage,
            Ok(Err(outcome)) => return Err(never_ready(outcome, thread)),
            Err(_) => return Err(fail("its thread ended without a word".to_owned())),
        };
        let ready = recv_ready(ours.as_fd());
        let conn = match ready.and_then(|(pidfd, ())| connect(ours, pidfd)) {
            Ok(conn) => conn,
            Err(detail) => {
                kill.kill();
                let outcome = usage_rx.recv().ok().and_then(Result::err);
                let _ = thread.join();
                return Err(match outcome {
                    Some(Ok(execution)) => fail(format!("{detail}; {}", stderr_tail(&execution))),
                    Some(Err(error)) => error,
                    None => fail(detail),
                });
            }
        };
        Ok(LinuxTemplate { instance, conn, kill, thread: Mutex::new(Some(thread)), ended, memory_usage })
    }

    /// Forks one run's sandbox, ready as a warm one.
    pub fn fork(self: &Arc<Self>) -> Result<ForkedSandbox, SandboxError> {
        if !self.is_alive() {
            return Err(SandboxError::Setup { step: "fork a run".to_owned(), detail: "the template ended".to_owned() });
        }
        WarmSandbox::start(Box::new(ForkedRunner { template: self.clone(), root: Mutex::new(None) }), &[])
            .map(ForkedSandbox)
    }

    fn is_alive(&self) -> bool {
        !self.ended.load(Ordering::SeqCst) && self.conn.alive()
    }
}

impl Drop for LinuxTemplate {
    fn drop(&mut self) {
        self.kill.kill();
        let thread = self.thread.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The backend's handle on a template.
#[derive(Debug)]
pub struct TemplateHandle(pub Arc<LinuxTemplate>);

impl Template for TemplateHandle {
    fn is_ready(&self) -> bool {
        self.0.is_alive()
    }

    fn memory_bytes(&self) -> Option<u64> {
        let file = self.0.memory_usage.as_ref().filter(|_| self.0.is_alive())?;
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    fn fork(&self) -> Result<Box<dyn WarmInstance>, SandboxError> {
        Ok(Box::new(self.0.fork()?))
    }
}

/// One fork of a template, waiting for its run.
pub struct ForkedSandbox(WarmSandbox);

impl WarmInstance for ForkedSandbox {
    fn is_ready(&self) -> bool {
        self.0.is_ready()
    }

    fn memory_bytes(&self) -> Option<u64> {
        self.0.memory_bytes()
    }

    fn claim(self: Box<Self>, claim: airlock_core::Claim) -> Claimed {
        Box::new(self.0).claim(claim)
    }
}

/// A fork's own /work and /tmp, opened through its root from outside, held
/// after its run for the outputs' copy-out.
#[derive(Debug)]
pub struct ForkRoot {
    pub work: OwnedFd,
    pub tmp: OwnedFd,
}

/// What a warm fork's thread runs (see `warm`).
struct ForkedRunner {
    template: Arc<LinuxTemplate>,
    /// The fork's root, once its setup was checked.
    root: Mutex<Option<ForkRoot>>,
}

impl WarmRun for ForkedRunner {
    fn run(&self, _preload: &[String], _job: &Job, gate: &mut Gate<'_>) -> Result<Execution, SandboxError> {
        let (execution, root) = self.template.instance.run_fork(&self.template.conn, gate)?;
        *self.root.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = root;
        Ok(execution)
    }

    fn copy_in(
        &self,
        waiting: &crate::supervise::Waiting<'_>,
        written: u64,
        path: &SandboxPath,
        data: &[u8],
    ) -> Result<u64, SandboxError> {
        let root = waiting.fork_root().ok_or_else(|| SandboxError::Setup {
            step: "copy the files in".to_owned(),
            detail: "the fork's /work was not opened".to_owned(),
        })?;
        self.template.instance.copy_in_at(root.work.as_fd(), written, path, data)
    }

    fn prepare(&self, waiting: &crate::supervise::Waiting<'_>) -> Result<(), SandboxError> {
        let root = waiting.fork_root().ok_or_else(|| SandboxError::Setup {
            step: "seed the fork's /tmp".to_owned(),
            detail: "the fork's /tmp was not opened".to_owned(),
        })?;
        // What a sandbox's /tmp holds from its start (matplotlib's
        // configuration and font cache), as for a cold run.
        for (name, content) in &self.template.instance.runtime.tmp_seed {
            copy::write(&self.template.instance.files, root.tmp.as_fd(), &SandboxPath::parse(name)?, content)?;
        }
        Ok(())
    }

    fn refuses_network(&self) -> Option<&'static str> {
        Some("it allows hosts, and a fork has no proxy listener (a pool in the pooled mode serves it warm)")
    }

    fn into_instance(self: Box<Self>) -> Box<dyn Instance> {
        let root = self.root.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        Box::new(ForkedInstance { template: self.template, root })
    }
}

/// A fork whose run is over: its /work, for reading the outputs. A fork
/// runs once; a second run is refused, naming the fix.
struct ForkedInstance {
    template: Arc<LinuxTemplate>,
    root: Option<ForkRoot>,
}

impl ForkedInstance {
    fn runs_once() -> SandboxError {
        SandboxError::Unsupported {
            backend: "linux",
            what: "run again in a forked sandbox".to_owned(),
            reason: "a forked sandbox runs one job: take another sandbox from the pool for the next (or use the \
                     pool's pooled mode, whose sandboxes run a second job cold)"
                .to_owned(),
        }
    }
}

impl Instance for ForkedInstance {
    fn write(&mut self, _path: &SandboxPath, _data: &[u8]) -> Result<(), SandboxError> {
        Err(ForkedInstance::runs_once())
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        match &self.root {
            Some(root) => copy::read(&self.template.instance.files, root.work.as_fd(), path, max_bytes),
            None => Err(ArtifactError::NotFound { path: path.to_string() }),
        }
    }

    fn set_limits(&mut self, _limits: Limits) {}

    fn run(&mut self, _job: &Job, _kill: &KillSwitch) -> Result<Execution, SandboxError> {
        Err(ForkedInstance::runs_once())
    }
}

impl LinuxInstance {
    /// The template's run: until `kill`, or until the template ends.
    fn run_template(
        &self,
        preload: &[String],
        control: OwnedFd,
        kill: &KillSwitch,
        usage_tx: &std::sync::mpsc::Sender<TemplateStarting>,
    ) -> Result<Execution, SandboxError> {
        let job = Job { language: airlock_policy::Language::Python, ..Job::default() };
        let cgroup_made = |usage: Option<PathBuf>| {
            let _ = usage_tx.send(Ok(usage));
        };
        self.run_as(&job, kill, Mode::Template { preload, control, cgroup_made: &cgroup_made })
    }

    /// A fork of the template `conn`, as a warm run whose claim waits in `gate`.
    fn run_fork(
        &self,
        conn: &TemplateConn,
        gate: &mut Gate<'_>,
    ) -> Result<(Execution, Option<ForkRoot>), SandboxError> {
        // The template's setup helper, if it exited after the template began.
        self.reap_ending();
        let limits = &self.policy.limits;
        let hierarchy = self.cgroups.as_ref().ok_or_else(|| SandboxError::Setup {
            step: "create the run's cgroup".to_owned(),
            detail: "a fork needs a cgroup".to_owned(),
        })?;
        let mut cgroup: Box<dyn RunCgroup> = hierarchy
            .create(&CgroupLimits {
                memory_bytes: limits.memory_bytes,
                pids: limits.pids + AIRLOCK_PROCESSES,
                cpus: limits.cpus,
            })
            .map_err(|e| SandboxError::Setup { step: "create the run's cgroup".to_owned(), detail: e.to_string() })?;
        let plan = ForkPlan {
            hostname: "airlock".to_owned(),
            disk_bytes: limits.disk_bytes,
            disk_inodes: limits.disk_inodes,
            rlimits: limits::for_policy(&self.policy, false),
            landlock: Some(self.landlock_plan(Vec::new())),
            seccomp: self.seccomp.as_ref().clone(),
        };
        let caps = airlock_core::driver::ReportCaps::default();
        let kill = KillSwitch::new();
        let watch = Watch {
            wall_time: limits.wall_time,
            cpu_time: limits.cpu_time,
            output_bytes: limits.output_bytes,
            output_overflow: limits.output_overflow,
            report_bytes: caps.report_bytes,
            stdin: &[],
            kill: &kill,
            open_files: u64::from(limits.open_files),
            // The fork's tmpfs is checked once its run is over (below).
            stage: self.stage.as_fd(),
        };
        let (mut observed, root) = crate::supervise::run_forked(conn, &plan, cgroup.as_ref(), &watch, gate)
            .map_err(|e| SandboxError::io("running the fork", e))?;
        if let Some(root) = &root {
            if let Ok(vfs) = rustix::fs::fstatvfs(root.work.as_fd()) {
                if vfs.f_bavail == 0 {
                    observed.reached.insert(Limit::Disk);
                }
                if vfs.f_favail == 0 {
                    observed.reached.insert(Limit::Inodes);
                }
            }
        }
        if !observed.started {
            return Err(crate::instance::never_started(&observed, None));
        }
        let stats = cgroup.stats();
        let version = cgroup.version();
        let mut failures = Vec::new();
        if let Err(e) = cgroup.remove() {
            failures.push(format!("removing the run's cgroup failed: {e}"));
        }
        let mut execution = self.execution(observed, stats, Some(version), &caps, None, failures);
        execution.isolation.details.insert("host_ids".to_owned(), self.host_id.mapping.describe_for_forks());
        execution.isolation.details.insert(
            "start".to_owned(),
            "forked from a template that imported the preload and ran no code: it shares the template's host ids, \
             address layout and hash seed with the template's other runs (docs/design.md, \"Forked starts\")"
                .to_owned(),
        );
        Ok((execution, root))
    }
}

/// A forked run's state in the supervisor's loop (`supervise`).
pub(crate) struct ForkedRun<'a> {
    template: &'a TemplateConn,
    init: Option<OwnedFd>,
    /// The code's process: its host pid and pidfd.
    code: Option<(i32, OwnedFd)>,
    host_pids: Vec<i32>,
    /// The fork's root, once its setup was checked.
    pub root: Option<ForkRoot>,
}

/// What a checked fork put in force.
pub(crate) struct Started {
    pub layers: Vec<Layer>,
}

impl<'a> ForkedRun<'a> {
    pub fn new(template: &'a TemplateConn) -> ForkedRun<'a> {
        ForkedRun { template, init: None, code: None, host_pids: Vec::new(), root: None }
    }

    /// The template forked: `fds` are the init's and the code's pidfds.
    /// Checks both are the template's children in a PID namespace one below
    /// its own, the init confined, and moves both into the run's cgroup,
    /// the init first.
    pub fn adopt(
        &mut self,
        init_pid: i32,
        code_pid: i32,
        fds: Vec<OwnedFd>,
        cgroup: Option<&dyn RunCgroup>,
    ) -> Result<(), Failure> {
        let step = "adopt the fork";
        let [init, code]: [OwnedFd; 2] = fds
            .try_into()
            .map_err(|fds: Vec<OwnedFd>| Failure::plain(step, format!("{} pidfds came, not 2", fds.len())))?;
        let init_host = host_pid(init.as_fd()).map_err(|e| Failure::new(step, "the init's pid", &e))?;
        let code_host = host_pid(code.as_fd()).map_err(|e| Failure::new(step, "the code's pid", &e))?;
        self.init = Some(init);
        self.host_pids = vec![init_host, code_host];
        self.code = Some((code_host, code));
        let template = self.template;
        let fail = |what: String| Failure::plain(step, what);
        check_child(init_host, template, 1)
            .map_err(|e| fail(format!("the run's init (template's pid {init_pid}): {e}")))?;
        check_confined(init_host, template).map_err(|e| fail(format!("the run's init: {e}")))?;
        check_child(code_host, template, 2)
            .map_err(|e| fail(format!("the code's process (template's pid {code_pid}): {e}")))?;
        let cgroup = cgroup.ok_or_else(|| fail("a fork needs a cgroup".to_owned()))?;
        for pid in [init_host, code_host] {
            cgroup.adopt(pid).map_err(|e| Failure::new("move the fork into the run's cgroup", "", &e))?;
        }
        Ok(())
    }

    pub fn init_pidfd(&mut self) -> Option<OwnedFd> {
        self.init.take()
    }

    pub fn host_pids(&self) -> Vec<i32> {
        self.host_pids.clone()
    }

    /// The code's process says its sandbox is made: its own report, then
    /// the checks from outside, then its /work and /tmp, opened.
    pub fn check_setup(&mut self, report: &str) -> Result<Started, Failure> {
        let step = "check the fork's sandbox";
        let program = std::ffi::CString::new("the fork").unwrap_or_default();
        let landlock = process::parse_setup(report, &program)?;
        let (pid, pidfd) = self.code.as_ref().ok_or_else(|| Failure::plain(step, "the fork was not adopted"))?;
        let fail = |what: String| Failure::plain(step, what);
        check_confined(*pid, self.template).map_err(|e| fail(format!("the code's process: {e}")))?;
        for kind in OWN_NAMESPACES {
            let link = std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                .map_err(|e| Failure::new(step, format!("the code's {kind} namespace"), &e))?;
            if self.template.namespaces.get(kind).is_some_and(|t| *t == link.to_string_lossy()) {
                return Err(fail(format!("the code's process shares the template's {kind} namespace")));
            }
        }
        let open = |dir: &str| {
            rustix::fs::open(
                format!("/proc/{pid}/root/{dir}"),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Failure::new(step, format!("open the fork's /{dir}"), &e.into()))
        };
        let root = ForkRoot { work: open("work")?, tmp: open("tmp")? };
        // Opened by pid: the process must still be the fork (its pid not
        // reused), which its pidfd, not yet readable, says.
        if readable(pidfd.as_fd()) {
            return Err(fail("the code's process ended during its setup".to_owned()));
        }
        let (work, tmp) = (stat(root.work.as_fd())?, stat(root.tmp.as_fd())?);
        let template_work = self.template_work_dev();
        if work.st_dev != tmp.st_dev || template_work == Some(work.st_dev) {
            return Err(fail("the fork's /work and /tmp are not its own tmpfs".to_owned()));
        }
        self.root = Some(root);
        Ok(Started { layers: process::layers_in_force(landlock) })
    }

    fn template_work_dev(&self) -> Option<u64> {
        let path = format!("/proc/{}/root/work", self.template.host_pid);
        std::fs::metadata(path).ok().map(|m| std::os::linux::fs::MetadataExt::st_dev(&m))
    }
}

fn stat(fd: BorrowedFd<'_>) -> Result<rustix::fs::Stat, Failure> {
    rustix::fs::fstat(fd).map_err(|e| Failure::new("check the fork's sandbox", "fstat", &e.into()))
}

/// The pid a pidfd names, in this process's PID namespace.
fn host_pid(pidfd: BorrowedFd<'_>) -> io::Result<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    info.lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| io::Error::other("the process has ended"))
}

/// `/proc/PID/status`, as its fields.
fn status(pid: i32) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.to_owned(), value.trim().to_owned()))
        .collect())
}

/// `pid` is the template's child, at `depth` in a PID namespace one below
/// the template's (1: the run's init, 2: the code).
fn check_child(pid: i32, template: &TemplateConn, depth: i32) -> Result<(), String> {
    let fields = status(pid)?;
    let field = |key: &str| fields.get(key).map(String::as_str).unwrap_or_default();
    if field("PPid") != template.host_pid.to_string() {
        return Err(format!("its parent is {}, not the template {}", field("PPid"), template.host_pid));
    }
    let nspid: Vec<&str> = field("NSpid").split_whitespace().collect();
    if nspid.len() != template.pid_depth + 1 || nspid.last() != Some(&depth.to_string().as_str()) {
        return Err(format!("its NSpid is {:?}, not {depth} one namespace below the template's", field("NSpid")));
    }
    Ok(())
}

/// `pid` holds no capability, has no_new_privs and one seccomp filter more
/// than the template.
fn check_confined(pid: i32, template: &TemplateConn) -> Result<(), String> {
    let fields = status(pid)?;
    let field = |key: &str| fields.get(key).map(String::as_str).unwrap_or_default();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        if u64::from_str_radix(field(set), 16) != Ok(0) {
            return Err(format!("{set} is {}, not empty", field(set)));
        }
    }
    if field("NoNewPrivs") != "1" {
        return Err("no_new_privs is not set".to_owned());
    }
    let filters = template.seccomp_filters + 1;
    if field("Seccomp") != "2" || field("Seccomp_filters") != filters.to_string() {
        return Err(format!("it has {} seccomp filters, not {filters}", field("Seccomp_filters")));
    }
    Ok(())
}

/// Waits for the template's word that it serves forks, and its pidfd.
fn recv_ready(control: BorrowedFd<'_>) -> Result<(OwnedFd, ()), String> {
    match crate::supervise::recv_within_as::<FromTemplate>(control, TEMPLATE_READY_TIMEOUT) {
        Ok(Some((FromTemplate::Ready, mut fds))) if fds.len() == 1 => Ok((fds.remove(0), ())),
        Ok(Some((FromTemplate::Failed(failure), _))) => Err(failure.to_string()),
        Ok(Some((other, _))) => Err(format!("the template said {other:?}")),
        Ok(None) => Err("the template ended before it served forks".to_owned()),
        Err(e) => Err(format!("the template did not serve forks: {e}")),
    }
}

/// The template's facts, read from outside.
fn connect(control: OwnedFd, pidfd: OwnedFd) -> Result<TemplateConn, String> {
    let pid = host_pid(pidfd.as_fd()).map_err(|e| format!("the template's pid: {e}"))?;
    let fields = status(pid)?;
    let field = |key: &str| fields.get(key).map(String::as_str).unwrap_or_default();
    let seccomp_filters = field("Seccomp_filters").parse().map_err(|_| "the template's seccomp filters".to_owned())?;
    let pid_depth = field("NSpid").split_whitespace().count();
    let mut namespaces = BTreeMap::new();
    for kind in OWN_NAMESPACES {
        let link =
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).map_err(|e| format!("its {kind} namespace: {e}"))?;
        namespaces.insert(kind, link.to_string_lossy().into_owned());
    }
    Ok(TemplateConn { control: Mutex::new(control), pidfd, host_pid: pid, seccomp_filters, pid_depth, namespaces })
}

fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    !matches!(poll(&mut fds, Some(&zero)), Ok(0))
}

fn stderr_tail(execution: &Execution) -> String {
    let stderr = String::from_utf8_lossy(&execution.stderr.bytes);
    let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!("the template ended ({}): {}", execution.status, tail.join("\n"))
}

fn never_ready(outcome: Result<Execution, SandboxError>, thread: JoinHandle<()>) -> SandboxError {
    let _ = thread.join();
    match outcome {
        Err(error) => error,
        Ok(execution) => SandboxError::Setup { step: "start the template".to_owned(), detail: stderr_tail(&execution) },
    }
}
