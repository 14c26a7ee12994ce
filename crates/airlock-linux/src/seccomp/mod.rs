//! The seccomp filter: a policy written as data (`seccomp/default.toml`),
//! compiled to classic BPF here in the supervisor, installed by the helper as
//! the last step before exec.
//!
//! The policy is an allowlist. Before any rule the filter kills on a foreign
//! architecture and on x32 syscall numbers; then a binary search over the
//! syscall number reaches each syscall's rules; anything unlisted fails with
//! the policy's default action.

mod compile;

#[cfg(target_arch = "aarch64")]
#[path = "table_aarch64.rs"]
mod table;
#[cfg(target_arch = "x86_64")]
#[path = "table_x86_64.rs"]
mod table;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use compile::{Instruction, compile, evaluate};

/// The default policy, as shipped.
pub const DEFAULT_POLICY: &str = include_str!("../../seccomp/default.toml");

/// The default policy compiled to BPF by the build script (build.rs), which
/// leaves it at the crate root as `DEFAULT_SECCOMP_BPF`.
pub fn default_program() -> Vec<Instruction> {
    // build.rs wrote whole instructions; an empty program would fail loudly at install.
    Instruction::from_bytes(crate::DEFAULT_SECCOMP_BPF).unwrap_or_default()
}

/// What the filter does with a syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Allow,
    Errno(u16),
    KillProcess,
}

impl Action {
    /// The `SECCOMP_RET_*` value.
    pub fn ret(self) -> u32 {
        const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
        const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
        const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
        match self {
            Action::Allow => SECCOMP_RET_ALLOW,
            Action::Errno(e) => SECCOMP_RET_ERRNO | u32::from(e),
            Action::KillProcess => SECCOMP_RET_KILL_PROCESS,
        }
    }

    fn parse(text: &str) -> Result<Action, PolicyFileError> {
        match text {
            "allow" => Ok(Action::Allow),
            "kill" => Ok(Action::KillProcess),
            _ => {
                let name = text.strip_prefix("errno:").ok_or_else(|| PolicyFileError::BadAction(text.to_owned()))?;
                ERRNOS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| Action::Errno(*v))
                    .ok_or_else(|| PolicyFileError::BadAction(text.to_owned()))
            }
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Allow => f.write_str("allow"),
            Action::KillProcess => f.write_str("kill"),
            Action::Errno(e) => match ERRNOS.iter().find(|(_, v)| v == e) {
                Some((name, _)) => write!(f, "errno:{name}"),
                None => write!(f, "errno:{e}"),
            },
        }
    }
}

const ERRNOS: [(&str, u16); 4] = [("EPERM", 1), ("EACCES", 13), ("ENOSYS", 38), ("EAFNOSUPPORT", 97)];

/// Named constants a policy may use in conditions.
const SYMBOLS: [(&str, u32); 15] = [
    ("CLONE_NEWTIME", 0x0000_0080),
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
    ("TIOCSTI", 0x5412),
    ("TIOCLINUX", 0x541C),
    ("AF_UNIX", 1),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("PER_LINUX", 0),
    ("PER_QUERY", 0xffff_ffff),
];

/// A test on the low 32 bits of one syscall argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The argument is one of these values.
    In { arg: u8, values: Vec<u32> },
    /// The argument is none of these values.
    NotIn { arg: u8, values: Vec<u32> },
    /// The argument has any of these bits set.
    AnyBit { arg: u8, mask: u32 },
}

/// One rule for one syscall: when the condition holds (or always), the action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub when: Option<Condition>,
    pub action: Action,
}

/// A policy ready to compile: for each syscall number, its rules in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub default_action: Action,
    /// Syscall number to (name, rules). A syscall allowed outright has one
    /// unconditional `Allow` rule.
    pub syscalls: BTreeMap<u32, (String, Vec<Rule>)>,
}

/// A policy file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("the seccomp policy is not valid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("unknown action {0:?}: use allow, kill, or errno:NAME (EPERM, EACCES, ENOSYS, EAFNOSUPPORT)")]
    BadAction(String),
    #[error("unknown constant {0:?} in a condition")]
    UnknownSymbol(String),
    #[error("syscall {0:?} is listed twice as allowed, or allowed and also given rules")]
    Duplicate(String),
    #[error("syscall {0:?} is not a syscall on any architecture airlock knows")]
    UnknownSyscall(String),
    #[error("condition on argument {0}: syscalls have arguments 0 to 5")]
    BadArgument(u8),
    #[error("a condition needs exactly one of `in`, `not_in` or `any_bit`")]
    BadCondition,
    #[error("the compiled filter has {0} instructions, more than the kernel's limit of 4096")]
    TooLong(usize),
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    default_action: String,
    #[serde(default)]
    allow: Vec<AllowGroup>,
    #[serde(default)]
    rule: Vec<RuleEntry>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct AllowGroup {
    #[allow(dead_code)]
    comment: String,
    names: Vec<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    syscalls: Vec<String>,
    when: Option<ConditionEntry>,
    action: String,
    #[allow(dead_code)]
    comment: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ConditionEntry {
    arg: u8,
    #[serde(rename = "in")]
    is_in: Option<Vec<String>>,
    not_in: Option<Vec<String>>,
    any_bit: Option<Vec<String>>,
}

fn symbol(name: &str) -> Result<u32, PolicyFileError> {
    SYMBOLS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| PolicyFileError::UnknownSymbol(name.to_owned()))
}

fn symbols(names: &[String]) -> Result<Vec<u32>, PolicyFileError> {
    names.iter().map(|n| symbol(n)).collect()
}

/// Names known on some architecture; a name known nowhere is a typo.
fn is_known_anywhere(name: &str) -> bool {
    number(name).is_some() || OTHER_ARCH_NAMES.contains(&name)
}

/// Syscalls the policy names that exist on x86_64 but not on aarch64: skipped
/// there rather than refused as typos.
const OTHER_ARCH_NAMES: [&str; 30] = [
    "open",
    "stat",
    "lstat",
    "access",
    "pipe",
    "select",
    "dup2",
    "fork",
    "vfork",
    "creat",
    "readlink",
    "getdents",
    "mkdir",
    "rmdir",
    "rename",
    "link",
    "unlink",
    "symlink",
    "chmod",
    "chown",
    "lchown",
    "utime",
    "utimes",
    "futimesat",
    "mknod",
    "poll",
    "epoll_create",
    "epoll_wait",
    "signalfd",
    "eventfd",
];

fn number(name: &str) -> Option<u32> {
    table::SYSCALLS.iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
}

impl Policy {
    /// Reads a policy file, resolving names for this architecture.
    pub fn parse(text: &str) -> Result<Policy, PolicyFileError> {
        let file: PolicyFile = toml::from_str(text)?;
        let mut syscalls: BTreeMap<u32, (String, Vec<Rule>)> = BTreeMap::new();
        for group in &file.allow {
            for name in &group.names {
                if !is_known_anywhere(name) {
                    return Err(PolicyFileError::UnknownSyscall(name.clone()));
                }
                let Some(nr) = number(name) else { continue };
                if syscalls.insert(nr, (name.clone(), vec![Rule { when: None, action: Action::Allow }])).is_some() {
                    return Err(PolicyFileError::Duplicate(name.clone()));
                }
            }
        }
        let mut ruled: BTreeMap<u32, (String, Vec<Rule>)> = BTreeMap::new();
        for entry in &file.rule {
            let action = Action::parse(&entry.action)?;
            let when = entry.when.as_ref().map(condition).transpose()?;
            for name in &entry.syscalls {
                if !is_known_anywhere(name) {
                    return Err(PolicyFileError::UnknownSyscall(name.clone()));
                }
                let Some(nr) = number(name) else { continue };
                if syscalls.contains_key(&nr) {
                    return Err(PolicyFileError::Duplicate(name.clone()));
                }
                ruled
                    .entry(nr)
                    .or_insert_with(|| (name.clone(), Vec::new()))
                    .1
                    .push(Rule { when: when.clone(), action });
            }
        }
        syscalls.extend(ruled);
        Ok(Policy { default_action: Action::parse(&file.default_action)?, syscalls })
    }

    /// The shipped default policy.
    pub fn default_policy() -> Result<Policy, PolicyFileError> {
        Policy::parse(DEFAULT_POLICY)
    }

    /// What the policy decides for syscall `nr` with these arguments (low 32
    /// bits), evaluated on the data rather than the BPF; tests compare the two.
    pub fn decide(&self, nr: u32, args: [u64; 6]) -> Action {
        let Some((_, rules)) = self.syscalls.get(&nr) else {
            return self.default_action;
        };
        for rule in rules {
            let holds = match &rule.when {
                None => true,
                Some(Condition::In { arg, values }) => values.contains(&(args[usize::from(*arg)] as u32)),
                Some(Condition::NotIn { arg, values }) => !values.contains(&(args[usize::from(*arg)] as u32)),
                Some(Condition::AnyBit { arg, mask }) => (args[usize::from(*arg)] as u32) & mask != 0,
            };
            if holds {
                return rule.action;
            }
        }
        self.default_action
    }

    /// The syscall number for `name` on this architecture.
    pub fn number(name: &str) -> Option<u32> {
        number(name)
    }
}

fn condition(entry: &ConditionEntry) -> Result<Condition, PolicyFileError> {
    if entry.arg > 5 {
        return Err(PolicyFileError::BadArgument(entry.arg));
    }
    let arg = entry.arg;
    match (&entry.is_in, &entry.not_in, &entry.any_bit) {
        (Some(v), None, None) => Ok(Condition::In { arg, values: symbols(v)? }),
        (None, Some(v), None) => Ok(Condition::NotIn { arg, values: symbols(v)? }),
        (None, None, Some(v)) => Ok(Condition::AnyBit { arg, mask: symbols(v)?.into_iter().fold(0, |a, b| a | b) }),
        _ => Err(PolicyFileError::BadCondition),
    }
}

impl fmt::Display for Policy {
    /// One line per syscall: the form the security tests print and check.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "default: {}", self.default_action)?;
        for (nr, (name, rules)) in &self.syscalls {
            write!(f, "{nr:>4} {name}:")?;
            for rule in rules {
                match &rule.when {
                    None => write!(f, " {}", rule.action)?,
                    Some(c) => write!(f, " [{c:?}] {};", rule.action)?,
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_built_in_is_the_policy_compiled() {
        let policy = Policy::default_policy().unwrap();
        assert_eq!(default_program(), compile(&policy).unwrap());
        // Printable, for a person reviewing what the sandbox may call.
        let text = policy.to_string();
        assert!(text.starts_with("default: errno:EPERM\n"), "{text}");
        assert!(text.lines().any(|l| l.ends_with(" clone3: errno:ENOSYS")), "{text}");
        assert!(text.lines().any(|l| l.trim_start().ends_with(" read: allow")), "{text}");
    }

    #[test]
    fn the_default_policy_parses() {
        let policy = Policy::default_policy().unwrap();
        assert_eq!(policy.default_action, Action::Errno(1));
        assert!(policy.syscalls.len() > 200);
    }

    #[test]
    fn typos_are_caught() {
        let err = Policy::parse("default_action = \"errno:EPERM\"\n[[allow]]\ncomment = \"x\"\nnames = [\"reed\"]\n");
        assert!(matches!(err, Err(PolicyFileError::UnknownSyscall(n)) if n == "reed"));
        let err = Policy::parse("default_action = \"errno:EPREM\"\n");
        assert!(matches!(err, Err(PolicyFileError::BadAction(_))));
    }

    #[test]
    fn denied_syscalls_are_not_allowed() {
        let policy = Policy::default_policy().unwrap();
        for name in [
            "setns",
            "mount",
            "umount2",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "pivot_root",
            "chroot",
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
        ] {
            let Some(nr) = Policy::number(name) else {
                continue;
            };
            assert_ne!(policy.decide(nr, [0; 6]), Action::Allow, "{name} must not be allowed");
        }
    }
}
