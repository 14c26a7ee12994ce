//! cgroup v1: a directory per controller (memory, pids, cpu, and cpuacct for
//! usage when it is mounted apart from cpu).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::dir::Dir;
use super::{CgroupLimits, CgroupStats, MIB, PROCESSES, Placement, RunCgroup, kill_listed, lower, remove_dir_retrying};

/// The CFS period airlock uses for CPU quotas, in microseconds.
const CFS_PERIOD_US: u64 = 100_000;

pub struct V1Cgroup {
    memory: Dir,
    pids: Dir,
    cpu: Dir,
    /// Its cgroup in the cpuacct hierarchy, when that is mounted apart from cpu's.
    cpuacct: Option<Dir>,
    /// Whether cpuacct.usage is in the cpu hierarchy's cgroup (co-mounted).
    usage_in_cpu: bool,
    removed: bool,
}

impl V1Cgroup {
    pub fn create(
        name: &str,
        memory: &Path,
        pids: &Path,
        cpu: &Path,
        cpuacct: Option<&Path>,
        limits: &CgroupLimits,
    ) -> io::Result<V1Cgroup> {
        let mut paths = vec![memory.join(name), pids.join(name), cpu.join(name)];
        if let Some(acct) = cpuacct.filter(|a| *a != cpu) {
            paths.push(acct.join(name));
        }
        let mut made = Vec::with_capacity(paths.len());
        for path in paths {
            match Dir::make(path) {
                Ok(dir) => made.push(dir),
                Err(e) => {
                    // Nothing runs in them yet: the ones made go at once.
                    for dir in made.iter().rev() {
                        let _ = remove_dir_retrying(dir.path(), &|| ());
                    }
                    return Err(e);
                }
            }
        }
        let mut made = made.into_iter();
        let (Some(memory), Some(pids), Some(cpu)) = (made.next(), made.next(), made.next()) else {
            return Err(io::Error::other("three cgroup v1 hierarchies were asked for"));
        };
        // Removed on drop from here on, should a limit not be set.
        let mut cgroup = V1Cgroup { memory, pids, cpu, cpuacct: made.next(), usage_in_cpu: false, removed: false };
        let (memory, pids, cpu) = (cgroup.memory.open()?, cgroup.pids.open()?, cgroup.cpu.open()?);
        let usage_in_cpu = cpu.has("cpuacct.usage");

        // Swap: the memory+swap limit equals the memory limit, so a run can
        // never page out to get more. Without swap accounting (memsw files
        // absent) swappiness 0 keeps the kernel from swapping the cgroup.
        memory.write("memory.limit_in_bytes", limits.memory_bytes.to_string())?;
        if memory.has("memory.memsw.limit_in_bytes") {
            memory.write("memory.memsw.limit_in_bytes", limits.memory_bytes.to_string())?;
        }
        let _ = memory.write("memory.swappiness", "0");
        // Socket buffers: cgroup v1 counts them only once a TCP limit is set,
        // and apart from memory.limit_in_bytes (v2 counts them with the rest).
        // Without it a run queued hundreds of MiB in loopback TCP buffers
        // under a 64 MiB cap. The same cap, and the supervisor stops a run
        // that reaches it (`socket_memory_exhausted`), as v2's OOM killer would.
        if memory.has("memory.kmem.tcp.limit_in_bytes") {
            memory.write("memory.kmem.tcp.limit_in_bytes", limits.memory_bytes.to_string())?;
        }
        pids.write("pids.max", limits.pids.to_string())?;
        cpu.write("cpu.cfs_period_us", CFS_PERIOD_US.to_string())?;
        let quota = ((limits.cpus * CFS_PERIOD_US as f64).round() as u64).max(1000);
        cpu.write("cpu.cfs_quota_us", quota.to_string())?;
        drop((memory, pids, cpu));
        cgroup.usage_in_cpu = usage_in_cpu;
        Ok(cgroup)
    }

    /// Its cgroups, one per hierarchy, in the order they were made.
    fn dirs(&self) -> impl DoubleEndedIterator<Item = &Dir> {
        [&self.memory, &self.pids, &self.cpu].into_iter().chain(self.cpuacct.as_ref())
    }
}

impl RunCgroup for V1Cgroup {
    fn placement(&self) -> io::Result<Placement> {
        self.dirs()
            .map(|dir| dir.open()?.open_file("tasks", rustix::fs::OFlags::WRONLY))
            .collect::<io::Result<_>>()
            .map(Placement::EnterTasks)
    }

    fn cpu_usage(&self) -> Option<Duration> {
        let dir = if self.usage_in_cpu { Some(&self.cpu) } else { self.cpuacct.as_ref() };
        dir?.read_u64("cpuacct.usage").map(Duration::from_nanos)
    }

    fn socket_memory_exhausted(&self) -> bool {
        // failcnt is not kept for this counter by every kernel (6.x stopped);
        // the peak reaching the limit says the same.
        let Ok(memory) = self.memory.open() else { return false };
        let read = |file: &str| memory.read_u64(file);
        read("memory.kmem.tcp.failcnt").is_some_and(|failures| failures > 0)
            || matches!((read("memory.kmem.tcp.max_usage_in_bytes"), read("memory.kmem.tcp.limit_in_bytes")),
                (Some(peak), Some(limit)) if peak >= limit)
    }

    fn stats(&self) -> CgroupStats {
        let memory = self.memory.open().ok();
        let read = |file: &str| memory.as_ref().and_then(|memory| memory.read_u64(file));
        // Socket buffers are the run's memory too: the peak counts them.
        let tcp = read("memory.kmem.tcp.max_usage_in_bytes").unwrap_or(0);
        CgroupStats {
            peak_memory_bytes: read("memory.max_usage_in_bytes").map(|m| m + tcp),
            oom_kills: memory
                .as_ref()
                .and_then(|memory| memory.read_key("memory.oom_control", "oom_kill"))
                .unwrap_or(0),
            // memory+swap reaches its limit with memory (they are equal).
            memory_max_hits: read("memory.failcnt").unwrap_or(0) + read("memory.memsw.failcnt").unwrap_or(0),
            pids_max_hits: self.pids.read_key("pids.events", "max").unwrap_or(0),
            cpu_usage: self.cpu_usage(),
        }
    }

    fn processes(&self) -> Vec<i32> {
        // Every process of the run is in each controller's cgroup; one list suffices.
        self.pids.procs()
    }

    fn kill_all(&self) {
        kill_listed(&|| self.pids.procs());
    }

    fn remove(&mut self) -> io::Result<()> {
        if std::mem::replace(&mut self.removed, true) {
            return Ok(());
        }
        let kill = || {
            kill_listed(&|| self.pids.procs());
        };
        let mut first_error = Ok(());
        for dir in self.dirs().rev() {
            if let Err(e) = remove_dir_retrying(dir.path(), &kill) {
                first_error =
                    first_error.and(Err(io::Error::new(e.kind(), format!("removing {}: {e}", dir.path().display()))));
            }
        }
        first_error
    }

    fn version(&self) -> &'static str {
        "v1"
    }

    fn memory_usage_file(&self) -> PathBuf {
        self.memory.file("memory.usage_in_bytes")
    }

    fn adopt(&self, pid: i32) -> io::Result<()> {
        // One write per hierarchy; the process waits through all of them.
        for dir in self.dirs() {
            dir.open()?.write("cgroup.procs", pid.to_string())?;
        }
        Ok(())
    }

    fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String> {
        if let Some(limit) = memory_bytes {
            // As at creation: memory+swap and socket buffers get the same
            // limit. Memory first: memory+swap may never be under it.
            let memory = self.memory.open().map_err(|e| e.to_string())?;
            let files: Vec<PathBuf> =
                ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"]
                    .into_iter()
                    .filter(|file| memory.has(file))
                    .map(|file| self.memory.file(file))
                    .collect();
            let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
            lower("memory", &self.memory_usage_file(), &files, limit, MIB)?;
        }
        if let Some(limit) = pids {
            lower(
                "processes",
                &self.pids.file("pids.current"),
                &[&self.pids.file("pids.max")],
                limit.into(),
                PROCESSES,
            )?;
        }
        Ok(())
    }
}

impl Drop for V1Cgroup {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}
