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
    match sys::landlock_version() {
        Ok(abi) => {
            available.insert(Layer::Landlock);
            details.insert("landlock_abi".to_owned(), abi.to_string());
        }
        Err(errno) => {
            let started = fs::read_to_string("/sys/kernel/security/lsm").ok();
            missing.insert(Layer::Landlock, landlock_missing(errno, started.as_deref()));
        }
    }
    match cgroups {
        Ok(hierarchy) => {
            available.insert(Layer::Cgroups);
            details.insert("cgroup".to_owned(), hierarchy.version().to_owned());
            details.insert("cgroup_route".to_owned(), hierarchy.route());
        }
        Err(why) => {
            missing.insert(Layer::Cgroups, why.clone());
        }
    }
    Probe { backend: BackendKind::Linux, host: airlock_core::host::facts(), available, missing, details }
}

/// Why this kernel has no Landlock, and the exact fix. `errno` is the
/// kernel's answer to the version query; `started` is the list of security
/// modules it started (/sys/kernel/security/lsm), from which the `lsm=`
/// value that adds Landlock and keeps the others is spelt out.
fn landlock_missing(errno: rustix::io::Errno, started: Option<&str>) -> String {
    if errno != rustix::io::Errno::OPNOTSUPP {
        return format!(
            "this kernel has no Landlock (landlock_create_ruleset: {errno}): it needs Linux 5.13 or later built \
             with CONFIG_SECURITY_LANDLOCK=y, as Debian 12, Ubuntu 22.04 and Fedora 35 and later ship it; \
             upgrade the kernel"
        );
    }
    // "capability" is always on and never named in lsm=.
    let others: Vec<&str> =
        started.unwrap_or_default().trim().split(',').filter(|m| !m.is_empty() && *m != "capability").collect();
    let value =
        std::iter::once("landlock").chain(others.iter().copied().filter(|m| *m != "landlock")).collect::<Vec<_>>();
    let known = if started.is_some() { "" } else { " (add the modules of /sys/kernel/security/lsm after it)" };
    format!(
        "this kernel has Landlock but did not start it: its lsm= boot list leaves landlock out; boot with \
         `lsm={}`{known} (on GRUB: add it to GRUB_CMDLINE_LINUX in /etc/default/grub, then `sudo update-grub` \
         and reboot)",
        value.join(",")
    )
}

/// Whether the helper will be able to make the sandbox's user namespace,
/// and if not, why and the exact fix: the sysctls first (they name the fix
/// best), then AppArmor's restriction (Ubuntu 23.10 and later), then a real
/// attempt, which catches what no file tells (a container runtime's seccomp
/// filter refusing unshare).
fn user_namespaces(ids: &Result<crate::hostid::Allocator, String>) -> Result<(), String> {
    let read = |path: &str| fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<i64>().ok());
    let root = rustix::process::geteuid().is_root();
    if read("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user namespaces are disabled (sysctl user.max_user_namespaces=0): enable them with \
                    `sudo sysctl -w user.max_user_namespaces=15000` (and keep it with \
                    `echo user.max_user_namespaces=15000 | sudo tee /etc/sysctl.d/90-airlock.conf`)"
            .to_owned());
    }
    if !root && read("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err("unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0): enable \
                    them with `sudo sysctl -w kernel.unprivileged_userns_clone=1` (and keep it with \
                    `echo kernel.unprivileged_userns_clone=1 | sudo tee /etc/sysctl.d/90-airlock.conf`), or run \
                    airlock as root"
            .to_owned());
    }
    if !root
        && read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1)
        && !std::path::Path::new(APPARMOR_PROFILE).exists()
    {
        return Err(format!(
            "AppArmor restricts unprivileged user namespaces here (sysctl \
             kernel.apparmor_restrict_unprivileged_userns=1) and airlock's helper has no profile: install the one \
             airlock ships, packaging/apparmor/airlock-init, as {APPARMOR_PROFILE} with the path of airlock-init \
             filled in, then `sudo apparmor_parser -r {APPARMOR_PROFILE}` (the README's \"Ubuntu 24.04\" section \
             gives the commands)"
        ));
    }
    try_unshare_user_namespace()?;
    crate::userns::check_mapping(ids)
}

/// Where the README installs the helper's AppArmor profile.
const APPARMOR_PROFILE: &str = "/etc/apparmor.d/airlock-init";

/// Starts `/bin/true` in a user namespace of its own: the one check that
/// sees every reason the kernel may refuse one.
fn try_unshare_user_namespace() -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new("/bin/true");
    command.env_clear().stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    // SAFETY: between fork and exec the child only makes one system call,
    // which neither allocates nor takes a lock.
    unsafe {
        command.pre_exec(|| {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER).map_err(std::io::Error::from)
        })
    };
    match command.status() {
        Ok(_) => Ok(()),
        // No /bin/true: nothing was tried; the helper will say what it meets.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOENT.raw_os_error()) => Ok(()),
        Err(e) => Err(format!(
            "this host refuses to make a user namespace (unshare(CLONE_NEWUSER): {e}); inside a container, its \
             runtime's seccomp profile or security module forbids it: start the container with \
             `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` (docker, podman), or run \
             airlock on the host"
        )),
    }
}

#[cfg(test)]
mod tests {
    use rustix::io::Errno;

    use super::landlock_missing;

    #[test]
    fn a_kernel_that_did_not_start_landlock_is_told_the_lsm_list_that_adds_it() {
        let why = landlock_missing(Errno::OPNOTSUPP, Some("capability,lockdown,yama,apparmor\n"));
        assert!(why.contains("`lsm=landlock,lockdown,yama,apparmor`"), "{why}");
        assert!(why.contains("sudo update-grub"), "{why}");
        let unknown = landlock_missing(Errno::OPNOTSUPP, None);
        assert!(unknown.contains("`lsm=landlock`") && unknown.contains("/sys/kernel/security/lsm"), "{unknown}");
    }

    #[test]
    fn a_kernel_without_landlock_is_told_to_upgrade() {
        let why = landlock_missing(Errno::NOSYS, Some("capability,yama"));
        assert!(why.contains("CONFIG_SECURITY_LANDLOCK") && why.contains("upgrade the kernel"), "{why}");
        assert!(!why.contains("lsm="), "{why}");
    }
}
