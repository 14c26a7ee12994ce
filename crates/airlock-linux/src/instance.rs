//! One Linux sandbox: its namespaces and work directory, held by descriptors,
//! and the runs made in it.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock_core::driver::{self, PROGRAM_DIR, REPORT_FILE, ReportCaps};
use airlock_core::{ArtifactError, Execution, Instance, Job, KillSwitch, Runtime, SandboxError};
use airlock_policy::{Isolation, Layer, Limit, Policy, SandboxPath, Status, Usage};

use crate::cgroup::{CgroupLimits, Hierarchy, RunCgroup};
use crate::protocol::{CgroupEntry, LandlockPlan, RunPlan};
use crate::seccomp::Instruction;
use crate::supervise::{self, KillReason, Observed, SandboxFds, Watch};
use crate::{copy, limits};

/// A sandbox made by [`crate::LinuxBackend`].
pub struct LinuxInstance {
    pub(crate) helper: PathBuf,
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
}

impl std::fmt::Debug for LinuxInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxInstance").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Instance for LinuxInstance {
    fn write(&mut self, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
        let limits = &self.policy.limits;
        let fail = |reason: String| SandboxError::Input { path: path.to_string(), reason };
        if data.len() as u64 > limits.file_bytes {
            return Err(fail(format!("{} bytes is above max_file_bytes ({})", data.len(), limits.file_bytes)));
        }
        if self.written + data.len() as u64 > limits.files_total_bytes {
            return Err(fail(format!(
                "the files copied in would total more than max_files_total_bytes ({})",
                limits.files_total_bytes
            )));
        }
        copy::write(self.work.as_fd(), path, data)?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        copy::read(self.work.as_fd(), path, max_bytes)
    }

    fn run(&mut self, job: &Job, kill: &KillSwitch) -> Result<Execution, SandboxError> {
        // The copy-in cap counts what was copied in for this run.
        self.written = 0;
        let limits = &self.policy.limits;
        let caps = ReportCaps::default();
        let program = driver::program(job, &self.runtime, &caps);
        let network = self.policy.network.is_enabled();
        let mut env = self.runtime.environment(&self.policy);
        if network {
            // The proxy is the only way out; clients find it here. Set only
            // when hosts are allowed, so code without network sees none.
            for (key, value) in airlock_net::proxy_environment(std::net::SocketAddr::V4(crate::PROXY_ADDR)) {
                env.insert(key.to_owned(), value);
            }
        }
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let landlock_required = !self.degraded.contains(&Layer::Landlock);
        let mut writable_files: Vec<String> = ["/dev/null", "/dev/zero", "/dev/full"].map(String::from).to_vec();
        if program.reports {
            writable_files.push(format!("{PROGRAM_DIR}/{REPORT_FILE}"));
        }
        let plan = RunPlan {
            supervisor_pid: std::process::id() as i32,
            // Filled in by `supervise::run` from the cgroup it is handed.
            cgroup: CgroupEntry::None,
            cgroup_fds: 0,
            hostname: "airlock".to_owned(),
            program_files: program.files.iter().map(|f| (f.name.to_owned(), f.content.clone())).collect(),
            report_fifo: program.reports,
            proxy_listener: network,
            argv: program.argv,
            env,
            cwd: job.cwd.as_ref().map_or_else(|| "/work".to_owned(), ToString::to_string),
            rlimits: limits::for_policy(&self.policy, self.cgroups.is_none()),
            open_files: u64::from(limits.open_files),
            landlock: (self.landlock_abi.is_some() || landlock_required).then(|| LandlockPlan {
                writable_dirs: vec!["/work".to_owned(), "/tmp".to_owned()],
                writable_files,
                required: landlock_required,
            }),
            seccomp: self.seccomp.as_ref().clone(),
        };

        let mut cgroup: Option<Box<dyn RunCgroup>> = match &self.cgroups {
            Some(h) => Some(
                h.create(&CgroupLimits {
                    memory_bytes: limits.memory_bytes,
                    // The pids limit is the code's, on top of airlock's own processes.
                    pids: limits.pids + h.own_processes(),
                    cpus: limits.cpus,
                })
                .map_err(|e| SandboxError::Setup {
                    step: "create the run's cgroup".to_owned(),
                    detail: e.to_string(),
                })?,
            ),
            None => None,
        };
        let watch = Watch {
            wall_time: limits.wall_time,
            cpu_time: limits.cpu_time,
            output_bytes: limits.output_bytes,
            output_overflow: limits.output_overflow,
            report_bytes: caps.report_bytes,
            stdin: &job.stdin,
            kill,
        };
        // The proxy starts on the listener the sandbox made inside its own
        // namespace, before any code runs; it serves until the run is over.
        let mut proxy: Option<Result<airlock_net::ProxyHandle, airlock_net::NetError>> = None;
        let mut start_proxy = |listener: OwnedFd| {
            let config = airlock_net::ProxyConfig::from_policy(&self.policy.network);
            let started = airlock_net::Proxy::start(std::net::TcpListener::from(listener), config);
            let ok = started.is_ok();
            proxy = Some(started);
            ok
        };
        let observed = supervise::run(
            &self.helper,
            plan,
            SandboxFds { user_ns: self.user_ns.as_fd(), mount_ns: self.mount_ns.as_fd() },
            cgroup.as_deref(),
            &watch,
            &mut start_proxy,
        )
        .map_err(|e| SandboxError::io("running the sandbox", e))?;
        let proxy = match proxy {
            Some(Ok(handle)) => Some(handle.finish()),
            Some(Err(e)) => {
                return Err(SandboxError::Setup { step: "start the network proxy".to_owned(), detail: e.to_string() });
            }
            None if network && observed.failure.is_none() => {
                return Err(SandboxError::Setup {
                    step: "start the network proxy".to_owned(),
                    detail: "the sandbox did not hand over its proxy socket".to_owned(),
                });
            }
            None => None,
        };

        let stats = cgroup.as_ref().map(|c| c.stats()).unwrap_or_default();
        let cgroup_version = cgroup.as_ref().map(|c| c.version());
        if let Some(mut c) = cgroup.take() {
            c.remove().map_err(|e| SandboxError::io("removing the run's cgroup", e))?;
        }
        self.execution(observed, stats, cgroup_version, &caps, proxy)
    }
}

impl LinuxInstance {
    fn execution(
        &self,
        observed: Observed,
        stats: crate::cgroup::CgroupStats,
        cgroup_version: Option<&'static str>,
        caps: &ReportCaps,
        proxy: Option<airlock_net::ProxyOutcome>,
    ) -> Result<Execution, SandboxError> {
        if let Some(failure) = observed.failure {
            return Err(SandboxError::Setup { step: failure.step.clone(), detail: failure.to_string() });
        }
        let limits = &self.policy.limits;
        let mut hit: BTreeSet<Limit> = observed.limits_hit.iter().copied().collect();
        let mut notes = Vec::new();
        let network = proxy.map(|outcome| {
            hit.extend(outcome.limits_hit.iter().copied());
            if outcome.unlisted_refusals > 0 {
                notes.push(format!(
                    "{} more connections were refused past the connection cap and are counted, not listed",
                    outcome.unlisted_refusals
                ));
            }
            outcome.record
        });
        let cpu_used = stats.cpu_usage.or(observed.rusage_cpu);
        if stats.oom_kills > 0 {
            hit.insert(Limit::Memory);
        }
        if stats.pids_max_hits > 0 {
            hit.insert(Limit::Pids);
        }
        if let Ok(vfs) = rustix::fs::fstatvfs(&self.stage) {
            if vfs.f_bavail == 0 {
                hit.insert(Limit::Disk);
            }
            if vfs.f_favail == 0 {
                hit.insert(Limit::Inodes);
            }
        }
        const SIGKILL: i32 = 9;
        const SIGXCPU: i32 = 24;
        const SIGXFSZ: i32 = 25;
        if observed.signal == Some(SIGXFSZ) {
            hit.insert(Limit::Disk);
        }
        let over_cpu = cpu_used.is_some_and(|c| c >= limits.cpu_time);
        let (status, message) = match observed.killed {
            Some(KillReason::WallTime) => {
                hit.insert(Limit::WallTime);
                (Status::Timeout, format!("stopped at the wall-time limit of {}", seconds(limits.wall_time)))
            }
            Some(KillReason::CpuTime) => {
                hit.insert(Limit::CpuTime);
                (Status::CpuLimit, format!("stopped at the CPU-time limit of {}", seconds(limits.cpu_time)))
            }
            Some(KillReason::Output) => (
                Status::OutputLimit,
                format!("stopped when its output passed the limit of {} bytes per stream", limits.output_bytes),
            ),
            Some(KillReason::Requested) => (Status::SandboxError, "stopped on request before it finished".to_owned()),
            // Reported as the proxy's own error before the run gets here.
            Some(KillReason::ProxyFailed) => {
                return Err(SandboxError::Setup {
                    step: "start the network proxy".to_owned(),
                    detail: "the proxy did not start".to_owned(),
                });
            }
            Some(KillReason::SetupTimeout) => {
                return Err(SandboxError::Setup {
                    step: "start the sandbox".to_owned(),
                    detail: format!("it was not ready within {:?}", supervise::SETUP_TIMEOUT),
                });
            }
            None if stats.oom_kills > 0 && (!observed.exited || observed.signal == Some(SIGKILL)) => (
                Status::MemoryLimit,
                format!("killed by the kernel at the memory limit of {} MiB", limits.memory_bytes >> 20),
            ),
            None if !observed.exited => {
                return Err(SandboxError::Setup {
                    step: "supervise the run".to_owned(),
                    detail: "the sandbox's init ended without reporting the code's exit".to_owned(),
                });
            }
            None if observed.signal == Some(SIGXCPU) || (observed.signal == Some(SIGKILL) && over_cpu) => {
                hit.insert(Limit::CpuTime);
                (Status::CpuLimit, format!("stopped at the CPU-time limit of {}", seconds(limits.cpu_time)))
            }
            None if observed.exit_code == Some(0) => (Status::Ok, String::new()),
            None => (Status::Failed, String::new()),
        };

        let mut layers = observed.layers;
        if cgroup_version.is_some() {
            layers.push(Layer::Cgroups);
        }
        layers.sort();
        let mut details = std::collections::BTreeMap::new();
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
        Ok(Execution {
            status,
            limits_hit: hit,
            message: {
                let all: Vec<String> = std::iter::once(message).chain(notes).filter(|m| !m.is_empty()).collect();
                (!all.is_empty()).then(|| all.join("; "))
            },
            exit_code: observed.exit_code,
            signal: observed.signal,
            stdout: observed.stdout,
            stderr: observed.stderr,
            usage: Usage {
                wall_ms: observed.wall.as_millis() as u64,
                cpu_ms: cpu_used.map(|d| d.as_millis() as u64),
                peak_memory_bytes: stats.peak_memory_bytes,
            },
            isolation: Isolation { backend: "linux".to_owned(), layers, degraded: self.degraded.clone(), details },
            report,
            network,
        })
    }
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}
