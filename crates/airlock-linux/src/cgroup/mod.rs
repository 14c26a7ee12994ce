//! Cgroups, supervisor side: one cgroup per run, nested under the cgroup the
//! caller runs in, entered by the helper before any code runs, removed after.
//!
//! Two hierarchies sit behind one trait, [`RunCgroup`]: cgroup v1 (one
//! directory per controller, as on hybrid hosts) and cgroup v2 (one unified
//! directory). airlock only ever creates, writes and removes directories it
//! named itself (`airlock-<pid>-<start time>-<n>`); it never writes to the
//! cgroup it runs in, except, on v2, to a cgroup delegated to it: by the
//! operator with `AIRLOCK_CGROUP`, or by systemd as a transient scope (see
//! `systemd`). Which of these a run used is its [`Route`]. A run's cgroup
//! files are opened by name relative to its directory (`dir`).

mod dir;
mod systemd;
mod v1;
mod v2;

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The limits a run's cgroup enforces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    /// Processes and threads, including airlock's own ([`AIRLOCK_PROCESSES`]).
    pub pids: u32,
    /// CPU bandwidth in CPUs.
    pub cpus: f64,
}

/// Processes of airlock's own a run's cgroup counts, on top of the code's:
/// the run's init. (The helper stays outside.)
pub const AIRLOCK_PROCESSES: u32 = 1;

/// What a run's cgroup observed: the kernel's own counters, which count a
/// limit when it bites and which nothing in the run can reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub peak_memory_bytes: Option<u64>,
    /// Processes the kernel's OOM killer killed in the cgroup.
    pub oom_kills: u64,
    /// Times the run's memory reached its limit (the kernel then reclaimed,
    /// or killed, to stay under it): v2 `memory.events` max, v1
    /// `memory.failcnt`.
    pub memory_max_hits: u64,
    /// Times a fork or clone failed at the pids limit.
    pub pids_max_hits: u64,
    pub cpu_usage: Option<Duration>,
}

/// One run's cgroup, on either hierarchy.
pub trait RunCgroup: Send {
    /// How the helper enters the cgroup before the run's first process is
    /// made (see [`Placement`]).
    fn placement(&self) -> io::Result<Placement>;
    /// CPU time used so far by every process of the run.
    fn cpu_usage(&self) -> Option<Duration>;
    /// Whether the run's socket buffers reached the memory cap where the
    /// hierarchy counts them apart from the rest (cgroup v1); where it
    /// counts them with the rest (v2), the OOM killer answers instead.
    fn socket_memory_exhausted(&self) -> bool {
        false
    }
    fn stats(&self) -> CgroupStats;
    /// The processes in the cgroup now (pids in this process's namespace).
    fn processes(&self) -> Vec<i32>;
    /// Kills every process in the cgroup, once, without waiting.
    fn kill_all(&self);
    /// Removes the cgroup; retries briefly while the kernel finishes tearing
    /// the processes down.
    fn remove(&mut self) -> io::Result<()>;
    /// "v1" or "v2", for the record.
    fn version(&self) -> &'static str;
    /// The file where the kernel keeps the memory the run holds now (its
    /// processes', and its files in tmpfs).
    fn memory_usage_file(&self) -> PathBuf;
    /// Lowers the memory limit (bytes) and the process limit (airlock's own
    /// included) to these, for a warm sandbox's claim. Refused, nothing
    /// changed, where the run already uses as much as the lower limit.
    fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String>;
    /// Moves the process `pid` (a host pid) into the cgroup, from outside:
    /// a forked run's processes, which the template made elsewhere and
    /// which wait until both are moved.
    fn adopt(&self, pid: i32) -> io::Result<()>;
}

/// Checks a lower limit against the usage in `current`: `Err` says why it
/// cannot be applied now.
fn check_lower(what: &str, current: &Path, limit: u64, unit: u64, unit_name: &str) -> Result<(), String> {
    let used =
        read_u64(current).ok_or_else(|| format!("its {what} in use could not be read ({})", current.display()))?;
    if used >= limit {
        return Err(format!(
            "its {what} in use ({} {unit_name}) is not under the {} {unit_name} asked for",
            used / unit,
            limit / unit
        ));
    }
    Ok(())
}

/// Lowers a limit to `limit` where `current` is under it, writing `files`
/// in order.
fn lower(what: &str, current: &Path, files: &[&Path], limit: u64, unit: (u64, &str)) -> Result<(), String> {
    check_lower(what, current, limit, unit.0, unit.1)?;
    for file in files {
        write(file, limit.to_string()).map_err(|e| format!("lowering its {what} limit: {e}"))?;
    }
    Ok(())
}

const MIB: (u64, &str) = (1 << 20, "MiB");
const PROCESSES: (u64, &str) = (1, "processes");

/// How a run's processes get into its cgroup, without the global lock a
/// migration by pid takes (which waits for an RCU grace period: about 10 ms
/// a run on a busy cgroup v1 host).
#[derive(Debug)]
pub enum Placement {
    /// cgroup v1: the helper, single-threaded, writes "0" to each of these
    /// `tasks` files, moving itself; a thread moving itself needs no global
    /// lock. Its children are born inside.
    EnterTasks(Vec<OwnedFd>),
    /// cgroup v2: the sandbox's init is born inside, through clone3's
    /// CLONE_INTO_CGROUP with this directory.
    CloneInto(OwnedFd),
}

/// Child side (the run's init and the code's process, each single-threaded
/// at that point): moves itself into the run's cgroup v1 hierarchies by
/// writing "0" to each `tasks` file.
pub fn enter_self(tasks: &[OwnedFd]) -> Result<(), crate::protocol::Failure> {
    for fd in tasks {
        rustix::io::write(fd, b"0")
            .map_err(|e| crate::protocol::Failure::new("enter the run's cgroup", "tasks", &e.into()))?;
    }
    Ok(())
}

pub use systemd::{HOLD_ARG, hold};

/// Child side (the run's init, once inside the run's cgroup): a cgroup
/// namespace of its own, which the code joins, so that the run sees its
/// cgroup as `/` and nothing of the host's tree above it.
pub fn own_namespace() -> Result<(), crate::protocol::Failure> {
    // SAFETY: CLONE_NEWCGROUP unshares no descriptor table, nor anything else
    // Rust holds; the init is single-threaded.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }
        .map_err(|e| crate::protocol::Failure::new("make the run's cgroup namespace", "", &e.into()))
}

/// Where runs' cgroups are made on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1: the caller's cgroup in each controller's hierarchy.
    V1 { memory: PathBuf, pids: PathBuf, cpu: PathBuf, cpuacct: Option<PathBuf> },
    /// cgroup v2: the parent directory, and how airlock came to it.
    V2 { parent: PathBuf, route: Route },
}

/// How airlock got a cgroup v2 parent for its runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The cgroup airlock runs in already hands the controllers to its
    /// children (root at the top of a hierarchy, or a prepared one); airlock
    /// nests beneath it and changes nothing of it.
    Own,
    /// The cgroup the operator named in `AIRLOCK_CGROUP`: airlock may enable
    /// the controllers in it.
    Operator,
    /// A transient scope with `Delegate=yes` from systemd: the user's own
    /// instance, or the system's for root.
    Systemd { unit: String, user_manager: bool },
}

impl Route {
    /// Whether airlock may enable controllers in the parent.
    fn delegated(&self) -> bool {
        !matches!(self, Route::Own)
    }
}

/// The environment variable naming a cgroup delegated to airlock.
pub const DELEGATED_CGROUP_ENV: &str = "AIRLOCK_CGROUP";

const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

impl Hierarchy {
    /// Finds where this process may make cgroups, or says why it cannot.
    /// On cgroup v2, when its own cgroup cannot take children with the
    /// controllers and systemd runs the host, asks systemd for a delegated
    /// scope, held by `helper` (see `systemd`).
    pub fn detect(helper: Option<&Path>) -> Result<Hierarchy, String> {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let membership =
            fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let delegated = std::env::var_os(DELEGATED_CGROUP_ENV).map(PathBuf::from);
        let read_controllers = |mount: &Path| fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        let hierarchy = Hierarchy::from_tables(&mountinfo, &membership, delegated.as_deref(), &read_controllers)?;
        match hierarchy.check_writable() {
            Ok(()) => Ok(hierarchy),
            Err(own) => match &hierarchy {
                Hierarchy::V2 { route: Route::Own, .. } if systemd::booted() => {
                    let mounts = parse_mountinfo(&mountinfo);
                    let unified = mounts.iter().find(|m| m.fstype == "cgroup2").ok_or("no cgroup2 mount")?;
                    let scope = systemd::scope(&unified.mount_point, &unified.root, helper).map_err(|e| {
                        format!("{e} (airlock asked because its own cgroup cannot take its runs: {own})")
                    })?;
                    Ok(Hierarchy::V2 {
                        parent: scope.dir.clone(),
                        route: Route::Systemd { unit: scope.unit.clone(), user_manager: scope.user_manager },
                    })
                }
                _ => Err(own),
            },
        }
    }

    /// Decides from the text of /proc/self/mountinfo and /proc/self/cgroup;
    /// `read_controllers` gives a cgroup2 mount's `cgroup.controllers`.
    pub fn from_tables(
        mountinfo: &str,
        membership: &str,
        delegated: Option<&Path>,
        read_controllers: &dyn Fn(&Path) -> String,
    ) -> Result<Hierarchy, String> {
        let mounts = parse_mountinfo(mountinfo);
        // A unified hierarchy that has the controllers wins: it is the future
        // and the only place they can be on a pure v2 host.
        if let Some(unified) = mounts.iter().find(|m| m.fstype == "cgroup2") {
            let controllers = read_controllers(&unified.mount_point);
            let has_all = CONTROLLERS.iter().all(|c| controllers.split_whitespace().any(|x| x == *c));
            if has_all {
                let parent = match delegated {
                    Some(path) => path.to_owned(),
                    None => {
                        let own = membership
                            .lines()
                            .find_map(|l| l.strip_prefix("0::"))
                            .ok_or("this process is not in a cgroup v2 cgroup")?;
                        join_beneath(&unified.mount_point, &unified.root, own)?
                    }
                };
                let route = if delegated.is_some() { Route::Operator } else { Route::Own };
                return Ok(Hierarchy::V2 { parent, route });
            }
        }
        let find = |controller: &str| -> Result<Option<PathBuf>, String> {
            let Some(mount) = mounts.iter().find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == controller))
            else {
                return Ok(None);
            };
            let own = membership
                .lines()
                .find_map(|line| {
                    let mut parts = line.splitn(3, ':');
                    let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
                    list.split(',').any(|c| c == controller).then_some(path)
                })
                .ok_or_else(|| format!("this process is in no {controller} cgroup"))?;
            match delegated {
                Some(path) => Ok(Some(mount.mount_point.join(path.strip_prefix("/").unwrap_or(path)))),
                None => join_beneath(&mount.mount_point, &mount.root, own).map(Some),
            }
        };
        match (find("memory")?, find("pids")?, find("cpu")?) {
            (Some(memory), Some(pids), Some(cpu)) => Ok(Hierarchy::V1 { memory, pids, cpu, cpuacct: find("cpuacct")? }),
            _ => Err("no cgroup hierarchy here has the memory, pids and cpu controllers (neither a cgroup v2 \
                      mount with them enabled nor cgroup v1 mounts of each)"
                .to_owned()),
        }
    }

    fn check_writable(&self) -> Result<(), String> {
        let dirs: Vec<&Path> = match self {
            Hierarchy::V1 { memory, pids, cpu, .. } => vec![memory, pids, cpu],
            Hierarchy::V2 { parent, .. } => vec![parent],
        };
        for dir in dirs {
            if rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_err() {
                return Err(format!(
                    "this user may not create cgroups under {}; run as root, or delegate a cgroup to this user \
                     (chown it, or systemd-run --user --scope -p Delegate=yes) and run airlock inside it{}",
                    dir.display(),
                    if matches!(self, Hierarchy::V2 { .. }) {
                        format!(" or name it in {DELEGATED_CGROUP_ENV}")
                    } else {
                        String::new()
                    }
                ));
            }
        }
        if let Hierarchy::V2 { parent, route } = self {
            v2::check_controllers(parent, route.delegated())?;
        }
        Ok(())
    }

    /// "v1" or "v2".
    pub fn version(&self) -> &'static str {
        match self {
            Hierarchy::V1 { .. } => "v1",
            Hierarchy::V2 { .. } => "v2",
        }
    }

    /// Which cgroups the runs get, for the record's isolation details:
    /// `v1`, `v2 nested in airlock's own cgroup`, and so on.
    pub fn route(&self) -> String {
        match self {
            Hierarchy::V1 { .. } => "v1, nested in airlock's own cgroups".to_owned(),
            Hierarchy::V2 { route: Route::Own, parent } => {
                format!("v2, nested in airlock's own cgroup {}", parent.display())
            }
            Hierarchy::V2 { route: Route::Operator, parent } => {
                format!("v2, in the cgroup {DELEGATED_CGROUP_ENV} delegates: {}", parent.display())
            }
            Hierarchy::V2 { route: Route::Systemd { unit, user_manager }, .. } => format!(
                "v2, in the transient scope {unit} that {} systemd delegated (Delegate=yes)",
                if *user_manager { "the user's" } else { "the system's" }
            ),
        }
    }

    /// Makes a fresh cgroup for one run, with `limits` set.
    pub fn create(&self, limits: &CgroupLimits) -> io::Result<Box<dyn RunCgroup>> {
        let name = run_cgroup_name();
        match self {
            Hierarchy::V1 { memory, pids, cpu, cpuacct } => {
                Ok(Box::new(v1::V1Cgroup::create(&name, memory, pids, cpu, cpuacct.as_deref(), limits)?))
            }
            Hierarchy::V2 { parent, route } => {
                Ok(Box::new(v2::V2Cgroup::create(&name, parent, route.delegated(), limits)?))
            }
        }
    }

    /// Removes the cgroups a crashed airlock left behind: those named for a
    /// process that no longer exists. Errors are ignored: it is housekeeping.
    pub fn remove_stale(&self) {
        let parents: Vec<&Path> = match self {
            Hierarchy::V1 { memory, pids, cpu, cpuacct } => {
                let mut v = vec![memory.as_path(), pids.as_path(), cpu.as_path()];
                v.extend(cpuacct.as_deref());
                v
            }
            Hierarchy::V2 { parent, .. } => vec![parent.as_path()],
        };
        for parent in parents {
            let Ok(entries) = fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if is_stale(name) {
                    let dir = entry.path();
                    let _ = remove_dir_retrying(&dir, &|| {
                        kill_listed(&|| list_procs(&dir));
                    });
                }
            }
        }
    }
}

/// A mounted cgroup filesystem.
struct CgroupMount {
    root: String,
    mount_point: PathBuf,
    fstype: String,
    options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let mut rest = right.split(' ');
            let fstype = rest.next()?;
            let _source = rest.next()?;
            let super_options = rest.next().unwrap_or("");
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                root: unescape(fields.get(3)?),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                fstype: fstype.to_owned(),
                options: super_options.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount_point`
/// whose root is `mount_root` (not "/" inside containers).
fn join_beneath(mount_point: &Path, mount_root: &str, path: &str) -> Result<PathBuf, String> {
    let relative = if mount_root == "/" {
        path.trim_start_matches('/')
    } else {
        path.strip_prefix(mount_root)
            .ok_or_else(|| format!("this process's cgroup {path} is outside the mounted part {mount_root}"))?
            .trim_start_matches('/')
    };
    if relative.split('/').any(|c| c == "..") {
        return Err(format!("unexpected cgroup path {path}"));
    }
    Ok(mount_point.join(relative))
}

/// `airlock-<pid>-<start time>-<n>`: unique, and tells whether its maker lives.
fn run_cgroup_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let start = process_start_time(pid).unwrap_or(0);
    format!("airlock-{pid}-{start}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn is_stale(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("airlock-") else {
        return false;
    };
    let mut parts = rest.split('-');
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    process_start_time(pid) != Some(start)
}

/// A process's start time in clock ticks since boot (field 22 of stat).
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// The processes listed in `dir/cgroup.procs`.
fn list_procs(dir: &Path) -> Vec<i32> {
    parse_procs(&fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default())
}

/// The pids of a `cgroup.procs` file's text.
fn parse_procs(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// SIGKILLs every process `list` gives, once; returns whether there were any.
fn kill_listed(list: &dyn Fn() -> Vec<i32>) -> bool {
    let pids = list();
    for pid in &pids {
        if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    !pids.is_empty()
}

/// Removes the cgroup directory `dir`. A run's is empty by the time it is
/// removed (its init is dead, and every process of the run with it), so it
/// goes at once; while it is not (EBUSY: a process left, or the kernel still
/// tearing the last ones down), `kill` is called (once per try: a process
/// forked as the list was read is killed at the next) and the removal
/// retried, for about a second at most.
fn remove_dir_retrying(dir: &Path, kill: &dyn Fn()) -> io::Result<()> {
    let mut last = Ok(());
    for attempt in 0..50 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Err(e),
        }
        kill();
        std::thread::sleep(Duration::from_millis(if attempt < 10 { 2 } else { 20 }));
    }
    last
}

fn write(path: &Path, value: impl AsRef<[u8]>) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The value of `key` in the text of a flat keyed file (`key value` per line).
fn value_of(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
8:pids:/
4:memory:/process_api/917b
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hybrid_hosts_use_v1_nested_under_our_own_cgroups() {
        let h = Hierarchy::from_tables(HYBRID_MOUNTINFO, HYBRID_CGROUP, None, &|_| "hugetlb".into()).unwrap();
        assert_eq!(
            h,
            Hierarchy::V1 {
                memory: "/sys/fs/cgroup/memory/process_api/917b".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: "/sys/fs/cgroup/cpu".into(),
                cpuacct: Some("/sys/fs/cgroup/cpuacct".into()),
            }
        );
    }

    #[test]
    fn a_container_s_mount_root_is_stripped() {
        let mountinfo = "40 31 0:38 /docker/abc /sys/fs/cgroup rw - cgroup cgroup rw,memory,pids,cpu\n";
        let cgroup = "5:memory,pids,cpu:/docker/abc/app\n";
        let h = Hierarchy::from_tables(mountinfo, cgroup, None, &|_| String::new()).unwrap();
        assert!(matches!(h, Hierarchy::V1 { memory, .. } if memory == Path::new("/sys/fs/cgroup/app")));
    }

    #[test]
    fn a_unified_hierarchy_with_the_controllers_wins() {
        let mountinfo = "30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let h =
            Hierarchy::from_tables(mountinfo, "0::/user.slice/app\n", None, &|_| "cpu io memory pids".into()).unwrap();
        assert_eq!(h, Hierarchy::V2 { parent: "/sys/fs/cgroup/user.slice/app".into(), route: Route::Own });
        let d = Path::new("/sys/fs/cgroup/delegated");
        let h = Hierarchy::from_tables(mountinfo, "0::/x\n", Some(d), &|_| "cpu memory pids".into()).unwrap();
        assert_eq!(h, Hierarchy::V2 { parent: d.into(), route: Route::Operator });
    }

    #[test]
    fn no_controllers_is_a_clear_error() {
        let err = Hierarchy::from_tables("1 0 0:1 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "0::/\n", None, &|_| {
            String::new()
        })
        .unwrap_err();
        assert!(err.contains("memory, pids and cpu"), "{err}");
    }

    #[test]
    fn names_say_whether_their_maker_lives() {
        let name = run_cgroup_name();
        assert!(!is_stale(&name), "our own cgroup is not stale");
        assert!(is_stale("airlock-999999999-1-0"), "no such process");
        let pid = std::process::id();
        assert!(is_stale(&format!("airlock-{pid}-1-0")), "same pid, another start time");
        assert!(!is_stale("someone-else"), "never touch what we did not name");
    }
}
