//! The backend trait: answer before running, refuse what cannot be honoured.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use airlock_policy::{
    BackendKind, HostFacts, Isolation, Language, Layer, Limit, Limits, NetworkRecord, Policy, SandboxPath, Status,
    Usage,
};

use crate::driver::DriverReport;
use crate::error::{ArtifactError, SandboxError};
use crate::output::Captured;
use crate::runtime::Runtime;

/// What a backend can enforce on this host, found without running anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub backend: BackendKind,
    /// The host's resources, for checking policies.
    pub host: HostFacts,
    /// Layers this host can put in force.
    pub available: BTreeSet<Layer>,
    /// For each layer that is not available: why, and how to fix it.
    pub missing: BTreeMap<Layer, String>,
    /// Free-form facts worth showing (`cgroup = v1`, `landlock_abi = 7`).
    pub details: BTreeMap<String, String>,
}

impl Probe {
    /// Refuses `policy` if it needs a layer this host lacks and did not
    /// explicitly accept to lose it. Returns the layers that will be missing.
    pub fn check(&self, policy: &Policy) -> Result<Vec<Layer>, SandboxError> {
        let mut degraded = Vec::new();
        for (layer, why) in &self.missing {
            if policy.allow_degraded.contains(layer) {
                degraded.push(*layer);
            } else {
                return Err(SandboxError::Unavailable {
                    layer: *layer,
                    reason: why.clone(),
                    degradable: airlock_policy::Layer::degradable_on(policy.backend).contains(layer),
                });
            }
        }
        Ok(degraded)
    }
}

/// One isolation backend. Implementations are cheap to clone or share.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What this host lets the backend enforce.
    fn probe(&self) -> Result<Probe, SandboxError>;

    /// Makes a sandbox for `policy` running `runtime`. Refuses, with an error
    /// that names the missing piece, anything it cannot enforce; never runs
    /// with less than the policy asks.
    fn create(&self, policy: &Policy, runtime: &Runtime) -> Result<Box<dyn Instance>, SandboxError>;

    /// Makes a sandbox as [`Backend::create`] does, to be started ahead of
    /// its run, warm or as a template ([`Instance::start_warm`],
    /// [`Instance::start_template`]), as a pool's refill does. A backend that
    /// prepares a cold sandbox's first run ahead of it, in a way those
    /// cannot use, leaves that out.
    fn create_to_start_ahead(&self, policy: &Policy, runtime: &Runtime) -> Result<Box<dyn Instance>, SandboxError> {
        self.create(policy, runtime)
    }
}

/// One sandbox: a work directory that lives as long as the instance, and the
/// runs made in it. Dropping it destroys everything it made.
pub trait Instance: Send {
    /// Copies `data` into the work directory at `path`, creating parent
    /// directories. Never follows a link the sandbox may have planted.
    fn write(&mut self, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError>;

    /// Reads back one regular file from the work directory, refusing links,
    /// FIFOs and anything above `max_bytes`.
    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError>;

    /// Runs one job in a fresh process tree (or fresh instance) and reports
    /// what happened. Returns `Err` only when the code never started; once
    /// it has, every failure of the backend's own is in the execution
    /// (status `internal_error`), beside everything observed.
    fn run(&mut self, job: &Job, kill: &KillSwitch) -> Result<Execution, SandboxError>;

    /// Makes later runs obey `limits` (a caller's per-run limits, already
    /// checked against the host). The rest of the policy stays as created.
    fn set_limits(&mut self, limits: Limits);

    /// Makes this sandbox warm, for one run: starts its interpreter with
    /// every layer of a cold run in force, imports `preload`, and returns
    /// once it waits before the first byte of code. A backend that cannot
    /// says so (the caller then runs cold).
    fn start_warm(self: Box<Self>, preload: &[String]) -> Result<Box<dyn WarmInstance>, SandboxError> {
        let _ = preload;
        Err(SandboxError::Unsupported {
            backend: "this",
            what: "start a sandbox ahead of its run".to_owned(),
            reason: "the backend has no warm start; runs start cold".to_owned(),
        })
    }

    /// Makes this sandbox a template (see [`Template`]): its interpreter
    /// imports `preload` and then forks runs' sandboxes. A backend that
    /// cannot says so (the caller then uses another mode).
    fn start_template(self: Box<Self>, preload: &[String]) -> Result<Box<dyn Template>, SandboxError> {
        let _ = preload;
        Err(SandboxError::Unsupported {
            backend: "this",
            what: "fork runs from a template".to_owned(),
            reason: "the backend has no forked start; use the pool's pooled mode".to_owned(),
        })
    }
}

/// A template ([`Instance::start_template`]): a sandbox whose interpreter
/// imported the preload and forks each run's sandbox, never running code
/// itself.
pub trait Template: Send + Sync {
    /// Whether it still serves forks.
    fn is_ready(&self) -> bool;

    /// The memory it holds now (its cgroup's usage), where the backend can tell.
    fn memory_bytes(&self) -> Option<u64> {
        None
    }

    /// Forks one run's sandbox, ready as a warm one: its own namespaces,
    /// /work, /tmp, cgroup and limits, every layer of a cold run in force.
    fn fork(&self) -> Result<Box<dyn WarmInstance>, SandboxError>;
}

/// A sandbox started ahead of its run ([`Instance::start_warm`]): its
/// interpreter waits for the code of exactly one run.
pub trait WarmInstance: Send {
    /// Whether it still waits (its processes alive).
    fn is_ready(&self) -> bool;

    /// The memory its processes hold now (its cgroup's usage), where the
    /// backend can tell.
    fn memory_bytes(&self) -> Option<u64> {
        None
    }

    /// Hands it to one run: copies the files in, releases the code with the
    /// claim's limits, and returns once the run is over, with the sandbox
    /// (for reading its outputs; then drop it: it is never run again).
    fn claim(self: Box<Self>, claim: Claim) -> Claimed;
}

/// What a run brings to a warm sandbox.
#[derive(Debug)]
pub struct Claim {
    pub job: Job,
    /// Files to copy into /work first.
    pub files: Vec<(SandboxPath, Vec<u8>)>,
    /// Its own wall and CPU time (at most the warm sandbox's: the rest of
    /// its limits are in force since it started).
    pub wall_time: std::time::Duration,
    pub cpu_time: std::time::Duration,
    /// A lower memory limit (bytes) and process limit than the warm
    /// sandbox's, for this run: applied to its cgroup from outside before
    /// the code is released, or the claim is [`Claimed::Unsuited`]. `None`:
    /// the sandbox's own.
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    /// Variables the driver sets (`Some`) or removes (`None`) before the
    /// code's first byte, where the run's environment differs from the
    /// warm sandbox's in names its pool lets a claim set.
    pub env: Vec<(String, Option<String>)>,
    /// The run's network: where it allows hosts, the warm sandbox starts
    /// its proxy for them at the release (the proxy's variables set then
    /// too), or the claim is [`Claimed::Unsuited`]; where it allows none,
    /// the sandbox has no proxy.
    pub network: airlock_policy::NetworkPolicy,
    pub kill: KillSwitch,
    /// When the run was asked for.
    pub requested_at: std::time::Instant,
}

/// How a claim went.
pub enum Claimed {
    /// The code ran (or the sandbox failed to start it: `Err`), in this sandbox.
    Ran { instance: Box<dyn Instance>, execution: Box<Result<Execution, SandboxError>> },
    /// A file could not be copied in; the warm sandbox was destroyed, the code never ran.
    Refused(SandboxError),
    /// The warm sandbox was no longer ready (its interpreter died waiting);
    /// nothing ran: run cold.
    Stale(String),
    /// The claim's limits could not be applied to it (its processes already
    /// use more than the lower limit asked for); the warm sandbox was
    /// destroyed, nothing ran: run cold.
    Unsuited(String),
}

impl std::fmt::Debug for Claimed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claimed::Ran { execution, .. } => {
                f.debug_struct("Ran").field("execution", execution).finish_non_exhaustive()
            }
            Claimed::Refused(error) => f.debug_tuple("Refused").field(error).finish(),
            Claimed::Stale(why) => f.debug_tuple("Stale").field(why).finish(),
            Claimed::Unsuited(why) => f.debug_tuple("Unsuited").field(why).finish(),
        }
    }
}

/// One piece of code to run.
#[derive(Clone, Debug, Default)]
pub struct Job {
    pub code: String,
    pub language: Language,
    /// Bytes for the code's standard input; empty means /dev/null.
    pub stdin: Vec<u8>,
    /// Working directory; `None` means /work.
    pub cwd: Option<SandboxPath>,
    /// The name tracebacks show for the code, e.g. `weighted_median.py`.
    pub display_name: Option<String>,
}

impl Job {
    /// The name tracebacks show for the code.
    pub fn display_name(&self) -> &str {
        self.display_name.as_deref().unwrap_or(match self.language {
            Language::Python => "<code>",
            Language::Sh => "<script>",
        })
    }
}

/// A handle that stops a run from another thread (a server shutting down).
#[derive(Clone, Debug, Default)]
pub struct KillSwitch(Arc<AtomicBool>);

impl KillSwitch {
    pub fn new() -> KillSwitch {
        KillSwitch::default()
    }

    /// Asks the run to stop; the backend kills it within its polling interval.
    pub fn kill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_killed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What a backend observed of one run. [`crate::record::assemble`] adds what
/// the caller knows (code, policy, inputs, artefacts) to make the record.
#[derive(Clone, Debug, Default)]
pub struct Execution {
    pub status: Status,
    pub limits_hit: BTreeSet<Limit>,
    pub message: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub usage: Usage,
    pub isolation: Isolation,
    /// What the Python driver reported (value, error, figures); untrusted.
    pub report: Option<DriverReport>,
    pub network: Option<NetworkRecord>,
}
