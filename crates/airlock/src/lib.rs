//! airlock runs code a language model wrote without letting it run your
//! machine.
//!
//! ```no_run
//! use airlock::{Policy, Sandbox};
//!
//! let mut sandbox = Sandbox::new(Policy::default())?;
//! sandbox.write("/work/data.csv", b"x,w\n1,2\n3,4\n")?;
//! let record = sandbox.run("import pandas as pd\npd.read_csv('/work/data.csv').x.sum()");
//! assert!(record.ok());
//! assert_eq!(record.value.as_deref(), Some("4"));
//! # Ok::<(), airlock::Error>(())
//! ```
//!
//! Every run happens in a fresh sandbox process tree with no network, an
//! empty environment and hard limits; every run returns a
//! [`RunRecord`] with the code beside what it did. The isolation comes from a
//! backend ([`BackendKind`]): Linux namespaces, seccomp, Landlock and cgroups
//! by default. A backend that cannot enforce the policy refuses to run.
//!
//! Every run can be recorded in the hash-chained audit store ([`audit`]):
//! give the sandbox an [`Audit`] (`SandboxOptions::audit` or
//! [`Sandbox::set_audit`]). [`Sandbox::run_request`] then notes a failure to
//! record in the record's `message`; [`Sandbox::run_checked`] returns it as
//! [`RunError::Unrecorded`], with the record, for callers that must not hand out an
//! unrecorded run.
//!
//! The crates behind this one: `airlock-policy` (the policy and the record,
//! plain data), `airlock-core` (the backend trait and what backends share),
//! `airlock-linux` (the default backend).

#![forbid(unsafe_code)]

mod artifacts;
mod driver_folder;
pub mod image;
pub mod interpreter;
pub mod pool;
pub mod report;
mod sandbox;
pub mod setup;

pub use airlock_audit as audit;
pub use airlock_core::record::without_operator_advice;
pub use airlock_core::{Backend, KillSwitch, Runtime, RuntimeFile, RuntimeMount, SandboxError};
pub use airlock_policy::*;
pub use artifacts::save_to_host;
pub use pool::{Pool, PoolMode, PoolOptions, PoolStats, READ_AT_START};
pub use sandbox::{
    Audit, Output, RunError, RunRequest, Sandbox, SandboxOptions, backend_for, host_facts, install_wasm_backend,
};
pub use setup::{CopyIn, CopyInError, resolve_runtime};

/// Everything that can go wrong outside a run itself (a run that fails is a
/// [`RunRecord`] with its status, not an error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Path(#[from] SandboxPathError),
    #[error(transparent)]
    Artifact(#[from] airlock_core::ArtifactError),
    #[error("the Python interpreter {program}: {reason}")]
    Interpreter { program: String, reason: String },
    #[error(
        "there is no image called {name:?}; build it with `airlock image build {name} --requirements FILE`, or see `airlock image list`"
    )]
    ImageMissing { name: String },
    #[error(
        "image {name:?} cannot be used: {reason}; rebuild it with `airlock image build {name}` (or remove it with `airlock image rm {name}`)"
    )]
    ImageCorrupt { name: String, reason: String },
    /// `name` is empty for a step not tied to one image (`airlock image lock`).
    #[error("{}", if name.is_empty() { format!("the image step failed: {reason}") } else { format!("building image {name:?} failed: {reason}") })]
    ImageBuild { name: String, reason: String },
    #[error(transparent)]
    Lock(#[from] image::LockError),
    #[error(
        "package {package}: {file} has SHA-256 {actual}, but the lock pins {expected}; the index served another \
         file (a compromised index or mirror, or a lock made against another index), so nothing from it was kept \
         or run; make sure the index is the one the lock was made with, or lock again with `airlock image lock`"
    )]
    HashMismatch { package: String, file: String, expected: String, actual: String },
    #[error(
        "{} not among the extra packages image {image:?} may add; {}",
        requested.join(", "),
        if allowed.is_empty() {
            "it has no vetted set (the operator makes one with `airlock image vet NAME LOCK`)".to_owned()
        } else {
            format!("the vetted set allows: {}", allowed.join(", "))
        }
    )]
    NotVetted { image: String, requested: Vec<String>, allowed: Vec<String> },
    #[error("the package index {url:?} (from {origin}) cannot be used: {reason}")]
    Index { url: String, origin: String, reason: String },
    #[error(
        "{name:?} is not a valid image name: use letters, digits, '.', '-' and '_', starting with a letter or digit, at most 64 characters"
    )]
    BadImageName { name: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}
