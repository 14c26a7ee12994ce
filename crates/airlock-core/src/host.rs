//! What this host has, for checking policies against it: the same facts
//! whichever backend runs the code.

use std::fs;

use airlock_policy::HostFacts;

/// Memory, CPUs, pid_max and nr_open of this host. A fact that cannot be
/// read takes the kernel's default (or 0 memory, which refuses every policy
/// rather than allow one the host may not have room for).
pub fn facts() -> HostFacts {
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let read =
        |path: &str, default: u32| fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(default);
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    HostFacts {
        memory_bytes: memory_kib * 1024,
        cpus,
        pid_max: read("/proc/sys/kernel/pid_max", 32_768),
        nr_open: read("/proc/sys/fs/nr_open", 1 << 20),
    }
}
