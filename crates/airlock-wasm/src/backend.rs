//! The [`Backend`] of the WebAssembly sandbox: what this host lets it
//! enforce, the interpreter installed and compiled once, and a sandbox per
//! [`Backend::create`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use airlock_core::{Backend, Instance, Probe, Runtime, SandboxError};
use airlock_linux::Hierarchy;
use airlock_linux::confine;
use airlock_linux::seccomp::Instruction;
use airlock_policy::{BackendKind, Layer, Policy};

use crate::cache::{self, WASMTIME_VERSION};
use crate::install::{self, InstallProgress, InstalledInterpreter};
use crate::instance::WasmInstance;
use crate::stage::Stage;

pub(crate) const BACKEND: &str = "wasm";
/// The environment variable naming the worker binary, for installs where it
/// is not beside the running program.
pub const WORKER_ENV: &str = "AIRLOCK_WASM_WORKER";
/// The worker's file name.
pub const WORKER_NAME: &str = "airlock-wasm-worker";
/// Variables the guest needs beside the base environment, unless the
/// runtime or the policy sets them: matplotlib draws off-screen through the
/// driver's backend and keeps its cache in the run's /tmp.
const GUEST_ENV: [(&str, &str); 2] =
    [("MPLBACKEND", "module://airlock_inline_backend"), ("MPLCONFIGDIR", "/tmp/.matplotlib")];

/// CPython compiled to WASI, run under wasmtime, one confined worker process
/// per guest. Cheap to share: the host is probed and the interpreter checked
/// once, on first use, and kept.
#[derive(Debug)]
pub struct WasmBackend {
    data_dir: PathBuf,
    worker: Option<PathBuf>,
    loaded: Mutex<Option<Arc<Loaded>>>,
    host: OnceLock<HostState>,
}

/// The interpreter, installed and compiled.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub installed: InstalledInterpreter,
    /// The compiled-module cache, checked; each worker maps it.
    pub cache: PathBuf,
}

/// What this host can enforce, read once.
#[derive(Debug)]
struct HostState {
    cgroups: Result<Hierarchy, String>,
    /// Where each sandbox's host id comes from, as the Linux backend's.
    ids: Result<confine::Allocator, String>,
    /// The Linux layers the worker can have here (namespaces, seccomp,
    /// Landlock, cgroups), as the Linux backend probes them.
    probe: Probe,
    seccomp: Result<Arc<Vec<Instruction>>, String>,
}

impl WasmBackend {
    /// A backend keeping its interpreter in `data_dir` (callers pass
    /// `airlock_core::paths::data_dir()`), finding its worker through
    /// [`WORKER_ENV`] or beside the running program.
    pub fn new(data_dir: PathBuf) -> WasmBackend {
        WasmBackend { data_dir, worker: None, loaded: Mutex::new(None), host: OnceLock::new() }
    }

    /// A backend using this worker binary.
    pub fn with_worker(data_dir: PathBuf, worker: impl Into<PathBuf>) -> WasmBackend {
        WasmBackend { worker: Some(worker.into()), ..WasmBackend::new(data_dir) }
    }

    /// Where the worker binary is.
    pub fn worker_path(&self) -> Result<PathBuf, SandboxError> {
        match &self.worker {
            Some(path) => Ok(path.clone()),
            None => confine::find_helper(WORKER_NAME, WORKER_ENV, "`scripts/build --wasm`"),
        }
    }

    fn host(&self) -> &HostState {
        self.host.get_or_init(|| {
            // The worker binary holds a systemd scope when one is needed.
            let cgroups = Hierarchy::detect(self.worker_path().ok().as_deref());
            if let Ok(h) = &cgroups {
                // The next start after a crash cleans up what it left.
                h.remove_stale();
            }
            let ids = confine::Allocator::for_this_process();
            let probe = confine::probe(&cgroups, &ids);
            let seccomp = crate::seccomp::worker_filter()
                .map(Arc::new)
                .map_err(|e| format!("the worker's seccomp policy (seccomp/worker.toml): {e}"));
            HostState { cgroups, ids, probe, seccomp }
        })
    }

    /// Installs the interpreter if needed and compiles it, reporting each
    /// step to `progress`.
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
        let worker = self.worker_path()?;
        let cache = crate::compile::ensure_in_worker(&worker, &installed, progress)
            .map_err(|e| setup("loading the compiled interpreter")(e.to_string()))?;
        let loaded = Arc::new(Loaded { installed, cache });
        *slot = Some(loaded.clone());
        Ok(loaded)
    }
}

/// Progress of an automatic install, on stderr: a first use may download
/// 100 MB and compile for a minute, which must not look like a hang.
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
        let host = self.host();
        let mut probe = host.probe.clone();
        probe.backend = BackendKind::Wasm;
        let details = &mut probe.details;
        details.insert("wasmtime".to_owned(), WASMTIME_VERSION.to_owned());
        details.insert("interpreter".to_owned(), format!("{} {}", install::PACKAGE, install::PACKAGE_VERSION));
        match self.worker_path() {
            Ok(path) => details.insert("worker".to_owned(), path.display().to_string()),
            Err(e) => details.insert("worker".to_owned(), format!("missing: {e}")),
        };
        if let Err(why) = &host.seccomp {
            probe.available.remove(&Layer::Seccomp);
            probe.missing.insert(Layer::Seccomp, why.clone());
        }
        match install::installed(&self.data_dir) {
            Ok(Some(found)) => {
                probe.available.insert(Layer::Wasm);
                let cached = cache::cache_path_for(&found.dir, &found.snapshot_sha256).exists();
                let details = &mut probe.details;
                details.insert("artifact_sha256".to_owned(), found.sums_sha256);
                details.insert("python".to_owned(), found.python_version);
                details.insert("compiled".to_owned(), if cached { "cached" } else { "not yet" }.to_owned());
            }
            Ok(None) => {
                // Installed automatically on first use; say so rather than refuse.
                probe.available.insert(Layer::Wasm);
                probe.details.insert(
                    "interpreter_installed".to_owned(),
                    "no: installed on first use (airlock backend install wasm)".to_owned(),
                );
            }
            Err(e) => {
                probe.missing.insert(Layer::Wasm, e.to_string());
            }
        }
        Ok(probe)
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
        let host = self.host();
        let probe = self.probe()?;
        policy.check(&probe.host)?;
        let degraded = probe.check(policy)?;
        let worker = self.worker_path()?;
        let loaded = self.load(&mut progress_on_stderr)?;
        let allocator = host.ids.as_ref().map_err(|detail| SandboxError::Setup {
            step: "choose the sandbox's host ids".to_owned(),
            detail: detail.clone(),
        })?;
        let plain = degraded.contains(&Layer::UserNamespace);
        // Without namespaces, root runs the guest as a host id of its own from
        // the reserved range, held for the sandbox's life, as the Linux
        // backend's sandbox user is; where those ids cannot be taken, as root
        // without capabilities. Anyone else runs it as themselves.
        let plain_id = if plain && rustix::process::geteuid().is_root() && confine::check_mapping(&host.ids).is_ok() {
            Some(take_host_id(allocator)?)
        } else {
            None
        };
        let stage = if plain {
            Stage::on_host(&loaded.installed, plain_id)?
        } else {
            Stage::namespaced(&worker, &loaded.installed, &policy.limits, take_host_id(allocator)?)?
        };
        let run_as = stage.run_as();
        let seccomp = if degraded.contains(&Layer::Seccomp) {
            None
        } else {
            Some(host.seccomp.clone().map_err(|detail| SandboxError::Setup { step: "seccomp".to_owned(), detail })?)
        };
        let mut env = runtime.environment(policy);
        for (key, value) in GUEST_ENV {
            env.entry(key.to_owned()).or_insert_with(|| value.to_owned());
        }
        Ok(Box::new(WasmInstance {
            cgroups: if degraded.contains(&Layer::Cgroups) { None } else { host.cgroups.clone().ok() },
            loaded,
            worker,
            policy: policy.clone(),
            env,
            stage,
            seccomp,
            degraded,
            run_as,
            copied_in: 0,
        }))
    }
}

/// A host id for one sandbox, given back when the sandbox drops.
fn take_host_id(allocator: &confine::Allocator) -> Result<confine::HostId, SandboxError> {
    allocator.allocate().map_err(|e| SandboxError::Setup { step: "take a host id".to_owned(), detail: e.to_string() })
}

/// The record's details every run of an installed interpreter shares.
pub(crate) fn interpreter_details(installed: &InstalledInterpreter) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("artifact_sha256".to_owned(), installed.sums_sha256.clone()),
        ("snapshot_sha256".to_owned(), installed.snapshot_sha256.clone()),
        ("wasmtime".to_owned(), WASMTIME_VERSION.to_owned()),
        ("python".to_owned(), installed.python_version.clone()),
    ])
}
