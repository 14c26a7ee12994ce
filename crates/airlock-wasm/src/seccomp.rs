//! The worker's seccomp filter: a policy written as data
//! (`seccomp/worker.toml`), compiled by the Linux backend's compiler once per
//! process, installed by the worker before the guest's first instruction.
//!
//! Compiled here at run time rather than by a build script: the compiler
//! lives in airlock-linux, which a build script could only reach by building
//! the whole Linux backend a second time for the build machine. Compiling
//! takes well under a millisecond, once.

use airlock_linux::seccomp::{Arch, Instruction, Policy, PolicyFileError, compile};

/// The worker's policy, as shipped.
pub const WORKER_POLICY: &str = include_str!("../seccomp/worker.toml");

/// The worker's policy, parsed for this machine's architecture.
pub fn worker_policy() -> Result<Policy, PolicyFileError> {
    Policy::parse(WORKER_POLICY, Arch::native())
}

/// The worker's filter, compiled.
pub fn worker_filter() -> Result<Vec<Instruction>, PolicyFileError> {
    compile(&worker_policy()?)
}

#[cfg(test)]
mod tests {
    use airlock_linux::seccomp::Action;

    use super::*;

    fn decide(name: &str, args: [u64; 6]) -> Option<Action> {
        let policy = worker_policy().unwrap();
        policy.number(name).map(|nr| policy.decide(nr, args))
    }

    #[test]
    fn the_policy_compiles() {
        let program = worker_filter().unwrap();
        assert!(!program.is_empty() && program.len() < 4096);
    }

    #[test]
    fn no_process_no_program_no_namespace_no_socket() {
        for name in [
            "execve",
            "execveat",
            "fork",
            "vfork",
            "unshare",
            "setns",
            "socket",
            "socketpair",
            "connect",
            "bind",
            "listen",
            "accept",
            "accept4",
            "kill",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "pidfd_open",
            "pidfd_getfd",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "open_tree",
            "move_mount",
            "fsopen",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "keyctl",
            "add_key",
            "setuid",
            "setresuid",
            "setgroups",
            "capset",
            "setrlimit",
            "prctl",
            "personality",
            "chmod",
            "fchmod",
            "fchown",
            "mknodat",
            "landlock_create_ruleset",
            "seccomp",
            "init_module",
            "kexec_load",
            "reboot",
        ] {
            if let Some(action) = decide(name, [0; 6]) {
                assert_ne!(action, Action::Allow, "{name} must not be allowed");
            }
        }
        // Not even a thread: the worker is one.
        const CLONE_VM: u64 = 0x100;
        const CLONE_THREAD: u64 = 0x1_0000;
        for name in ["clone", "clone3"] {
            assert_ne!(decide(name, [CLONE_VM | CLONE_THREAD, 0, 0, 0, 0, 0]), Some(Action::Allow), "{name}");
        }
    }
}
