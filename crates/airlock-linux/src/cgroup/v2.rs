//! cgroup v2: one directory in the unified hierarchy.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    CONTROLLERS, CgroupLimits, CgroupStats, MIB, PROCESSES, Placement, RunCgroup, kill_listed, kill_procs, list_procs,
    lower, open_for_helper, read_key, read_u64, remove_dir_retrying, write,
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
    dir: PathBuf,
    made: bool,
}

impl V2Cgroup {
    pub fn create(name: &str, parent: &Path, delegated: bool, limits: &CgroupLimits) -> io::Result<V2Cgroup> {
        check_controllers(parent, delegated).map_err(io::Error::other)?;
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        let cgroup = V2Cgroup { dir, made: true };
        write(&cgroup.dir.join("memory.max"), limits.memory_bytes.to_string())?;
        // No swap at all: a run cannot page out to get more memory.
        write(&cgroup.dir.join("memory.swap.max"), "0")?;
        // Kill the whole run on OOM, not one process of it.
        let _ = write(&cgroup.dir.join("memory.oom.group"), "1");
        write(&cgroup.dir.join("pids.max"), limits.pids.to_string())?;
        let quota = ((limits.cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        write(&cgroup.dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?;
        Ok(cgroup)
    }
}

impl V2Cgroup {
    /// cgroup.kill (Linux 5.14) kills every process at once, even ones
    /// forking as we read the list; false on kernels without it. Opened
    /// without O_CREAT: the file exists on every kernel that has it.
    fn kill_at_once(&self) -> bool {
        fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"1"))
            .is_ok()
    }
}

impl RunCgroup for V2Cgroup {
    fn placement(&self) -> io::Result<Placement> {
        open_for_helper(&self.dir, rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY).map(Placement::CloneInto)
    }

    fn cpu_usage(&self) -> Option<Duration> {
        read_key(&self.dir.join("cpu.stat"), "usage_usec").map(Duration::from_micros)
    }

    fn stats(&self) -> CgroupStats {
        CgroupStats {
            // memory.peak exists from Linux 5.19.
            peak_memory_bytes: read_u64(&self.dir.join("memory.peak")),
            oom_kills: read_key(&self.dir.join("memory.events"), "oom_kill").unwrap_or(0),
            memory_max_hits: read_key(&self.dir.join("memory.events"), "max").unwrap_or(0),
            pids_max_hits: read_key(&self.dir.join("pids.events"), "max").unwrap_or(0),
            cpu_usage: self.cpu_usage(),
        }
    }

    fn processes(&self) -> Vec<i32> {
        list_procs(&self.dir)
    }

    fn kill_all(&self) {
        if !self.kill_at_once() {
            kill_listed(&self.dir);
        }
    }

    fn remove(&mut self) -> io::Result<()> {
        if !self.made {
            return Ok(());
        }
        if !self.kill_at_once() {
            kill_procs(&self.dir);
        }
        remove_dir_retrying(&self.dir)
            .map_err(|e| io::Error::new(e.kind(), format!("removing {}: {e}", self.dir.display())))?;
        self.made = false;
        Ok(())
    }

    fn version(&self) -> &'static str {
        "v2"
    }

    fn memory_usage_file(&self) -> PathBuf {
        self.dir.join("memory.current")
    }

    fn adopt(&self, pid: i32) -> io::Result<()> {
        write(&self.dir.join("cgroup.procs"), pid.to_string())
    }

    fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String> {
        if let Some(limit) = memory_bytes {
            lower("memory", &self.memory_usage_file(), &[&self.dir.join("memory.max")], limit, MIB)?;
        }
        if let Some(limit) = pids {
            lower("processes", &self.dir.join("pids.current"), &[&self.dir.join("pids.max")], limit.into(), PROCESSES)?;
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
