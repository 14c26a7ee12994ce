//! rlimits: a second layer under the cgroup, per process.

use airlock_policy::Policy;
use rustix::process::{Resource, Rlimit as Limit, setrlimit};

use crate::protocol::{Failure, Rlimit, RlimitResource};

/// The rlimits for a policy. Supervisor side. `without_cgroups` adds the
/// weaker per-process stand-ins for the cgroup's memory and pids limits.
pub fn for_policy(policy: &Policy, without_cgroups: bool) -> Vec<Rlimit> {
    let l = &policy.limits;
    let both = |resource, value| Rlimit { resource, soft: value, hard: value };
    // A second past the CPU limit, so the supervisor's own check (which sums
    // the whole run) normally fires first and names the limit.
    let cpu_seconds = l.cpu_time.as_secs() + 1;
    let mut limits = vec![
        // 1 byte, not 0: the kernel writes no core file below a page, and
        // at exactly 1 it hands no crash to a piped core_pattern either,
        // which at 0 it does, starting the host's handler (systemd-coredump,
        // apport) as root for every crash of the code. The code may not
        // change it (seccomp/default.toml).
        both(RlimitResource::Core, 1),
        both(RlimitResource::NoFile, u64::from(l.open_files)),
        // As large as the whole work tmpfs: a full disk shows as ENOSPC,
        // not as a smaller file-size limit that would hide which was reached.
        both(RlimitResource::FileSize, l.disk_bytes + crate::mounts::LAYOUT_BYTES),
        Rlimit { resource: RlimitResource::Cpu, soft: cpu_seconds, hard: cpu_seconds + 1 },
        both(RlimitResource::MemLock, 64 * 1024),
    ];
    if without_cgroups {
        limits.push(both(RlimitResource::AddressSpace, l.memory_bytes));
        limits.push(both(RlimitResource::NProc, u64::from(l.pids)));
    }
    limits
}

/// Child side: applies them.
pub fn apply(limits: &[Rlimit]) -> Result<(), Failure> {
    for limit in limits {
        let resource = match limit.resource {
            RlimitResource::Core => Resource::Core,
            RlimitResource::NoFile => Resource::Nofile,
            RlimitResource::FileSize => Resource::Fsize,
            RlimitResource::Cpu => Resource::Cpu,
            RlimitResource::NProc => Resource::Nproc,
            RlimitResource::AddressSpace => Resource::As,
            RlimitResource::MemLock => Resource::Memlock,
        };
        let wanted = Limit { current: Some(limit.soft), maximum: Some(limit.hard) };
        // Already so (a fork of a template made with the same limits): not
        // set again, since the filter the template runs under refuses to
        // set the core-dump limit at all.
        if rustix::process::getrlimit(resource) == wanted {
            continue;
        }
        setrlimit(resource, wanted)
            .map_err(|e| Failure::new("set rlimits", format!("{:?}", limit.resource), &e.into()))?;
    }
    Ok(())
}
