//! The policy as every front door writes it: optional fields in friendly units.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::{
    MAX_WALL_TIME_S, MIN_CPUS, MIN_DISK_INODES, MIN_MEMORY_MB, MIN_OPEN_FILES, MIN_SECONDS, OutputOverflow,
};
use crate::schema::{degradable_items, patterns};

/// A policy as written by a user: every field optional, in the units people
/// type (seconds, MiB). Command-line flags, HTTP bodies, MCP arguments, the
/// server's TOML config and Python keyword arguments all become one of these;
/// [`crate::Policy::from_spec`] checks it. Unknown fields are refused.
///
/// Its JSON Schema ([`PolicySpec::schema`], derived from this type: the doc
/// comments are the descriptions, the attributes the bounds that
/// [`crate::Policy::check`] enforces) is the one every door publishes: the
/// HTTP API's request schema and OpenAPI document, the MCP tools' input
/// schemas, the Python stubs. A field left out, or `null`, keeps the default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "PolicySpec",
    description = "Limits and permissions for a run; every field optional (absent or null keeps the default)."
)]
pub struct PolicySpec {
    /// Wall-clock limit, seconds (default 20).
    #[schemars(range(min = MIN_SECONDS, max = MAX_WALL_TIME_S))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// CPU-time limit over all processes, seconds (default 20).
    #[schemars(range(min = MIN_SECONDS, max = MAX_WALL_TIME_S))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_s: Option<f64>,
    /// Memory limit, MiB, no swap (default 512).
    #[schemars(range(min = MIN_MEMORY_MB))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Processes and threads at once (default 64).
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// CPU bandwidth in CPUs (default 1).
    #[schemars(range(min = MIN_CPUS))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Size of the writable /work and /tmp together, MiB (default 64).
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// Files and directories /work and /tmp may hold together (default 4096).
    #[schemars(range(min = MIN_DISK_INODES))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_inodes: Option<u64>,
    /// Bytes kept per output stream (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// `truncate` (default) or `kill` when a stream passes `max_output_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_output_limit: Option<OutputOverflow>,
    /// Largest single file copied in or out (default 16 MiB).
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_bytes: Option<u64>,
    /// Largest total copied in, and copied out, per run (default 64 MiB).
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files_total_bytes: Option<u64>,
    /// Open files per process (default 256).
    #[schemars(range(min = MIN_OPEN_FILES))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u32>,
    /// The code's whole environment; nothing is inherited.
    #[schemars(extend("propertyNames" = {"pattern": patterns::ENV_KEY}, "additionalProperties" = {"type": "string", "pattern": patterns::NO_NUL}))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Hosts reachable through the proxy: `HOST[:PORT]`, `*.DOMAIN[:PORT]`,
    /// or an IP literal. Empty or absent: no network.
    #[schemars(inner(length(min = 1, max = 300)))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    /// Bytes the sandbox may send through the proxy per run.
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_network_bytes_out: Option<u64>,
    /// Bytes the sandbox may receive through the proxy per run.
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_network_bytes_in: Option<u64>,
    /// Connections through the proxy per run.
    #[schemars(range(min = 1))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `linux` (default) or `wasm`.
    #[schemars(extend("enum" = ["linux", "wasm", null]))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Isolation layers the caller accepts to lose where the host lacks them
    /// (`cgroups`, `landlock`). Without this a missing layer is an error.
    #[schemars(transform = degradable_items)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_degraded: Option<Vec<String>>,
    /// Extra packages for the run, beyond its image, from the operator's
    /// vetted set for that image (`statsmodels`): installed once into a
    /// derived image, cached, never with network in the run. A package
    /// outside the vetted set is refused with the list of those allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_packages: Option<Vec<String>>,
}

impl PolicySpec {
    /// The fields one run may set for itself, in a sandbox made with other
    /// limits (the Python package's `sb.run(..., timeout_s=...)`): those
    /// every backend enforces afresh at each run. The disk, the copy caps,
    /// the network and the environment belong to the sandbox, made once.
    pub const PER_RUN: [&'static str; 8] =
        ["timeout_s", "cpu_time_s", "memory_mb", "pids", "cpus", "max_output_bytes", "on_output_limit", "open_files"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<PolicySpec>(r#"{"memory_mb": 64, "memroy_mb": 1}"#).unwrap_err();
        assert!(err.to_string().contains("memroy_mb"), "{err}");
    }

    #[test]
    fn wrong_types_are_refused() {
        assert!(serde_json::from_str::<PolicySpec>(r#"{"memory_mb": "lots"}"#).is_err());
        assert!(serde_json::from_str::<PolicySpec>(r#"{"pids": -1}"#).is_err());
    }
}
