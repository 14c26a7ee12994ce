//! The [`Backend`] and [`Instance`] of the WebAssembly sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use airlock_core::driver::{self, PROGRAM_DIR, REPORT_FILE, ReportCaps};
use airlock_core::{ArtifactError, Backend, Execution, Instance, Job, KillSwitch, Probe, Runtime, SandboxError};
use airlock_policy::{BackendKind, Isolation, Language, Layer, Limit, Policy, SandboxPath, Status, Usage};
use wasmtime::{Engine, InstancePre};

use crate::cache::{self, WASMTIME_VERSION};
use crate::files;
use crate::guest::{self, Ending, GuestState, Preopen, RunSpec, Stop};
use crate::install::{self, InstallProgress, InstalledInterpreter};

const BACKEND: &str = "wasm";
/// argv[0] of the guest interpreter, where its prefix (/usr/local) says it lives.
const GUEST_PYTHON: &str = "/usr/local/bin/python.wasm";
/// Where the stdlib zip's folder is preopened.
const GUEST_STDLIB_DIR: &str = "/usr/local/lib";
/// Variables the guest needs beside the base environment, unless the
/// runtime or the policy sets them: matplotlib draws off-screen through the
/// driver's backend and keeps its cache in the run's /tmp.
const GUEST_ENV: [(&str, &str); 2] =
    [("MPLBACKEND", "module://airlock_inline_backend"), ("MPLCONFIGDIR", "/tmp/.matplotlib")];

/// CPython compiled to WASI, run under wasmtime. Cheap to share: the engine
/// and the compiled interpreter are loaded once, on first use, and kept.
#[derive(Debug)]
pub struct WasmBackend {
    data_dir: PathBuf,
    loaded: Mutex<Option<Arc<Loaded>>>,
}

/// The engine and the interpreter ready to instantiate.
struct Loaded {
    engine: Engine,
    pre: InstancePre<GuestState>,
    installed: InstalledInterpreter,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("installed", &self.installed).finish_non_exhaustive()
    }
}

impl WasmBackend {
    /// A backend keeping its interpreter in `data_dir` (callers pass
    /// `airlock_core::paths::data_dir()`).
    pub fn new(data_dir: PathBuf) -> WasmBackend {
        WasmBackend { data_dir, loaded: Mutex::new(None) }
    }

    /// Installs the interpreter if needed and loads it, compiling it the
    /// first time, reporting each step to `progress`.
    pub fn prepare(&self, progress: &mut dyn FnMut(InstallProgress)) -> Result<(), SandboxError> {
        self.load(progress).map(|_| ())
    }

    fn load(&self, progress: &mut dyn FnMut(InstallProgress)) -> Result<Arc<Loaded>, SandboxError> {
        let mut slot = self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(loaded) = slot.as_ref() {
            return Ok(loaded.clone());
        }
        let setup = |step: &str| {
            let step = step.to_owned();
            move |detail: String| SandboxError::Setup { step, detail }
        };
        let installed = install::install(&self.data_dir, progress)
            .map_err(|e| setup("installing the wasm interpreter")(e.to_string()))?;
        let engine = cache::engine().map_err(|e| setup("making the wasm engine")(e.to_string()))?;
        let module = cache::load_module(&engine, &installed, progress)
            .map_err(|e| setup("loading the compiled interpreter")(e.to_string()))?;
        let linker = guest::linker(&engine).map_err(|e| setup("linking WASI")(format!("{e:#}")))?;
        let pre = linker.instantiate_pre(&module).map_err(|e| setup("preparing the interpreter")(format!("{e:#}")))?;
        let loaded = Arc::new(Loaded { engine, pre, installed });
        *slot = Some(loaded.clone());
        Ok(loaded)
    }
}

/// Progress of an automatic install, on stderr: a first use may download
/// 100 MB and compile for a minute, which must not look like a hang.
/// Tells a person on stderr how installing and compiling the interpreter goes.
pub fn progress_on_stderr(step: InstallProgress) {
    let line = match step {
        InstallProgress::Downloading { package, version } => {
            format!("downloading the wasm interpreter ({package} {version}) with pip...")
        }
        InstallProgress::Downloaded { bytes } => format!("downloaded {:.1} MB", bytes as f64 / 1e6),
        InstallProgress::Verified { done, total, .. } if done == total => {
            format!("verified {total} files")
        }
        InstallProgress::Verified { .. } => return,
        InstallProgress::UnpackedData { files } => {
            format!("unpacked matplotlib's data ({files} files)")
        }
        InstallProgress::Installed { dir } => {
            format!("installed the wasm interpreter in {}", dir.display())
        }
        InstallProgress::AlreadyInstalled { .. } => return,
        InstallProgress::Compiling { .. } => {
            "compiling the wasm interpreter (once; about a minute and 2 GB of memory)...".to_owned()
        }
        InstallProgress::Compiled { seconds, .. } => format!("compiled in {seconds:.0} s"),
        InstallProgress::CacheRejected { cache, reason } => {
            format!("discarding the compiled interpreter {}: {reason}", cache.display())
        }
    };
    eprintln!("airlock: {line}");
}

impl Backend for WasmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    fn probe(&self) -> Result<Probe, SandboxError> {
        let mut available = BTreeSet::new();
        let mut missing = BTreeMap::new();
        let mut details = BTreeMap::from([
            ("wasmtime".to_owned(), WASMTIME_VERSION.to_owned()),
            ("interpreter".to_owned(), format!("{} {}", install::PACKAGE, install::PACKAGE_VERSION)),
        ]);
        match install::installed(&self.data_dir) {
            Ok(Some(found)) => {
                available.insert(Layer::Wasm);
                details.insert("artifact_sha256".to_owned(), found.sums_sha256);
                details.insert("python".to_owned(), found.python_version);
                let cached = cache::cache_path_for(&found.dir, &found.snapshot_sha256).exists();
                details.insert("compiled".to_owned(), if cached { "cached" } else { "not yet" }.to_owned());
            }
            Ok(None) => {
                // Installed automatically on first use; say so rather than refuse.
                available.insert(Layer::Wasm);
                details.insert(
                    "interpreter_installed".to_owned(),
                    "no: installed on first use (airlock backend install wasm)".to_owned(),
                );
            }
            Err(e) => {
                missing.insert(Layer::Wasm, e.to_string());
            }
        }
        Ok(Probe { backend: BackendKind::Wasm, host: airlock_core::host::facts(), available, missing, details })
    }

    fn create(&self, policy: &Policy, runtime: &Runtime) -> Result<Box<dyn Instance>, SandboxError> {
        if policy.network.is_enabled() {
            let hosts: Vec<String> = policy.network.allow.iter().map(ToString::to_string).collect();
            return Err(SandboxError::Unsupported {
                backend: BACKEND,
                what: format!("allow network access (to {})", hosts.join(", ")),
                reason: "WASI preview 1 has no sockets, so the guest cannot reach any host; run with the linux \
                         backend, or without allow_hosts"
                    .to_owned(),
            });
        }
        let loaded = self.load(&mut progress_on_stderr)?;
        let (work, work_fd) =
            files::private_dir("airlock-wasm-work-").map_err(|e| SandboxError::io("making the work directory", e))?;
        let mut env = runtime.environment(policy);
        for (key, value) in GUEST_ENV {
            env.entry(key.to_owned()).or_insert_with(|| value.to_owned());
        }
        Ok(Box::new(WasmInstance { loaded, policy: policy.clone(), env, work, work_fd, copied_in: 0 }))
    }
}

/// One wasm sandbox: a private work directory, and fresh guests run over it.
struct WasmInstance {
    loaded: Arc<Loaded>,
    policy: Policy,
    env: BTreeMap<String, String>,
    /// Preopened as /work; removed with the instance.
    work: tempfile::TempDir,
    work_fd: OwnedFd,
    /// Bytes copied in since the last run, against `files_total_bytes`.
    copied_in: u64,
}

impl WasmInstance {
    fn isolation(&self) -> Isolation {
        let installed = &self.loaded.installed;
        let limits = &self.policy.limits;
        let details = BTreeMap::from([
            ("artifact_sha256".to_owned(), installed.sums_sha256.clone()),
            ("snapshot_sha256".to_owned(), installed.snapshot_sha256.clone()),
            ("wasmtime".to_owned(), WASMTIME_VERSION.to_owned()),
            ("python".to_owned(), installed.python_version.clone()),
            (
                "cpu_time".to_owned(),
                format!(
                    "the guest thread's CPU clock, checked every {} ms (the guest is one thread){}",
                    guest::TICK.as_millis(),
                    if limits.cpus < 1.0 {
                        format!("; held to {} of a core by pausing it", limits.cpus)
                    } else {
                        String::new()
                    }
                ),
            ),
            (
                "disk".to_owned(),
                format!(
                    "/work and the guest's private root (/tmp) measured every {} ms and at the end; the run is stopped past a cap",
                    (guest::TICK * guest::DISK_EVERY_TICKS as u32).as_millis()
                ),
            ),
            (
                "memory".to_owned(),
                "the guest's linear memory, refused past the cap by the store's limiter; host-side buffers \
                 (output, the driver's report) have caps of their own"
                    .to_owned(),
            ),
            (
                "open_files".to_owned(),
                format!(
                    "this process's descriptors counted every {} ms; the run is stopped past the cap",
                    guest::TICK.as_millis()
                ),
            ),
            ("processes".to_owned(), "none: WASI has no process or thread creation".to_owned()),
            ("network".to_owned(), "none: WASI preview 1 has no sockets".to_owned()),
        ]);
        Isolation { backend: BACKEND.to_owned(), layers: vec![Layer::Wasm], degraded: Vec::new(), details }
    }
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
        files::write_beneath(&self.work_fd, path.relative(), data).map_err(|e| match e.raw_os_error() {
            Some(code) if code == libc_eloop() => {
                input("a component of the path is a symbolic link, which is never followed".to_owned())
            }
            _ => input(e.to_string()),
        })?;
        self.copied_in = total;
        Ok(())
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        files::read_beneath(&self.work_fd, path.relative(), max_bytes, &path.to_string())
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
        let caps = ReportCaps::default();
        let mut program = driver::program(job, &Runtime::default(), &caps);
        if let Some(first) = program.argv.first_mut() {
            *first = GUEST_PYTHON.to_owned();
        }

        // A fresh private root per run: / and /tmp for the guest, and the
        // driver's folder. Nothing a run leaves there reaches the next.
        let (root, root_fd) =
            files::private_dir("airlock-wasm-root-").map_err(|e| SandboxError::io("making the guest's root", e))?;
        let program_dir = PROGRAM_DIR.trim_start_matches('/');
        for file in &program.files {
            files::write_beneath(&root_fd, &format!("{program_dir}/{}", file.name), file.content.as_bytes())
                .map_err(|e| SandboxError::io(format!("writing {PROGRAM_DIR}/{}", file.name), e))?;
        }
        std::fs::create_dir(root.path().join("tmp")).map_err(|e| SandboxError::io("making /tmp", e))?;

        let installed = &self.loaded.installed;
        let cwd = job.cwd.as_ref().map_or_else(|| "/work".to_owned(), ToString::to_string);
        let mut env: Vec<(String, String)> = self.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        // WASI has no working directory of its own: wasi-libc starts at the
        // root, so the driver moves to the job's folder first.
        env.push(("AIRLOCK_CWD".to_owned(), cwd));
        let spec = RunSpec {
            argv: program.argv.clone(),
            env,
            stdin: job.stdin.clone(),
            preopens: vec![
                Preopen { host: installed.stdlib_dir.clone(), guest: GUEST_STDLIB_DIR.to_owned(), writable: false },
                Preopen {
                    host: installed.mpl_data.clone(),
                    guest: format!("{GUEST_STDLIB_DIR}/{}/matplotlib/mpl-data", installed.stdlib_name),
                    writable: false,
                },
                Preopen { host: root.path().to_owned(), guest: "/".to_owned(), writable: true },
                Preopen { host: self.work.path().to_owned(), guest: "/work".to_owned(), writable: true },
            ],
            writable: vec![root.path().to_owned(), self.work.path().to_owned()],
            limits: self.policy.limits.clone(),
        };
        let outcome = guest::run(&self.loaded.engine, &self.loaded.pre, spec, kill)
            .map_err(|detail| SandboxError::Setup { step: "running the guest".to_owned(), detail })?;

        let report = if program.reports {
            let report_path = format!("{program_dir}/{REPORT_FILE}");
            match files::read_beneath(&root_fd, &report_path, caps.report_bytes as u64, "the driver's report") {
                Ok(bytes) => Some(driver::parse_report(&bytes, &caps)),
                Err(ArtifactError::NotFound { .. }) => None,
                Err(e) => Some(airlock_core::driver::DriverReport {
                    problems: vec![format!("the driver's report could not be read: {e}")],
                    ..Default::default()
                }),
            }
        } else {
            None
        };
        Ok(self.execution(outcome, report))
    }
}

impl WasmInstance {
    fn execution(&self, outcome: guest::Outcome, report: Option<airlock_core::driver::DriverReport>) -> Execution {
        let limits = &self.policy.limits;
        let mut limits_hit = BTreeSet::new();
        if outcome.output_truncated {
            limits_hit.insert(Limit::Output);
        }
        let (status, exit_code, message) = match &outcome.ending {
            Ending::Exited(0) => (Status::Ok, Some(0), None),
            Ending::Exited(code) => (Status::Failed, Some(*code), None),
            Ending::Trapped(trap) => {
                (Status::Failed, None, Some(format!("the interpreter stopped with a WebAssembly trap: {trap}")))
            }
            Ending::Stopped(stop) => {
                let (status, limit, message) = match stop {
                    Stop::WallTime => (
                        Status::Timeout,
                        Some(Limit::WallTime),
                        format!(
                            "the run passed its wall-time limit of {:.1} s and was stopped",
                            limits.wall_time.as_secs_f64()
                        ),
                    ),
                    Stop::CpuTime => (
                        Status::CpuLimit,
                        Some(Limit::CpuTime),
                        format!(
                            "the run used its CPU-time limit of {:.1} s and was stopped",
                            limits.cpu_time.as_secs_f64()
                        ),
                    ),
                    Stop::Memory => (
                        Status::MemoryLimit,
                        Some(Limit::Memory),
                        format!(
                            "the run asked for {} MiB of memory, past its limit of {} MiB, and was stopped",
                            outcome.memory_refused.unwrap_or(0) >> 20,
                            limits.memory_bytes >> 20
                        ),
                    ),
                    Stop::Output => (
                        Status::OutputLimit,
                        Some(Limit::Output),
                        format!("the output passed its cap of {} bytes and the run was stopped", limits.output_bytes),
                    ),
                    Stop::Disk => (
                        Status::Failed,
                        Some(Limit::Disk),
                        format!(
                            "the files written passed the disk cap of {} MiB and the run was stopped",
                            limits.disk_bytes >> 20
                        ),
                    ),
                    Stop::Inodes => (
                        Status::Failed,
                        Some(Limit::Inodes),
                        format!(
                            "the files made passed the cap of {} files and folders and the run was stopped",
                            limits.disk_inodes
                        ),
                    ),
                    Stop::OpenFiles => (
                        Status::Failed,
                        Some(Limit::OpenFiles),
                        format!("the run held more than {} files open and was stopped", limits.open_files),
                    ),
                    Stop::Killed => (Status::SandboxError, None, "stopped on request before it finished".to_owned()),
                };
                if let Some(limit) = limit {
                    limits_hit.insert(limit);
                }
                (status, None, Some(message))
            }
        };
        Execution {
            status,
            limits_hit,
            message,
            exit_code,
            signal: None,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            usage: Usage {
                wall_ms: outcome.wall.as_millis() as u64,
                cpu_ms: outcome.cpu.map(|d| d.as_millis() as u64),
                peak_memory_bytes: outcome.peak_memory,
                ..Usage::default()
            },
            isolation: self.isolation(),
            report,
            network: None,
        }
    }
}

fn libc_eloop() -> i32 {
    rustix::io::Errno::LOOP.raw_os_error()
}
