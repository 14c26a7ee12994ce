//! The run record: what ran, under which policy, and what happened.
//!
//! Users parse this, so it is a documented schema (docs/record.md) with a
//! version. Add fields; never change the meaning of one.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::policy::Layer;
use crate::spec::PolicySpec;

/// Bumped when a field changes meaning or disappears.
pub const RECORD_SCHEMA_VERSION: u32 = 1;

/// How a run ended, in one word.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The code exited 0.
    Ok,
    /// The code exited non-zero, was killed by a signal of its own making, or
    /// raised an exception.
    Failed,
    /// The wall-clock limit stopped the run.
    Timeout,
    /// The kernel killed the run for memory.
    MemoryLimit,
    /// The CPU-time limit stopped the run.
    CpuLimit,
    /// The output limit stopped the run (with `on_output_limit = "kill"`).
    OutputLimit,
    /// The sandbox could not start the code: the code never ran.
    #[default]
    SandboxError,
    /// The code started, but airlock's own machinery failed during the run
    /// (or it was stopped on request) before airlock could vouch for how it
    /// ended; everything observed is kept, and `message` says what failed.
    InternalError,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::MemoryLimit => "memory_limit",
            Status::CpuLimit => "cpu_limit",
            Status::OutputLimit => "output_limit",
            Status::SandboxError => "sandbox_error",
            Status::InternalError => "internal_error",
        }
    }

    /// Every status, for documentation and metrics.
    pub const ALL: [Status; 8] = [
        Status::Ok,
        Status::Failed,
        Status::Timeout,
        Status::MemoryLimit,
        Status::CpuLimit,
        Status::OutputLimit,
        Status::SandboxError,
        Status::InternalError,
    ];

    /// The limit a run with this status was stopped by, if a limit did.
    pub fn stopping_limit(self) -> Option<Limit> {
        match self {
            Status::Timeout => Some(Limit::WallTime),
            Status::MemoryLimit => Some(Limit::Memory),
            Status::CpuLimit => Some(Limit::CpuTime),
            Status::OutputLimit => Some(Limit::Output),
            _ => None,
        }
    }

    /// Parses a status name.
    pub fn parse(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit a run reached. A run can reach several and still finish (a fork
/// that failed with EAGAIN, a write that failed with ENOSPC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    WallTime,
    CpuTime,
    Memory,
    Pids,
    Disk,
    Inodes,
    OpenFiles,
    Output,
    /// An artefact larger than the per-file or total cap was refused.
    Artifacts,
    NetworkBytes,
    NetworkConnections,
}

impl Limit {
    /// Every limit, for documentation and metrics.
    pub const ALL: [Limit; 11] = [
        Limit::WallTime,
        Limit::CpuTime,
        Limit::Memory,
        Limit::Pids,
        Limit::Disk,
        Limit::Inodes,
        Limit::OpenFiles,
        Limit::Output,
        Limit::Artifacts,
        Limit::NetworkBytes,
        Limit::NetworkConnections,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Limit::WallTime => "wall_time",
            Limit::CpuTime => "cpu_time",
            Limit::Memory => "memory",
            Limit::Pids => "pids",
            Limit::Disk => "disk",
            Limit::Inodes => "inodes",
            Limit::OpenFiles => "open_files",
            Limit::Output => "output",
            Limit::Artifacts => "artifacts",
            Limit::NetworkBytes => "network_bytes",
            Limit::NetworkConnections => "network_connections",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The language of the code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    #[default]
    Python,
    /// A POSIX shell script, run by `/bin/sh`.
    Sh,
}

impl Language {
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Sh => "sh",
        }
    }

    pub fn parse(name: &str) -> Option<Language> {
        match name {
            "python" | "py" | "python3" => Some(Language::Python),
            "sh" | "shell" | "bash" => Some(Language::Sh),
            _ => None,
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A file copied into the work directory before the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct InputRecord {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// A named artefact read back after the run, or the reason it was refused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ArtifactRecord {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Where the artefact was written on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_to: Option<String>,
    /// The content, base64, when the caller asked for it inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// Why the artefact was refused; the other fields are then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A matplotlib figure that came back as a PNG.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct FigureRecord {
    pub name: String,
    pub width: u32,
    pub height: u32,
    pub bytes: u64,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png_base64: Option<String>,
}

/// Which kind of rich result: the last expression's value, or a `display()` call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultKind {
    /// The value of the last expression (as a notebook's `execute_result`).
    #[default]
    Value,
    /// One object passed to `display()` (a notebook's `display_data`).
    Display,
}

/// A rich result, as a notebook shows it: one object in several
/// representations, keyed by MIME type (`text/plain`, always; `text/html`,
/// `text/markdown`, `text/latex`, `image/svg+xml`, `application/json` as
/// text; `image/png` and `image/jpeg` as base64).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DisplayResult {
    pub kind: ResultKind,
    pub data: std::collections::BTreeMap<String, String>,
}

impl DisplayResult {
    /// The MIME types whose data is base64 bytes rather than text.
    pub const BINARY_TYPES: [&'static str; 2] = ["image/png", "image/jpeg"];

    /// The MIME types a result may carry.
    pub const TYPES: [&'static str; 8] = [
        "text/plain",
        "text/html",
        "text/markdown",
        "text/latex",
        "image/svg+xml",
        "application/json",
        "image/png",
        "image/jpeg",
    ];

    /// The text a reader without a notebook sees.
    pub fn text(&self) -> &str {
        self.data.get("text/plain").map_or("", String::as_str)
    }
}

/// An uncaught exception, with line numbers that match the code as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub traceback: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

/// What a run used. A field a backend cannot measure is absent, never zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Usage {
    pub wall_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Milliseconds spent getting the image with the run's extra packages
    /// (`with_packages`) before the sandbox was made: building the derived
    /// image the first time, finding it after. Absent without extra packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ms: Option<u64>,
    /// Whether that image was already built (`false`: this run paid for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_cached: Option<bool>,
    /// How the run's sandbox started: made for it, or taken ready from a pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<RunStart>,
    /// A pooled run: milliseconds its sandbox waited ready, its preload
    /// imported, before this run claimed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_wait_ms: Option<u64>,
    /// Milliseconds from the run's request to the code's first instruction,
    /// as the Python driver announced it (the driver runs inside the
    /// sandbox: a timing, never a verdict). Absent for shell code, and when
    /// the code never ran (a syntax error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_instruction_ms: Option<u64>,
}

/// How a run's sandbox started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStart {
    /// Made for this run: a fresh interpreter, imports paid by the run.
    Cold,
    /// Taken from a pool: made before the run was asked for, every layer of
    /// a cold start in force, its interpreter started and its preload
    /// imported; its clocks start when the code is released. Never reused.
    Pooled,
    /// Forked from a pool's template, an interpreter that imported the
    /// preload and ran no code: its own namespaces, /work, /tmp, cgroup and
    /// layers, made after the fork; it shares the template's host ids,
    /// address layout and hash seed with the template's other runs.
    Forked,
}

/// Which isolation was in force for the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Isolation {
    pub backend: String,
    /// The layers actually in force.
    pub layers: Vec<Layer>,
    /// Layers the policy allowed to be missing and that were missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<Layer>,
    /// Backend details: cgroup version, Landlock ABI, wasm artefact hash...
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub details: std::collections::BTreeMap<String, String>,
}

/// The runtime image the code ran in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ImageRef {
    pub name: String,
    pub hash: String,
}

/// What the proxy decided for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkVerdict {
    Allowed,
    Denied,
}

/// One connection through the proxy, allowed or refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NetworkEvent {
    pub host: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    pub verdict: NetworkVerdict,
    /// Why it was refused, or how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// The run's network: the rules and every connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NetworkRecord {
    pub allowed_hosts: Vec<String>,
    pub connections: Vec<NetworkEvent>,
}

/// Everything about one run. Every run, on every backend, produces one, even
/// when the sandbox could not start (status `sandbox_error`) or airlock
/// failed while the code ran (status `internal_error`, with everything
/// observed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RunRecord {
    pub schema_version: u32,
    pub id: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub status: Status,
    pub limits_hit: Vec<Limit>,
    /// A sentence saying why the run ended as it did, when that is not obvious
    /// from the exit code (a limit, a sandbox error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The exact bytes of stdout, base64, present only when they are not
    /// UTF-8 (then `stdout` holds them decoded lossily).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    pub code: String,
    pub code_sha256: String,
    pub language: Language,
    pub policy: PolicySpec,
    pub inputs: Vec<InputRecord>,
    pub artifacts: Vec<ArtifactRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<FigureRecord>,
    /// `repr` of the last expression, when the code ends with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Rich results in order: every `display()` call, then the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<DisplayResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    pub usage: Usage,
    pub isolation: Isolation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRecord>,
}

impl RunRecord {
    /// Whether the code ran and exited 0 within every limit.
    pub fn ok(&self) -> bool {
        self.status == Status::Ok
    }

    /// The record without the artefact, figure and image contents, which can
    /// be megabytes each; their hashes stay. What the audit store keeps, and
    /// what an MCP result carries beside the contents' own blocks.
    pub fn without_contents(&self) -> RunRecord {
        let mut record = self.clone();
        for result in &mut record.results {
            result.data.retain(|mime, _| !DisplayResult::BINARY_TYPES.contains(&mime.as_str()));
        }
        for artifact in &mut record.artifacts {
            artifact.content_base64 = None;
        }
        for figure in &mut record.figures {
            figure.png_base64 = None;
        }
        record
    }

    /// The limit that stopped the run, if a limit did.
    pub fn stopping_limit(&self) -> Option<Limit> {
        self.status.stopping_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails to compile when a limit is added, until it is added to `Limit::ALL` too.
    fn position(limit: Limit) -> usize {
        match limit {
            Limit::WallTime => 0,
            Limit::CpuTime => 1,
            Limit::Memory => 2,
            Limit::Pids => 3,
            Limit::Disk => 4,
            Limit::Inodes => 5,
            Limit::OpenFiles => 6,
            Limit::Output => 7,
            Limit::Artifacts => 8,
            Limit::NetworkBytes => 9,
            Limit::NetworkConnections => 10,
        }
    }

    #[test]
    fn every_limit_is_listed_once() {
        for (index, limit) in Limit::ALL.iter().enumerate() {
            assert_eq!(position(*limit), index);
        }
    }

    #[test]
    fn without_contents_keeps_the_hashes() {
        let record = RunRecord {
            artifacts: vec![ArtifactRecord {
                path: "/work/a".into(),
                sha256: Some("ab".into()),
                content_base64: Some("AA==".into()),
                ..ArtifactRecord::default()
            }],
            figures: vec![FigureRecord {
                sha256: "cd".into(),
                png_base64: Some("AA==".into()),
                ..FigureRecord::default()
            }],
            ..RunRecord::default()
        };
        let stored = record.without_contents();
        assert_eq!((stored.artifacts[0].content_base64.as_ref(), stored.figures[0].png_base64.as_ref()), (None, None));
        assert_eq!((stored.artifacts[0].sha256.as_deref(), stored.figures[0].sha256.as_str()), (Some("ab"), "cd"));
    }
}
