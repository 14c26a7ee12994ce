//! Compiles a seccomp [`Policy`] to classic BPF.
//!
//! Layout: an architecture check, an x32 check, a binary search over
//! *ranges* of syscall numbers that are handled alike (most of the allowlist
//! is a few long runs of allowed numbers), each range jumping to its
//! handling: a return, or a syscall's argument rules. Then the rules, then
//! one return per distinct action. A small program is cheap to load (twice
//! a run) and cheap to run (every syscall of the code goes through it).
//! Conditional jumps only ever skip one instruction (their offsets are 8
//! bits); every longer jump is a `JA`, whose offset is 32 bits, so no policy
//! is too far apart to encode.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Action, Policy, PolicyFileError, Test};

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

impl Instruction {
    /// A program as the kernel reads it: each instruction's 8 bytes, little-endian.
    pub fn to_bytes(program: &[Instruction]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(program.len() * 8);
        for i in program {
            bytes.extend_from_slice(&i.code.to_le_bytes());
            bytes.push(i.jt);
            bytes.push(i.jf);
            bytes.extend_from_slice(&i.k.to_le_bytes());
        }
        bytes
    }

    /// The inverse of [`Instruction::to_bytes`]; `None` unless whole instructions.
    pub fn from_bytes(bytes: &[u8]) -> Option<Vec<Instruction>> {
        if bytes.len() % 8 != 0 {
            return None;
        }
        Some(
            bytes
                .chunks_exact(8)
                .map(|c| Instruction {
                    code: u16::from_le_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect(),
        )
    }
}

const LD_W_ABS: u16 = 0x20;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGE_K: u16 = 0x35;
const JMP_JSET_K: u16 = 0x45;
const ALU_AND_K: u16 = 0x54;
const RET_K: u16 = 0x06;

const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// Low 32 bits of argument `i` (little-endian): `offsetof(seccomp_data, args[i])`.
fn offset_arg(i: u8) -> u32 {
    16 + 8 * u32::from(i)
}

/// High 32 bits of argument `i`.
fn offset_arg_high(i: u8) -> u32 {
    offset_arg(i) + 4
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Label {
    Rule(u32, usize),
    /// Condition `.2` of rule `.1` of syscall `.0`; one past the last is
    /// where the rule holds.
    Condition(u32, usize, usize),
    Ret(Action),
    Node(usize),
}

/// How a range of syscall numbers is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handling {
    /// Straight to a return.
    Return(Action),
    /// Through this syscall's argument rules.
    Rules(u32),
}

impl Handling {
    fn label(self) -> Label {
        match self {
            Handling::Return(action) => Label::Ret(action),
            Handling::Rules(nr) => Label::Rule(nr, 0),
        }
    }
}

/// The syscall numbers cut into ranges handled alike: `(first, handling)`,
/// each range running up to the next one's first number; the last to the end.
fn ranges(policy: &Policy) -> Vec<(u32, Handling)> {
    let mut ranges: Vec<(u32, Handling)> = vec![(0, Handling::Return(policy.default_action))];
    let mut push = |first: u32, handling: Handling| {
        // A range starting at the same number is superseded; one handled
        // alike just extends.
        if ranges.last().is_some_and(|(start, _)| *start == first) {
            ranges.pop();
        }
        if ranges.last().map(|(_, h)| *h) != Some(handling) {
            ranges.push((first, handling));
        }
    };
    for (nr, (_, rules)) in &policy.syscalls {
        let handling = match rules.as_slice() {
            [rule] if rule.when.is_empty() => Handling::Return(rule.action),
            _ => Handling::Rules(*nr),
        };
        push(*nr, handling);
        push(nr + 1, Handling::Return(policy.default_action));
    }
    ranges
}

/// An instruction whose jump target may not be known yet.
enum Pending {
    Ready(Instruction),
    Jump(Label),
}

struct Assembler {
    code: Vec<Pending>,
    labels: BTreeMap<Label, usize>,
}

impl Assembler {
    fn here(&mut self, label: Label) {
        self.labels.insert(label, self.code.len());
    }
    fn emit(&mut self, code: u16, jt: u8, jf: u8, k: u32) {
        self.code.push(Pending::Ready(Instruction { code, jt, jf, k }));
    }
    fn jump(&mut self, to: Label) {
        self.code.push(Pending::Jump(to));
    }
    /// `if A == k { goto to }`.
    fn if_eq_goto(&mut self, k: u32, to: Label) {
        self.emit(JMP_JEQ_K, 0, 1, k);
        self.jump(to);
    }
    fn finish(self) -> Vec<Instruction> {
        let labels = self.labels;
        self.code
            .into_iter()
            .enumerate()
            .map(|(at, item)| match item {
                Pending::Ready(i) => i,
                Pending::Jump(label) => {
                    // Every label is placed after every jump to it (forward
                    // only), which the layout above guarantees.
                    let target = labels[&label];
                    Instruction { code: JMP_JA, jt: 0, jf: 0, k: (target - at - 1) as u32 }
                }
            })
            .collect()
    }
}

/// Compiles `policy` to a BPF program for its architecture.
pub fn compile(policy: &Policy) -> Result<Vec<Instruction>, PolicyFileError> {
    let mut asm = Assembler { code: Vec::new(), labels: BTreeMap::new() };
    let arch = policy.arch;
    // The architecture first: a 32-bit entry point has other numbers.
    asm.emit(LD_W_ABS, 0, 0, OFFSET_ARCH);
    asm.emit(JMP_JEQ_K, 1, 0, arch.audit_arch());
    asm.emit(RET_K, 0, 0, Action::KillProcess.ret());
    asm.emit(LD_W_ABS, 0, 0, OFFSET_NR);
    if let Some(bit) = arch.x32_bit() {
        asm.emit(JMP_JGE_K, 0, 1, bit);
        asm.emit(RET_K, 0, 0, Action::KillProcess.ret());
    }

    let ranges = ranges(policy);
    let mut next_node = 0;
    search(&mut asm, &ranges, &mut next_node);

    let mut actions: Vec<Action> = ranges
        .iter()
        .filter_map(|(_, h)| match h {
            Handling::Return(action) => Some(*action),
            Handling::Rules(_) => None,
        })
        .collect();
    for (nr, (_, rules)) in &policy.syscalls {
        if !ranges.iter().any(|(_, h)| *h == Handling::Rules(*nr)) {
            continue;
        }
        for (index, rule) in rules.iter().enumerate() {
            asm.here(Label::Rule(*nr, index));
            let fails = Label::Rule(*nr, index + 1);
            actions.push(rule.action);
            for (at, condition) in rule.when.iter().enumerate() {
                asm.here(Label::Condition(*nr, index, at));
                let holds = Label::Condition(*nr, index, at + 1);
                asm.emit(LD_W_ABS, 0, 0, offset_arg(condition.arg));
                if let Some(mask) = condition.mask {
                    asm.emit(ALU_AND_K, 0, 0, mask);
                }
                match &condition.test {
                    Test::In(values) => {
                        for v in values {
                            asm.if_eq_goto(*v, holds);
                        }
                        asm.jump(fails);
                    }
                    Test::NotIn(values) => {
                        for v in values {
                            asm.if_eq_goto(*v, fails);
                        }
                        asm.jump(holds);
                    }
                    Test::AnyBit(bits) => {
                        asm.emit(JMP_JSET_K, 0, 1, *bits);
                        asm.jump(holds);
                        asm.jump(fails);
                    }
                    // Low half zero: then the high half decides.
                    Test::NonNull => {
                        asm.emit(JMP_JEQ_K, 1, 0, 0);
                        asm.jump(holds);
                        asm.emit(LD_W_ABS, 0, 0, offset_arg_high(condition.arg));
                        asm.emit(JMP_JEQ_K, 1, 0, 0);
                        asm.jump(holds);
                        asm.jump(fails);
                    }
                }
            }
            asm.here(Label::Condition(*nr, index, rule.when.len()));
            asm.jump(Label::Ret(rule.action));
        }
        // No rule held: the default action (its return sits after the rules,
        // so the jump stays forward).
        asm.here(Label::Rule(*nr, rules.len()));
        asm.jump(Label::Ret(policy.default_action));
    }

    actions.push(policy.default_action);
    actions.sort();
    actions.dedup();
    for action in actions {
        asm.here(Label::Ret(action));
        asm.emit(RET_K, 0, 0, action.ret());
    }

    let program = asm.finish();
    if program.len() > 4096 {
        return Err(PolicyFileError::TooLong(program.len()));
    }
    Ok(program)
}

/// Emits a binary search over `ranges` with the syscall number in A.
fn search(asm: &mut Assembler, ranges: &[(u32, Handling)], next_node: &mut usize) {
    match ranges {
        [] => {}
        [(_, handling)] => asm.jump(handling.label()),
        _ => {
            let (low, high) = ranges.split_at(ranges.len() / 2);
            let right = Label::Node(*next_node);
            *next_node += 1;
            // if nr >= the first number of the upper half { goto right } else the lower half.
            asm.emit(JMP_JGE_K, 0, 1, high[0].0);
            asm.jump(right);
            search(asm, low, next_node);
            asm.here(right);
            search(asm, high, next_node);
        }
    }
}

/// Runs a BPF program over one syscall, as the kernel would. For tests and
/// for `airlock debug seccomp`-style inspection; not on any hot path.
pub fn evaluate(program: &[Instruction], arch: u32, nr: u32, args: [u64; 6]) -> Option<u32> {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    while let Some(ins) = program.get(pc) {
        match ins.code {
            LD_W_ABS => {
                let at = ins.k as usize;
                acc = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?);
                pc += 1;
            }
            ALU_AND_K => {
                acc &= ins.k;
                pc += 1;
            }
            JMP_JA => pc += 1 + ins.k as usize,
            JMP_JEQ_K | JMP_JGE_K | JMP_JSET_K => {
                let taken = match ins.code {
                    JMP_JEQ_K => acc == ins.k,
                    JMP_JGE_K => acc >= ins.k,
                    _ => acc & ins.k != 0,
                };
                pc += 1 + usize::from(if taken { ins.jt } else { ins.jf });
            }
            RET_K => return Some(ins.k),
            _ => return None,
        }
    }
    None
}
