//! The sandbox every front door uses.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use airlock_audit::{AuditError, AuditStore};

use airlock_core::record::{self, RunContext};
use airlock_core::{Backend, Instance, Job, KillSwitch, Runtime};
use airlock_linux::LinuxBackend;
use airlock_policy::{
    ArtifactRecord, BackendKind, HostFacts, InputRecord, Isolation, Language, Policy, RunRecord, SandboxPath,
};
use airlock_wasm::WasmBackend;
use base64::Engine;

use crate::Error;
use crate::image::{BuildEvent, ImageStore};

/// The backend for `kind`, made once per process.
pub fn backend_for(kind: BackendKind) -> Result<&'static dyn Backend, Error> {
    static LINUX: OnceLock<LinuxBackend> = OnceLock::new();
    match kind {
        BackendKind::Linux => Ok(LINUX.get_or_init(LinuxBackend::new)),
        BackendKind::Wasm => Ok(wasm_backend()?),
    }
}

fn wasm_backend() -> Result<&'static WasmBackend, Error> {
    static WASM: OnceLock<WasmBackend> = OnceLock::new();
    if let Some(backend) = WASM.get() {
        return Ok(backend);
    }
    let data_dir = airlock_core::paths::data_dir()?;
    Ok(WASM.get_or_init(|| WasmBackend::new(data_dir)))
}

/// Installs the WebAssembly backend's interpreter and compiles it, telling a
/// person on stderr how it goes (`airlock backend install wasm`). Its first
/// use does the same by itself.
pub fn install_wasm_backend() -> Result<(), Error> {
    Ok(wasm_backend()?.prepare(&mut airlock_wasm::progress_on_stderr)?)
}

fn no_image_for_extras(backend: BackendKind) -> Error {
    if backend == BackendKind::Wasm {
        return Error::Sandbox(airlock_core::SandboxError::Unsupported {
            backend: "wasm",
            what: "add extra packages (with_packages)".to_owned(),
            reason: "its interpreter, with its packages, is built in; images are for the linux backend".to_owned(),
        });
    }
    Error::Sandbox(airlock_core::SandboxError::Unsupported {
        backend: "airlock",
        what: "add extra packages (with_packages) to a host interpreter".to_owned(),
        reason: "extra packages come from an image's vetted set; run in an image (the default, python-data, has one)"
            .to_owned(),
    })
}

/// This host's memory, CPUs and process limits, for checking policies.
pub fn host_facts() -> Result<HostFacts, Error> {
    Ok(backend_for(BackendKind::Linux)?.probe()?.host)
}

/// How to make a sandbox.
#[derive(Default)]
pub struct SandboxOptions<'a> {
    pub policy: Policy,
    /// The image to run in; `None` means the default image, `python-data`,
    /// built on first use.
    pub image: Option<String>,
    /// Run this host interpreter as it is instead of an image.
    pub python: Option<String>,
    /// Told about the default image's build, if one is needed.
    pub on_build: Option<&'a mut dyn FnMut(BuildEvent)>,
    /// Record every run in this audit store.
    pub audit: Option<Audit>,
    /// The image store to take the image from; `None` means airlock's data
    /// directory.
    pub images: Option<ImageStore>,
    /// The backend to run on (a Linux backend with its helper elsewhere);
    /// `None` means the one the policy names, as installed.
    pub backend: Option<&'a dyn Backend>,
}

/// Where a sandbox records its runs, and in whose name.
#[derive(Clone, Debug)]
pub struct Audit {
    pub store: Arc<AuditStore>,
    /// Who asked for the runs: a token's name, never a token.
    pub principal: Option<String>,
}

/// A run whose record cannot simply be handed out.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The sandbox could not start the code; the record says so (status
    /// `sandbox_error`, the error as its message). Once the code has
    /// started, a run always has a record of everything observed, even when
    /// airlock's own machinery failed (status `internal_error`).
    #[error("{error}")]
    Sandbox { error: airlock_core::SandboxError, record: Box<RunRecord> },
    /// The run happened but the audit store could not record it; the
    /// record is kept whole, so nothing about the run is lost.
    #[error("run {} was not recorded in the audit store: {error}", record.id)]
    Unrecorded {
        record: Box<RunRecord>,
        #[source]
        error: AuditError,
    },
}

impl RunError {
    /// The run's record.
    pub fn record(&self) -> &RunRecord {
        match self {
            RunError::Sandbox { record, .. } | RunError::Unrecorded { record, .. } => record,
        }
    }

    pub fn into_record(self) -> RunRecord {
        match self {
            RunError::Sandbox { record, .. } | RunError::Unrecorded { record, .. } => *record,
        }
    }
}

impl std::fmt::Debug for SandboxOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxOptions")
            .field("policy", &self.policy)
            .field("image", &self.image)
            .field("python", &self.python)
            .field("audit", &self.audit)
            .field("images", &self.images)
            .finish()
    }
}

/// A file to read back after a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub path: SandboxPath,
    /// Write it to this host path (a plain 0644 file).
    pub save_to: Option<PathBuf>,
    /// Put its content, base64, in the record.
    pub inline: bool,
}

/// One run: the code, its language, and what to read back.
#[derive(Clone, Debug, Default)]
pub struct RunRequest {
    pub code: String,
    pub language: Language,
    /// Bytes for standard input; empty means /dev/null.
    pub stdin: Vec<u8>,
    /// Working directory below /work; `None` means /work.
    pub cwd: Option<SandboxPath>,
    /// The name tracebacks show, e.g. the script's file name.
    pub display_name: Option<String>,
    pub outputs: Vec<Output>,
    /// Limits for this run only, instead of the sandbox's (checked against
    /// the host: [`Sandbox::limits_for`]); `None` keeps the sandbox's.
    pub limits: Option<airlock_policy::Limits>,
}

impl RunRequest {
    /// Python code, run from /work.
    pub fn python(code: impl Into<String>) -> RunRequest {
        RunRequest { code: code.into(), ..RunRequest::default() }
    }

    /// Shell code, run by /bin/sh from /work.
    pub fn shell(code: impl Into<String>) -> RunRequest {
        RunRequest { code: code.into(), language: Language::Sh, ..RunRequest::default() }
    }
}

/// A sandbox: a work directory that lives as long as this value, and the
/// runs made in it, each in a fresh process tree. Dropping it destroys
/// everything it made.
pub struct Sandbox {
    instance: Box<dyn Instance>,
    policy: Policy,
    runtime: Runtime,
    inputs: Vec<InputRecord>,
    kill: KillSwitch,
    audit: Option<Audit>,
    /// What getting the image with the policy's extra packages cost
    /// (milliseconds, whether it was cached), for the next run's record.
    image_cost: Option<(u64, bool)>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("policy", &self.policy).field("runtime", &self.runtime).finish_non_exhaustive()
    }
}

/// `runtime`, or, when `policy` asks for extra packages, the image that
/// extends it with them, found or built in `store` (airlock's own when
/// `None`), with what that cost (wall ms, whether it was cached). The
/// image they extend must still be the one `runtime` was made from.
pub(crate) fn runtime_with_extras(
    policy: &Policy,
    runtime: Runtime,
    store: Option<ImageStore>,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<(Runtime, Option<(u64, bool)>), Error> {
    if policy.with_packages.is_empty() {
        return Ok((runtime, None));
    }
    let Some(image) = &runtime.image else { return Err(no_image_for_extras(policy.backend)) };
    let store = match store {
        Some(store) => store,
        None => ImageStore::open_default()?,
    };
    let base = store.get(&image.name)?;
    if base.manifest.hash != image.hash {
        return Err(Error::ImageCorrupt {
            name: image.name.clone(),
            reason: format!("it is now {}, not the {} this runtime was made from", base.manifest.hash, image.hash),
        });
    }
    let packages: Vec<String> = policy.with_packages.iter().cloned().collect();
    let prepared = store.with_packages(&base, &packages, progress)?;
    Ok((prepared.image.runtime(), Some((prepared.wall_ms, prepared.cached))))
}

impl Sandbox {
    /// A sandbox with `policy`, running the default image.
    pub fn new(policy: Policy) -> Result<Sandbox, Error> {
        Sandbox::with_options(SandboxOptions { policy, ..SandboxOptions::default() })
    }

    /// A sandbox as `options` say. Every backend takes the same path: the
    /// runtime for the policy's backend ([`crate::resolve_runtime`]), its
    /// extra packages, the sandbox, then the audit store, so that no backend
    /// can hand out a run the store did not see.
    pub fn with_options(options: SandboxOptions<'_>) -> Result<Sandbox, Error> {
        let mut quiet = |_: BuildEvent| {};
        let progress: &mut dyn FnMut(BuildEvent) = match options.on_build {
            Some(p) => p,
            None => &mut quiet,
        };
        let runtime = crate::setup::resolve_runtime_in(
            options.images.as_ref(),
            options.policy.backend,
            options.image.as_deref(),
            options.python.as_deref(),
            progress,
        )?;
        let backend = match options.backend {
            Some(backend) => backend,
            None => backend_for(options.policy.backend)?,
        };
        let mut sandbox = Sandbox::with_extras(backend, options.policy, runtime, options.images, progress)?;
        sandbox.set_audit(options.audit);
        Ok(sandbox)
    }

    /// A sandbox with `policy` running `runtime`.
    pub fn with_runtime(policy: Policy, runtime: Runtime) -> Result<Sandbox, Error> {
        Sandbox::with_backend(backend_for(policy.backend)?, policy, runtime)
    }

    /// A sandbox made by a backend of the caller's (a Linux backend with its
    /// helper at a given path, say). When the policy asks for extra
    /// packages, the runtime must come from an image in airlock's data
    /// directory: the image with them is found or built first.
    pub fn with_backend(backend: &dyn Backend, policy: Policy, runtime: Runtime) -> Result<Sandbox, Error> {
        Sandbox::with_extras(backend, policy, runtime, None, &mut |_| {})
    }

    /// The sandbox, once the runtime has the policy's extra packages: the
    /// image they extend is taken from `store` (airlock's own when `None`)
    /// and must still be the one the runtime was made from.
    fn with_extras(
        backend: &dyn Backend,
        policy: Policy,
        runtime: Runtime,
        store: Option<ImageStore>,
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<Sandbox, Error> {
        let (runtime, image_cost) = runtime_with_extras(&policy, runtime, store, progress)?;
        Sandbox::create(backend, policy, runtime, image_cost)
    }

    fn create(
        backend: &dyn Backend,
        policy: Policy,
        runtime: Runtime,
        image_cost: Option<(u64, bool)>,
    ) -> Result<Sandbox, Error> {
        if backend.kind() != policy.backend {
            // The record would name one backend while another ran the code.
            return Err(Error::Sandbox(airlock_core::SandboxError::Unsupported {
                backend: "airlock",
                what: format!("run a {} policy on the {} backend", policy.backend, backend.kind()),
                reason: "the policy's backend and the backend given must be the same".to_owned(),
            }));
        }
        let instance = backend.create(&policy, &runtime)?;
        Ok(Sandbox { instance, policy, runtime, inputs: Vec::new(), kill: KillSwitch::new(), audit: None, image_cost })
    }

    /// A sandbox around an instance made elsewhere (a pool's).
    pub(crate) fn from_instance(instance: Box<dyn Instance>, policy: Policy, runtime: Runtime) -> Sandbox {
        Sandbox {
            instance,
            policy,
            runtime,
            inputs: Vec::new(),
            kill: KillSwitch::new(),
            audit: None,
            image_cost: None,
        }
    }

    /// Records every later run in `audit` (or in none).
    pub fn set_audit(&mut self, audit: Option<Audit>) {
        self.audit = audit;
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// A handle that stops the current run from another thread, and every
    /// later one: a sandbox whose switch was thrown refuses to run again
    /// (make a new one).
    pub fn kill_switch(&self) -> KillSwitch {
        self.kill.clone()
    }

    /// Copies `data` into the work directory at `path` (`/work/x.csv` or `x.csv`).
    pub fn write(&mut self, path: &str, data: &[u8]) -> Result<(), Error> {
        let path = SandboxPath::parse(path)?;
        self.instance.write(&path, data)?;
        let entry =
            InputRecord { path: path.to_string(), bytes: data.len() as u64, sha256: airlock_core::sha256_hex(data) };
        match self.inputs.iter_mut().find(|i| i.path == entry.path) {
            Some(existing) => *existing = entry,
            None => self.inputs.push(entry),
        }
        Ok(())
    }

    /// Reads back one file from the work directory, capped at the policy's
    /// `max_file_bytes`.
    pub fn read(&mut self, path: &str) -> Result<Vec<u8>, Error> {
        self.read_capped(path, self.policy.limits.file_bytes)
    }

    /// Reads back one file, refusing it above `max_bytes`.
    pub fn read_capped(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        let path = SandboxPath::parse(path)?;
        Ok(self.instance.read(&path, max_bytes)?)
    }

    /// Runs Python code and returns its record.
    pub fn run(&mut self, code: &str) -> RunRecord {
        self.run_request(&RunRequest::python(code))
    }

    /// Runs a request and returns its record. Never fails: a sandbox that
    /// could not start the code gives a record with status `sandbox_error`,
    /// and a run the audit store could not record says so in its `message`.
    /// Front doors that must tell these apart use [`Sandbox::run_checked`].
    pub fn run_request(&mut self, request: &RunRequest) -> RunRecord {
        match self.run_checked(request) {
            Ok(record) => record,
            Err(failure) => match *failure {
                RunError::Sandbox { record, .. } => *record,
                RunError::Unrecorded { mut record, error } => {
                    let note = format!("this run was NOT recorded in the audit store: {error}");
                    record.message = Some(match record.message.take() {
                        Some(message) => format!("{message}; {note}"),
                        None => note,
                    });
                    *record
                }
            },
        }
    }

    /// Runs a request, records it in the audit store if one is set (a run
    /// the sandbox failed to carry out is recorded too), and returns its
    /// record, or why it cannot simply be handed out (see [`RunError`]).
    /// The audit store receives exactly the record returned, artefacts
    /// included (their contents aside).
    pub fn run_checked(&mut self, request: &RunRequest) -> Result<RunRecord, Box<RunError>> {
        let outcome = self.execute(request);
        let Some(audit) = &self.audit else { return outcome };
        let record = match &outcome {
            Ok(record) => record,
            Err(failure) => failure.record(),
        };
        match audit.store.append(record, audit.principal.as_deref()) {
            Ok(_) => outcome,
            Err(error) => {
                let record = match outcome {
                    Ok(record) => record,
                    Err(failure) => failure.into_record(),
                };
                Err(Box::new(RunError::Unrecorded { record: Box::new(record), error }))
            }
        }
    }

    /// The sandbox's limits with the per-run fields `spec` sets
    /// ([`airlock_policy::PolicySpec::PER_RUN`]), checked against `host`: limits for
    /// [`RunRequest::limits`]. A spec that sets any other field is refused.
    pub fn limits_for(
        &self,
        spec: &airlock_policy::PolicySpec,
        host: &HostFacts,
    ) -> Result<airlock_policy::Limits, Error> {
        let fields = serde_json::to_value(spec).unwrap_or_default();
        if let Some(field) = fields
            .as_object()
            .into_iter()
            .flatten()
            .map(|(f, _)| f)
            .find(|f| !airlock_policy::PolicySpec::PER_RUN.contains(&f.as_str()))
        {
            return Err(Error::Policy(airlock_policy::PolicyError::Invalid {
                field: "limits",
                message: format!(
                    "{field} belongs to the sandbox, not to one run; a run may set {}",
                    airlock_policy::PolicySpec::PER_RUN.join(", ")
                ),
            }));
        }
        Ok(self.policy.with_spec(spec, host)?.limits)
    }

    fn execute(&mut self, request: &RunRequest) -> Result<RunRecord, Box<RunError>> {
        let Some(limits) = &request.limits else { return self.execute_with_limits(request) };
        // This run's limits, in force for it and in its record; the sandbox's after.
        let own = std::mem::replace(&mut self.policy.limits, limits.clone());
        self.instance.set_limits(limits.clone());
        let outcome = self.execute_with_limits(request);
        self.instance.set_limits(own.clone());
        self.policy.limits = own;
        outcome
    }

    fn execute_with_limits(&mut self, request: &RunRequest) -> Result<RunRecord, Box<RunError>> {
        let job = Job {
            code: request.code.clone(),
            language: request.language,
            stdin: request.stdin.clone(),
            cwd: request.cwd.clone(),
            display_name: request.display_name.clone(),
        };
        let ctx = RunContext {
            id: record::new_id(),
            started_at: record::now_rfc3339(),
            job: &job,
            policy: &self.policy,
            image: self.runtime.image.clone(),
            runtime_description: &self.runtime.describe,
            // The files copied in for this run; the next run's record lists its own.
            inputs: std::mem::take(&mut self.inputs),
        };
        let outcome = if self.kill.is_killed() {
            Err(airlock_core::SandboxError::Setup {
                step: "start the run".to_owned(),
                detail: "this sandbox was stopped with its kill switch; make a new one".to_owned(),
            })
        } else {
            self.instance.run(&job, &self.kill)
        };
        let mut rec = match outcome {
            Ok(execution) => record::assemble(&ctx, execution),
            Err(error) => {
                let isolation = Isolation { backend: self.policy.backend.to_string(), ..Isolation::default() };
                let record = Box::new(record::sandbox_error(&ctx, &error, isolation));
                return Err(Box::new(RunError::Sandbox { error, record }));
            }
        };
        let (artifacts, over_cap) = self.collect(&request.outputs);
        record::add_artifacts(&mut rec, artifacts, over_cap);
        // The image was got once, for this sandbox: its first run says what it cost.
        if let Some((ms, cached)) = self.image_cost.take() {
            rec.usage.image_ms = Some(ms);
            rec.usage.image_cached = Some(cached);
        }
        Ok(rec)
    }

    /// Reads the requested outputs after a run, each capped, together capped.
    fn collect(&mut self, outputs: &[Output]) -> (Vec<ArtifactRecord>, bool) {
        let limits = &self.policy.limits;
        let mut total = 0u64;
        let mut over_cap = false;
        let mut records = Vec::new();
        for output in outputs {
            let path = output.path.to_string();
            let remaining = limits.files_total_bytes.saturating_sub(total);
            let cap = limits.file_bytes.min(remaining);
            let entry = match self.instance.read(&output.path, cap) {
                Ok(data) => {
                    total += data.len() as u64;
                    let mut entry = ArtifactRecord {
                        path: path.clone(),
                        bytes: Some(data.len() as u64),
                        sha256: Some(airlock_core::sha256_hex(&data)),
                        ..ArtifactRecord::default()
                    };
                    if output.inline {
                        entry.content_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&data));
                    }
                    if let Some(host) = &output.save_to {
                        match crate::artifacts::save_to_host(host, &data) {
                            Ok(saved) => entry.saved_to = Some(saved.display().to_string()),
                            Err(e) => entry.error = Some(format!("read, but not saved to {}: {e}", host.display())),
                        }
                    }
                    entry
                }
                Err(error) => {
                    let error = match error {
                        airlock_core::ArtifactError::TooLarge { size, .. }
                            if cap < limits.file_bytes && size <= limits.file_bytes =>
                        {
                            airlock_core::ArtifactError::TotalTooLarge {
                                path: path.clone(),
                                cap: limits.files_total_bytes,
                            }
                        }
                        other => other,
                    };
                    over_cap |= matches!(
                        error,
                        airlock_core::ArtifactError::TooLarge { .. }
                            | airlock_core::ArtifactError::TotalTooLarge { .. }
                    );
                    ArtifactRecord { path, error: Some(error.to_string()), ..ArtifactRecord::default() }
                }
            };
            records.push(entry);
        }
        (records, over_cap)
    }
}
