//! What every airlock backend implements and shares.
//!
//! A backend (Linux namespaces, WebAssembly) implements [`Backend`]: it says
//! what the host lets it enforce, refuses a policy it cannot honour, and makes
//! [`Instance`]s, each one sandbox with its own work directory. An instance
//! runs [`Job`]s and reports an [`Execution`]; [`record::assemble`] turns that
//! into the [`airlock_policy::RunRecord`] every front door returns.
//!
//! Backends share the Python [`driver`] (values, errors and figures, the way a
//! notebook shows them), [`output::CappedBuffer`] for stdout and stderr, and
//! the [`runtime::Runtime`] description of what the code runs with.

#![forbid(unsafe_code)]

pub mod backend;
pub mod driver;
pub mod error;
pub mod output;
pub mod paths;
pub mod record;
pub mod runtime;

pub use backend::{Backend, Execution, Instance, Job, KillSwitch, Probe};
pub use error::{ArtifactError, SandboxError};
pub use runtime::{Runtime, RuntimeMount};

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}
