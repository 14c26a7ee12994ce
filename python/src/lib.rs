//! `airlock._native`: the Python package's bindings over the airlock library.
//!
//! Thin on purpose. The Python side (python/airlock/) turns keyword
//! arguments into a `PolicySpec` as JSON and wraps results; this side
//! checks the spec with [`airlock::Policy::from_spec`], calls the facade
//! ([`airlock::Sandbox`]) and maps its errors to the exception classes. It
//! lets go of the GIL around every call that can block, so other Python
//! threads, and other sandboxes, go on meanwhile.

#![forbid(unsafe_code)]

mod errors;
mod helper;
mod pool;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use airlock::audit::AuditStore;
use airlock::image::BuildEvent;
use airlock::{
    Audit, Backend, KillSwitch, Language, Policy, PolicySpec, RunError, RunRecord, RunRequest, SandboxOptions,
    SandboxPath,
};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::errors::{Failure, Kind};

/// What a finished run hands to Python: the record as JSON, whether it is
/// ok, and the limit that stopped it.
type NativeResult = (String, bool, Option<&'static str>);

/// One sandbox. Python's `airlock.Sandbox` wraps it.
#[pyclass(frozen, module = "airlock._native", name = "Sandbox")]
struct NativeSandbox {
    /// `None` once closed. Locked only with the GIL released, so a run that
    /// holds it never blocks a thread that holds the GIL.
    sandbox: Mutex<Option<airlock::Sandbox>>,
    kill: KillSwitch,
    /// Set by [`NativeSandbox::kill`]: the kill switch stays thrown, so no
    /// later run could get anywhere.
    stopped: AtomicBool,
}

/// How a run ended, for [`NativeSandbox::run`]: its result, or the failure
/// and, when the run was attempted, its `sandbox_error` result.
type Outcome = Result<NativeResult, (Failure, Option<NativeResult>)>;

/// How often a thread waiting for a run lets Python look at signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

#[pymethods]
impl NativeSandbox {
    /// Makes a sandbox from a `PolicySpec` (JSON) running image `image`,
    /// building the default image first if it does not exist yet, recording
    /// every run in the audit store at `audit` (`""`: airlock's own).
    #[new]
    #[pyo3(signature = (spec_json, image, audit=None))]
    fn new(py: Python<'_>, spec_json: &str, image: &str, audit: Option<&str>) -> PyResult<NativeSandbox> {
        let sandbox = py.detach(|| create(spec_json, image, audit)).map_err(|f| f.into_py(py))?;
        Ok(NativeSandbox::wrap(sandbox))
    }

    /// Copies `data` into the work directory at `path`.
    fn write(&self, py: Python<'_>, path: &str, data: PyBackedBytes) -> PyResult<()> {
        py.detach(|| self.with_sandbox(|sandbox| Ok(sandbox.write(path, &data)?))).map_err(|f| f.into_py(py))
    }

    /// Reads one regular file back from the work directory, refused above
    /// `max_bytes` (default: the policy's `max_file_bytes`).
    #[pyo3(signature = (path, max_bytes=None))]
    fn read<'py>(&self, py: Python<'py>, path: &str, max_bytes: Option<u64>) -> PyResult<Bound<'py, PyBytes>> {
        let data = py
            .detach(|| {
                self.with_sandbox(|sandbox| {
                    Ok(match max_bytes {
                        Some(cap) => sandbox.read_capped(path, cap)?,
                        None => sandbox.read(path)?,
                    })
                })
            })
            .map_err(|f| f.into_py(py))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Runs `code` and returns `(record JSON, ok, stopping limit)`.
    /// `limits_json` is a `PolicySpec` of limits for this run only. Raises
    /// when the sandbox itself failed, with the same triple as the
    /// exception's `_result`, and on Ctrl-C, after killing the run.
    #[pyo3(signature = (code, lang, cwd=None, stdin=None, limits_json=None))]
    fn run(
        &self,
        py: Python<'_>,
        code: String,
        lang: &str,
        cwd: Option<&str>,
        stdin: Option<PyBackedBytes>,
        limits_json: Option<&str>,
    ) -> PyResult<NativeResult> {
        let mut request = run_request(code, lang, cwd, stdin.as_deref()).map_err(|f| f.into_py(py))?;
        if let Some(json) = limits_json {
            let spec = parse_spec(json).map_err(|f| f.into_py(py))?;
            let limits = py.detach(|| {
                let host = helper::backend()?.probe()?.host;
                self.with_sandbox(|sandbox| Ok(sandbox.limits_for(&spec, &host)?))
            });
            request.limits = Some(limits.map_err(|f| f.into_py(py))?);
        }
        self.run_interruptibly(py, &request)?.or_else(|(failure, result)| {
            let error = failure.into_py(py);
            if let Some(result) = result {
                error.value(py).setattr("_result", result)?;
            }
            Err(error)
        })
    }

    /// Stops the run in progress, from any thread. The sandbox refuses
    /// runs afterwards.
    fn kill(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.kill.kill();
    }

    /// Destroys the sandbox and everything in it; waits for a run in
    /// progress to end first. Closing twice is fine.
    fn close(&self, py: Python<'_>) {
        let taken = py.detach(|| self.sandbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
        // Dropped here, GIL or not: tearing down is closing descriptors.
        drop(taken);
    }

    /// Whether the sandbox has been closed.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.sandbox.lock().map_or(true, |guard| guard.is_none()))
    }
}

impl NativeSandbox {
    /// The Python face of `sandbox` (made here, or taken from a pool).
    fn wrap(sandbox: airlock::Sandbox) -> NativeSandbox {
        let kill = sandbox.kill_switch();
        NativeSandbox { sandbox: Mutex::new(Some(sandbox)), kill, stopped: AtomicBool::new(false) }
    }

    /// Runs `request` on a thread of its own while this one waits with the
    /// GIL released, taking it back every [`SIGNAL_POLL`] so that Python can
    /// handle signals: Ctrl-C kills the run and raises KeyboardInterrupt
    /// instead of waiting out the run's time limit.
    fn run_interruptibly(&self, py: Python<'_>, request: &RunRequest) -> PyResult<Outcome> {
        std::thread::scope(|scope| {
            let (done, mut finished) = mpsc::channel();
            scope.spawn(move || {
                // The waiting side receives until it has the outcome, so this is always taken.
                let _ = done.send(self.run_blocking(request));
            });
            loop {
                // The receiver moves in and out: it may not be shared across threads.
                let (receiver, received) = py.detach(move || {
                    let received = finished.recv_timeout(SIGNAL_POLL);
                    (finished, received)
                });
                finished = receiver;
                match received {
                    Ok(outcome) => return Ok(outcome),
                    Err(RecvTimeoutError::Timeout) => {
                        if let Err(interrupted) = py.check_signals() {
                            self.kill();
                            // The killed run ends within the backend's polling interval.
                            let _ = py.detach(move || finished.recv());
                            return Err(interrupted);
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return Ok(Err((Failure::new(Kind::Sandbox, "the run ended without a result"), None)));
                    }
                }
            }
        })
    }

    /// One run, start to end; call it with the GIL released.
    fn run_blocking(&self, request: &RunRequest) -> Outcome {
        if self.stopped.load(Ordering::SeqCst) {
            let message = "this sandbox was stopped while a run was in progress; make a new one";
            return Err((Failure::new(Kind::Sandbox, message), None));
        }
        match self.with_sandbox(|sandbox| Ok(sandbox.run_checked(request))) {
            Err(failure) => Err((failure, None)),
            Ok(Ok(record)) => Ok(native_result(&record)),
            Ok(Err(failure)) => match *failure {
                RunError::Sandbox { error, record } => Err((Failure::from(error), Some(native_result(&record)))),
                // Never handed out as if it were recorded: raised, the record
                // beside the error.
                RunError::Unrecorded { record, error } => {
                    let message = format!("run {} was NOT recorded in the audit store: {error}", record.id);
                    Err((Failure::new(Kind::Sandbox, message), Some(native_result(&record))))
                }
            },
        }
    }

    /// Calls `f` with the open sandbox; call it with the GIL released.
    fn with_sandbox<T>(&self, f: impl FnOnce(&mut airlock::Sandbox) -> Result<T, Failure>) -> Result<T, Failure> {
        let mut guard = self.sandbox.lock().map_err(|_| {
            Failure::new(Kind::Sandbox, "this sandbox broke during an earlier call; close it and make a new one")
        })?;
        match guard.as_mut() {
            Some(sandbox) => f(sandbox),
            None => Err(Failure::new(
                Kind::Sandbox,
                "this sandbox is closed; make a new one (`with Sandbox(...) as sb:` closes it at the end of the block)",
            )),
        }
    }
}

fn create(spec_json: &str, image: &str, audit: Option<&str>) -> Result<airlock::Sandbox, Failure> {
    let spec = parse_spec(spec_json)?;
    let backend = helper::backend()?;
    let policy = Policy::from_spec(&spec, &backend.probe()?.host).map_err(airlock::Error::from)?;
    let audit = audit.map(open_audit).transpose()?;
    let mut progress = |event: BuildEvent| log_build(&event);
    Ok(airlock::Sandbox::with_options(SandboxOptions {
        policy,
        image: Some(image.to_owned()),
        on_build: Some(&mut progress),
        audit,
        backend: Some(backend),
        ..SandboxOptions::default()
    })?)
}

/// The audit store at `path`, or airlock's own for `""`.
fn open_audit(path: &str) -> Result<Audit, Failure> {
    let path = match path {
        "" => AuditStore::default_path(),
        given => Ok(std::path::PathBuf::from(given)),
    };
    let store = path.and_then(|p| AuditStore::open(&p)).map_err(|e| {
        Failure::new(Kind::Sandbox, format!("opening the audit store: {e}; pass audit= the path of a writable store"))
    })?;
    Ok(Audit { store: std::sync::Arc::new(store), principal: None })
}

/// The `PolicySpec` in `spec_json`, checked against the spec's schema (the
/// one every door publishes), or an error that names the setting at fault.
fn parse_spec(spec_json: &str) -> Result<PolicySpec, Failure> {
    let value: serde_json::Value = serde_json::from_str(spec_json)
        .map_err(|e| Failure::new(Kind::Policy, format!("the sandbox settings are not JSON: {e}")))?;
    airlock::validate(&PolicySpec::schema(), &value).map_err(|e| Failure::new(Kind::Policy, e.to_string()))?;
    serde_json::from_value(value).map_err(|e| Failure::new(Kind::Policy, e.to_string()))
}

fn run_request(code: String, lang: &str, cwd: Option<&str>, stdin: Option<&[u8]>) -> Result<RunRequest, Failure> {
    let language = Language::parse(lang).ok_or_else(|| {
        Failure::new(Kind::Policy, format!("lang={lang:?} is not a language airlock runs; use \"python\" or \"sh\""))
    })?;
    // The work directory itself is the default; SandboxPath names what is below it.
    let cwd = match cwd.map(|c| (c, c.trim_end_matches('/'))) {
        None | Some((_, "/work")) => None,
        Some((given, below)) => {
            Some(SandboxPath::parse(below).map_err(|e| Failure::new(Kind::Policy, format!("cwd={given:?}: {e}")))?)
        }
    };
    Ok(RunRequest {
        code,
        language,
        stdin: stdin.map(<[u8]>::to_vec).unwrap_or_default(),
        cwd,
        display_name: None,
        outputs: Vec::new(),
        limits: None,
    })
}

fn native_result(record: &RunRecord) -> NativeResult {
    // A record is plain data; serialising it cannot fail.
    let json = serde_json::to_string(record).unwrap_or_default();
    (json, record.ok(), record.stopping_limit().map(|limit| limit.name()))
}

/// Reports an image build on the `airlock` logger: the first sandbox may
/// spend a minute building the default image.
fn log_build(event: &BuildEvent) {
    let message = match event {
        BuildEvent::Step { index, total, what } => format!("building the image [{index}/{total}] {what}"),
        BuildEvent::Package { index, total, name } => format!("  ({index}/{total}) {name}"),
        BuildEvent::Reused { hash } => format!("the image already exists ({hash})"),
        BuildEvent::Done { hash, size_bytes } => {
            format!("image ready ({hash}, {:.0} MiB)", *size_bytes as f64 / 1048576.0)
        }
    };
    Python::attach(|py| {
        let logged = py
            .import("logging")
            .and_then(|logging| logging.call_method1("getLogger", ("airlock",)))
            .and_then(|logger| logger.call_method1("info", (message,)));
        // Progress is a courtesy; a broken logging setup must not stop the build.
        drop(logged);
    });
}

/// The helper this module installs and runs, for diagnostics.
#[pyfunction]
fn helper_path(py: Python<'_>) -> PyResult<String> {
    let backend = py.detach(helper::backend).map_err(|e| Failure::from(e).into_py(py))?;
    backend.helper_path().map(|p| p.display().to_string()).map_err(|e| Failure::from(e).into_py(py))
}

/// airlock's native module.
#[pymodule(name = "_native")]
mod native {
    #[pymodule_export]
    use super::{NativeSandbox, helper_path, pool::NativePool};
}
