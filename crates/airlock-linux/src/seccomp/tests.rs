//! The policy and its compiled filter, checked for every architecture airlock
//! builds for, on whichever machine runs the tests.

use std::collections::BTreeSet;

use super::*;

const EPERM: Action = Action::Errno(1);
const ENOTTY: Action = Action::Errno(25);
const ENOSYS: Action = Action::Errno(38);
const EPROTONOSUPPORT: Action = Action::Errno(93);
const EAFNOSUPPORT: Action = Action::Errno(97);

fn compiled(arch: Arch) -> (Policy, Vec<Instruction>) {
    let policy = Policy::default_policy(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
    let program = compile(&policy).unwrap_or_else(|e| panic!("{arch}: {e}"));
    (policy, program)
}

/// What the compiled filter answers, as an action.
fn run(arch: Arch, program: &[Instruction], nr: u32, args: [u64; 6]) -> Action {
    let ret = evaluate(program, arch.audit_arch(), nr, args).unwrap_or_else(|| panic!("{arch}: no return for {nr}"));
    match ret {
        0x7fff_0000 => Action::Allow,
        0x8000_0000 => Action::KillProcess,
        r if r & 0xffff_0000 == 0x0005_0000 => Action::Errno((r & 0xffff) as u16),
        r => panic!("{arch}: unexpected return {r:#x} for {nr}"),
    }
}

#[test]
fn the_program_built_in_is_the_policy_compiled_for_this_machine() {
    let (policy, program) = compiled(Arch::native());
    assert_eq!(default_program(), program);
    // Printable, for a person reviewing what the sandbox may call.
    let text = policy.to_string();
    assert!(text.starts_with(&format!("{} default: errno:ENOSYS\n", Arch::native())), "{text}");
    assert!(text.lines().any(|l| l.ends_with(" clone3: errno:ENOSYS")), "{text}");
    assert!(text.lines().any(|l| l.trim_start().ends_with(" read: allow")), "{text}");
}

#[test]
fn the_policy_compiles_small_for_every_architecture() {
    for arch in Arch::ALL {
        let (policy, program) = compiled(arch);
        assert!(policy.syscalls.len() > 250, "{arch}: {} syscalls named", policy.syscalls.len());
        // Ranges of syscalls handled alike keep it a few hundred instructions:
        // cheap to load (twice a run) and to run (every syscall of the code).
        assert!(program.len() < 700, "{arch}: {} instructions", program.len());
    }
    assert_ne!(compiled(Arch::X86_64).1, compiled(Arch::Aarch64).1);
}

/// Argument values worth trying for syscall `nr`: every constant its rules
/// compare with (masked and unmasked, with high bits and with the flags a
/// caller adds), and a few others.
fn interesting_args(policy: &Policy, nr: u32) -> Vec<[u64; 6]> {
    let mut per_arg: [BTreeSet<u64>; 6] = Default::default();
    for set in &mut per_arg {
        set.extend([0, 1, 0xffff_ffff]);
    }
    for rule in policy.syscalls.get(&nr).map(|(_, r)| r.as_slice()).unwrap_or_default() {
        for c in &rule.when {
            let set = &mut per_arg[usize::from(c.arg)];
            let values = match &c.test {
                Test::In(v) | Test::NotIn(v) => v.clone(),
                Test::AnyBit(bits) => vec![*bits, !*bits],
                // Pointers whose low or high half alone is zero.
                Test::NonNull => {
                    set.extend([0x1_0000_0000, 0x7fff_0000_1000, 1 << 63]);
                    Vec::new()
                }
            };
            for v in values {
                let v = u64::from(v);
                // SOCK_CLOEXEC and SOCK_NONBLOCK, which the mask drops; high bits the kernel ignores.
                set.extend([v, v | 0x8_0000, v | 0x800, v + 1, v | 0xdead_0000_0000_0000]);
            }
        }
    }
    let mut all = vec![[0u64; 6]];
    for (arg, set) in per_arg.iter().enumerate().take(4) {
        all = all
            .iter()
            .flat_map(|args| {
                set.iter().map(move |v| {
                    let mut next = *args;
                    next[arg] = *v;
                    next
                })
            })
            .collect();
    }
    all
}

#[test]
fn the_program_agrees_with_the_policy_on_every_syscall_and_argument_that_matters() {
    for arch in Arch::ALL {
        let (policy, program) = compiled(arch);
        for nr in 0..1024u32 {
            for args in interesting_args(&policy, nr) {
                assert_eq!(
                    run(arch, &program, nr, args),
                    policy.decide(nr, args),
                    "{arch}: syscall {nr} args {args:x?}"
                );
            }
        }
    }
}

#[test]
fn every_number_the_policy_does_not_name_gets_enosys() {
    for arch in Arch::ALL {
        let (policy, program) = compiled(arch);
        let mut unnamed = 0;
        for nr in (0..2048u32).chain([0x3fff_ffff]) {
            if policy.syscalls.contains_key(&nr) {
                continue;
            }
            unnamed += 1;
            assert_eq!(run(arch, &program, nr, [0; 6]), ENOSYS, "{arch}: {nr} ({:?})", arch.name(nr));
        }
        assert!(unnamed > 1500, "{arch}");
    }
}

#[test]
fn foreign_architectures_and_x32_are_killed() {
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const AUDIT_ARCH_ARM: u32 = 0x4000_0028;
    for arch in Arch::ALL {
        let (policy, program) = compiled(arch);
        let read = policy.number("read").unwrap();
        for foreign in [AUDIT_ARCH_I386, AUDIT_ARCH_ARM, Arch::ALL.iter().find(|a| **a != arch).unwrap().audit_arch()] {
            assert_eq!(evaluate(&program, foreign, read, [0; 6]), Some(Action::KillProcess.ret()), "{arch}");
        }
        if let Some(bit) = arch.x32_bit() {
            assert_eq!(run(arch, &program, read | bit, [0; 6]), Action::KillProcess);
        }
        assert_eq!(run(arch, &program, read, [0; 6]), Action::Allow);
    }
}

#[test]
fn typos_are_caught_and_names_of_one_architecture_are_not() {
    let parse = |text: &str| Policy::parse(text, Arch::Aarch64);
    let err = parse("default_action = \"errno:EPERM\"\n[[allow]]\ncomment = \"x\"\nnames = [\"reed\"]\n");
    assert!(matches!(err, Err(PolicyFileError::UnknownSyscall(n)) if n == "reed"));
    assert!(matches!(parse("default_action = \"errno:EPREM\"\n"), Err(PolicyFileError::BadAction(_))));
    let err = parse(
        "default_action = \"allow\"\n[[rule]]\nsyscalls = [\"ioctl\"]\nwhen = { arg = 1, in = [\"TCGETZ\"] }\naction = \"allow\"\n",
    );
    assert!(matches!(err, Err(PolicyFileError::UnknownSymbol(n)) if n == "TCGETZ"));
    // `open` is x86_64's only: skipped on aarch64, not refused as a typo.
    let policy =
        parse("default_action = \"errno:EPERM\"\n[[allow]]\ncomment = \"x\"\nnames = [\"open\", \"openat\"]\n")
            .unwrap();
    assert_eq!(policy.syscalls.len(), 1);
}

#[test]
fn denied_syscalls_are_denied_on_every_architecture_that_has_them() {
    let denied = [
        "setns",
        "mount",
        "umount2",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "open_tree_attr",
        "mount_setattr",
        "pivot_root",
        "chroot",
        "listmount",
        "statmount",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "keyctl",
        "add_key",
        "request_key",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "iopl",
        "ioperm",
        "name_to_handle_at",
        "open_by_handle_at",
        "pidfd_getfd",
        "process_madvise",
        "kcmp",
        "fanotify_init",
        "memfd_secret",
        "io_setup",
        "io_submit",
        "inotify_init",
        "inotify_init1",
        "inotify_add_watch",
        "mq_open",
        "mq_timedsend",
        "migrate_pages",
        "move_pages",
        "landlock_restrict_self",
    ];
    for arch in Arch::ALL {
        let policy = Policy::default_policy(arch).unwrap();
        for name in denied {
            match arch.number(name) {
                Some(nr) => {
                    let action = policy.decide(nr, [0; 6]);
                    assert!(action == EPERM || action == ENOSYS, "{arch}: {name} is {action}");
                    assert!(
                        policy.syscalls.contains_key(&nr),
                        "{arch}: {name} is denied by being named, not by chance"
                    );
                }
                // Absent here: then it is a syscall elsewhere, never a typo.
                None => assert!(is_known_anywhere(name), "{name} is a syscall nowhere"),
            }
        }
    }
}

#[test]
fn the_issue_s_rules_hold_on_every_architecture() {
    for arch in Arch::ALL {
        let (policy, program) = compiled(arch);
        let call = |name: &str, args: [u64; 6]| {
            let nr = policy.number(name).unwrap_or_else(|| panic!("{arch}: no {name}"));
            run(arch, &program, nr, args)
        };
        let a = |v: &[u64]| {
            let mut args = [0u64; 6];
            args[..v.len()].copy_from_slice(v);
            args
        };
        assert_eq!(call("clone3", a(&[])), ENOSYS);
        assert_eq!(call("clone", a(&[0x1000_0000 | 17])), EPERM, "CLONE_NEWUSER");
        assert_eq!(call("clone", a(&[0x003d_0f00])), Action::Allow, "pthread_create's flags");
        assert_eq!(call("clone", a(&[0x8000 | 17])), EPERM, "CLONE_PARENT");
        assert_eq!(call("unshare", a(&[0x4000_0000])), EPERM, "CLONE_NEWNET");
        // A thread with a descriptor table of its own, either way.
        assert_eq!(call("unshare", a(&[0x400])), EPERM, "CLONE_FILES");
        assert_eq!(call("unshare", a(&[0x200])), Action::Allow, "CLONE_FS");
        assert_eq!(call("clone", a(&[0x0001_0000 | 0x100 | 0x800])), EPERM, "a thread without CLONE_FILES");
        assert_eq!(call("clone", a(&[17])), Action::Allow, "fork");
        // The core-dump limit: read, never set (pointers tested in all 64 bits).
        assert_eq!(call("prlimit64", a(&[0, 4, 0, 0x7fff_0000_2000])), Action::Allow, "reading RLIMIT_CORE");
        for new in [0x7fff_0000_1000, 0x1_0000_0000, 1 << 63] {
            assert_eq!(
                call("prlimit64", a(&[0, 4, new])),
                Action::Errno(0),
                "{arch}: setting RLIMIT_CORE from {new:#x}"
            );
            assert_eq!(call("prlimit64", a(&[0, 4, new, 0x1_0000_0000])), EPERM, "{arch}: and reading it back");
        }
        assert_eq!(call("prlimit64", a(&[0, 7, 0x7fff_0000_1000])), Action::Allow, "setting RLIMIT_NOFILE");
        if policy.number("setrlimit").is_some() {
            assert_eq!(call("setrlimit", a(&[4, 0x7fff_0000_1000])), Action::Errno(0), "setrlimit(RLIMIT_CORE)");
            assert_eq!(call("setrlimit", a(&[7, 0x7fff_0000_1000])), Action::Allow, "setrlimit(RLIMIT_NOFILE)");
        }

        // ioctl: the allowlist, the rest as a descriptor that lacks them.
        for allowed in [0x5401, 0x5413, 0x541B, 0x5421, 0x5451, 0x5450, 0x4004_9409] {
            assert_eq!(call("ioctl", a(&[1, allowed])), Action::Allow, "{arch}: ioctl {allowed:#x}");
            assert_eq!(call("ioctl", a(&[1, allowed | 0xffff_ffff_0000_0000])), Action::Allow, "{allowed:#x}");
        }
        assert_eq!(call("ioctl", a(&[0, 0x5412])), EPERM, "TIOCSTI");
        assert_eq!(call("ioctl", a(&[0, 0xdead_0000_0000_5412])), EPERM, "TIOCSTI with high bits");
        assert_eq!(call("ioctl", a(&[0, 0x541C])), EPERM, "TIOCLINUX");
        for refused in [0x5402u64, 0x5410, 0x5414, 0x8008_6601, 0x4008_6602, 0x5406] {
            // TCSETS, TIOCSPGRP, TIOCSWINSZ, FS_IOC_GETFLAGS/SETFLAGS, TCSETSW
            assert_eq!(call("ioctl", a(&[1, refused])), ENOTTY, "{arch}: ioctl {refused:#x}");
        }

        // socket: families, and within them the protocols TCP, UDP and unix sockets need.
        const SOCK_CLOEXEC_NONBLOCK: u64 = 0x8_0800;
        assert_eq!(call("socket", a(&[1, 1, 0])), Action::Allow, "AF_UNIX stream");
        assert_eq!(call("socket", a(&[1, 5 | SOCK_CLOEXEC_NONBLOCK, 0])), Action::Allow, "AF_UNIX seqpacket");
        assert_eq!(call("socket", a(&[2, 1 | SOCK_CLOEXEC_NONBLOCK, 0])), Action::Allow, "TCP");
        assert_eq!(call("socket", a(&[10, 1, 6])), Action::Allow, "TCP over IPv6");
        assert_eq!(call("socket", a(&[2, 2, 17])), Action::Allow, "UDP");
        assert_eq!(call("socket", a(&[2, 1, 262])), EPROTONOSUPPORT, "MPTCP");
        assert_eq!(call("socket", a(&[10, 2, 136])), EPROTONOSUPPORT, "UDP-Lite");
        assert_eq!(call("socket", a(&[2, 5, 132])), EPROTONOSUPPORT, "SCTP");
        assert_eq!(call("socket", a(&[2, 2, 1])), EPROTONOSUPPORT, "ICMP ping socket");
        assert_eq!(call("socket", a(&[2, 1, 17])), EPROTONOSUPPORT, "a stream socket asking for UDP");
        assert_eq!(call("socket", a(&[2, 3, 1])), EPERM, "raw");
        assert_eq!(call("socket", a(&[1, 1, 1])), EPROTONOSUPPORT, "unix with a protocol");
        assert_eq!(call("socket", a(&[16, 3, 0])), EAFNOSUPPORT, "AF_NETLINK");
        assert_eq!(call("socket", a(&[17, 3, 0])), EAFNOSUPPORT, "AF_PACKET");
        assert_eq!(call("setsockopt", a(&[3, 6, 31])), EPERM, "TCP_ULP");
        assert_eq!(call("setsockopt", a(&[3, 6, 1])), Action::Allow, "TCP_NODELAY");

        // Only the calling process.
        for name in ["prlimit64", "sched_setaffinity", "sched_setattr", "sched_setscheduler", "sched_setparam"] {
            assert_eq!(call(name, a(&[0])), Action::Allow, "{arch}: {name} on the caller");
            assert_eq!(call(name, a(&[1])), EPERM, "{arch}: {name} on init");
            assert_eq!(call(name, a(&[0x1_0000_0000])), Action::Allow, "high bits of a pid_t are not read");
        }
        assert_eq!(call("setpriority", a(&[0, 0, 10])), Action::Allow, "nice");
        assert_eq!(call("setpriority", a(&[0, 1, 19])), EPERM, "PRIO_PROCESS, init");
        assert_eq!(call("setpriority", a(&[2, 0, 19])), EPERM, "PRIO_USER: all of the uid's processes");
        assert_eq!(call("setpriority", a(&[1, 0, 19])), EPERM, "PRIO_PGRP");
        assert_eq!(call("ioprio_set", a(&[1, 0, 0x6000])), Action::Allow);
        assert_eq!(call("ioprio_set", a(&[1, 1, 0x6000])), EPERM);
        assert_eq!(call("ioprio_set", a(&[3, 0, 0x6000])), EPERM, "IOPRIO_WHO_USER");

        // Host-wide pools and watching.
        assert_eq!(call("io_setup", a(&[8, 0])), ENOSYS);
        assert_eq!(call("inotify_init1", a(&[0])), ENOSYS);
        assert_eq!(call("mq_open", a(&[])), ENOSYS);
        assert_eq!(call("fcntl", a(&[3, 1026, 0x8000_0001])), EPERM, "F_NOTIFY");
        assert_eq!(call("fcntl", a(&[3, 1024, 0])), EPERM, "F_SETLEASE");
        assert_eq!(call("fcntl", a(&[3, 2, 1])), Action::Allow, "F_SETFD");
        assert_eq!(call("mmap", a(&[0, 4096, 3, 0x22])), Action::Allow, "anonymous private");
        assert_eq!(call("mmap", a(&[0, 2 << 20, 3, 0x4_0022])), EPERM, "MAP_HUGETLB");
        assert_eq!(call("memfd_create", a(&[0, 4])), EPERM, "MFD_HUGETLB");
        assert_eq!(call("shmget", a(&[0, 1 << 21, 0x800])), EPERM, "SHM_HUGETLB");
        assert_eq!(call("syncfs", a(&[3])), Action::Errno(0), "syncfs does nothing and succeeds");

        assert_eq!(call("personality", a(&[0x0040_0000])), EPERM, "READ_IMPLIES_EXEC");
        assert_eq!(call("personality", a(&[0xffff_ffff])), Action::Allow);
        assert_eq!(call("bpf", a(&[])), EPERM);
        assert_eq!(call("io_uring_setup", a(&[])), EPERM);
    }
}

/// The template's filter: the default, widened by `seccomp/template.toml`.
fn compiled_template(arch: Arch) -> (Policy, Vec<Instruction>) {
    let policy = Policy::template_policy(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
    let program = compile(&policy).unwrap_or_else(|e| panic!("{arch}: {e}"));
    (policy, program)
}

#[test]
fn the_template_program_built_in_is_its_policy_compiled_for_this_machine() {
    assert_eq!(template_program(), compiled_template(Arch::native()).1);
    assert_ne!(template_program(), default_program());
}

#[test]
fn the_template_filter_is_the_default_but_for_what_its_forks_need() {
    const NAMESPACES: u64 =
        0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;
    const CLONE_NEWTIME: u64 = 0x80;
    let widened = [
        "setns",
        "mount",
        "umount2",
        "sethostname",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "unshare",
        "ioctl",
    ];
    for arch in Arch::ALL {
        let (default, _) = compiled(arch);
        let (policy, program) = compiled_template(arch);
        let call = |name: &str, arg0: u64| {
            let nr = policy.number(name).unwrap_or_else(|| panic!("{arch}: no {name}"));
            run(arch, &program, nr, [arg0, 0, 0, 0, 0, 0])
        };
        // Every other syscall, with every argument its rules compare, is decided as the default decides.
        for nr in 0..1024u32 {
            let name = arch.name(nr).unwrap_or_default();
            for args in interesting_args(&policy, nr).into_iter().chain(interesting_args(&default, nr)) {
                assert_eq!(run(arch, &program, nr, args), policy.decide(nr, args), "{arch}: {name} {args:x?}");
                if !widened.contains(&name) {
                    assert_eq!(policy.decide(nr, args), default.decide(nr, args), "{arch}: {name} {args:x?}");
                }
            }
        }
        for name in &widened[..7] {
            assert_eq!(call(name, 0), Action::Allow, "{arch}: {name}");
        }
        assert_eq!(call("unshare", NAMESPACES), Action::Allow, "{arch}: unshare of every namespace a fork makes");
        assert_eq!(call("unshare", 0x1000_0000), Action::Allow, "{arch}: the nested user namespace");
        assert_eq!(call("unshare", CLONE_NEWTIME), EPERM, "{arch}: a time namespace");
        let ioctl = |request: u64| {
            let nr = policy.number("ioctl").unwrap_or_else(|| panic!("{arch}: no ioctl"));
            (run(arch, &program, nr, [3, request, 0, 0, 0, 0]), default.decide(nr, [3, request, 0, 0, 0, 0]))
        };
        assert_eq!(ioctl(0x8914).0, Action::Allow, "{arch}: a fork's loopback up");
        assert_ne!(ioctl(0x8914).1, Action::Allow, "{arch}: the default refuses it");
        assert_eq!(ioctl(0x5412).0, ioctl(0x5412).1, "{arch}: TIOCSTI as the default decides");
        assert_eq!(call("unshare", NAMESPACES | CLONE_NEWTIME), EPERM, "{arch}: with a time namespace");
        // What stays refused: namespaces through clone, mounts by other means, a new root.
        assert_eq!(call("clone", 0x2000_0000 | 17), EPERM, "{arch}: clone with CLONE_NEWPID");
        assert_eq!(call("clone", 0x1000_0000 | 17), EPERM, "{arch}: clone with CLONE_NEWUSER");
        assert_eq!(call("clone3", 0), ENOSYS, "{arch}: clone3");
        for name in [
            "pivot_root",
            "chroot",
            "fsopen",
            "fsmount",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "ptrace",
            "bpf",
            "setdomainname",
            "keyctl",
        ] {
            if policy.number(name).is_some() {
                assert_eq!(call(name, 0), EPERM, "{arch}: {name}");
            }
        }
    }
}

#[test]
fn a_widening_file_widens_only_what_it_names_and_only_over_the_default() {
    let base = || Policy::default_policy(Arch::X86_64).unwrap();
    let rule = |name: &str| format!("base = \"default.toml\"\n[[rule]]\nsyscalls = [\"{name}\"]\naction = \"allow\"\n");
    // `read` is allowed outright already: naming it is a mistake, not a no-op.
    assert!(matches!(base().widened(&rule("read")), Err(PolicyFileError::NotWidening(n)) if n == "read"));
    assert!(matches!(base().widened(&rule("reed")), Err(PolicyFileError::UnknownSyscall(n)) if n == "reed"));
    let other_base = "base = \"strict.toml\"\n";
    assert!(matches!(base().widened(other_base), Err(PolicyFileError::UnknownBase(b)) if b == "strict.toml"));
    assert!(matches!(base().widened("base = \"default.toml\"\nallow = []\n"), Err(PolicyFileError::Toml(_))));
    let nr = base().number("bpf").unwrap();
    assert_eq!(base().decide(nr, [0; 6]), EPERM);
    assert_eq!(base().widened(&rule("bpf")).unwrap().decide(nr, [0; 6]), Action::Allow);
}
