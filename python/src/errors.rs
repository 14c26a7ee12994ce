//! airlock's errors as the Python exceptions of `airlock._errors`.
//!
//! The classes are defined in Python (they carry docstrings, a second base
//! and the `result` of a failed run); this file only decides which one an
//! error becomes.

use airlock::SandboxError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Which exception an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Anything else that went wrong in the sandbox.
    Sandbox,
    /// A setting or argument that cannot be used.
    Policy,
    /// A file that could not be copied in or out.
    Artifact,
    /// The host cannot give the isolation asked for.
    Unavailable,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Sandbox => "SandboxError",
            Kind::Policy => "PolicyError",
            Kind::Artifact => "ArtifactError",
            Kind::Unavailable => "SandboxUnavailable",
        }
    }
}

/// An error on its way to Python: its class and its message.
#[derive(Debug)]
pub struct Failure {
    pub kind: Kind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into() }
    }

    /// The Python exception.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        match exception_class(py, self.kind) {
            Ok(class) => PyErr::from_type(class, self.message),
            Err(import_failed) => import_failed,
        }
    }
}

impl From<airlock::Error> for Failure {
    fn from(error: airlock::Error) -> Failure {
        let kind = match &error {
            airlock::Error::Sandbox(inner) => sandbox_kind(inner),
            airlock::Error::Policy(_)
            | airlock::Error::Path(_)
            | airlock::Error::ImageMissing { .. }
            | airlock::Error::BadImageName { .. }
            | airlock::Error::NotVetted { .. } => Kind::Policy,
            airlock::Error::Artifact(_) => Kind::Artifact,
            airlock::Error::Interpreter { .. } => Kind::Unavailable,
            airlock::Error::ImageCorrupt { .. }
            | airlock::Error::ImageBuild { .. }
            | airlock::Error::Lock(_)
            | airlock::Error::HashMismatch { .. }
            | airlock::Error::Index { .. }
            | airlock::Error::Io { .. } => Kind::Sandbox,
        };
        Failure::new(kind, error.to_string())
    }
}

impl From<SandboxError> for Failure {
    fn from(error: SandboxError) -> Failure {
        Failure::new(sandbox_kind(&error), error.to_string())
    }
}

fn sandbox_kind(error: &SandboxError) -> Kind {
    match error {
        SandboxError::Policy(_) | SandboxError::Path(_) => Kind::Policy,
        SandboxError::Unavailable { .. } | SandboxError::Unsupported { .. } | SandboxError::Missing { .. } => {
            Kind::Unavailable
        }
        // A file refused on its way in: too large, or a link in its path.
        SandboxError::Input { .. } => Kind::Artifact,
        SandboxError::Setup { .. } | SandboxError::Io { .. } => Kind::Sandbox,
    }
}

fn exception_class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    static SANDBOX: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static POLICY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static ARTIFACT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static UNAVAILABLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let cell = match kind {
        Kind::Sandbox => &SANDBOX,
        Kind::Policy => &POLICY,
        Kind::Artifact => &ARTIFACT,
        Kind::Unavailable => &UNAVAILABLE,
    };
    cell.import(py, "airlock._errors", kind.class_name()).cloned()
}
