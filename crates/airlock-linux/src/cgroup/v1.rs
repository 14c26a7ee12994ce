//! cgroup v1: a directory per controller (memory, pids, cpu, and cpuacct for
//! usage when it is mounted apart from cpu).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    CgroupLimits, CgroupStats, MIB, PROCESSES, Placement, RunCgroup, kill_listed, kill_procs, list_procs, lower,
    open_for_helper, read_key, read_u64, remove_dir_retrying, write,
};

/// The CFS period airlock uses for CPU quotas, in microseconds.
const CFS_PERIOD_US: u64 = 100_000;

pub struct V1Cgroup {
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    /// Where cpuacct.usage is: the cpuacct hierarchy, or cpu's when co-mounted.
    cpuacct: Option<PathBuf>,
    /// Every directory made, for removal in reverse order.
    made: Vec<PathBuf>,
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
        let mut cgroup = V1Cgroup {
            memory: memory.join(name),
            pids: pids.join(name),
            cpu: cpu.join(name),
            cpuacct: None,
            made: Vec::new(),
        };
        let mut dirs = vec![cgroup.memory.clone(), cgroup.pids.clone(), cgroup.cpu.clone()];
        if let Some(acct) = cpuacct.filter(|a| *a != cpu) {
            dirs.push(acct.join(name));
        }
        for dir in &dirs {
            // A failure part-way leaves `made` for Drop to remove.
            fs::create_dir(dir).map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
            cgroup.made.push(dir.clone());
        }
        cgroup.cpuacct =
            if cgroup.cpu.join("cpuacct.usage").exists() { Some(cgroup.cpu.clone()) } else { dirs.get(3).cloned() };

        // Swap: the memory+swap limit equals the memory limit, so a run can
        // never page out to get more. Without swap accounting (memsw files
        // absent) swappiness 0 keeps the kernel from swapping the cgroup.
        write(&cgroup.memory.join("memory.limit_in_bytes"), limits.memory_bytes.to_string())?;
        let memsw = cgroup.memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, limits.memory_bytes.to_string())?;
        }
        let _ = write(&cgroup.memory.join("memory.swappiness"), "0");
        // Socket buffers: cgroup v1 counts them only once a TCP limit is set,
        // and apart from memory.limit_in_bytes (v2 counts them with the rest).
        // Without it a run queued hundreds of MiB in loopback TCP buffers
        // under a 64 MiB cap. The same cap, and the supervisor stops a run
        // that reaches it (`socket_memory_exhausted`), as v2's OOM killer would.
        let tcp = cgroup.memory.join("memory.kmem.tcp.limit_in_bytes");
        if tcp.exists() {
            write(&tcp, limits.memory_bytes.to_string())?;
        }
        write(&cgroup.pids.join("pids.max"), limits.pids.to_string())?;
        write(&cgroup.cpu.join("cpu.cfs_period_us"), CFS_PERIOD_US.to_string())?;
        let quota = ((limits.cpus * CFS_PERIOD_US as f64).round() as u64).max(1000);
        write(&cgroup.cpu.join("cpu.cfs_quota_us"), quota.to_string())?;
        Ok(cgroup)
    }
}

impl RunCgroup for V1Cgroup {
    fn placement(&self) -> io::Result<Placement> {
        self.made
            .iter()
            .map(|dir| open_for_helper(&dir.join("tasks"), rustix::fs::OFlags::WRONLY))
            .collect::<io::Result<_>>()
            .map(Placement::EnterTasks)
    }

    fn cpu_usage(&self) -> Option<Duration> {
        read_u64(&self.cpuacct.as_ref()?.join("cpuacct.usage")).map(Duration::from_nanos)
    }

    fn socket_memory_exhausted(&self) -> bool {
        // failcnt is not kept for this counter by every kernel (6.x stopped);
        // the peak reaching the limit says the same.
        let read = |file: &str| read_u64(&self.memory.join(file));
        read("memory.kmem.tcp.failcnt").is_some_and(|failures| failures > 0)
            || matches!((read("memory.kmem.tcp.max_usage_in_bytes"), read("memory.kmem.tcp.limit_in_bytes")),
                (Some(peak), Some(limit)) if peak >= limit)
    }

    fn stats(&self) -> CgroupStats {
        // Socket buffers are the run's memory too: the peak counts them.
        let tcp = read_u64(&self.memory.join("memory.kmem.tcp.max_usage_in_bytes")).unwrap_or(0);
        CgroupStats {
            peak_memory_bytes: read_u64(&self.memory.join("memory.max_usage_in_bytes")).map(|m| m + tcp),
            oom_kills: read_key(&self.memory.join("memory.oom_control"), "oom_kill").unwrap_or(0),
            // memory+swap reaches its limit with memory (they are equal).
            memory_max_hits: read_u64(&self.memory.join("memory.failcnt")).unwrap_or(0)
                + read_u64(&self.memory.join("memory.memsw.failcnt")).unwrap_or(0),
            pids_max_hits: read_key(&self.pids.join("pids.events"), "max").unwrap_or(0),
            cpu_usage: self.cpu_usage(),
        }
    }

    fn processes(&self) -> Vec<i32> {
        // Every process of the run is in each controller's cgroup; one list suffices.
        list_procs(&self.pids)
    }

    fn kill_all(&self) {
        kill_listed(&self.pids);
    }

    fn remove(&mut self) -> io::Result<()> {
        kill_procs(&self.pids);
        let mut first_error = Ok(());
        while let Some(dir) = self.made.pop() {
            if let Err(e) = remove_dir_retrying(&dir) {
                first_error =
                    first_error.and(Err(io::Error::new(e.kind(), format!("removing {}: {e}", dir.display()))));
            }
        }
        first_error
    }

    fn version(&self) -> &'static str {
        "v1"
    }

    fn memory_usage_file(&self) -> PathBuf {
        self.memory.join("memory.usage_in_bytes")
    }

    fn adopt(&self, pid: i32) -> io::Result<()> {
        // One write per hierarchy; the process waits through all of them.
        for dir in &self.made {
            write(&dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    fn lower_limits(&self, memory_bytes: Option<u64>, pids: Option<u32>) -> Result<(), String> {
        if let Some(limit) = memory_bytes {
            // As at creation: memory+swap and socket buffers get the same
            // limit. Memory first: memory+swap may never be under it.
            let files: Vec<PathBuf> =
                ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"]
                    .iter()
                    .map(|file| self.memory.join(file))
                    .filter(|path| path.exists())
                    .collect();
            let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
            lower("memory", &self.memory_usage_file(), &files, limit, MIB)?;
        }
        if let Some(limit) = pids {
            lower(
                "processes",
                &self.pids.join("pids.current"),
                &[&self.pids.join("pids.max")],
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
