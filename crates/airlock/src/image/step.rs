//! One step of an image build (resolving a lock, downloading, installing),
//! run as shell code in an airlock sandbox like any other run: its own
//! policy, the host folders it needs mounted (one of them writable at most),
//! its record in the audit store. The host reads back only the named files
//! it asked for, each capped, and never follows a link to do so.

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_core::{Backend, Runtime};
use airlock_policy::{HostFacts, Policy, PolicySpec, RunRecord, Status};

use super::fetch::Wanted;
use super::lock::Selected;
use crate::sandbox::{Audit, RunError, RunRequest, Sandbox};

/// Who runs build steps, and where their records go.
#[derive(Clone, Copy)]
pub(crate) struct Steps<'a> {
    pub backend: &'a dyn Backend,
    pub audit: Option<&'a Audit>,
    pub host: HostFacts,
}

/// What every build gathers before its steps, in one place: where the
/// steps run and are recorded, the package index, the file cache and uv's
/// folder.
pub(crate) struct Toolbox {
    pub backend: &'static dyn Backend,
    pub audit: Option<Audit>,
    pub host: HostFacts,
    pub index: super::PackageIndex,
    pub cache: super::fetch::FileCache,
    pub uv_root: std::path::PathBuf,
}

impl Toolbox {
    pub(crate) fn steps(&self) -> Steps<'_> {
        Steps { backend: self.backend, audit: self.audit.as_ref(), host: self.host }
    }

    /// Every file a build downloads: the selected distributions, then uv's
    /// own archive (when the toolbox's uv has not been fetched yet).
    pub(crate) fn fetch_list(&self, selected: &[Selected]) -> Result<Vec<Wanted>, crate::Error> {
        let mut wanted: Vec<Wanted> =
            selected.iter().map(|s| Wanted { package: s.name.clone(), file: s.file.clone() }).collect();
        wanted.extend(super::uv::wanted(&self.uv_root)?);
        Ok(wanted)
    }
}

impl super::ImageStore {
    pub(crate) fn toolbox(&self) -> Result<Toolbox, crate::Error> {
        let backend = self.build_backend()?;
        Ok(Toolbox {
            backend,
            audit: self.build_audit()?,
            host: backend.probe()?.host,
            index: self.index()?,
            cache: super::fetch::FileCache { root: self.cache_dir().join("files") },
            uv_root: self.cache_dir().join("uv"),
        })
    }
}

/// What a step may use.
#[derive(Clone, Debug)]
pub(crate) struct StepLimits {
    pub wall_time: Duration,
    /// Hosts it may reach through the proxy (the package index); none: no network.
    pub hosts: Vec<String>,
    /// Bytes it may receive through the proxy.
    pub bytes_in: u64,
    /// Room for /work and /tmp, and the largest single file it may write.
    pub disk_bytes: u64,
}

/// A step to run.
pub(crate) struct Step<'a> {
    /// For messages and the record: `download`, `install`, `lock`.
    pub what: &'a str,
    pub limits: StepLimits,
    pub runtime: Runtime,
    /// Files copied into /work first.
    pub inputs: Vec<(String, Vec<u8>)>,
    pub script: String,
    /// Files in /work to read back after the run, and the most bytes of each.
    pub outputs: Vec<(&'a str, u64)>,
}

/// What a step left: its record, and the outputs that exist.
pub(crate) struct Outcome {
    pub record: RunRecord,
    pub outputs: BTreeMap<String, Vec<u8>>,
}

const MIB: u64 = 1024 * 1024;

impl Steps<'_> {
    /// Runs `step`; an error says which step failed and why, with the end of
    /// its output and the id of its record.
    pub fn run(&self, step: Step<'_>) -> Result<Outcome, String> {
        let what = step.what;
        let policy = self.policy(&step.limits).map_err(|e| format!("the {what} step's policy: {e}"))?;
        let mut sandbox = Sandbox::with_backend(self.backend, policy, step.runtime)
            .map_err(|e| format!("making the {what} step's sandbox: {e}"))?;
        sandbox.set_audit(self.audit.cloned());
        for (path, data) in &step.inputs {
            sandbox.write(path, data).map_err(|e| format!("copying {path} into the {what} step: {e}"))?;
        }
        let request = RunRequest { display_name: Some(format!("image-{what}.sh")), ..RunRequest::shell(step.script) };
        let record = match sandbox.run_checked(&request) {
            Ok(record) => record,
            Err(failure) => match *failure {
                RunError::Sandbox { error, record } => {
                    return Err(format!("the {what} step's sandbox failed: {error} (run {})", record.id));
                }
                RunError::Unrecorded { error, record } => {
                    return Err(format!(
                        "the {what} step (run {}) could not be recorded in the audit store, so the build stops: {error}",
                        record.id
                    ));
                }
            },
        };
        if record.status != Status::Ok {
            return Err(failed(what, &record));
        }
        let mut outputs = BTreeMap::new();
        for (path, cap) in step.outputs {
            // A missing output is the caller's to judge; anything else is an error.
            match sandbox.read_capped(path, cap) {
                Ok(data) => {
                    outputs.insert(path.to_owned(), data);
                }
                Err(crate::Error::Artifact(airlock_core::ArtifactError::NotFound { .. })) => {}
                Err(e) => return Err(format!("reading {path} back from the {what} step: {e}")),
            }
        }
        Ok(Outcome { record, outputs })
    }

    fn policy(&self, limits: &StepLimits) -> Result<Policy, airlock_policy::PolicyError> {
        let memory_mb = (self.host.memory_bytes / MIB / 2).clamp(256, 4096);
        let network = !limits.hosts.is_empty();
        let spec = PolicySpec {
            timeout_s: Some(limits.wall_time.as_secs_f64()),
            cpu_time_s: Some(limits.wall_time.as_secs_f64() * f64::from(self.host.cpus)),
            memory_mb: Some(memory_mb),
            pids: Some(1024.min(self.host.pid_max)),
            cpus: Some(f64::from(self.host.cpus)),
            disk_mb: Some((limits.disk_bytes / MIB).clamp(64, (self.host.memory_bytes / MIB).max(64))),
            disk_inodes: Some(65_536),
            max_output_bytes: Some(4 * MIB),
            max_file_bytes: Some(64 * MIB),
            max_files_total_bytes: Some(256 * MIB),
            open_files: Some(4096.min(self.host.nr_open)),
            allow_hosts: network.then(|| limits.hosts.clone()),
            max_network_bytes_in: network.then_some(limits.bytes_in.max(MIB)),
            max_network_bytes_out: network.then_some(64 * MIB),
            max_connections: network.then_some(4096),
            ..PolicySpec::default()
        };
        Policy::from_spec(&spec, &self.host)
    }
}

/// Why a step's run did not succeed: its status, message and the end of its
/// output, with the record's id to look it up by.
fn failed(what: &str, record: &RunRecord) -> String {
    let tail = |text: &str| {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    let mut reason = format!("the {what} step ended with status {}", record.status.name());
    if let Some(code) = record.exit_code {
        reason.push_str(&format!(" (exit {code})"));
    }
    if let Some(message) = &record.message {
        reason.push_str(&format!(": {message}"));
    }
    let output = [tail(&record.stderr), tail(&record.stdout)].into_iter().filter(|t| !t.is_empty()).collect::<Vec<_>>();
    if !output.is_empty() {
        reason.push_str(&format!("\n{}", airlock_core::terminal_safe(&output.join("\n"))));
    }
    reason.push_str(&format!(
        "\n(run {}; `airlock audit show {}` shows it whole when it was recorded)",
        record.id, record.id
    ));
    reason
}
