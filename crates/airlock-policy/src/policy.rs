//! The checked policy: what one sandbox may use, with safe defaults.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::network::{HostRule, HostRuleError};
use crate::spec::PolicySpec;

pub(crate) const MIB: u64 = 1024 * 1024;

/// The most wall time any policy may ask for; longer jobs are not what a code
/// tool is for, and a typo of `86400` for `8640` should not hold a slot for days.
pub const MAX_WALL_TIME: Duration = Duration::from_secs(24 * 60 * 60);

/// [`MAX_WALL_TIME`] in the seconds a spec is written in.
pub const MAX_WALL_TIME_S: f64 = 24.0 * 60.0 * 60.0;

/// The smallest memory limit accepted: CPython alone needs about this much to start.
pub const MIN_MEMORY_BYTES: u64 = 16 * MIB;

/// The same, in the MiB a spec is written in.
pub const MIN_MEMORY_MB: u64 = MIN_MEMORY_BYTES / MIB;

/// The shortest time limit accepted, in seconds: a millisecond. Below it a
/// limit is a typo, and no run could even start.
pub const MIN_SECONDS: f64 = 0.001;

/// The least CPU bandwidth accepted: a cgroup's quota cannot be smaller
/// than a hundredth of its period.
pub const MIN_CPUS: f64 = 0.01;

/// The smallest open-file limit accepted: an interpreter needs a handful of
/// descriptors before the code runs at all.
pub const MIN_OPEN_FILES: u32 = 16;

/// The smallest inode count accepted for the work directory: it must hold at
/// least its own layout.
pub const MIN_DISK_INODES: u64 = 64;

/// Which isolation backend runs the code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Linux namespaces, seccomp, Landlock and cgroups (the default).
    #[default]
    Linux,
    /// CPython compiled to WebAssembly, run under wasmtime.
    Wasm,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Linux => "linux",
            BackendKind::Wasm => "wasm",
        })
    }
}

/// What to do when a run writes more than `max_output_bytes` to a stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputOverflow {
    /// Keep the first bytes, mark the stream truncated, discard the rest, and
    /// let the run go on (the limit is listed in `limits_hit`).
    #[default]
    Truncate,
    /// Stop the run at once with status `output_limit`.
    Kill,
}

/// An isolation layer. A backend lists the layers it put in force in every
/// record; a policy may name layers it accepts to run without.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    UserNamespace,
    PidNamespace,
    MountNamespace,
    NetworkNamespace,
    IpcNamespace,
    UtsNamespace,
    CgroupNamespace,
    /// Memory, pids and CPU limits enforced by a cgroup of the run's own.
    Cgroups,
    Seccomp,
    Landlock,
    NoNewPrivs,
    CapabilitiesDropped,
    Rlimits,
    /// The code runs as WebAssembly with only the WASI functions the host grants.
    Wasm,
}

impl Layer {
    /// The name used in records, flags and errors.
    pub fn name(self) -> &'static str {
        match self {
            Layer::UserNamespace => "user_namespace",
            Layer::PidNamespace => "pid_namespace",
            Layer::MountNamespace => "mount_namespace",
            Layer::NetworkNamespace => "network_namespace",
            Layer::IpcNamespace => "ipc_namespace",
            Layer::UtsNamespace => "uts_namespace",
            Layer::CgroupNamespace => "cgroup_namespace",
            Layer::Cgroups => "cgroups",
            Layer::Seccomp => "seccomp",
            Layer::Landlock => "landlock",
            Layer::NoNewPrivs => "no_new_privs",
            Layer::CapabilitiesDropped => "capabilities_dropped",
            Layer::Rlimits => "rlimits",
            Layer::Wasm => "wasm",
        }
    }

    /// Layers a caller may explicitly accept to run without on `backend`.
    /// The others are the sandbox itself: without them there is nothing
    /// worth calling one. On the wasm backend the guest's own boundary
    /// (WebAssembly) is that; the worker process's confinement around it
    /// (namespaces, seccomp) is a second boundary, which a host without them
    /// may lose when the caller says so.
    pub fn degradable_on(backend: BackendKind) -> &'static [Layer] {
        match backend {
            BackendKind::Linux => &[Layer::Cgroups, Layer::Landlock],
            BackendKind::Wasm => &[Layer::Cgroups, Layer::Landlock, Layer::UserNamespace, Layer::Seccomp],
        }
    }

    /// Parses a layer name as written in records and flags.
    pub fn parse(name: &str) -> Option<Layer> {
        Layer::ALL.iter().copied().find(|layer| layer.name() == name)
    }

    /// Every layer, for documentation.
    pub const ALL: [Layer; 14] = ALL_LAYERS;
}

const ALL_LAYERS: [Layer; 14] = [
    Layer::UserNamespace,
    Layer::PidNamespace,
    Layer::MountNamespace,
    Layer::NetworkNamespace,
    Layer::IpcNamespace,
    Layer::UtsNamespace,
    Layer::CgroupNamespace,
    Layer::Cgroups,
    Layer::Seccomp,
    Layer::Landlock,
    Layer::NoNewPrivs,
    Layer::CapabilitiesDropped,
    Layer::Rlimits,
    Layer::Wasm,
];

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Hard limits, each enforced by the runtime rather than by the code.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock time from start to kill.
    pub wall_time: Duration,
    /// CPU time summed over every process of the run.
    pub cpu_time: Duration,
    /// Resident memory of the whole run, swap excluded (there is none).
    pub memory_bytes: u64,
    /// Processes and threads the code may have at once.
    pub pids: u32,
    /// CPU bandwidth, in CPUs (1.0 = one full core).
    pub cpus: f64,
    /// Bytes the writable directories (/work and /tmp together) may hold.
    pub disk_bytes: u64,
    /// Files and directories the writable directories may hold.
    pub disk_inodes: u64,
    /// Bytes kept from each of stdout and stderr.
    pub output_bytes: u64,
    /// What happens past `output_bytes`.
    pub output_overflow: OutputOverflow,
    /// Largest single file copied in or out.
    pub file_bytes: u64,
    /// Largest total of files copied in, and of files copied out, per run.
    pub files_total_bytes: u64,
    /// Open file descriptors per process.
    pub open_files: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall_time: Duration::from_secs(20),
            cpu_time: Duration::from_secs(20),
            memory_bytes: 512 * MIB,
            pids: 64,
            cpus: 1.0,
            disk_bytes: 64 * MIB,
            disk_inodes: 4096,
            output_bytes: MIB,
            output_overflow: OutputOverflow::Truncate,
            file_bytes: 16 * MIB,
            files_total_bytes: 64 * MIB,
            open_files: 256,
        }
    }
}

/// Network access. Empty `allow` means no network at all, the default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkPolicy {
    /// Hosts the sandbox may reach through the filtering proxy.
    pub allow: Vec<HostRule>,
    /// Bytes the sandbox may send through the proxy, per run.
    pub max_bytes_out: u64,
    /// Bytes the sandbox may receive through the proxy, per run.
    pub max_bytes_in: u64,
    /// Connections the sandbox may open through the proxy, per run.
    pub max_connections: u32,
}

impl NetworkPolicy {
    /// The default caps that apply once any host is allowed.
    pub const DEFAULT_MAX_BYTES_OUT: u64 = 16 * MIB;
    pub const DEFAULT_MAX_BYTES_IN: u64 = 256 * MIB;
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 64;

    /// Whether any egress is allowed at all.
    pub fn is_enabled(&self) -> bool {
        !self.allow.is_empty()
    }
}

/// A checked policy. Build it with [`Policy::default`] or [`Policy::from_spec`];
/// every value in it has been checked against the host it was made for.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub limits: Limits,
    /// The whole environment of the code. Nothing is inherited from the caller.
    pub env: BTreeMap<String, String>,
    pub network: NetworkPolicy,
    pub backend: BackendKind,
    /// Isolation layers the caller accepts to run without, where the host
    /// cannot provide them. Empty by default: a missing layer is an error.
    pub allow_degraded: BTreeSet<Layer>,
    /// Extra packages from the image's vetted set, as named (see
    /// [`PolicySpec::with_packages`]). Empty by default.
    pub with_packages: BTreeSet<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            limits: Limits::default(),
            env: BTreeMap::new(),
            network: NetworkPolicy {
                allow: Vec::new(),
                max_bytes_out: NetworkPolicy::DEFAULT_MAX_BYTES_OUT,
                max_bytes_in: NetworkPolicy::DEFAULT_MAX_BYTES_IN,
                max_connections: NetworkPolicy::DEFAULT_MAX_CONNECTIONS,
            },
            backend: BackendKind::Linux,
            allow_degraded: BTreeSet::new(),
            with_packages: BTreeSet::new(),
        }
    }
}

/// What the host has, as far as a policy is concerned. Backends read these
/// from the system; tests make them up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// Physical memory of the host.
    pub memory_bytes: u64,
    /// CPUs this process may run on.
    pub cpus: u32,
    /// The kernel's largest process id (`/proc/sys/kernel/pid_max`).
    pub pid_max: u32,
    /// The kernel's largest open-file limit (`/proc/sys/fs/nr_open`).
    pub nr_open: u32,
}

/// A policy value that cannot be used, naming the field and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("{field} must be a number of seconds of at least 0.001 (got {value}); pass e.g. {field}=20")]
    BadDuration { field: &'static str, value: f64 },
    #[error("{field} is {value} s, above the most allowed ({max} s); ask for less time")]
    DurationTooLong { field: &'static str, value: f64, max: u64 },
    #[error("{field} is {value}, below the smallest usable value {min}; {hint}")]
    TooSmall { field: &'static str, value: u64, min: u64, hint: &'static str },
    #[error("{field} is {value}, above what this host has ({max}); ask for at most {max}")]
    AboveHost { field: &'static str, value: u64, max: u64 },
    #[error("cpus must be a number from 0.01 to the host's {max} (got {value})")]
    BadCpus { value: f64, max: u32 },
    #[error("env key {key:?} is not a valid variable name: use letters, digits and '_', not starting with a digit")]
    BadEnvKey { key: String },
    #[error("env value for {key:?} contains a NUL byte, which no process can receive")]
    BadEnvValue { key: String },
    #[error("allow_hosts entry {entry:?}: {source}")]
    BadHostRule { entry: String, source: HostRuleError },
    #[error(
        "allow_degraded names {name:?}, which is not a layer; the layers that may be lowered are: {} (linux), {} (wasm)",
        degradable_names(BackendKind::Linux),
        degradable_names(BackendKind::Wasm)
    )]
    UnknownLayer { name: String },
    #[error(
        "allow_degraded names {layer}, which the {backend} backend cannot lower; only {} can be",
        degradable_names(*backend)
    )]
    LayerNotDegradable { layer: Layer, backend: BackendKind },
    #[error("backend {name:?} is unknown; use \"linux\" or \"wasm\"")]
    UnknownBackend { name: String },
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    /// A request asked for more than the operator allows.
    #[error("{field} is {value}, above the operator's ceiling of {ceiling}; ask for at most {ceiling}")]
    AboveCeiling { field: &'static str, value: String, ceiling: String },
    /// A request asked for something the operator did not allow at all.
    #[error("{field}: {message}")]
    NotAllowed { field: &'static str, message: String },
}

impl PolicyError {
    /// The policy field the error is about, for an API answer that names it.
    pub fn field(&self) -> &'static str {
        match self {
            PolicyError::BadDuration { field, .. }
            | PolicyError::DurationTooLong { field, .. }
            | PolicyError::TooSmall { field, .. }
            | PolicyError::AboveHost { field, .. }
            | PolicyError::Invalid { field, .. }
            | PolicyError::AboveCeiling { field, .. }
            | PolicyError::NotAllowed { field, .. } => field,
            PolicyError::BadCpus { .. } => "cpus",
            PolicyError::BadEnvKey { .. } | PolicyError::BadEnvValue { .. } => "env",
            PolicyError::BadHostRule { .. } => "allow_hosts",
            PolicyError::UnknownLayer { .. } | PolicyError::LayerNotDegradable { .. } => "allow_degraded",
            PolicyError::UnknownBackend { .. } => "backend",
        }
    }
}

fn degradable_names(backend: BackendKind) -> String {
    Layer::degradable_on(backend).iter().map(|l| l.name()).collect::<Vec<_>>().join(", ")
}

impl Policy {
    /// Applies `spec` over the defaults and checks every value against `host`.
    pub fn from_spec(spec: &PolicySpec, host: &HostFacts) -> Result<Policy, PolicyError> {
        Policy::default().with_spec(spec, host)
    }

    /// Applies the fields `spec` sets over this policy, then checks the result.
    pub fn with_spec(&self, spec: &PolicySpec, host: &HostFacts) -> Result<Policy, PolicyError> {
        let mut policy = self.clone();
        let limits = &mut policy.limits;
        if let Some(seconds) = spec.timeout_s {
            limits.wall_time = duration("timeout_s", seconds)?;
        }
        if let Some(seconds) = spec.cpu_time_s {
            limits.cpu_time = duration("cpu_time_s", seconds)?;
        }
        if let Some(mb) = spec.memory_mb {
            limits.memory_bytes = mb.saturating_mul(MIB);
        }
        if let Some(pids) = spec.pids {
            limits.pids = pids;
        }
        if let Some(cpus) = spec.cpus {
            limits.cpus = cpus;
        }
        if let Some(mb) = spec.disk_mb {
            limits.disk_bytes = mb.saturating_mul(MIB);
        }
        if let Some(inodes) = spec.disk_inodes {
            limits.disk_inodes = inodes;
        }
        if let Some(bytes) = spec.max_output_bytes {
            limits.output_bytes = bytes;
        }
        if let Some(action) = spec.on_output_limit {
            limits.output_overflow = action;
        }
        if let Some(bytes) = spec.max_file_bytes {
            limits.file_bytes = bytes;
        }
        if let Some(bytes) = spec.max_files_total_bytes {
            limits.files_total_bytes = bytes;
        }
        if let Some(n) = spec.open_files {
            limits.open_files = n;
        }
        if let Some(env) = &spec.env {
            policy.env = env.clone();
        }
        if let Some(hosts) = &spec.allow_hosts {
            policy.network.allow = hosts
                .iter()
                .map(|entry| {
                    HostRule::parse(entry).map_err(|source| PolicyError::BadHostRule { entry: entry.clone(), source })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(bytes) = spec.max_network_bytes_out {
            policy.network.max_bytes_out = bytes;
        }
        if let Some(bytes) = spec.max_network_bytes_in {
            policy.network.max_bytes_in = bytes;
        }
        if let Some(n) = spec.max_connections {
            policy.network.max_connections = n;
        }
        if let Some(backend) = &spec.backend {
            policy.backend = match backend.as_str() {
                "linux" => BackendKind::Linux,
                "wasm" => BackendKind::Wasm,
                other => {
                    return Err(PolicyError::UnknownBackend { name: other.to_owned() });
                }
            };
        }
        if let Some(layers) = &spec.allow_degraded {
            policy.allow_degraded = layers
                .iter()
                .map(|name| {
                    let layer = Layer::parse(name).ok_or_else(|| PolicyError::UnknownLayer { name: name.clone() })?;
                    if Layer::degradable_on(policy.backend).contains(&layer) {
                        Ok(layer)
                    } else {
                        Err(PolicyError::LayerNotDegradable { layer, backend: policy.backend })
                    }
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(packages) = &spec.with_packages {
            policy.with_packages = packages.iter().map(|p| p.trim().to_owned()).collect();
        }
        policy.check(host)?;
        Ok(policy)
    }

    /// Checks every value against the host. [`Policy::from_spec`] calls this;
    /// call it yourself after editing fields by hand.
    pub fn check(&self, host: &HostFacts) -> Result<(), PolicyError> {
        let l = &self.limits;
        check_duration("timeout_s", l.wall_time)?;
        check_duration("cpu_time_s", l.cpu_time)?;
        at_least("memory_mb", l.memory_bytes / MIB, MIN_MEMORY_BYTES / MIB, "CPython needs about 16 MiB to start")?;
        at_most("memory_mb", l.memory_bytes / MIB, host.memory_bytes / MIB)?;
        at_least("pids", l.pids.into(), 1, "the code itself is one process")?;
        at_most("pids", l.pids.into(), host.pid_max.into())?;
        if !(l.cpus.is_finite() && l.cpus >= MIN_CPUS && l.cpus <= f64::from(host.cpus)) {
            return Err(PolicyError::BadCpus { value: l.cpus, max: host.cpus });
        }
        at_least("disk_mb", l.disk_bytes / MIB, 1, "the work directory needs room for its files")?;
        // The work directory is a tmpfs: it lives in memory.
        at_most("disk_mb", l.disk_bytes / MIB, host.memory_bytes / MIB)?;
        at_least("disk_inodes", l.disk_inodes, MIN_DISK_INODES, "the work directory needs room for its layout")?;
        at_least(
            "open_files",
            l.open_files.into(),
            MIN_OPEN_FILES.into(),
            "an interpreter needs a few descriptors to start",
        )?;
        at_most("open_files", l.open_files.into(), host.nr_open.into())?;
        // A total below the per-file cap is simply the tighter of the two:
        // every copy checks both.
        at_least("max_file_bytes", l.file_bytes, 1, "files of at least one byte must fit")?;
        at_least("max_files_total_bytes", l.files_total_bytes, 1, "files of at least one byte must fit")?;
        let degradable = Layer::degradable_on(self.backend);
        if let Some(layer) = self.allow_degraded.iter().find(|l| !degradable.contains(l)) {
            return Err(PolicyError::LayerNotDegradable { layer: *layer, backend: self.backend });
        }
        if self.with_packages.len() > MAX_WITH_PACKAGES {
            return Err(PolicyError::Invalid {
                field: "with_packages",
                message: format!("{} packages asked for; at most {MAX_WITH_PACKAGES}", self.with_packages.len()),
            });
        }
        if let Some(bad) = self.with_packages.iter().find(|p| !is_package_name(p)) {
            return Err(PolicyError::Invalid {
                field: "with_packages",
                message: format!(
                    "{bad:?} is not a package name: letters, digits, '.', '-' and '_', starting and ending with a \
                     letter or digit (no version: the vetted set pins it)"
                ),
            });
        }
        for (key, value) in &self.env {
            if !is_env_key(key) {
                return Err(PolicyError::BadEnvKey { key: key.clone() });
            }
            if value.contains('\0') {
                return Err(PolicyError::BadEnvValue { key: key.clone() });
            }
        }
        // A cap of 0 on the proxy says "no network", which an empty
        // allow_hosts already says: refused, with or without hosts, so that
        // every door (and the schema) states one rule.
        let cap_hint = "leave allow_hosts empty for no network";
        at_least("max_connections", self.network.max_connections.into(), 1, cap_hint)?;
        at_least("max_network_bytes_in", self.network.max_bytes_in, 1, cap_hint)?;
        at_least("max_network_bytes_out", self.network.max_bytes_out, 1, cap_hint)?;
        Ok(())
    }

    /// This policy written as a spec with every field set: the form records
    /// carry and every front door accepts.
    pub fn to_spec(&self) -> PolicySpec {
        let l = &self.limits;
        PolicySpec {
            timeout_s: Some(l.wall_time.as_secs_f64()),
            cpu_time_s: Some(l.cpu_time.as_secs_f64()),
            memory_mb: Some(l.memory_bytes / MIB),
            pids: Some(l.pids),
            cpus: Some(l.cpus),
            disk_mb: Some(l.disk_bytes / MIB),
            disk_inodes: Some(l.disk_inodes),
            max_output_bytes: Some(l.output_bytes),
            on_output_limit: Some(l.output_overflow),
            max_file_bytes: Some(l.file_bytes),
            max_files_total_bytes: Some(l.files_total_bytes),
            open_files: Some(l.open_files),
            env: Some(self.env.clone()),
            allow_hosts: Some(self.network.allow.iter().map(|r| r.to_string()).collect()),
            max_network_bytes_out: Some(self.network.max_bytes_out),
            max_network_bytes_in: Some(self.network.max_bytes_in),
            max_connections: Some(self.network.max_connections),
            backend: Some(self.backend.to_string()),
            allow_degraded: Some(self.allow_degraded.iter().map(|l| l.name().to_owned()).collect()),
            with_packages: Some(self.with_packages.iter().cloned().collect()),
        }
    }
}

fn duration(field: &'static str, seconds: f64) -> Result<Duration, PolicyError> {
    if !seconds.is_finite() || seconds < MIN_SECONDS {
        return Err(PolicyError::BadDuration { field, value: seconds });
    }
    if seconds > MAX_WALL_TIME.as_secs_f64() {
        return Err(PolicyError::DurationTooLong { field, value: seconds, max: MAX_WALL_TIME.as_secs() });
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn check_duration(field: &'static str, value: Duration) -> Result<(), PolicyError> {
    duration(field, value.as_secs_f64()).map(|_| ())
}

fn at_least(field: &'static str, value: u64, min: u64, hint: &'static str) -> Result<(), PolicyError> {
    if value < min {
        return Err(PolicyError::TooSmall { field, value, min, hint });
    }
    Ok(())
}

fn at_most(field: &'static str, value: u64, max: u64) -> Result<(), PolicyError> {
    if value > max {
        return Err(PolicyError::AboveHost { field, value, max });
    }
    Ok(())
}

/// The most extra packages one run may ask for.
pub const MAX_WITH_PACKAGES: usize = 32;

/// A distribution name as PEP 508 allows it.
fn is_package_name(name: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    name.len() <= 100
        && alnum(name.chars().next())
        && alnum(name.chars().last())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// Whether `key` can name an environment variable: letters, digits and `_`,
/// not starting with a digit.
pub fn is_env_key(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFacts {
        HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = Policy::from_spec(&PolicySpec::default(), &host()).unwrap();
        assert_eq!(p.limits.wall_time, Duration::from_secs(20));
        assert_eq!(p.limits.cpu_time, Duration::from_secs(20));
        assert_eq!(p.limits.memory_bytes, 512 * MIB);
        assert_eq!(p.limits.pids, 64);
        assert_eq!(p.limits.cpus, 1.0);
        assert_eq!(p.limits.disk_bytes, 64 * MIB);
        assert_eq!(p.limits.disk_inodes, 4096);
        assert_eq!(p.limits.output_bytes, MIB);
        assert_eq!(p.limits.file_bytes, 16 * MIB);
        assert_eq!(p.limits.files_total_bytes, 64 * MIB);
        assert_eq!(p.limits.open_files, 256);
        assert!(p.env.is_empty());
        assert!(!p.network.is_enabled());
        assert!(p.allow_degraded.is_empty());
    }

    #[test]
    fn nonsense_is_refused_with_the_field_named() {
        let cases: Vec<(PolicySpec, &str)> = vec![
            (PolicySpec { memory_mb: Some(0), ..Default::default() }, "memory_mb"),
            (PolicySpec { memory_mb: Some(1 << 40), ..Default::default() }, "memory_mb"),
            (PolicySpec { timeout_s: Some(-1.0), ..Default::default() }, "timeout_s"),
            (PolicySpec { timeout_s: Some(f64::NAN), ..Default::default() }, "timeout_s"),
            (PolicySpec { cpu_time_s: Some(0.0), ..Default::default() }, "cpu_time_s"),
            (PolicySpec { pids: Some(0), ..Default::default() }, "pids"),
            (PolicySpec { cpus: Some(3.0), ..Default::default() }, "cpus"),
            (PolicySpec { disk_mb: Some(1 << 20), ..Default::default() }, "disk_mb"),
            (PolicySpec { open_files: Some(2), ..Default::default() }, "open_files"),
            (PolicySpec { allow_degraded: Some(vec!["seccomp".into()]), ..Default::default() }, "seccomp"),
            (PolicySpec { allow_degraded: Some(vec!["bogus".into()]), ..Default::default() }, "bogus"),
            (PolicySpec { backend: Some("vm".into()), ..Default::default() }, "vm"),
            (PolicySpec { with_packages: Some(vec!["numpy==2.0".into()]), ..Default::default() }, "with_packages"),
            (PolicySpec { with_packages: Some(vec!["../x".into()]), ..Default::default() }, "with_packages"),
        ];
        for (spec, needle) in cases {
            let err = Policy::from_spec(&spec, &host()).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should name {needle}");
        }
    }

    #[test]
    fn what_may_be_lowered_depends_on_the_backend() {
        let spec = |backend: &str| PolicySpec {
            backend: Some(backend.into()),
            allow_degraded: Some(vec!["user_namespace".into(), "seccomp".into()]),
            ..Default::default()
        };
        let wasm = Policy::from_spec(&spec("wasm"), &host()).unwrap();
        assert!(wasm.allow_degraded.contains(&Layer::UserNamespace) && wasm.allow_degraded.contains(&Layer::Seccomp));
        let err = Policy::from_spec(&spec("linux"), &host()).unwrap_err().to_string();
        assert!(err.contains("the linux backend cannot lower") && err.contains("cgroups, landlock"), "{err}");
        let mut edited = wasm;
        edited.backend = BackendKind::Linux;
        assert!(matches!(edited.check(&host()), Err(PolicyError::LayerNotDegradable { .. })));
    }

    #[test]
    fn env_keys_are_checked() {
        let mut env = BTreeMap::new();
        env.insert("1BAD".to_owned(), "x".to_owned());
        let spec = PolicySpec { env: Some(env), ..Default::default() };
        assert!(matches!(Policy::from_spec(&spec, &host()), Err(PolicyError::BadEnvKey { .. })));
    }

    #[test]
    fn spec_round_trips() {
        let spec = PolicySpec {
            timeout_s: Some(3.5),
            memory_mb: Some(128),
            allow_hosts: Some(vec!["example.com".into(), "*.example.org:443".into()]),
            allow_degraded: Some(vec!["landlock".into()]),
            with_packages: Some(vec!["statsmodels".into()]),
            ..Default::default()
        };
        let policy = Policy::from_spec(&spec, &host()).unwrap();
        let again = Policy::from_spec(&policy.to_spec(), &host()).unwrap();
        assert_eq!(policy, again);
    }
}
