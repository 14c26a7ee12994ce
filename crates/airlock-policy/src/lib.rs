//! airlock's plain data: what a run may do, and what it did.
//!
//! Every front door (the command line, the HTTP API, MCP, the Python package)
//! fills the same [`PolicySpec`]; one function, [`Policy::from_spec`], checks it
//! against the facts of the host ([`HostFacts`]) and turns it into a [`Policy`].
//! A front door that serves others (the HTTP API, MCP) first checks a
//! request against the operator's ceiling with [`PolicySpec::check_within`].
//! Every run, on every backend, leaves one [`RunRecord`].
//!
//! This crate makes no system calls and holds no `unsafe`: backends read the
//! host, this crate only decides.

#![forbid(unsafe_code)]

mod ceiling;
mod network;
mod path;
mod policy;
mod record;
pub mod schema;
mod spec;

pub use network::{DEFAULT_PORTS, HostPattern, HostRule, HostRuleError, normalize_name};
pub use path::{SandboxPath, SandboxPathError, WORK_DIR};
pub use policy::{
    BackendKind, HostFacts, Layer, Limits, NetworkPolicy, OutputOverflow, Policy, PolicyError, is_env_key,
};
pub use record::{
    ArtifactRecord, DisplayResult, ErrorInfo, FigureRecord, ImageRef, InputRecord, Isolation, Language, Limit,
    NetworkEvent, NetworkRecord, NetworkVerdict, RECORD_SCHEMA_VERSION, ResultKind, RunRecord, RunStart, Status, Usage,
};
pub use schema::{SchemaViolation, validate};
pub use spec::PolicySpec;
