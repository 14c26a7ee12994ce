//! The engine both front doors share: it turns a request into a policy and a
//! [`RunRequest`], admits it to a bounded number of slots behind a bounded
//! queue, runs it on a blocking thread through the facade, records it, and
//! stops everything on shutdown. No sandbox logic lives here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock::audit::{AuditError, AuditStore};
use airlock::{
    Audit, KillSwitch, Language, Output, PolicyError, PolicySpec, RunRecord, RunRequest, Sandbox, SandboxPath,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::metrics::{Gauges, Metrics, Rejection};

/// How long a client refused with 429 is told to wait.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One run as a front door asks for it, before any check.
#[derive(Clone, Debug, Default)]
pub struct RunJob {
    pub code: String,
    pub language: Language,
    pub stdin: Vec<u8>,
    /// Files copied in after the operator's, as (path as given, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// Files in /work to return, inline, after the run.
    pub outputs: Vec<String>,
    /// What the request asks for; checked against the operator's ceiling.
    pub policy: PolicySpec,
    /// The name tracebacks show.
    pub display_name: Option<String>,
}

/// Why a run was not carried out, or carried out but not recorded.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The request is wrong; `field` names what to fix (400).
    #[error("{field}: {message}")]
    BadRequest { field: String, message: String },
    /// Every slot and the queue are full (429).
    #[error("the server is running {slots} runs with {queue} more waiting; try again in {} s", RETRY_AFTER.as_secs())]
    Busy { slots: usize, queue: usize },
    /// The server is shutting down (503).
    #[error("the server is shutting down and takes no more runs")]
    ShuttingDown,
    /// The sandbox could not be made (500).
    #[error("the sandbox could not be made: {0}")]
    Sandbox(String),
    /// The run happened but could not be recorded, so it is not returned
    /// (500, or 507 when the disk is full).
    #[error("run {run_id} could not be recorded in the audit store, so it is not returned: {error}")]
    Unrecorded { run_id: String, error: AuditError },
}

impl RunError {
    fn bad(field: impl Into<String>, message: impl Into<String>) -> RunError {
        RunError::BadRequest { field: field.into(), message: message.into() }
    }

    fn from_policy(error: PolicyError) -> RunError {
        RunError::bad(format!("policy.{}", error.field()), error.to_string())
    }
}

/// A checked run, ready for a slot.
struct Prepared {
    policy: airlock::Policy,
    files: Vec<(SandboxPath, Arc<[u8]>)>,
    request: RunRequest,
}

/// The shared engine.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    audit: Arc<AuditStore>,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    metrics: Metrics,
    active: Mutex<BTreeMap<u64, KillSwitch>>,
    next_run: AtomicU64,
    accepting: AtomicBool,
    /// Set when the grace period is over: every run is being killed.
    killing: AtomicBool,
    tasks: TaskTracker,
}

impl Engine {
    /// An engine for `settings`, recording into `audit`.
    pub fn new(settings: Settings, audit: Arc<AuditStore>) -> Engine {
        Engine {
            slots: Arc::new(Semaphore::new(settings.concurrency)),
            settings,
            audit,
            waiting: AtomicUsize::new(0),
            metrics: Metrics::default(),
            active: Mutex::new(BTreeMap::new()),
            next_run: AtomicU64::new(0),
            accepting: AtomicBool::new(true),
            killing: AtomicBool::new(false),
            tasks: TaskTracker::new(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn audit(&self) -> &Arc<AuditStore> {
        &self.audit
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            queue_depth: self.waiting.load(Ordering::SeqCst),
            sandboxes_active: self.active_runs(),
            slots: self.settings.concurrency,
            queue_capacity: self.settings.queue,
        }
    }

    /// Runs whose sandbox is alive now.
    pub fn active_runs(&self) -> usize {
        self.active.lock().map_or(0, |active| active.len())
    }

    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::SeqCst)
    }

    /// Checks `job`, waits for a slot, runs it, records it and returns its
    /// record. The run goes on to the end (and is recorded) even if the
    /// caller stops waiting for it.
    pub async fn run(self: &Arc<Self>, job: RunJob, principal: Option<String>) -> Result<RunRecord, RunError> {
        let prepared = self.prepare(job)?;
        let permit = self.admit().await?;
        let audit = Audit { store: self.audit.clone(), principal };
        let engine = self.clone();
        let handle = self.tasks.spawn_blocking(move || engine.execute(prepared, audit, permit));
        handle.await.map_err(|error| RunError::Sandbox(format!("the run's thread failed: {error}")))?
    }

    /// Stops taking runs, lets running ones go on for the grace period, then
    /// kills them; returns when every sandbox is gone.
    pub async fn shutdown(&self) {
        self.accepting.store(false, Ordering::SeqCst);
        // Runs waiting in the queue are refused at once.
        self.slots.close();
        self.tasks.close();
        if tokio::time::timeout(self.settings.grace_period, self.tasks.wait()).await.is_err() {
            self.kill_all();
            self.tasks.wait().await;
        }
    }

    /// Kills every run now, and every run whose sandbox is being made.
    pub fn kill_all(&self) {
        self.killing.store(true, Ordering::SeqCst);
        if let Ok(active) = self.active.lock() {
            for kill in active.values() {
                kill.kill();
            }
        }
    }

    /// On a blocking thread, holding a slot: make the sandbox, copy the
    /// files in, run, record. The sandbox is gone when this returns.
    fn execute(&self, prepared: Prepared, audit: Audit, _slot: OwnedSemaphorePermit) -> Result<RunRecord, RunError> {
        let Prepared { policy, files, request } = prepared;
        let mut sandbox = Sandbox::with_runtime(policy, self.settings.runtime.clone())
            .map_err(|error| RunError::Sandbox(error.to_string()))?;
        sandbox.set_audit(Some(audit));
        let _registered = Registered::new(self, sandbox.kill_switch());
        for (path, data) in &files {
            sandbox.write(&path.to_string(), data).map_err(|error| RunError::Sandbox(error.to_string()))?;
        }
        // A run the sandbox could not carry out still has its record (status
        // sandbox_error), recorded and returned like any other.
        let result = match sandbox.run_checked(&request) {
            Ok(record) => Ok(record),
            Err(failure) => match *failure {
                airlock::RunError::Sandbox { record, .. } => Ok(*record),
                airlock::RunError::Unrecorded { record, error } => Err((record, error)),
            },
        };
        let record = match &result {
            Ok(record) => record,
            Err((record, _)) => {
                self.metrics.record_audit_failure();
                record
            }
        };
        self.metrics.record_run(record.status, record.usage.wall_ms);
        drop(sandbox);
        result.map_err(|(record, error)| RunError::Unrecorded { run_id: record.id.clone(), error })
    }

    fn prepare(&self, job: RunJob) -> Result<Prepared, RunError> {
        if !self.is_accepting() {
            self.metrics.record_rejection(Rejection::ShuttingDown);
            return Err(RunError::ShuttingDown);
        }
        let settings = &self.settings;
        job.policy.check_within(&settings.ceiling).map_err(RunError::from_policy)?;
        let policy = settings.defaults.with_spec(&job.policy, &settings.host).map_err(RunError::from_policy)?;
        let limits = &policy.limits;
        let mut files: Vec<(SandboxPath, Arc<[u8]>)> =
            settings.files.iter().map(|file| (file.path.clone(), file.data.clone())).collect();
        for (index, (path, data)) in job.files.into_iter().enumerate() {
            let path =
                SandboxPath::parse(&path).map_err(|e| RunError::bad(format!("files[{index}].path"), e.to_string()))?;
            if files.iter().any(|(existing, _)| *existing == path) {
                return Err(RunError::bad(
                    format!("files[{index}].path"),
                    format!("{path} is given twice (or is one of the operator's files)"),
                ));
            }
            files.push((path, data.into()));
        }
        let mut total = 0u64;
        for (index, (path, data)) in files.iter().enumerate() {
            let size = data.len() as u64;
            if size > limits.file_bytes {
                return Err(RunError::bad(
                    "policy.max_file_bytes",
                    format!("{path} is {size} bytes, above the per-file cap of {} bytes", limits.file_bytes),
                ));
            }
            total += size;
            if total > limits.files_total_bytes {
                return Err(RunError::bad(
                    "policy.max_files_total_bytes",
                    format!(
                        "the files together pass the cap of {} bytes at {path} (file {index})",
                        limits.files_total_bytes
                    ),
                ));
            }
        }
        let outputs = job
            .outputs
            .iter()
            .enumerate()
            .map(|(index, path)| {
                SandboxPath::parse(path)
                    .map(|path| Output { path, save_to: None, inline: true })
                    .map_err(|e| RunError::bad(format!("outputs[{index}]"), e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if job.code.contains('\0') {
            return Err(RunError::bad("code", "contains a NUL byte, which no interpreter reads"));
        }
        let request = RunRequest {
            code: job.code,
            language: job.language,
            stdin: job.stdin,
            cwd: None,
            display_name: job.display_name,
            outputs,
        };
        Ok(Prepared { policy, files, request })
    }

    /// A slot now, or after waiting in the queue, or a refusal when the
    /// queue is full or the server is shutting down.
    async fn admit(&self) -> Result<OwnedSemaphorePermit, RunError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let waiting = Waiting::join(&self.waiting, self.settings.queue).ok_or_else(|| {
            self.metrics.record_rejection(Rejection::Busy);
            RunError::Busy { slots: self.settings.concurrency, queue: self.settings.queue }
        })?;
        let permit = self.slots.clone().acquire_owned().await;
        drop(waiting);
        permit.map_err(|_closed| {
            self.metrics.record_rejection(Rejection::ShuttingDown);
            RunError::ShuttingDown
        })
    }
}

/// A run's kill switch, listed while its sandbox lives, so that shutdown
/// can stop it.
struct Registered<'a> {
    engine: &'a Engine,
    number: u64,
}

impl<'a> Registered<'a> {
    fn new(engine: &'a Engine, kill: KillSwitch) -> Registered<'a> {
        let number = engine.next_run.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut active) = engine.active.lock() {
            active.insert(number, kill.clone());
        }
        // Listed first, then checked: a kill_all either sees this run in the
        // list or has set the flag this reads.
        if engine.killing.load(Ordering::SeqCst) {
            kill.kill();
        }
        Registered { engine, number }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut active) = self.engine.active.lock() {
            active.remove(&self.number);
        }
    }
}

/// A place in the queue, given back when dropped (the run got a slot, or
/// its caller went away).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn join(waiting: &'a AtomicUsize, capacity: usize) -> Option<Waiting<'a>> {
        waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < capacity).then_some(n + 1))
            .ok()
            .map(|_| Waiting(waiting))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
