//! What this host can enforce, read without running anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use airlock_core::Probe;
use airlock_policy::{BackendKind, Layer};

use crate::cgroup::Hierarchy;
use crate::sys;

/// The layers that come with the sandbox's user namespace: the namespaces
/// each run makes in it, and capabilities that exist only inside it.
pub const NAMESPACE_LAYERS: [Layer; 8] = [
    Layer::UserNamespace,
    Layer::PidNamespace,
    Layer::MountNamespace,
    Layer::NetworkNamespace,
    Layer::IpcNamespace,
    Layer::UtsNamespace,
    Layer::CgroupNamespace,
    Layer::CapabilitiesDropped,
];

/// Reads the host's facts and layers. `cgroups` is the outcome of
/// [`Hierarchy::detect`], done once per process by the caller.
pub fn probe(cgroups: &Result<Hierarchy, String>, ids: &Result<crate::hostid::Allocator, String>) -> Probe {
    let mut available = BTreeSet::new();
    let mut missing = BTreeMap::new();
    let mut details = BTreeMap::new();

    match user_namespaces(ids) {
        Ok(()) => {
            available.extend(NAMESPACE_LAYERS);
        }
        Err(why) => {
            missing.insert(Layer::UserNamespace, why);
        }
    }
    if fs::read_to_string("/proc/self/status").is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:"))) {
        available.extend([Layer::Seccomp, Layer::NoNewPrivs]);
    } else {
        missing.insert(Layer::Seccomp, "this kernel was built without seccomp (CONFIG_SECCOMP_FILTER)".to_owned());
    }
    available.insert(Layer::Rlimits);
    match sys::landlock_abi() {
        Some(abi) => {
            available.insert(Layer::Landlock);
            details.insert("landlock_abi".to_owned(), abi.to_string());
        }
        None => {
            missing.insert(
                Layer::Landlock,
                "this kernel has no Landlock (it needs Linux 5.13 or later with landlock in its lsm= boot list)"
                    .to_owned(),
            );
        }
    }
    match cgroups {
        Ok(hierarchy) => {
            available.insert(Layer::Cgroups);
            details.insert("cgroup".to_owned(), hierarchy.version().to_owned());
        }
        Err(why) => {
            missing.insert(Layer::Cgroups, why.clone());
        }
    }
    Probe { backend: BackendKind::Linux, host: airlock_core::host::facts(), available, missing, details }
}

fn user_namespaces(ids: &Result<crate::hostid::Allocator, String>) -> Result<(), String> {
    let read = |path: &str| fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<i64>().ok());
    if read("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user namespaces are disabled (sysctl user.max_user_namespaces=0); set it above 0".to_owned());
    }
    if !rustix::process::geteuid().is_root() && read("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err(
            "unprivileged user namespaces are disabled; set sysctl kernel.unprivileged_userns_clone=1 or run as root"
                .to_owned(),
        );
    }
    crate::userns::check_mapping(ids)
}
