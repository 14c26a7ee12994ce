//! What this host can enforce, read without running anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

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

/// The helper's argument that makes it try one user namespace and exit
/// (0 if the kernel made it); see [`try_user_namespace`].
pub const PROBE_USERNS_ARG: &str = "probe-userns";

/// Reads the host's facts and layers. `cgroups` is the outcome of
/// [`Hierarchy::detect`], done once per process by the caller. The trial
/// user namespace is made by a child of this program (the wasm backend's
/// case: its worker makes none with a profile of its own).
pub fn probe(cgroups: &Result<Hierarchy, String>, ids: &Result<crate::hostid::Allocator, String>) -> Probe {
    probe_with_helper(cgroups, ids, None)
}

/// As [`probe`], with the trial user namespace made by `helper`, the
/// binary that makes the runs' namespaces: a security module may judge it
/// apart from this program (AppArmor's profile on Ubuntu names the helper
/// alone).
pub fn probe_with_helper(
    cgroups: &Result<Hierarchy, String>,
    ids: &Result<crate::hostid::Allocator, String>,
    helper: Option<&Path>,
) -> Probe {
    let mut available = BTreeSet::new();
    let mut missing = BTreeMap::new();
    let mut details = BTreeMap::new();

    match user_namespaces(ids, helper) {
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
fn user_namespaces(ids: &Result<crate::hostid::Allocator, String>, helper: Option<&Path>) -> Result<(), String> {
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
    let apparmor_restricts = !root && read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1);
    if apparmor_restricts && !Path::new(APPARMOR_PROFILE).exists() {
        return Err(apparmor_fix("airlock's helper has no profile"));
    }
    trial_user_namespace(helper, helper.and_then(trial_cache_path).as_deref()).map_err(|why| {
        if apparmor_restricts {
            apparmor_fix(&format!(
                "{APPARMOR_PROFILE} exists but does not let this helper make one ({why}): it is not loaded, or \
                 names another path than the helper's"
            ))
        } else {
            why
        }
    })?;
    crate::userns::check_mapping(ids)
}

/// The refusal under Ubuntu's AppArmor restriction: what is wrong, and the
/// install commands of the README.
fn apparmor_fix(what: &str) -> String {
    format!(
        "AppArmor restricts unprivileged user namespaces here (sysctl \
         kernel.apparmor_restrict_unprivileged_userns=1) and {what}: install the profile airlock ships, \
         packaging/apparmor/airlock-init, as {APPARMOR_PROFILE} with the path of airlock-init filled in, then \
         `sudo apparmor_parser -r {APPARMOR_PROFILE}` (the README's \"Ubuntu 24.04\" section gives the commands)"
    )
}

/// Where the README installs the helper's AppArmor profile.
const APPARMOR_PROFILE: &str = "/etc/apparmor.d/airlock-init";

/// Where a trial's success with `helper` is remembered (see
/// [`trial_user_namespace`]).
fn trial_cache_path(helper: &Path) -> Option<PathBuf> {
    airlock_core::paths::data_dir().ok().map(|d| trial_entry(&d.join(TRIAL_CACHE), helper))
}

/// The entry for `helper` in the folder `trials`: one per helper path, so
/// that two installs used in turn (the command's helper and the Python
/// package's, say) do not each overwrite the other's and make the trial at
/// every start.
fn trial_entry(trials: &Path, helper: &Path) -> PathBuf {
    let digest = airlock_core::sha256_hex(helper.as_os_str().as_encoded_bytes());
    trials.join(&digest[..32])
}

/// The folder, in airlock's data directory, that remembers trials' successes.
pub const TRIAL_CACHE: &str = "cache/userns-trials";

/// [`try_unshare_user_namespace`], skipped when the helper made one before
/// in the same conditions: the trial is a fork, an exec and a namespace,
/// about a millisecond of every start. `cache` remembers a success (never a
/// refusal) under everything the kernel's answer depends on ([`trial_key`]).
/// A wrong entry cannot make a run weaker: each run's helper makes its own
/// user namespace or the run fails, and a sandbox whose set-up fails
/// forgets the entry ([`forget_trial`]), so the next start tries again and
/// names the fix.
fn trial_user_namespace(helper: Option<&Path>, cache: Option<&Path>) -> Result<(), String> {
    let key = helper.and_then(trial_key);
    let remembered = |cache: &Path| fs::read_to_string(cache).ok();
    if let (Some(key), Some(cache)) = (&key, cache) {
        if remembered(cache).as_deref() == Some(key.as_str()) {
            return Ok(());
        }
    }
    try_unshare_user_namespace(helper)?;
    if let (Some(key), Some(cache)) = (key, cache) {
        // A cache: failing to save it costs the trial next time, nothing more.
        let tmp = cache.with_extension(format!("{}.tmp", std::process::id()));
        let saved = cache.parent().is_some_and(|dir| fs::create_dir_all(dir).is_ok()) && fs::write(&tmp, key).is_ok();
        if !saved || fs::rename(&tmp, cache).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
    Ok(())
}

/// Forgets every remembered trial: called when a sandbox could not be set
/// up (forgetting more than that helper's costs a trial, nothing more).
pub fn forget_trial() {
    if let Ok(data) = airlock_core::paths::data_dir() {
        let _ = fs::remove_dir_all(data.join(TRIAL_CACHE));
    }
}

/// What the kernel's answer to the helper's unshare depends on, as text:
/// this boot, the helper binary as it is now, who asks, in which user
/// namespace, under which seccomp filters, capabilities and security label,
/// and the sysctls that govern user namespaces. `None` when any of it
/// cannot be read: then the trial is made.
fn trial_key(helper: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let read = |path: &str| fs::read_to_string(path).ok();
    let meta = fs::metadata(helper).ok()?;
    let status = read("/proc/self/status")?;
    let confinement: Vec<&str> = status
        .lines()
        .filter(|l| {
            ["Seccomp", "Seccomp_filters", "NoNewPrivs", "CapEff", "CapBnd"]
                .iter()
                .any(|k| l.split(':').next() == Some(*k))
        })
        .collect();
    let profile = fs::metadata(APPARMOR_PROFILE).ok().map(|m| format!("{}.{}", m.mtime(), m.mtime_nsec()));
    let key = format!(
        "boot {}\nhelper {} {} {} {} {}.{} {}.{}\nids {} {}\nuserns {}\n{}\nlabel {:?}\nsysctl {:?} {:?} {:?}\nprofile {:?}\n",
        read("/proc/sys/kernel/random/boot_id")?.trim(),
        helper.display(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        fs::read_link("/proc/self/ns/user").ok()?.display(),
        confinement.join(" "),
        read("/proc/self/attr/current").map(|l| l.trim().to_owned()),
        read("/proc/sys/user/max_user_namespaces").map(|v| v.trim().to_owned()),
        read("/proc/sys/kernel/unprivileged_userns_clone").map(|v| v.trim().to_owned()),
        read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").map(|v| v.trim().to_owned()),
        profile,
    );
    Some(key)
}

/// Makes one user namespace the way a run will: in the helper, which
/// tries it and exits (see [`try_user_namespace`]); without a helper (the
/// run will name it missing), in a child of this program that execs
/// `/bin/true`. The one check that sees every reason the kernel may refuse
/// one (a container runtime's seccomp filter, a security module).
fn try_unshare_user_namespace(helper: Option<&Path>) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut command = match helper {
        Some(helper) => {
            let mut command = std::process::Command::new(helper);
            command.arg(PROBE_USERNS_ARG);
            command
        }
        None => {
            let mut command = std::process::Command::new("/bin/true");
            // SAFETY: between fork and exec the child only makes one system
            // call, which neither allocates nor takes a lock.
            unsafe {
                command.pre_exec(|| {
                    rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER).map_err(std::io::Error::from)
                })
            };
            command
        }
    };
    command.env_clear().stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    let refused = |why: String| {
        format!(
            "this host refuses to make a user namespace (unshare(CLONE_NEWUSER): {why}); inside a container, its \
             runtime's seccomp profile or security module forbids it: start the container with \
             `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` (docker, podman), or run \
             airlock on the host"
        )
    };
    match command.stderr(std::process::Stdio::piped()).output() {
        Ok(out) if out.status.success() || helper.is_none() => Ok(()),
        Ok(out) => Err(refused(String::from_utf8_lossy(&out.stderr).trim().to_owned())),
        // No /bin/true: nothing was tried; the helper will say what it meets.
        Err(e) if helper.is_none() && e.raw_os_error() == Some(rustix::io::Errno::NOENT.raw_os_error()) => Ok(()),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// Helper side of [`PROBE_USERNS_ARG`]: makes a user namespace and exits 0,
/// or prints the kernel's refusal and exits 1.
pub fn try_user_namespace() -> ! {
    // SAFETY: CLONE_NEWUSER shares or unshares no memory nor descriptor
    // table; the process exits right after.
    match unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) } {
        Ok(()) => std::process::exit(0),
        Err(errno) => {
            eprintln!("{}", std::io::Error::from(errno));
            std::process::exit(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use rustix::io::Errno;

    use super::{landlock_missing, trial_user_namespace};

    /// A stand-in helper that logs each trial to `log` and answers with `status`.
    fn fake_helper(dir: &Path, name: &str, status: i32) -> std::path::PathBuf {
        let path = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        fs::write(&path, format!("#!/bin/sh\necho \"$1\" >> {}\necho refused >&2\nexit {status}\n", log.display()))
            .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn trials(dir: &Path, name: &str) -> usize {
        fs::read_to_string(dir.join(format!("{name}.log"))).map_or(0, |log| log.lines().count())
    }

    #[test]
    fn a_trial_that_succeeded_is_remembered_until_its_conditions_change() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache/userns-trial");
        let helper = fake_helper(dir.path(), "helper", 0);
        trial_user_namespace(Some(&helper), Some(&cache)).unwrap();
        trial_user_namespace(Some(&helper), Some(&cache)).unwrap();
        assert_eq!(trials(dir.path(), "helper"), 1, "the second start trusted the remembered trial");
        // Another boot's entry (or a damaged one) is not trusted: the trial is made again.
        let entry = fs::read_to_string(&cache).unwrap();
        fs::write(&cache, entry.replacen("boot ", "boot another-", 1)).unwrap();
        trial_user_namespace(Some(&helper), Some(&cache)).unwrap();
        assert_eq!(trials(dir.path(), "helper"), 2, "a stale entry was trusted");
        assert_eq!(fs::read_to_string(&cache).unwrap(), entry, "the entry is this boot's again");
        // Another helper binary is tried on its own.
        let other = fake_helper(dir.path(), "other", 0);
        trial_user_namespace(Some(&other), Some(&cache)).unwrap();
        assert_eq!(trials(dir.path(), "other"), 1, "another helper's trial was taken for this one's");
    }

    #[test]
    fn each_helper_has_an_entry_of_its_own() {
        let trials = Path::new("/data/cache/userns-trials");
        let command = super::trial_entry(trials, Path::new("/usr/lib/airlock/airlock-init"));
        let package = super::trial_entry(trials, Path::new("/home/u/.local/share/airlock/helpers/airlock-init-1f2e"));
        assert_ne!(command, package, "two helpers would overwrite each other's trial");
        assert_eq!(command.parent(), Some(trials));
        assert_eq!(command, super::trial_entry(trials, Path::new("/usr/lib/airlock/airlock-init")));
    }

    #[test]
    fn a_refusal_is_never_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("userns-trial");
        let helper = fake_helper(dir.path(), "helper", 1);
        for _ in 0..2 {
            let why = trial_user_namespace(Some(&helper), Some(&cache)).unwrap_err();
            assert!(why.contains("refused"), "{why}");
        }
        assert_eq!(trials(dir.path(), "helper"), 2, "each start tried again");
        assert!(!cache.exists(), "a refusal was remembered");
    }

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
