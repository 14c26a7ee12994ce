//! cgroup v2: one directory in the unified hierarchy.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::dir::Dir;
use super::{
    CONTROLLERS, CgroupLimits, CgroupStats, MIB, PROCESSES, Placement, RunCgroup, kill_listed, lower,
    remove_dir_retrying, write,
};

const CPU_PERIOD_US: u64 = 100_000;

/// Checks that `parent` hands the controllers airlock needs to its children;
/// in a delegated cgroup, enables them.
pub fn check_controllers(parent: &Path, delegated: bool) -> Result<(), String> {
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<&str> =
        CONTROLLERS.iter().copied().filter(|c| !enabled.split_whitespace().any(|e| e == *c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if delegated {
        let request: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
        return write(&parent.join("cgroup.subtree_control"), request.join(" ")).map_err(|e| {
            format!(
                "cannot enable the {} controllers in the delegated cgroup {}: {e}; it must hold no processes itself \
                 (move them to a child cgroup) and have the controllers in its cgroup.controllers",
                missing.join(", "),
                parent.display()
            )
        });
    }
    Err(format!(
        "cgroup v2: {} does not enable the {} controllers for its children, and airlock does not change a cgroup \
         it did not make; run airlock in a cgroup whose subtree_control enables them, or create a cgroup for it, \
         delegate it (e.g. systemd-run --user -p Delegate=yes) and name it in AIRLOCK_CGROUP",
        parent.display(),
        missing.join(", ")
    ))
}

pub struct V2Cgroup {
    dir: Dir,
    removed: bool,
}

impl V2Cgroup {
    pub fn create(name: &str, parent: &Path, delegated: bool, limits: &CgroupLimits) -> io::Result<V2Cgroup> {
        check_controllers(parent, delegated).map_err(io::Error::other)?;
        // Removed on drop from here on, should a limit not be set.
        let cgroup = V2Cgroup { dir: Dir::make(parent.join(name))?, removed: false };
        let dir = cgroup.dir.open()?;
        dir.write("memory.max", limits.memory_bytes.to_string())?;
        // No swap at all: a run cannot page out to get more memory.
        dir.write("memory.swap.max", "0")?;
        // Kill the whole run on OOM, not one process of it.
        let _ = dir.write("memory.oom.group", "1");
        dir.write("pids.max", limits.pids.to_string())?;
        let quota = ((limits.cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        dir.write("cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
        drop(dir);
        Ok(cgroup)
    }

    /// cgroup.kill (Linux 5.14) kills every process at once, even ones
    /// forking as we read the list; false on kernels without it (asked
    /// first: a write would try to create it).
    fn kill_at_once(&self) -> bool {
        self.dir.open().is_ok_and(|dir| dir.has("cgroup.kill") && dir.write("cgroup.kill", "1").is_ok())
    }
}

impl RunCgroup for V2Cgroup {
    fn placement(&self) -> io::Result<Placement> {
        self.dir.open().map(|dir| Placement::CloneInto(dir.into_fd()))
    }

    fn cpu_usage(&self) -> Option<Duration> {
        self.dir.read_key("cpu.stat", "usage_usec").map(Duration::from_micros)
    }

    fn stats(&self) -> CgroupStats {
        let dir = self.dir.open().ok();
        let key = |file: &str, key: &str| dir.as_ref().and_then(|dir| dir.read_key(file, key));
        CgroupStats {
            // memory.peak exists from Linux 5.19.
            peak_memory_bytes: dir.as_ref().and_then(|dir| dir.read_u64("memory.peak")),
            oom_kills: key("memory.events", "oom_kill").unwrap_or(0),
            memory_max_hits: key("memory.events", "max").unwrap_or(0),
            pids_max_hits: key("pids.events", "max").unwrap_or(0),
            cpu_usage: key("cpu.stat", "usage_usec").map(Duration::from_micros),
        }
    }

    fn processes(&self) -> Vec<i32> {
        self.dir.procs()
    }

    fn kill_all(&self) {
        if !self.kill_at_once() {
            kill_listed(&|| self.dir.procs());
        }
    }

    fn remove(&mut self) -> io::Result<()> {
        if std::mem::replace(&mut self.removed, true) {
            return Ok(());
        }
        let kill = || {
            if !self.kill_at_once() {
                kill_listed(&|| self.dir.procs());
            }
        };
        remove_dir_retrying(self.dir.path(), &kill)
            .map_err(|e| io::Error::new(e.kind(), format!("removing {}: {e}", self.dir.path().display())))
    }

    fn version(&self) -> &'static str {
        "v2"
    }

    fn memory_usage_file(&self) -> PathBuf {
        self.dir.file("memory.current")
    }

    fn adopt(&self, pid: i32) -> io::Result<()> {
        self.dir.open()?.write("cgroup.procs", pid.to_string())
    }

    fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String> {
        if let Some(limit) = memory_bytes {
            lower("memory", &self.memory_usage_file(), &[&self.dir.file("memory.max")], limit, MIB)?;
        }
        if let Some(limit) = pids {
            lower("processes", &self.dir.file("pids.current"), &[&self.dir.file("pids.max")], limit.into(), PROCESSES)?;
        }
        Ok(())
    }
}

impl Drop for V2Cgroup {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_written_where_v2_reads_them() {
        let parent = tempfile::tempdir().unwrap();
        fs::write(parent.path().join("cgroup.subtree_control"), "cpu memory pids\n").unwrap();
        let limits = CgroupLimits { memory_bytes: 64 << 20, pids: 10, cpus: 0.5 };
        let mut cg = V2Cgroup::create("airlock-test", parent.path(), false, &limits).unwrap();
        let dir = parent.path().join("airlock-test");
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), (64u64 << 20).to_string());
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("pids.max"), "10");
        assert_eq!(read("cpu.max"), "50000 100000");
        fs::write(dir.join("memory.peak"), "12345\n").unwrap();
        fs::write(dir.join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
        fs::write(dir.join("pids.events"), "max 2\n").unwrap();
        fs::write(dir.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        let stats = cg.stats();
        assert_eq!(stats.peak_memory_bytes, Some(12345));
        assert_eq!(stats.oom_kills, 1);
        assert_eq!(stats.memory_max_hits, 3);
        assert_eq!(stats.pids_max_hits, 2);
        assert_eq!(stats.cpu_usage, Some(Duration::from_micros(1500)));
        // A real cgroupfs removes its interface files itself; a plain directory does not.
        for f in fs::read_dir(&dir).unwrap() {
            fs::remove_file(f.unwrap().path()).unwrap();
        }
        cg.remove().unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn an_undelegated_parent_without_controllers_is_refused_not_changed() {
        let parent = tempfile::tempdir().unwrap();
        fs::write(parent.path().join("cgroup.subtree_control"), "cpu\n").unwrap();
        let err = check_controllers(parent.path(), false).unwrap_err();
        assert!(err.contains("memory, pids") && err.contains("AIRLOCK_CGROUP"), "{err}");
        assert_eq!(fs::read_to_string(parent.path().join("cgroup.subtree_control")).unwrap(), "cpu\n");
    }
}
