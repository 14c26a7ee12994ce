//! The seccomp filter: a policy written as data (`seccomp/default.toml`),
//! compiled to classic BPF at build time (build.rs), installed by the helper
//! as the last step before exec.
//!
//! The policy is an allowlist, down to arguments where a syscall multiplexes
//! (ioctl requests, socket protocols, fcntl commands, the pid a scheduling
//! call acts on). Before any rule the filter kills on a foreign architecture
//! and on x32 syscall numbers; then a binary search over the syscall number
//! reaches each syscall's rules. A number the policy names but does not
//! allow gets the rule's errno (EPERM for what the sandbox forbids); a
//! number it does not name at all (a syscall newer than the policy, or none)
//! gets the default, ENOSYS, which is what libc's fallbacks expect.
//!
//! Names are resolved per architecture ([`Arch`]), so the same policy
//! compiles, and is tested, for x86_64 and aarch64 on either.

mod compile;
#[path = "table_aarch64.rs"]
mod table_aarch64;
#[path = "table_x86_64.rs"]
mod table_x86_64;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use compile::{Instruction, compile, evaluate};

/// The default policy, as shipped.
pub const DEFAULT_POLICY: &str = include_str!("../../seccomp/default.toml");

/// The forked mode's template policy, as shipped: the default widened by
/// the rules of `seccomp/template.toml` ([`Policy::template_policy`]).
pub const TEMPLATE_POLICY: &str = include_str!("../../seccomp/template.toml");

/// The base a widening policy file may name: the only one shipped.
const TEMPLATE_BASE: &str = "default.toml";

/// The default policy compiled to BPF for this build's architecture by the
/// build script (build.rs), which leaves it at the crate root as
/// `DEFAULT_SECCOMP_BPF`.
pub fn default_program() -> Vec<Instruction> {
    // build.rs wrote whole instructions; an empty program would fail loudly at install.
    Instruction::from_bytes(crate::DEFAULT_SECCOMP_BPF).unwrap_or_default()
}

/// The template policy compiled to BPF for this build's architecture by the
/// build script, as `TEMPLATE_SECCOMP_BPF` at the crate root.
pub fn template_program() -> Vec<Instruction> {
    Instruction::from_bytes(crate::TEMPLATE_SECCOMP_BPF).unwrap_or_default()
}

/// An architecture the filter is built for: its syscall numbers and the
/// `AUDIT_ARCH_*` value the kernel reports in `seccomp_data.arch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// Every architecture airlock builds a filter for.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture this code was compiled for.
    pub const fn native() -> Arch {
        #[cfg(target_arch = "x86_64")]
        return Arch::X86_64;
        #[cfg(target_arch = "aarch64")]
        return Arch::Aarch64;
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        compile_error!("airlock-linux has seccomp syscall tables for x86_64 and aarch64 only");
    }

    /// By Rust's name for it (`CARGO_CFG_TARGET_ARCH`).
    pub fn from_target(name: &str) -> Option<Arch> {
        match name {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// `AUDIT_ARCH_X86_64` or `AUDIT_ARCH_AARCH64`.
    pub fn audit_arch(self) -> u32 {
        match self {
            Arch::X86_64 => 0xC000_003E,
            Arch::Aarch64 => 0xC000_00B7,
        }
    }

    /// x86_64's x32 ABI: its syscalls are x86_64 numbers with this bit set.
    pub fn x32_bit(self) -> Option<u32> {
        match self {
            Arch::X86_64 => Some(0x4000_0000),
            Arch::Aarch64 => None,
        }
    }

    fn table(self) -> &'static [(&'static str, u32)] {
        match self {
            Arch::X86_64 => table_x86_64::SYSCALLS,
            Arch::Aarch64 => table_aarch64::SYSCALLS,
        }
    }

    /// The number of syscall `name` on this architecture.
    pub fn number(self, name: &str) -> Option<u32> {
        self.table().iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
    }

    /// The name of syscall `nr` on this architecture.
    pub fn name(self, nr: u32) -> Option<&'static str> {
        self.table().iter().find(|(_, n)| *n == nr).map(|(name, _)| *name)
    }

    /// Every syscall number this architecture's table knows.
    pub fn numbers(self) -> impl Iterator<Item = u32> {
        self.table().iter().map(|(_, nr)| *nr)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        })
    }
}

/// Whether `name` is a syscall on some architecture airlock knows; a name
/// known nowhere is a typo. A name absent on one architecture only (`open`
/// on aarch64) is skipped there.
fn is_known_anywhere(name: &str) -> bool {
    Arch::ALL.iter().any(|arch| arch.number(name).is_some())
}

/// What the filter does with a syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Allow,
    /// Fails with this errno without running. `Errno(0)` skips the call and
    /// returns 0 (`skip` in the policy).
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
            "skip" => Ok(Action::Errno(0)),
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
            Action::Errno(0) => f.write_str("skip"),
            Action::Errno(e) => match ERRNOS.iter().find(|(_, v)| v == e) {
                Some((name, _)) => write!(f, "errno:{name}"),
                None => write!(f, "errno:{e}"),
            },
        }
    }
}

/// The errnos a policy may name (the same numbers on every architecture airlock knows).
const ERRNOS: [(&str, u16); 6] =
    [("EPERM", 1), ("EACCES", 13), ("ENOTTY", 25), ("ENOSYS", 38), ("EPROTONOSUPPORT", 93), ("EAFNOSUPPORT", 97)];

/// Named constants a policy may use in conditions. The kernel's values, the
/// same on x86_64 and aarch64 (both use the generic ioctl and fcntl numbers).
const SYMBOLS: &[(&str, u32)] = &[
    ("CLONE_NEWTIME", 0x0000_0080),
    ("CLONE_PARENT", 0x0000_8000),
    ("CLONE_FILES", 0x0000_0400),
    ("CLONE_THREAD", 0x0001_0000),
    ("RLIMIT_CORE", 4),
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
    // ioctl requests (asm-generic/ioctls.h, linux/fs.h, linux/sockios.h)
    ("TCGETS", 0x5401),
    ("TIOCGPGRP", 0x540F),
    ("TIOCSTI", 0x5412),
    ("TIOCGWINSZ", 0x5413),
    ("FIONREAD", 0x541B),
    ("TIOCLINUX", 0x541C),
    ("FIONBIO", 0x5421),
    ("TCGETS2", 0x802C_542A),
    ("FIONCLEX", 0x5450),
    ("FIOCLEX", 0x5451),
    ("FICLONE", 0x4004_9409),
    ("FICLONERANGE", 0x4020_940D),
    ("SIOCGIFNAME", 0x8910),
    ("SIOCGIFFLAGS", 0x8913),
    ("SIOCSIFFLAGS", 0x8914),
    ("SIOCGIFINDEX", 0x8933),
    // socket families, types, protocols
    ("AF_UNIX", 1),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("SOCK_STREAM", 1),
    ("SOCK_DGRAM", 2),
    ("SOCK_RAW", 3),
    ("SOCK_SEQPACKET", 5),
    ("SOCK_TYPE_MASK", 0xf),
    ("IPPROTO_IP", 0),
    ("IPPROTO_TCP", 6),
    ("IPPROTO_UDP", 17),
    ("SOL_TCP", 6),
    ("TCP_ULP", 31),
    // fcntl commands
    ("F_SETLEASE", 1024),
    ("F_NOTIFY", 1026),
    // hugetlb flags of mmap, memfd_create and shmget
    ("MAP_HUGETLB", 0x0004_0000),
    ("MFD_HUGETLB", 0x0004),
    ("SHM_HUGETLB", 0x0800),
    // scheduling and priority targets
    ("PRIO_PROCESS", 0),
    ("IOPRIO_WHO_PROCESS", 1),
    ("PER_LINUX", 0),
    ("PER_QUERY", 0xffff_ffff),
];

/// A test on the low 32 bits of one syscall argument (the kernel reads the
/// arguments airlock tests as 32-bit ints, so high bits cannot smuggle a
/// different value past the check), optionally masked first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub arg: u8,
    /// Bits kept before the test (`type & SOCK_TYPE_MASK`).
    pub mask: Option<u32>,
    pub test: Test,
}

/// What a [`Condition`] asks of its (masked) argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// It is one of these values.
    In(Vec<u32>),
    /// It is none of these values.
    NotIn(Vec<u32>),
    /// It has any of these bits set.
    AnyBit(u32),
    /// It is not NULL: a pointer, tested in all 64 bits (one whose low half
    /// is zero still points somewhere), never masked.
    NonNull,
}

impl Condition {
    fn holds(&self, args: &[u64; 6]) -> bool {
        let whole = args[usize::from(self.arg)];
        let value = (whole as u32) & self.mask.unwrap_or(u32::MAX);
        match &self.test {
            Test::In(values) => values.contains(&value),
            Test::NotIn(values) => !values.contains(&value),
            Test::AnyBit(bits) => value & bits != 0,
            Test::NonNull => whole != 0,
        }
    }
}

/// One rule for one syscall: when every condition holds (or there are
/// none), the action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub when: Vec<Condition>,
    pub action: Action,
}

/// A policy ready to compile for one architecture: for each syscall number
/// it names, its rules in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub arch: Arch,
    /// For every number the policy does not name.
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
    #[error(
        "unknown action {0:?}: use allow, kill, skip, or errno:NAME (EPERM, EACCES, ENOTTY, ENOSYS, EPROTONOSUPPORT, EAFNOSUPPORT)"
    )]
    BadAction(String),
    #[error("unknown constant {0:?} in a condition: use a number, or add the name to seccomp::SYMBOLS")]
    UnknownSymbol(String),
    #[error("syscall {0:?} is listed twice as allowed, or allowed and also given rules")]
    Duplicate(String),
    #[error("syscall {0:?} is not a syscall on any architecture airlock knows (x86_64, aarch64)")]
    UnknownSyscall(String),
    #[error("condition on argument {0}: syscalls have arguments 0 to 5")]
    BadArgument(u8),
    #[error("a condition needs exactly one of `in`, `not_in`, `any_bit` or `non_null = true` (which takes no mask)")]
    BadCondition,
    #[error("the compiled filter has {0} instructions, more than the kernel's limit of 4096")]
    TooLong(usize),
    #[error("a widening policy's base is {0:?}: the only base shipped is \"default.toml\"")]
    UnknownBase(String),
    #[error("syscall {0:?} is allowed outright by the base policy: a widening rule for it would change nothing")]
    NotWidening(String),
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

/// A policy file that widens a base (`seccomp/template.toml`): its rules go
/// before the base's for the syscalls they name.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WideningFile {
    base: String,
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
    when: Option<When>,
    action: String,
    #[allow(dead_code)]
    comment: Option<String>,
}

/// One condition, or a list that must all hold.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum When {
    One(ConditionEntry),
    All(Vec<ConditionEntry>),
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ConditionEntry {
    arg: u8,
    mask: Option<Value>,
    #[serde(rename = "in")]
    is_in: Option<Vec<Value>>,
    not_in: Option<Vec<Value>>,
    any_bit: Option<Vec<Value>>,
    /// `non_null = true`: the argument, a pointer, is not NULL.
    non_null: Option<bool>,
}

/// A constant in a condition: a name from [`SYMBOLS`], or a number.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum Value {
    Number(u32),
    Name(String),
}

impl Value {
    fn resolve(&self) -> Result<u32, PolicyFileError> {
        match self {
            Value::Number(n) => Ok(*n),
            Value::Name(name) => SYMBOLS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| PolicyFileError::UnknownSymbol(name.clone())),
        }
    }
}

fn values(list: &[Value]) -> Result<Vec<u32>, PolicyFileError> {
    list.iter().map(Value::resolve).collect()
}

impl Policy {
    /// Reads a policy file, resolving names for `arch`.
    pub fn parse(text: &str, arch: Arch) -> Result<Policy, PolicyFileError> {
        let file: PolicyFile = toml::from_str(text)?;
        let mut syscalls: BTreeMap<u32, (String, Vec<Rule>)> = BTreeMap::new();
        for group in &file.allow {
            for name in &group.names {
                if !is_known_anywhere(name) {
                    return Err(PolicyFileError::UnknownSyscall(name.clone()));
                }
                let Some(nr) = arch.number(name) else { continue };
                if syscalls.insert(nr, (name.clone(), vec![Rule { when: Vec::new(), action: Action::Allow }])).is_some()
                {
                    return Err(PolicyFileError::Duplicate(name.clone()));
                }
            }
        }
        let ruled = rules(&file.rule, arch)?;
        if let Some((_, (name, _))) = ruled.iter().find(|(nr, _)| syscalls.contains_key(nr)) {
            return Err(PolicyFileError::Duplicate(name.clone()));
        }
        syscalls.extend(ruled);
        Ok(Policy { arch, default_action: Action::parse(&file.default_action)?, syscalls })
    }

    /// The shipped default policy for `arch`.
    pub fn default_policy(arch: Arch) -> Result<Policy, PolicyFileError> {
        Policy::parse(DEFAULT_POLICY, arch)
    }

    /// The shipped template policy for `arch`: the default widened by
    /// `seccomp/template.toml`.
    pub fn template_policy(arch: Arch) -> Result<Policy, PolicyFileError> {
        Policy::default_policy(arch)?.widened(TEMPLATE_POLICY)
    }

    /// This policy with a widening file's rules put before its own for the
    /// syscalls they name. A syscall this policy allows outright is refused:
    /// the file would change nothing for it, so naming it is a mistake.
    pub fn widened(mut self, text: &str) -> Result<Policy, PolicyFileError> {
        let file: WideningFile = toml::from_str(text)?;
        if file.base != TEMPLATE_BASE {
            return Err(PolicyFileError::UnknownBase(file.base));
        }
        for (nr, (name, mut widening)) in rules(&file.rule, self.arch)? {
            match self.syscalls.get_mut(&nr) {
                Some((_, base)) if base.iter().all(|rule| rule.when.is_empty() && rule.action == Action::Allow) => {
                    return Err(PolicyFileError::NotWidening(name));
                }
                Some((_, base)) => {
                    widening.append(base);
                    *base = widening;
                }
                None => {
                    self.syscalls.insert(nr, (name, widening));
                }
            }
        }
        Ok(self)
    }

    /// What the policy decides for syscall `nr` with these arguments (low 32
    /// bits), evaluated on the data rather than the BPF; tests compare the two.
    pub fn decide(&self, nr: u32, args: [u64; 6]) -> Action {
        let Some((_, rules)) = self.syscalls.get(&nr) else {
            return self.default_action;
        };
        rules.iter().find(|rule| rule.when.iter().all(|c| c.holds(&args))).map_or(self.default_action, |r| r.action)
    }

    /// The number of syscall `name` on this policy's architecture.
    pub fn number(&self, name: &str) -> Option<u32> {
        self.arch.number(name)
    }
}

/// A file's `[[rule]]` entries, per syscall number of `arch`, in order.
fn rules(entries: &[RuleEntry], arch: Arch) -> Result<BTreeMap<u32, (String, Vec<Rule>)>, PolicyFileError> {
    let mut ruled: BTreeMap<u32, (String, Vec<Rule>)> = BTreeMap::new();
    for entry in entries {
        let action = Action::parse(&entry.action)?;
        let when = match &entry.when {
            None => Vec::new(),
            Some(When::One(c)) => vec![condition(c)?],
            Some(When::All(list)) => list.iter().map(condition).collect::<Result<_, _>>()?,
        };
        for name in &entry.syscalls {
            if !is_known_anywhere(name) {
                return Err(PolicyFileError::UnknownSyscall(name.clone()));
            }
            let Some(nr) = arch.number(name) else { continue };
            ruled.entry(nr).or_insert_with(|| (name.clone(), Vec::new())).1.push(Rule { when: when.clone(), action });
        }
    }
    Ok(ruled)
}

fn condition(entry: &ConditionEntry) -> Result<Condition, PolicyFileError> {
    if entry.arg > 5 {
        return Err(PolicyFileError::BadArgument(entry.arg));
    }
    let mask = entry.mask.as_ref().map(Value::resolve).transpose()?;
    let test = match (&entry.is_in, &entry.not_in, &entry.any_bit, entry.non_null) {
        (Some(v), None, None, None) => Test::In(values(v)?),
        (None, Some(v), None, None) => Test::NotIn(values(v)?),
        (None, None, Some(v), None) => Test::AnyBit(values(v)?.into_iter().fold(0, |a, b| a | b)),
        (None, None, None, Some(true)) if mask.is_none() => Test::NonNull,
        _ => return Err(PolicyFileError::BadCondition),
    };
    Ok(Condition { arg: entry.arg, mask, test })
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mask {
            Some(mask) => write!(f, "arg{} & {mask:#x}", self.arg)?,
            None => write!(f, "arg{}", self.arg)?,
        }
        let list = |values: &[u32]| values.iter().map(|v| format!("{v:#x}")).collect::<Vec<_>>().join(",");
        match &self.test {
            Test::In(values) => write!(f, " in [{}]", list(values)),
            Test::NotIn(values) => write!(f, " not in [{}]", list(values)),
            Test::AnyBit(bits) => write!(f, " has any of {bits:#x}"),
            Test::NonNull => write!(f, " is not NULL"),
        }
    }
}

impl fmt::Display for Policy {
    /// One line per syscall: the form a person reviewing what the sandbox
    /// may call reads, and the tests check.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} default: {}", self.arch, self.default_action)?;
        for (nr, (name, rules)) in &self.syscalls {
            write!(f, "{nr:>4} {name}:")?;
            for rule in rules {
                if rule.when.is_empty() {
                    write!(f, " {}", rule.action)?;
                } else {
                    let when: Vec<String> = rule.when.iter().map(ToString::to_string).collect();
                    write!(f, " [{}] {};", when.join(" and "), rule.action)?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
