//! Typed errors shared by every backend. Each message names the problem and the fix.

use airlock_policy::{Layer, PolicyError, SandboxPathError};

/// The sandbox could not be made, or could not run the code.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),

    #[error("invalid path: {0}")]
    Path(#[from] SandboxPathError),

    /// Fail closed: the policy needs a layer this host cannot provide.
    #[error("{layer} is required but not available here: {reason}{}", if *.degradable {
        format!(" (or accept running without it: allow_degraded=[\"{layer}\"], --allow-degraded {layer})")
    } else { String::new() })]
    Unavailable { layer: Layer, reason: String, degradable: bool },

    /// The backend cannot do what the policy or job asks, at all.
    #[error("the {backend} backend cannot {what}: {reason}")]
    Unsupported { backend: &'static str, what: String, reason: String },

    #[error("copying {path} in: {reason}")]
    Input { path: String, reason: String },

    /// A setup step inside the sandbox failed; `step` names it.
    #[error("sandbox setup failed at {step}: {detail}")]
    Setup { step: String, detail: String },

    #[error("{what} was not found: {hint}")]
    Missing { what: String, hint: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl SandboxError {
    /// An I/O error with what was being done when it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> SandboxError {
        SandboxError::Io { context: context.into(), source }
    }
}

/// A named artefact that could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{path} does not exist in the sandbox")]
    NotFound { path: String },
    #[error("{path} is a {kind}, not a regular file; only regular files are copied out")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} is or passes through a symbolic link, which is never followed out of the sandbox")]
    Link { path: String },
    #[error("{path} is {size} bytes, above the cap of {cap}; raise max_file_bytes or write less")]
    TooLarge { path: String, size: u64, cap: u64 },
    #[error("artefacts together would pass the cap of {cap} bytes at {path}; raise max_files_total_bytes")]
    TotalTooLarge { path: String, cap: u64 },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Path(#[from] SandboxPathError),
    #[error("the sandbox is gone: {0}")]
    Gone(String),
}
