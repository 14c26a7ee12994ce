//! One Linux sandbox: its namespaces and work directory, held by descriptors,
//! and the runs made in it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use airlock_core::driver::{self, PROGRAM_DIR, READY_FILE, REPORT_FILE, ReportCaps};
use airlock_core::outcome::{self, CodeEnd, Observations, Stop};
use airlock_core::{ArtifactError, Execution, Instance, Job, KillSwitch, Runtime, SandboxError};
use airlock_policy::{Isolation, Layer, Limit, Policy, RunStart, SandboxPath, Usage};

use crate::cgroup::{AIRLOCK_PROCESSES, CgroupLimits, Hierarchy, RunCgroup};
use crate::protocol::{CgroupEntry, LandlockPlan, ProcessEnd, RunPlan};
use crate::seccomp::Instruction;
use crate::supervise::{self, KillReason, Observed, SandboxFds, Watch};
use crate::warm::host_allows_huge_pages;
use crate::{copy, limits};

/// A sandbox made by [`crate::LinuxBackend`].
pub struct LinuxInstance {
    pub(crate) helper: PathBuf,
    /// The backend's native library (forked mode, arena allocator).
    pub(crate) native: Arc<crate::native::NativeLibrary>,
    pub(crate) policy: Policy,
    pub(crate) runtime: Runtime,
    pub(crate) user_ns: OwnedFd,
    pub(crate) mount_ns: OwnedFd,
    /// The stage tmpfs's root, for its free space after a run.
    pub(crate) stage: OwnedFd,
    pub(crate) work: OwnedFd,
    pub(crate) cgroups: Option<Hierarchy>,
    pub(crate) degraded: Vec<Layer>,
    pub(crate) seccomp: Arc<Vec<Instruction>>,
    pub(crate) landlock_abi: Option<u32>,
    /// Bytes copied in since the last run (the cap is per run).
    pub(crate) written: u64,
    /// How files are opened as the sandbox's user.
    pub(crate) files: copy::FileAccess,
    /// Facts of this sandbox for every record's isolation details (its host ids...).
    pub(crate) details: std::collections::BTreeMap<String, String>,
    /// Helpers whose work is done (the one that made the sandbox, the last
    /// run's): the sandbox's start and its runs' records do not wait for
    /// them to exit (see `supervise::run`). Reaped at the next run if they
    /// have exited, and when the sandbox goes.
    pub(crate) ending: std::sync::Mutex<Vec<supervise::Ending>>,
    /// A helper started while the sandbox was built, for its first run
    /// when that run is made on the same thread (see `spare`).
    pub(crate) run_helper: std::sync::Mutex<Option<crate::spare::SpareHelper>>,
    /// The cgroup of the sandbox's first run, made while the helper built
    /// the sandbox (the supervisor waits then anyway), with the limits it
    /// was made with: the first run takes it when its limits are the same,
    /// and any other run makes its own. Removed with the sandbox if no run
    /// took it.
    pub(crate) first_cgroup: std::sync::Mutex<Option<(CgroupLimits, Box<dyn RunCgroup>)>>,
    /// The sandbox's host ids, held while it lives; last, so they are given
    /// back only once the namespaces above are closed.
    pub(crate) host_id: crate::hostid::HostId,
}

impl std::fmt::Debug for LinuxInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxInstance")
            .field("policy", &self.policy)
            .field("host_ids", &self.host_id.mapping)
            .finish_non_exhaustive()
    }
}

impl Instance for LinuxInstance {
    fn write(&mut self, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
        self.written = self.copy_in(self.written, path, data)?;
        Ok(())
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        copy::read(&self.files, self.work.as_fd(), path, max_bytes)
    }

    fn set_limits(&mut self, limits: airlock_policy::Limits) {
        self.policy.limits = limits;
    }

    fn run(&mut self, job: &Job, kill: &KillSwitch) -> Result<Execution, SandboxError> {
        // The copy-in cap counts what was copied in for this run.
        self.written = 0;
        self.run_as(job, kill, Mode::Cold)
    }

    fn start_warm(self: Box<Self>, preload: &[String]) -> Result<Box<dyn airlock_core::WarmInstance>, SandboxError> {
        let refuse = |reason: &str| SandboxError::Unsupported {
            backend: "linux",
            what: "start this sandbox warm".to_owned(),
            reason: reason.to_owned(),
        };
        if self.cgroups.is_none() {
            return Err(refuse("without a cgroup the preload's CPU time could not be told from the run's"));
        }
        Ok(Box::new(crate::warm::WarmSandbox::start(self, preload)?))
    }

    fn start_template(self: Box<Self>, preload: &[String]) -> Result<Box<dyn airlock_core::Template>, SandboxError> {
        let template = crate::forked::LinuxTemplate::start(*self, preload)?;
        Ok(Box::new(crate::forked::TemplateHandle(Arc::new(template))))
    }
}

/// How a run starts.
pub(crate) enum Mode<'a, 'g> {
    /// The job's code, at once.
    Cold,
    /// Ahead of its claim.
    Warm(Warm<'a, 'g>),
    /// A forked pool's template (see `forked`): its driver imports the
    /// preload and serves forks on `control`, its standard input, with the
    /// backend's native library. `cgroup_made` is told where its cgroup
    /// keeps its memory; the run lasts until `kill`.
    Template { preload: &'a [String], control: OwnedFd, cgroup_made: &'a dyn Fn(Option<PathBuf>) },
}

/// A warm run: its driver imports `preload`, then the run waits in `gate`
/// for its claim.
pub(crate) struct Warm<'a, 'g> {
    pub preload: &'a [String],
    pub gate: &'a mut supervise::Gate<'g>,
}

/// CPU seconds a warm run's code process may spend on its preload on top of
/// the run's own: RLIMIT_CPU counts from the process's start, the cgroup's
/// check (the run's limit) from the code's release.
const PRELOAD_CPU_SECONDS: u64 = 60;

impl LinuxInstance {
    /// Copies `data` in at `path`, `written` bytes already copied for this
    /// run; returns the new total.
    pub(crate) fn copy_in(&self, written: u64, path: &SandboxPath, data: &[u8]) -> Result<u64, SandboxError> {
        let total = self.check_copy_in(written, path, data)?;
        copy::write(&self.files, self.work.as_fd(), path, data)?;
        Ok(total)
    }

    /// Whether `data` may be copied in at `path` with `written` bytes
    /// copied before it; the new total.
    fn check_copy_in(&self, written: u64, path: &SandboxPath, data: &[u8]) -> Result<u64, SandboxError> {
        let limits = &self.policy.limits;
        let fail = |reason: String| SandboxError::Input { path: path.to_string(), reason };
        if data.len() as u64 > limits.file_bytes {
            return Err(fail(format!("{} bytes is above max_file_bytes ({})", data.len(), limits.file_bytes)));
        }
        if written + data.len() as u64 > limits.files_total_bytes {
            return Err(fail(format!(
                "the files copied in would total more than max_files_total_bytes ({})",
                limits.files_total_bytes
            )));
        }
        Ok(written + data.len() as u64)
    }

    /// Copies `data` in at `path` below `work` (a fork's /work), `written`
    /// bytes already copied for this run; returns the new total.
    pub(crate) fn copy_in_at(
        &self,
        work: std::os::fd::BorrowedFd<'_>,
        written: u64,
        path: &SandboxPath,
        data: &[u8],
    ) -> Result<u64, SandboxError> {
        let total = self.check_copy_in(written, path, data)?;
        copy::write(&self.files, work, path, data)?;
        Ok(total)
    }

    /// The Landlock plan for the code: writes below /work, /tmp and the
    /// runtime's writable folders, and to `files` (a few devices, FIFOs).
    pub(crate) fn landlock_plan(&self, files: Vec<String>) -> LandlockPlan {
        let mut writable_files: Vec<String> = ["/dev/null", "/dev/zero", "/dev/full"].map(String::from).to_vec();
        writable_files.extend(files);
        LandlockPlan {
            writable_dirs: ["/work", "/tmp"]
                .into_iter()
                .map(String::from)
                .chain(self.runtime.mounts.iter().filter(|m| m.writable).map(|m| m.sandbox.display().to_string()))
                .collect(),
            writable_files,
            required: !self.degraded.contains(&Layer::Landlock),
        }
    }

    /// Reaps the helpers set aside as ending that have exited since: a
    /// helper's exit is not waited for, but nor is it left a zombie while
    /// the sandbox stands (a template's for its pool's expiry).
    pub(crate) fn reap_ending(&self) {
        self.ending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain_mut(|e| !e.try_reap());
    }

    /// Kills and reaps every helper set aside as ending: each has handed
    /// its sandbox over, so what is left of it is only its exit. For a
    /// sandbox about to wait for a claim, however long, where one that
    /// exits after a try would stay a zombie through the whole wait.
    fn end_ending(&self) {
        drop(std::mem::take(&mut *self.ending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)));
    }

    /// Runs `job` as `mode` says (warm or a template: the job then only
    /// gives the language).
    pub(crate) fn run_as(&self, job: &Job, kill: &KillSwitch, mode: Mode<'_, '_>) -> Result<Execution, SandboxError> {
        let limits = &self.policy.limits;
        let caps = ReportCaps::default();
        let huge_pages = host_allows_huge_pages();
        let start = match &mode {
            Mode::Warm(warm) => driver::Start::Warm { preload: warm.preload, huge_pages },
            Mode::Template { preload, .. } => driver::Start::Template { preload, huge_pages },
            Mode::Cold => driver::Start::Announced,
        };
        let template = matches!(mode, Mode::Template { .. });
        let program = driver::program_with(job, &self.runtime, &caps, start);
        // The native library, for the drivers that load it (see `native`): a
        // template, which needs it; a pooled sandbox, for its arena allocator
        // alone, which only huge pages make worth having. An optimisation
        // there, not a layer: a sandbox whose library cannot be had starts
        // without it.
        let native = match &mode {
            Mode::Template { .. } => Some(self.native.memfd(&self.helper)?),
            Mode::Warm(_) if huge_pages => self.native.memfd(&self.helper).ok(),
            Mode::Warm(_) | Mode::Cold => None,
        };
        // A cold run that allows hosts gets its proxy as it starts; a warm
        // run's is its claim's; a template's forks never have one.
        let cold_proxy = self.policy.network.is_enabled() && matches!(mode, Mode::Cold);
        let warm = matches!(mode, Mode::Warm(_));
        let mut env = self.runtime.environment(&self.policy);
        if cold_proxy {
            // The proxy is the only way out; clients find it here. Set only
            // when hosts are allowed, so code without network sees none (a
            // warm run's are set at its claim, as its proxy starts then; a
            // template's forks never have one: their claims that allow
            // hosts run cold).
            for (key, value) in airlock_net::proxy_environment(std::net::SocketAddr::V4(crate::PROXY_ADDR)) {
                env.insert(key.to_owned(), value);
            }
        }
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let landlock_required = !self.degraded.contains(&Layer::Landlock);
        let mut fifos = Vec::new();
        if program.reports {
            fifos.push(format!("{PROGRAM_DIR}/{REPORT_FILE}"));
        }
        if program.announces {
            fifos.push(format!("{PROGRAM_DIR}/{READY_FILE}"));
        }
        let mut rlimits = limits::for_policy(&self.policy, self.cgroups.is_none());
        for limit in rlimits.iter_mut().filter(|l| l.resource == crate::protocol::RlimitResource::Cpu) {
            match &mode {
                Mode::Cold => {}
                Mode::Warm(_) => {
                    limit.soft += PRELOAD_CPU_SECONDS;
                    limit.hard += PRELOAD_CPU_SECONDS;
                }
                // The template lives for its pool's expiry; each fork sets its own.
                Mode::Template { .. } => (limit.soft, limit.hard) = (u64::MAX, u64::MAX),
            }
        }
        let plan = RunPlan {
            supervisor_pid: std::process::id() as i32,
            // Filled in by `supervise::run` from the cgroup it is handed.
            cgroup: CgroupEntry::None,
            cgroup_fds: 0,
            hostname: "airlock".to_owned(),
            program_files: program.files.iter().map(|f| (f.name.to_owned(), f.content.clone())).collect(),
            report_fifo: program.reports,
            ready_fifo: program.announces,
            code_fifo: program.fed,
            // Every warm sandbox makes one: whether its run allows hosts,
            // and which, is the claim's to say.
            proxy_listener: cold_proxy || warm,
            // The proxy must serve before the code's first byte: a cold
            // run's code waits for it; a warm run's imports its preload
            // meanwhile, and its proxy starts at the claim (`supervise`).
            hold_for_release: cold_proxy,
            argv: program.argv,
            env,
            cwd: job.cwd.as_ref().map_or_else(|| "/work".to_owned(), ToString::to_string),
            rlimits,
            // A template enters no Landlock domain (its forks do) and runs
            // under the template's filter.
            landlock: (!template && (self.landlock_abi.is_some() || landlock_required))
                .then(|| self.landlock_plan(fifos)),
            seccomp: if template { crate::seccomp::template_program() } else { self.seccomp.as_ref().clone() },
            template,
            // Set by `supervise::run` from the descriptors it is handed.
            native_library: false,
        };

        let cgroup_limits = run_cgroup_limits(limits);
        let made_before = self.first_cgroup.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let mut cgroup: Option<Box<dyn RunCgroup>> = match (&self.cgroups, made_before) {
            (Some(_), Some((made_with, made))) if made_with == cgroup_limits => Some(made),
            (Some(h), _) => Some(h.create(&cgroup_limits).map_err(|e| SandboxError::Setup {
                step: "create the run's cgroup".to_owned(),
                detail: e.to_string(),
            })?),
            (None, _) => None,
        };
        let lifetime = |limit| if template { crate::forked::TEMPLATE_LIFETIME } else { limit };
        let watch = Watch {
            wall_time: lifetime(limits.wall_time),
            cpu_time: lifetime(limits.cpu_time),
            output_bytes: limits.output_bytes,
            output_overflow: limits.output_overflow,
            report_bytes: caps.report_bytes,
            stdin: &job.stdin,
            kill,
            open_files: u64::from(limits.open_files),
            stage: self.stage.as_fd(),
        };
        // The proxy starts on the listener the sandbox made inside its own
        // namespace, before the code is released; it serves until the run is over.
        let mut proxy: Option<Result<airlock_net::ProxyHandle, airlock_net::NetError>> = None;
        let mut start_proxy = |listener: OwnedFd, network: Option<&airlock_policy::NetworkPolicy>| {
            let config = airlock_net::ProxyConfig::from_policy(network.unwrap_or(&self.policy.network));
            let started = airlock_net::Proxy::start(std::net::TcpListener::from(listener), config);
            let ok = started.is_ok();
            proxy = Some(started);
            ok
        };
        self.reap_ending();
        // A warm run waits in its gate for as long as its pool keeps it: the
        // sandbox's setup helper, done since the preload began, is ended and
        // reaped before the wait, not left a zombie through it.
        let mut reaping_gate;
        let (gate, stdin) = match mode {
            Mode::Cold => (None, None),
            Mode::Warm(warm) => {
                reaping_gate = |waiting: &supervise::Waiting<'_>| {
                    self.end_ending();
                    (warm.gate)(waiting)
                };
                (Some(&mut reaping_gate as &mut supervise::Gate<'_>), None)
            }
            Mode::Template { control, cgroup_made, .. } => {
                cgroup_made(cgroup.as_ref().map(|c| c.memory_usage_file()));
                (None, Some(control))
            }
        };
        let spare = self.run_helper.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let (observed, ending) = supervise::run(
            crate::spare::HelperSource { path: &self.helper, spare },
            plan,
            SandboxFds { user_ns: self.user_ns.as_fd(), mount_ns: self.mount_ns.as_fd(), stdin, native },
            cgroup.as_deref(),
            &watch,
            &mut start_proxy,
            gate,
        )
        .map_err(|e| SandboxError::io("running the sandbox", e))?;
        self.ending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(ending);
        if !observed.started {
            return Err(never_started(&observed, proxy));
        }

        // The code started: from here on, whatever fails, everything
        // observed goes into the record.
        let mut failures = Vec::new();
        let proxy = match proxy {
            Some(Ok(handle)) => Some(handle.finish()),
            Some(Err(e)) => {
                failures.push(format!("the network proxy failed: {e}"));
                None
            }
            // A warm run's proxy is its claim's to ask for (and a listener
            // missing then stopped it before its code).
            None if cold_proxy => {
                failures.push("the sandbox did not hand over its proxy socket".to_owned());
                None
            }
            None => None,
        };
        // The kernel's counters, read before the cgroup goes.
        let stats = cgroup.as_ref().map(|c| c.stats()).unwrap_or_default();
        let cgroup_version = cgroup.as_ref().map(|c| c.version());
        if let Some(mut c) = cgroup.take() {
            if let Err(e) = c.remove() {
                failures.push(format!("removing the run's cgroup failed: {e}"));
            }
        }
        Ok(self.execution(observed, stats, cgroup_version, &caps, proxy, failures))
    }
}

/// The cgroup limits of a run with `limits`.
pub(crate) fn run_cgroup_limits(limits: &airlock_policy::Limits) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: limits.memory_bytes,
        // The pids limit is the code's, on top of the run's init.
        pids: limits.pids + AIRLOCK_PROCESSES,
        cpus: limits.cpus,
    }
}

/// Why a run whose code never started failed.
pub(crate) fn never_started(
    observed: &Observed,
    proxy: Option<Result<airlock_net::ProxyHandle, airlock_net::NetError>>,
) -> SandboxError {
    let setup = |step: &str, detail: String| SandboxError::Setup { step: step.to_owned(), detail };
    if let Some(failure) = &observed.setup_failure {
        return setup(&failure.step, failure.to_string());
    }
    match observed.killed {
        Some(KillReason::ProxyFailed) => setup(
            "start the network proxy",
            match proxy {
                Some(Err(e)) => e.to_string(),
                _ => "the sandbox did not hand over its proxy socket".to_owned(),
            },
        ),
        Some(KillReason::SetupTimeout) => {
            setup("start the sandbox", format!("it was not ready within {:?}", supervise::SETUP_TIMEOUT))
        }
        Some(KillReason::Requested) => setup("start the run", "stopped on request before the code started".to_owned()),
        Some(reason) => setup("start the run", format!("stopped ({reason:?}) before the code started")),
        None => setup("start the sandbox", "the helper exited without starting the code".to_owned()),
    }
}

impl LinuxInstance {
    /// The execution of a run whose code started, from everything observed.
    pub(crate) fn execution(
        &self,
        observed: Observed,
        stats: crate::cgroup::CgroupStats,
        cgroup_version: Option<&'static str>,
        caps: &ReportCaps,
        proxy: Option<airlock_net::ProxyOutcome>,
        failures: Vec<String>,
    ) -> Execution {
        let mut seen = Observations {
            code: match observed.code_end {
                Some(ProcessEnd::Exited(code)) => CodeEnd::Exited(code),
                Some(ProcessEnd::Killed(signal)) => CodeEnd::Signalled(signal),
                None => CodeEnd::Unknown,
            },
            reached: observed.reached,
            oom_killed: stats.oom_kills > 0,
            // A warm run's preload is not its own.
            cpu_used: stats
                .cpu_usage
                .or(observed.rusage_cpu)
                .map(|used| used.saturating_sub(observed.cpu_before_release.unwrap_or_default())),
            notes: observed.notes,
            failures: observed.failures,
            ..Observations::default()
        };
        seen.failures.extend(failures);
        seen.stop = match observed.killed {
            Some(KillReason::WallTime) => Some(Stop::WallTime),
            Some(KillReason::CpuTime) => Some(Stop::CpuTime),
            Some(KillReason::Output) => Some(Stop::Output),
            Some(KillReason::Requested) => Some(Stop::Requested),
            Some(KillReason::SocketMemory) => Some(Stop::SocketMemory),
            Some(KillReason::SetupTimeout | KillReason::ProxyFailed) => {
                seen.failures.push("the run was stopped while its sandbox was still being set up".to_owned());
                None
            }
            None => None,
        };
        // Counted since the cgroup was made: a warm run's preload came first.
        let before = observed.preload_limit_hits;
        if stats.memory_max_hits > before.memory {
            seen.reached.insert(Limit::Memory);
        }
        if stats.pids_max_hits > before.processes {
            seen.reached.insert(Limit::Pids);
        }
        // The init dies first only by something done to it: airlock's own
        // kill (then `killed` says why), or the code, which runs as the same
        // user and may set its limits. Either way the kernel then ended every
        // process of the run; the code's end above says how it ended.
        match (observed.init_first, observed.killed) {
            (Some(ProcessEnd::Killed(signal)), None) => seen.notes.push(format!(
                "the run's init (PID 1) was killed by signal {signal} before the code ended, and with it every \
                 process of the run"
            )),
            (Some(ProcessEnd::Exited(code)), _) => {
                seen.failures.push(format!("the run's init exited with status {code} before the code ended"))
            }
            _ => {}
        }
        let network = proxy.map(|outcome| {
            seen.reached.extend(outcome.limits_hit.iter().copied());
            if outcome.unlisted_refusals > 0 {
                seen.notes.push(format!(
                    "{} more connections were refused past the connection cap and are counted, not listed",
                    outcome.unlisted_refusals
                ));
            }
            outcome.record
        });
        // The limits in force for the code: a warm run's claim sets its
        // clocks, and may have lowered two more.
        let mut limits = self.policy.limits.clone();
        let lowered = observed.lowered;
        limits.memory_bytes = lowered.memory_bytes.unwrap_or(limits.memory_bytes);
        limits.pids = lowered.pids.unwrap_or(limits.pids);
        limits.wall_time = lowered.wall_time.unwrap_or(limits.wall_time);
        limits.cpu_time = lowered.cpu_time.unwrap_or(limits.cpu_time);
        // The peak counts socket buffers, which cgroup v1 limits apart
        // (`cgroup::v1`): past the limit in all, the run reached it (on v1
        // the sum of two peaks, an upper bound). Not where a claim lowered
        // the limit: the peak is the cgroup's, its preload's included, and
        // the claim was refused if it held more.
        if lowered.memory_bytes.is_none() && stats.peak_memory_bytes.is_some_and(|peak| peak > limits.memory_bytes) {
            seen.reached.insert(Limit::Memory);
        }
        let verdict = outcome::classify(&seen, &limits);

        let mut layers = observed.layers;
        if cgroup_version.is_some() {
            layers.push(Layer::Cgroups);
        }
        layers.sort();
        let mut details = self.details.clone();
        if let Some(v) = cgroup_version {
            details.insert("cgroup".to_owned(), v.to_owned());
            if let Some(hierarchy) = &self.cgroups {
                details.insert("cgroup_route".to_owned(), hierarchy.route());
            }
        }
        if let Some(abi) = observed.landlock_abi {
            details.insert("landlock_abi".to_owned(), abi.to_string());
        }
        details.insert("seccomp".to_owned(), format!("allowlist, {} BPF instructions", self.seccomp.len()));
        if cgroup_version.is_none() {
            details.insert(
                "limits".to_owned(),
                "no cgroup: memory and processes limited per process by rlimits (RLIMIT_AS, RLIMIT_NPROC); CPU time per process"
                    .to_owned(),
            );
        }
        let report = (!observed.report.is_empty() || observed.report_overflow).then(|| {
            if observed.report_overflow {
                let mut r = driver::DriverReport::default();
                r.problems
                    .push(format!("the driver's report passed its cap of {} bytes and was dropped", caps.report_bytes));
                r
            } else {
                driver::parse_report(&observed.report, caps)
            }
        });
        Execution {
            status: verdict.status,
            limits_hit: verdict.limits_hit,
            message: verdict.message,
            exit_code: seen.code.exit_code(),
            signal: seen.code.signal(),
            stdout: observed.stdout,
            stderr: observed.stderr,
            usage: Usage {
                wall_ms: observed.wall.as_millis() as u64,
                cpu_ms: seen.cpu_used.map(|d| d.as_millis() as u64),
                peak_memory_bytes: stats.peak_memory_bytes,
                start: Some(match (observed.forked, observed.cpu_before_release) {
                    (true, _) => RunStart::Forked,
                    (false, Some(_)) => RunStart::Pooled,
                    (false, None) => RunStart::Cold,
                }),
                first_instruction_ms: observed.first_instruction.map(|d| d.as_millis() as u64),
                ..Usage::default()
            },
            isolation: Isolation { backend: "linux".to_owned(), layers, degraded: self.degraded.clone(), details },
            report,
            network,
        }
    }
}
