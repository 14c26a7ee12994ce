//! One wasm sandbox: its stage (the work directory and /tmp), held by the
//! supervisor, and a fresh worker process for each guest run in it.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use airlock_core::driver::{self, ReportCaps};
use airlock_core::outcome::{self, CodeEnd, Observations};
use airlock_core::{ArtifactError, Execution, Instance, Job, KillSwitch, Runtime, SandboxError};
use airlock_linux::Hierarchy;
use airlock_linux::confine::{self, CgroupLimits, CgroupStats, RunCgroup};
use airlock_linux::protocol::{CgroupEntry, Rlimit, RlimitResource};
use airlock_linux::seccomp::Instruction;
use airlock_policy::{Isolation, Language, Layer, Limit, Policy, SandboxPath, Status, Usage};
use rustix::pipe::{PipeFlags, pipe_with};

use crate::backend::{BACKEND, Loaded, interpreter_details};
use crate::protocol::{GuestEnd, GuestPlan, encode_filter};
use crate::stage::Stage;
use crate::supervise::{self, Observed, PlanFds, Stop, Watch};

/// argv[0] of the guest interpreter, where its prefix (/usr/local) says it lives.
const GUEST_PYTHON: &str = "/usr/local/bin/python.wasm";
/// Memory the run's cgroup allows the worker on top of the guest's linear
/// memory: wasmtime itself, the interpreter's code as it is paged in from
/// the compiled module, the WASI host's buffers.
pub const WORKER_MEMORY_BYTES: u64 = 160 << 20;
/// Threads the run's cgroup allows: the worker and the guest's process (the
/// guest itself can make none).
const WORKER_TASKS: u32 = 8;
/// The signal a limit kills with: the kernel's OOM killer, the CPU rlimit's hard limit.
const SIGKILL: i32 = 9;

/// A sandbox made by [`crate::WasmBackend`].
pub(crate) struct WasmInstance {
    pub loaded: Arc<Loaded>,
    pub worker: PathBuf,
    pub policy: Policy,
    pub env: BTreeMap<String, String>,
    pub stage: Stage,
    pub cgroups: Option<Hierarchy>,
    /// The worker's filter, unless the policy accepted to run without.
    pub seccomp: Option<Arc<Vec<Instruction>>>,
    pub degraded: Vec<Layer>,
    /// Without namespaces, as root: the host uid and gid the guest runs as
    /// (the stage holds the id).
    pub run_as: Option<(u32, u32)>,
    /// Bytes copied in since the last run, against `files_total_bytes`.
    pub copied_in: u64,
}

impl Instance for WasmInstance {
    fn write(&mut self, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
        let limits = &self.policy.limits;
        let input = |reason: String| SandboxError::Input { path: path.to_string(), reason };
        if data.len() as u64 > limits.file_bytes {
            return Err(input(format!(
                "{} bytes is above max_file_bytes ({}); raise it or send less",
                data.len(),
                limits.file_bytes
            )));
        }
        let total = self.copied_in.saturating_add(data.len() as u64);
        if total > limits.files_total_bytes {
            return Err(input(format!(
                "the inputs together would be {total} bytes, above max_files_total_bytes ({})",
                limits.files_total_bytes
            )));
        }
        confine::copy_in(self.stage.files(), self.stage.work(), path, data)?;
        self.copied_in = total;
        Ok(())
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        confine::copy_out(self.stage.files(), self.stage.work(), path, max_bytes)
    }

    fn set_limits(&mut self, limits: airlock_policy::Limits) {
        self.policy.limits = limits;
    }

    fn run(&mut self, job: &Job, kill: &KillSwitch) -> Result<Execution, SandboxError> {
        if job.language == Language::Sh {
            return Err(SandboxError::Unsupported {
                backend: BACKEND,
                what: "run shell scripts".to_owned(),
                reason: "the guest is a Python interpreter with no shell and no processes; use --lang python, \
                         or the linux backend"
                    .to_owned(),
            });
        }
        self.copied_in = 0;
        let limits = &self.policy.limits;
        let caps = ReportCaps::default();
        // A runtime of no driver folder (which only the Linux backend binds):
        // the program carries the driver's sources, placed beside the code.
        let mut program = driver::program(job, &Runtime::default(), &caps);
        if let Some(first) = program.argv.first_mut() {
            *first = GUEST_PYTHON.to_owned();
        }
        let mut env: Vec<(String, String)> = self.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        // WASI has no working directory of its own: wasi-libc starts at the
        // root, so the driver moves to the job's folder first.
        let cwd = job.cwd.as_ref().map_or_else(|| "/work".to_owned(), ToString::to_string);
        env.push(("AIRLOCK_CWD".to_owned(), cwd));
        let installed = &self.loaded.installed;
        let namespaces = self.stage.is_namespaced();
        let landlock_required = !self.degraded.contains(&Layer::Landlock);
        let plan = GuestPlan {
            supervisor_pid: std::process::id() as i32,
            namespaces,
            // Filled in by `supervise::run` from the cgroup it is handed.
            cgroup: CgroupEntry::None,
            cgroup_fds: 0,
            program_dir: self.stage.program_dir(),
            program_files: program.files.iter().map(|f| (f.name.to_owned(), f.content.clone())).collect(),
            report_bytes: caps.report_bytes,
            run_as: self.run_as,
            drop_capabilities: !namespaces && rustix::process::geteuid().is_root() && self.run_as.is_none(),
            argv: program.argv,
            env,
            preopens: self.stage.preopens(installed),
            memory_bytes: limits.memory_bytes,
            open_files: limits.open_files,
            rlimits: self.rlimits(),
            landlock: (confine::landlock_abi().is_some() || landlock_required)
                .then(|| self.stage.landlock(landlock_required)),
            readable: self.stage.readable(installed),
            seccomp: self.seccomp.as_deref().map(|program| encode_filter(program)),
        };

        let io = |what: &'static str| move |e: std::io::Error| SandboxError::io(what, e);
        let module = crate::cache::open(&self.loaded.cache).map_err(|e| SandboxError::Setup {
            step: "open the compiled interpreter".to_owned(),
            detail: e.to_string(),
        })?;
        let stdin = stdin_memfd(&job.stdin).map_err(io("passing the standard input"))?;
        let (stdout_read, stdout_write) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io("pipe")(e.into()))?;
        let (stderr_read, stderr_write) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| io("pipe")(e.into()))?;
        for fd in [&stdout_read, &stderr_read] {
            // Only our ends: the guest writes to a blocking pipe.
            rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK).map_err(|e| io("pipe")(e.into()))?;
        }
        let mut cgroup = self.cgroup()?;
        let watch = Watch {
            wall_time: limits.wall_time,
            cpu_time: limits.cpu_time,
            output_bytes: limits.output_bytes,
            output_overflow: limits.output_overflow,
            report_bytes: caps.report_bytes,
            kill,
            measured_disk: self.stage.measured(limits),
            files: self.stage.files(),
        };
        let fds = PlanFds {
            stdout: stdout_write.as_fd(),
            stderr: stderr_write.as_fd(),
            stdin: stdin.as_fd(),
            module: module.as_fd(),
            namespaces: self.stage.namespaces(),
        };
        let observed = supervise::run(&self.worker, plan, fds, (stdout_read, stderr_read), cgroup.as_deref(), &watch);
        drop((stdout_write, stderr_write, stdin, module));
        let observed = observed.map_err(io("running the wasm worker"))?;
        let stats = cgroup.as_ref().map(|c| c.stats()).unwrap_or_default();
        let cgroup_version = cgroup.as_ref().map(|c| c.version());
        if let Some(mut c) = cgroup.take() {
            c.remove().map_err(io("removing the run's cgroup"))?;
        }
        self.execution(observed, stats, cgroup_version, &caps)
    }
}

impl WasmInstance {
    /// The run's cgroup: the whole worker (wasmtime, the compiled code it
    /// pages in, the guest's memory) counts against it.
    fn cgroup(&self) -> Result<Option<Box<dyn RunCgroup>>, SandboxError> {
        let Some(hierarchy) = &self.cgroups else { return Ok(None) };
        let limits = &self.policy.limits;
        hierarchy
            .create(&CgroupLimits {
                memory_bytes: limits.memory_bytes + WORKER_MEMORY_BYTES,
                // Only the worker and the guest's process are in it: the
                // supervisor and the stage's helper never enter it.
                pids: WORKER_TASKS,
                cpus: limits.cpus,
            })
            .map(Some)
            .map_err(|e| SandboxError::Setup { step: "create the run's cgroup".to_owned(), detail: e.to_string() })
    }

    /// The worker's rlimits, but the open-file limit, which it sets itself
    /// once it knows how many descriptors it holds.
    fn rlimits(&self) -> Vec<Rlimit> {
        let l = &self.policy.limits;
        let both = |resource, value| Rlimit { resource, soft: value, hard: value };
        // A second past the CPU limit, so the supervisor's own check
        // normally fires first and names the limit.
        let cpu_seconds = l.cpu_time.as_secs() + 1;
        // On a tmpfs, as large as all of it: a full disk shows as ENOSPC. On
        // the host's disk, the one thing the kernel holds: no file past the cap.
        let file_size = if self.stage.is_namespaced() { l.disk_bytes + confine::LAYOUT_BYTES } else { l.disk_bytes };
        vec![
            both(RlimitResource::Core, 0),
            both(RlimitResource::FileSize, file_size),
            Rlimit { resource: RlimitResource::Cpu, soft: cpu_seconds, hard: cpu_seconds + 1 },
            both(RlimitResource::MemLock, 64 * 1024),
        ]
    }

    fn execution(
        &self,
        observed: Observed,
        stats: CgroupStats,
        cgroup_version: Option<&'static str>,
        caps: &ReportCaps,
    ) -> Result<Execution, SandboxError> {
        if let Some(failure) = observed.failure {
            return Err(SandboxError::Setup { step: failure.step.clone(), detail: failure.to_string() });
        }
        let limits = &self.policy.limits;
        let end = observed.end.clone();
        let oom_killed = stats.oom_kills > 0;
        let reaped_signal = observed.reaped.and_then(|(_, signal)| signal);
        let mut seen = Observations {
            stop: match observed.stopped {
                Some(Stop::WallTime) => Some(outcome::Stop::WallTime),
                Some(Stop::CpuTime) => Some(outcome::Stop::CpuTime),
                Some(Stop::Output) => Some(outcome::Stop::Output),
                Some(Stop::Disk) => Some(outcome::Stop::Disk),
                Some(Stop::Inodes) => Some(outcome::Stop::Inodes),
                Some(Stop::Requested) => Some(outcome::Stop::Requested),
                Some(Stop::SetupTimeout) => {
                    return Err(SandboxError::Setup {
                        step: "start the wasm worker".to_owned(),
                        detail: format!("it was not ready within {:?}", supervise::SETUP_TIMEOUT),
                    });
                }
                // The worker's limiter refused the guest memory past its limit.
                None => end.as_ref().and_then(|e| e.memory_refused).map(|_| outcome::Stop::MemoryRefused),
            },
            code: match (&end, reaped_signal) {
                // Killed after it reported, with the cgroup's OOM kill counted.
                (Some(_), Some(SIGKILL)) if oom_killed => CodeEnd::Signalled(SIGKILL),
                (Some(GuestEnd { trap: None, exit_code: Some(code), .. }), _) => CodeEnd::Exited(*code),
                // A guest that neither exited nor trapped ended on a fault
                // of its interpreter's.
                (Some(_), _) => CodeEnd::Trapped,
                // The guest cannot signal its process: a signal is a limit's
                // (the kernel's OOM kill, the CPU rlimit) or the worker's end.
                (None, Some(signal)) => CodeEnd::Signalled(signal),
                (None, None) => CodeEnd::Unknown,
            },
            oom_killed,
            cpu_used: stats.cpu_usage.or(observed.rusage_cpu),
            ..Observations::default()
        };
        if observed.stdout.truncated() || observed.stderr.truncated() {
            seen.reached.insert(Limit::Output);
        }
        if end.as_ref().is_some_and(|e| e.open_files_hit) {
            seen.reached.insert(Limit::OpenFiles);
        }
        let (disk_full, inodes_full) = self.stage.full(limits);
        if disk_full {
            seen.reached.insert(Limit::Disk);
        }
        if inodes_full {
            seen.reached.insert(Limit::Inodes);
        }
        if let Some(asked) = end.as_ref().and_then(|e| e.memory_refused) {
            seen.notes.push(format!("it asked for {} MiB", asked >> 20));
        } else if let Some(trap) = end.as_ref().and_then(|e| e.trap.as_ref()) {
            seen.notes.push(format!("the interpreter stopped with a WebAssembly trap: {trap}"));
        }
        if oom_killed {
            seen.notes.push(format!(
                "the worker's cgroup holds {} MiB more than the limit, for wasmtime itself",
                WORKER_MEMORY_BYTES >> 20
            ));
        }
        let verdict = outcome::classify(&seen, limits);
        // Only a limit explains a guest whose worker did not say how it
        // ended; anything else is the worker's failure, not the code's.
        if end.is_none() && seen.stop.is_none() && !matches!(verdict.status, Status::MemoryLimit | Status::CpuLimit) {
            return Err(SandboxError::Setup {
                step: "run the guest".to_owned(),
                detail: format!(
                    "the guest's process ended without reporting how the guest ended ({})",
                    match observed.reaped {
                        Some((_, Some(signal))) => format!("killed by signal {signal}"),
                        Some((Some(code), None)) => format!("exit status {code}"),
                        _ => "no wait status".to_owned(),
                    }
                ),
            });
        }
        let cpu = seen.cpu_used;
        let report = match observed.report_refused {
            Some(problem) => Some(driver::DriverReport { problems: vec![problem], ..Default::default() }),
            None => (!observed.report.is_empty()).then(|| driver::parse_report(&observed.report, caps)),
        };
        let linear_peak = end.as_ref().map(|e| e.memory_peak).filter(|&peak| peak > 0);
        Ok(Execution {
            status: verdict.status,
            limits_hit: verdict.limits_hit,
            message: verdict.message,
            exit_code: end.as_ref().and_then(|e| e.exit_code).filter(|_| observed.stopped.is_none()),
            signal: None,
            stdout: observed.stdout,
            stderr: observed.stderr,
            usage: Usage {
                wall_ms: observed.wall.as_millis() as u64,
                cpu_ms: cpu.map(|d| d.as_millis() as u64),
                peak_memory_bytes: stats.peak_memory_bytes.or(linear_peak),
                ..Usage::default()
            },
            isolation: self.isolation(observed.layers.unwrap_or_default(), observed.landlock_abi, cgroup_version),
            report,
            network: None,
        })
    }

    fn isolation(&self, mut layers: Vec<Layer>, landlock_abi: Option<u32>, cgroup: Option<&str>) -> Isolation {
        let limits = &self.policy.limits;
        let namespaced = self.stage.is_namespaced();
        if cgroup.is_some() {
            layers.push(Layer::Cgroups);
        }
        layers.sort();
        layers.dedup();
        let mut details = interpreter_details(&self.loaded.installed);
        let mut detail = |key: &str, value: String| details.insert(key.to_owned(), value);
        detail(
            "worker",
            if namespaced {
                "a process of its own per run, started by fork+exec: in the sandbox's user namespace and fresh PID, \
                 mount, network, IPC, UTS and cgroup namespaces, its root the sandbox's stage"
                    .to_owned()
            } else {
                format!(
                    "a plain process of its own per run, started by fork+exec (no namespaces on this host){}",
                    match (self.run_as, rustix::process::geteuid().is_root()) {
                        (Some((uid, _)), _) => format!(", as host uid {uid}, this sandbox's own"),
                        (None, true) => {
                            ", as root without capabilities (airlock's reserved host ids cannot be taken here)"
                                .to_owned()
                        }
                        (None, false) => String::new(),
                    }
                )
            },
        );
        detail(
            "cpu_time",
            match cgroup {
                Some(v) => format!("the run's cgroup ({v}), read every {} ms", supervise::CHECK_INTERVAL.as_millis()),
                None => format!(
                    "the guest's process clock, read every {} ms; RLIMIT_CPU behind it",
                    supervise::CHECK_INTERVAL.as_millis()
                ),
            },
        );
        detail(
            "disk",
            if namespaced {
                format!(
                    "/work and /tmp on one tmpfs of {} bytes and {} inodes: the kernel refuses the byte past the cap",
                    limits.disk_bytes + confine::LAYOUT_BYTES,
                    limits.disk_inodes + confine::LAYOUT_INODES
                )
            } else {
                format!(
                    "/work and /tmp in a folder of the host, measured every {} ms and at the end (no tmpfs without \
                     namespaces); RLIMIT_FSIZE holds any one file to the cap",
                    supervise::DISK_INTERVAL.as_millis()
                )
            },
        );
        detail(
            "memory",
            match cgroup {
                Some(_) => format!(
                    "the guest's linear memory refused past the cap by wasmtime's limiter; the whole worker \
                     (wasmtime, the compiled code) in the run's cgroup at the cap plus {} MiB, whose peak is reported",
                    WORKER_MEMORY_BYTES >> 20
                ),
                None => "the guest's linear memory refused past the cap by wasmtime's limiter (no cgroup: the \
                         worker's own allocations are not capped)"
                    .to_owned(),
            },
        );
        detail(
            "open_files",
            format!(
                "RLIMIT_NOFILE of the worker: the guest's {} on top of the worker's own; reaching it is seen by \
                 the guest's host at the WASI call that did (the guest gets EIO, wasmtime's word for EMFILE)",
                limits.open_files
            ),
        );
        detail("processes", "none: WASI has no process or thread creation".to_owned());
        detail("network", "none: WASI preview 1 has no sockets; the worker has no network either".to_owned());
        if let Some(program) = &self.seccomp {
            detail(
                "seccomp",
                format!("the worker's allowlist (seccomp/worker.toml), {} BPF instructions", program.len()),
            );
        }
        if let Some(v) = cgroup {
            detail("cgroup", v.to_owned());
        }
        if let Some(abi) = landlock_abi {
            detail("landlock_abi", abi.to_string());
        }
        Isolation { backend: BACKEND.to_owned(), layers, degraded: self.degraded.clone(), details }
    }
}

/// The guest's standard input, in a memfd the worker reads.
fn stdin_memfd(stdin: &[u8]) -> std::io::Result<OwnedFd> {
    use std::io::Write;
    let memfd = rustix::fs::memfd_create("airlock-stdin", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(stdin)?;
    std::io::Seek::rewind(&mut file)?;
    Ok(OwnedFd::from(file))
}
