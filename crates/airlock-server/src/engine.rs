//! The engine both front doors share: it turns a request into a policy and a
//! [`RunRequest`], admits it to a bounded number of slots behind a bounded
//! queue (each token that holds no place keeping one, see [`crate::places`]), runs it on a blocking thread through the facade, records it, and
//! stops everything on shutdown. No sandbox logic lives here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use airlock::audit::{AuditError, AuditStore};
use airlock::{
    Audit, CopyIn, KillSwitch, Language, Output, PolicyError, PolicySpec, RunRecord, RunRequest, Sandbox, SandboxPath,
    Status,
};
use base64::Engine as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::artifacts::ArtifactStore;
use crate::config::Settings;
use crate::metrics::{Gauges, Metrics, Rejection};
use crate::places::{Place, Places, Principal, Refusal};

/// The shortest and longest wait a client refused with 429 is told.
pub const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

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
    #[error("the server is running {slots} runs with {queue} more waiting; try again in {} s", retry_after.as_secs())]
    Busy { slots: usize, queue: usize, retry_after: Duration },
    /// The caller holds `held` places, and the rest are kept for tokens
    /// that hold none (429).
    #[error(
        "this caller has {held} runs running or waiting, and the server's other places are kept for callers that have none; try again in {} s",
        retry_after.as_secs()
    )]
    CallerBusy { held: usize, retry_after: Duration },
    /// The server is shutting down (503).
    #[error("the server is shutting down and takes no more runs")]
    ShuttingDown,
    /// The run started, then airlock stopped it before it ended: the server
    /// shut down past its grace period, or the caller cancelled it. Not a
    /// failure of the code or of the sandbox; the record is in the audit
    /// store (503 at shutdown).
    #[error("run {run_id} was stopped before it ended: {why}")]
    Stopped { run_id: String, why: StopReason, record: Box<RunRecord> },
    /// The sandbox could not be made (500).
    #[error("the sandbox could not be made: {0}")]
    Sandbox(String),
    /// The run happened but could not be recorded, so it is not returned
    /// (500, or 507 when the disk is full).
    #[error("run {run_id} could not be recorded in the audit store, so it is not returned: {error}")]
    Unrecorded { run_id: String, error: AuditError },
}

/// Why airlock stopped a run it had started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The server shut down and the run outlived the grace period.
    Shutdown,
    /// The caller cancelled it (MCP `notifications/cancelled`).
    Cancelled,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Shutdown => "the server shut down and the run did not end within its grace period",
            StopReason::Cancelled => "the caller cancelled it",
        })
    }
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
    files: CopyIn,
    request: RunRequest,
}

/// The shared engine.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    audit: Arc<AuditStore>,
    slots: Arc<Semaphore>,
    /// The places (slots and queue) and who holds them.
    places: Arc<Places>,
    /// Runs waiting for a slot, for the gauge.
    waiting: AtomicUsize,
    metrics: Metrics,
    active: Mutex<BTreeMap<u64, KillSwitch>>,
    artifacts: ArtifactStore,
    /// The schema a run request must fit ([`crate::request::run_body_schema`]).
    run_schema: serde_json::Value,
    next_run: AtomicU64,
    accepting: AtomicBool,
    /// Set when the grace period is over: every run is being killed.
    killing: AtomicBool,
    tasks: TaskTracker,
    /// Sandboxes kept ready for runs with the defaults' policy.
    pool: Option<airlock::Pool>,
}

impl Engine {
    /// An engine for `settings`, recording into `audit` and keeping
    /// artefacts in `artifacts`.
    pub fn new(settings: Settings, audit: Arc<AuditStore>, artifacts: ArtifactStore) -> Engine {
        Engine {
            artifacts,
            run_schema: crate::request::run_body_schema(&settings),
            slots: Arc::new(Semaphore::new(settings.concurrency)),
            places: Places::new(
                settings.concurrency,
                settings.queue,
                settings.tokens.iter().map(|token| token.name.clone()).collect(),
            ),
            settings,
            audit,
            waiting: AtomicUsize::new(0),
            metrics: Metrics::default(),
            active: Mutex::new(BTreeMap::new()),
            next_run: AtomicU64::new(0),
            accepting: AtomicBool::new(true),
            killing: AtomicBool::new(false),
            tasks: TaskTracker::new(),
            pool: None,
        }
    }

    /// Serves runs from `pool` (made for the defaults' policy and the
    /// settings' runtime) when they fit it.
    pub fn with_pool(mut self, pool: airlock::Pool) -> Engine {
        self.pool = Some(pool);
        self
    }

    pub fn pool(&self) -> Option<&airlock::Pool> {
        self.pool.as_ref()
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

    pub fn artifacts(&self) -> &ArtifactStore {
        &self.artifacts
    }

    /// [`ArtifactStore::get`] on a blocking thread: it reads and hashes the
    /// whole file (up to the per-file cap), which must not hold up the
    /// threads that serve every other request.
    pub async fn artifact(self: &Arc<Self>, principal: Option<String>, sha256: String) -> Option<Vec<u8>> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || engine.artifacts.get(principal.as_deref(), &sha256)).await.ok().flatten()
    }

    /// The schema a run request must fit, as the OpenAPI document states it.
    pub fn run_schema(&self) -> &serde_json::Value {
        &self.run_schema
    }

    /// How long a refused client should wait: the runs ahead of it (every
    /// slot and the queue), at the mean run time so far, over the slots.
    pub fn retry_after(&self) -> Duration {
        let ahead = (self.settings.concurrency + self.settings.queue) as f64;
        let mean = self.metrics.mean_run_time().unwrap_or(RETRY_AFTER_MIN);
        let wait = mean.as_secs_f64() * ahead / self.settings.concurrency as f64;
        Duration::from_secs(wait.ceil() as u64).clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX)
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            queue_depth: self.waiting.load(Ordering::SeqCst),
            sandboxes_active: self.active_runs(),
            slots: self.settings.concurrency,
            queue_capacity: self.settings.queue,
            pool: self.pool.as_ref().map(|pool| {
                let stats = pool.stats();
                crate::metrics::PoolGauges {
                    size: stats.size as u64,
                    ready: stats.ready as u64,
                    memory_bytes: stats.memory_bytes,
                    hits: stats.hits,
                    misses: stats.misses,
                    unsuited: stats.unsuited,
                    refills: stats.refills,
                    refill_failures: stats.refill_failures,
                    refill_ms_total: stats.refill_ms_total,
                    last_refill_ms: stats.last_refill_ms,
                    templates: stats.templates,
                    template_memory_bytes: stats.template_memory_bytes,
                }
            }),
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
        self.run_cancellable(job, principal, CancellationToken::new()).await
    }

    /// [`Engine::run`], stopped when `cancel` is cancelled: a run waiting
    /// for a slot leaves the queue, a running one is killed (and recorded)
    /// and its slot freed.
    pub async fn run_cancellable(
        self: &Arc<Self>,
        job: RunJob,
        principal: Option<String>,
        cancel: CancellationToken,
    ) -> Result<RunRecord, RunError> {
        let prepared = self.prepare(job)?;
        let admitted = tokio::select! {
            admitted = self.admit(principal.clone()) => admitted?,
            () = cancel.cancelled() => return Err(RunError::BadRequest {
                field: String::new(),
                message: "the caller cancelled the run before it started".to_owned(),
            }),
        };
        let audit = Audit { store: self.audit.clone(), principal };
        let engine = self.clone();
        let stop = Arc::new(OnceLock::new());
        let run = {
            let stop = stop.clone();
            let cancel = cancel.clone();
            self.tasks.spawn_blocking(move || engine.execute(prepared, audit, admitted, &cancel, &stop))
        };
        let outcome = run.await.map_err(|error| RunError::Sandbox(format!("the run's thread failed: {error}")))?;
        let record = outcome?;
        // Killed by us rather than ended by itself: say so, apart from failures.
        let stopped = stop.get().copied().or(self.killing.load(Ordering::SeqCst).then_some(StopReason::Shutdown));
        match stopped {
            Some(why) if matches!(record.status, Status::SandboxError | Status::InternalError) => {
                Err(RunError::Stopped { run_id: record.id.clone(), why, record: Box::new(record) })
            }
            _ => Ok(record),
        }
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
        self.close_pool();
    }

    /// Destroys the ready sandboxes; no more are made.
    fn close_pool(&self) {
        if let Some(pool) = &self.pool {
            pool.close();
        }
    }

    /// Stops taking runs and kills the running ones at once (each is still
    /// recorded); returns when every sandbox is gone.
    pub async fn stop_now(&self) {
        self.accepting.store(false, Ordering::SeqCst);
        self.slots.close();
        self.tasks.close();
        self.kill_all();
        self.tasks.wait().await;
        self.close_pool();
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
    /// files in, run, record, keep the artefacts. The sandbox is gone when
    /// this returns. `cancel` kills the run; `stopped` then says why.
    fn execute(
        &self,
        prepared: Prepared,
        audit: Audit,
        _admitted: (Place, OwnedSemaphorePermit),
        cancel: &CancellationToken,
        stopped: &Arc<OnceLock<StopReason>>,
    ) -> Result<RunRecord, RunError> {
        let Prepared { policy, files, request } = prepared;
        let principal = audit.principal.clone();
        let sandbox = match &self.pool {
            Some(pool) => pool.sandbox(&policy),
            None => Sandbox::with_runtime(policy, self.settings.runtime.clone()),
        };
        let mut sandbox = sandbox.map_err(|error| RunError::Sandbox(error.to_string()))?;
        sandbox.set_audit(Some(audit));
        let _registered = Registered::new(self, sandbox.kill_switch());
        // A watcher on the runtime turns a cancellation into a kill.
        let kill = sandbox.kill_switch();
        let _watch = CancelWatch::spawn(cancel, move || kill.kill(), stopped);
        // The files are the caller's: one that cannot be written (no room in
        // the disk asked for, a name too long) is the request's fault.
        files.write_into(&mut sandbox).map_err(|error| RunError::bad("files", error.to_string()))?;
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
        self.keep_artifacts(principal.as_deref(), record);
        result.map_err(|(record, error)| RunError::Unrecorded { run_id: record.id.clone(), error })
    }

    /// Keeps the artefacts and figures a run of `principal`'s returned, for
    /// links to them.
    fn keep_artifacts(&self, principal: Option<&str>, record: &RunRecord) {
        let artifacts =
            record.artifacts.iter().filter_map(|a| Some((&a.path, a.content_base64.as_ref()?, a.sha256.as_ref()?)));
        let figures = record.figures.iter().filter_map(|f| Some((&f.name, f.png_base64.as_ref()?, &f.sha256)));
        for (name, b64, sha256) in artifacts.chain(figures) {
            let Ok(data) = base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()) else { continue };
            if let Err(error) = self.artifacts.put(principal, sha256, &data) {
                // The run and its record stand; only the later link is lost.
                eprintln!("airlock: could not keep {name} of run {}: {error}", record.id);
            }
        }
    }

    fn prepare(&self, job: RunJob) -> Result<Prepared, RunError> {
        if !self.is_accepting() {
            self.metrics.record_rejection(Rejection::ShuttingDown);
            return Err(RunError::ShuttingDown);
        }
        let settings = &self.settings;
        job.policy.check_within(&settings.ceiling).map_err(RunError::from_policy)?;
        let policy = settings.defaults.with_spec(&job.policy, &settings.host).map_err(RunError::from_policy)?;
        // The operator's files, then the request's, each within the run's own caps.
        let copy_error =
            |error: airlock::CopyInError| RunError::bad(format!("policy.{}", error.field()), error.to_string());
        let mut files = settings.files.under(&policy.limits).map_err(copy_error)?;
        for (index, (path, data)) in job.files.into_iter().enumerate() {
            let path =
                SandboxPath::parse(&path).map_err(|e| RunError::bad(format!("files[{index}].path"), e.to_string()))?;
            files.add(path, data.into()).map_err(copy_error)?;
        }
        // Each is read back after the run (through a helper process, for an
        // ordinary user's sandbox): no more than /work can hold files.
        if job.outputs.len() as u64 > policy.limits.disk_inodes {
            return Err(RunError::bad(
                "outputs",
                format!(
                    "names {} files, and /work and /tmp hold at most {} files and folders in all (disk_inodes)",
                    job.outputs.len(),
                    policy.limits.disk_inodes
                ),
            ));
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
        if job.code.len() > settings.max_code_bytes {
            return Err(RunError::bad(
                "code",
                format!(
                    "is {} bytes, above the server's cap of {} (max_code_bytes): send data as files, not in the code",
                    job.code.len(),
                    settings.max_code_bytes
                ),
            ));
        }
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
            limits: None,
        };
        Ok(Prepared { policy, files, request })
    }

    /// A place and a slot now, or a place and a slot after waiting in the
    /// queue, or a refusal when `principal` may have no place or the
    /// server is shutting down. Both are held until the run ends.
    async fn admit(&self, principal: Principal) -> Result<(Place, OwnedSemaphorePermit), RunError> {
        let place = self.places.take(principal).map_err(|refusal| {
            self.metrics.record_rejection(Rejection::Busy);
            let retry_after = self.retry_after();
            match refusal {
                Refusal::Full => {
                    RunError::Busy { slots: self.settings.concurrency, queue: self.settings.queue, retry_after }
                }
                Refusal::KeptForOthers { held } => RunError::CallerBusy { held, retry_after },
            }
        })?;
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok((place, permit));
        }
        let waiting = Waiting::join(&self.waiting);
        let permit = self.slots.clone().acquire_owned().await;
        drop(waiting);
        let permit = permit.map_err(|_closed| {
            self.metrics.record_rejection(Rejection::ShuttingDown);
            RunError::ShuttingDown
        })?;
        Ok((place, permit))
    }
}

/// Kills a run when its caller cancels it, for as long as this lives.
struct CancelWatch {
    done: CancellationToken,
}

impl CancelWatch {
    fn spawn(
        cancel: &CancellationToken,
        kill: impl FnOnce() + Send + 'static,
        stopped: &Arc<OnceLock<StopReason>>,
    ) -> Option<CancelWatch> {
        let done = CancellationToken::new();
        let (cancel, finished, stopped) = (cancel.clone(), done.clone(), stopped.clone());
        let watch = async move {
            tokio::select! {
                () = cancel.cancelled() => {
                    // The reason is set before the kill, so the run's end reads it.
                    let _ = stopped.set(StopReason::Cancelled);
                    kill();
                }
                () = finished.cancelled() => {}
            }
        };
        tokio::runtime::Handle::try_current().ok()?.spawn(watch);
        Some(CancelWatch { done })
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        self.done.cancel();
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

/// A run waiting for a slot, counted for the gauge while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn join(waiting: &'a AtomicUsize) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
