//! The sandbox every front door uses.

use std::path::PathBuf;
use std::sync::OnceLock;

use airlock_core::record::{self, RunContext};
use airlock_core::{Backend, Instance, Job, KillSwitch, Runtime};
use airlock_linux::LinuxBackend;
use airlock_policy::{
    ArtifactRecord, BackendKind, HostFacts, InputRecord, Isolation, Language, Policy, RunRecord, SandboxPath,
};
use base64::Engine;

use crate::Error;
use crate::image::{BuildEvent, DEFAULT_IMAGE, ImageStore};
use crate::interpreter::Interpreter;

/// The backend for `kind`, made once per process.
pub fn backend_for(kind: BackendKind) -> Result<&'static dyn Backend, Error> {
    static LINUX: OnceLock<LinuxBackend> = OnceLock::new();
    match kind {
        BackendKind::Linux => Ok(LINUX.get_or_init(LinuxBackend::new)),
        BackendKind::Wasm => Err(Error::Sandbox(airlock_core::SandboxError::Unsupported {
            backend: "wasm",
            what: "run code".to_owned(),
            reason: "the WebAssembly backend is not part of this build".to_owned(),
        })),
    }
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
}

impl std::fmt::Debug for SandboxOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxOptions")
            .field("policy", &self.policy)
            .field("image", &self.image)
            .field("python", &self.python)
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

/// A run the sandbox itself could not carry out: why, and its record
/// (status `sandbox_error`, the error as its message).
#[derive(Debug)]
pub struct RunFailure {
    pub error: airlock_core::SandboxError,
    pub record: RunRecord,
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
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("policy", &self.policy).field("runtime", &self.runtime).finish_non_exhaustive()
    }
}

impl Sandbox {
    /// A sandbox with `policy`, running the default image.
    pub fn new(policy: Policy) -> Result<Sandbox, Error> {
        Sandbox::with_options(SandboxOptions { policy, ..SandboxOptions::default() })
    }

    pub fn with_options(options: SandboxOptions<'_>) -> Result<Sandbox, Error> {
        let runtime = match (&options.python, &options.image) {
            (Some(python), None) => Interpreter::resolve(python)?.runtime(),
            (Some(_), Some(_)) => {
                return Err(Error::ImageBuild {
                    name: String::new(),
                    reason: "choose an image or an interpreter, not both".to_owned(),
                });
            }
            (None, image) => {
                let store = ImageStore::open_default()?;
                let name = image.as_deref().unwrap_or(DEFAULT_IMAGE);
                let mut quiet = |_: BuildEvent| {};
                let progress: &mut dyn FnMut(BuildEvent) = match options.on_build {
                    Some(p) => p,
                    None => &mut quiet,
                };
                store.get_or_build_default(name, progress)?.runtime()
            }
        };
        Sandbox::with_runtime(options.policy, runtime)
    }

    /// A sandbox with `policy` running `runtime`.
    pub fn with_runtime(policy: Policy, runtime: Runtime) -> Result<Sandbox, Error> {
        Sandbox::with_backend(backend_for(policy.backend)?, policy, runtime)
    }

    /// A sandbox made by a backend of the caller's (a Linux backend with its
    /// helper at a given path, say).
    pub fn with_backend(backend: &dyn Backend, policy: Policy, runtime: Runtime) -> Result<Sandbox, Error> {
        let instance = backend.create(&policy, &runtime)?;
        Ok(Sandbox { instance, policy, runtime, inputs: Vec::new(), kill: KillSwitch::new() })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// A handle that stops the current run from another thread.
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
    /// could not run the code gives a record with status `sandbox_error`.
    pub fn run_request(&mut self, request: &RunRequest) -> RunRecord {
        self.try_run_request(request).unwrap_or_else(|failure| failure.record)
    }

    /// Runs a request; a sandbox that could not run the code is an `Err`
    /// with the typed error beside the `sandbox_error` record, for front
    /// doors that report the two differently (the Python package raises).
    pub fn try_run_request(&mut self, request: &RunRequest) -> Result<RunRecord, Box<RunFailure>> {
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
            inputs: self.inputs.clone(),
        };
        let mut rec = match self.instance.run(&job, &self.kill) {
            Ok(execution) => record::assemble(&ctx, execution),
            Err(error) => {
                let isolation = Isolation { backend: self.policy.backend.to_string(), ..Isolation::default() };
                let record = record::sandbox_error(&ctx, &error, isolation);
                return Err(Box::new(RunFailure { error, record }));
            }
        };
        let (artifacts, over_cap) = self.collect(&request.outputs);
        record::add_artifacts(&mut rec, artifacts, over_cap);
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
