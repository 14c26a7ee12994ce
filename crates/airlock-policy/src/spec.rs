//! The policy as every front door writes it: optional fields in friendly units.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::OutputOverflow;

/// A policy as written by a user: every field optional, in the units people
/// type (seconds, MiB). Command-line flags, HTTP bodies, MCP arguments, the
/// server's TOML config and Python keyword arguments all become one of these;
/// [`crate::Policy::from_spec`] checks it. Unknown fields are refused.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Wall-clock limit, seconds (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// CPU-time limit over all processes, seconds (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_s: Option<f64>,
    /// Memory limit, MiB, no swap (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Processes and threads at once (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// CPU bandwidth in CPUs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Size of the writable /work and /tmp together, MiB (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// Files and directories /work and /tmp may hold together (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_inodes: Option<u64>,
    /// Bytes kept per output stream (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// `truncate` (default) or `kill` when a stream passes `max_output_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_output_limit: Option<OutputOverflow>,
    /// Largest single file copied in or out (default 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_bytes: Option<u64>,
    /// Largest total copied in, and copied out, per run (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files_total_bytes: Option<u64>,
    /// Open files per process (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u32>,
    /// The code's whole environment; nothing is inherited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Hosts reachable through the proxy: `HOST[:PORT]`, `*.DOMAIN[:PORT]`,
    /// or an IP literal. Empty or absent: no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    /// Bytes the sandbox may send through the proxy per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_network_bytes_out: Option<u64>,
    /// Bytes the sandbox may receive through the proxy per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_network_bytes_in: Option<u64>,
    /// Connections through the proxy per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `linux` (default) or `wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Isolation layers the caller accepts to lose where the host lacks them
    /// (`cgroups`, `landlock`). Without this a missing layer is an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_degraded: Option<Vec<String>>,
    /// Extra packages for the run, beyond its image, from the operator's
    /// vetted set for that image (`statsmodels`): installed once into a
    /// derived image, cached, never with network in the run. A package
    /// outside the vetted set is refused with the list of those allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_packages: Option<Vec<String>>,
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
