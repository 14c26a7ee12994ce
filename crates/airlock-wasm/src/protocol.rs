//! The messages between the supervisor and a guest's worker, over the same
//! framing as the Linux backend's helper (`airlock_linux::protocol`): the
//! plan travels as JSON in a memfd attached to one datagram, the replies are
//! small datagrams, some with descriptors.
//!
//! The descriptors sent with the plan, in order: the guest's stdout and
//! stderr (pipes to the supervisor), its stdin (a memfd), the compiled
//! module (the cache file, opened read-only), then, with namespaces, the
//! sandbox's user and mount namespaces, then the cgroup's descriptors.

use airlock_linux::protocol::{CgroupEntry, Failure, LandlockPlan, Rlimit};
use airlock_linux::seccomp::Instruction;
use airlock_policy::Layer;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The descriptors every plan comes with, before the optional ones.
#[cfg(feature = "worker")]
pub const FIXED_FDS: usize = 4;

/// One guest run.
#[derive(Debug, Serialize, Deserialize)]
pub struct GuestPlan {
    pub supervisor_pid: i32,
    /// Join the attached user and mount namespaces and make the run's own
    /// PID, mount, network, IPC, UTS and cgroup namespaces; else run as a
    /// plain child of the worker (a host without namespaces).
    pub namespaces: bool,
    pub cgroup: CgroupEntry,
    /// How many cgroup descriptors follow the others.
    pub cgroup_fds: usize,
    /// Where the worker writes the program and an empty report file, before
    /// any confinement, without namespaces (a folder of the host stage); with
    /// them, a tmpfs of the run's own at /.airlock.
    pub program_dir: String,
    /// Name and content of each file of the program (the driver's sources,
    /// the code).
    #[serde(with = "airlock_core::driver::files_in_base64")]
    pub program_files: Vec<(String, Vec<u8>)>,
    /// The most the driver's report may hold (room is made for it).
    pub report_bytes: usize,
    /// Without namespaces, as root: become this host uid and gid (the
    /// sandbox's own, of root's reserved range), as the Linux backend's
    /// sandbox user is...
    pub run_as: Option<(u32, u32)>,
    /// ... and, as root still (where those ids cannot be taken), drop every
    /// capability.
    pub drop_capabilities: bool,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Folders the guest sees, as the worker sees them.
    pub preopens: Vec<Preopen>,
    /// Bytes of linear memory the guest may have.
    pub memory_bytes: u64,
    /// Files the guest may hold open at once, on top of the worker's own.
    pub open_files: u32,
    pub rlimits: Vec<Rlimit>,
    pub landlock: Option<LandlockPlan>,
    /// Without namespaces: the folders the worker may read at all.
    pub readable: Vec<String>,
    /// The worker's seccomp filter, base64 of the `sock_filter` array;
    /// `None` where the policy accepted a host without seccomp.
    pub seccomp: Option<String>,
}

/// A folder the guest sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preopen {
    /// The path in the worker's view.
    pub host: String,
    /// The path in the guest's view.
    pub guest: String,
    pub writable: bool,
}

/// What the worker reports.
#[derive(Debug, Serialize, Deserialize)]
pub enum WorkerReply {
    /// The process that runs the guest exists; its pidfd comes attached.
    Started { pid: i32 },
    /// Everything is in force and the guest is about to start. The program
    /// folder comes attached: the supervisor reads the report from it.
    Ready { layers: Vec<Layer>, landlock_abi: Option<u32> },
    /// The guest ended by itself.
    Ended(GuestEnd),
    /// The worker outside reaped the guest's process: its wait status, seen
    /// by a process the guest cannot reach.
    Reaped { code: Option<i32>, signal: Option<i32> },
    /// A setup step failed; nothing after it ran.
    Failed(Failure),
}

/// How the guest ended, as the worker saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestEnd {
    /// `run()` returned or the guest called `proc_exit`.
    pub exit_code: Option<i32>,
    /// It trapped (a stack overflow, an unreachable), or the host refused it
    /// something and trapped it (memory past the cap).
    pub trap: Option<String>,
    /// The linear memory it asked for when the limiter refused it.
    pub memory_refused: Option<u64>,
    /// The most linear memory it had.
    pub memory_peak: u64,
    /// The guest held as many descriptors as its limit allows, at some moment.
    pub open_files_hit: bool,
}

/// A BPF program as the plan carries it.
pub fn encode_filter(program: &[Instruction]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Instruction::to_bytes(program))
}

/// The BPF program a plan carries.
#[cfg(feature = "worker")]
pub fn decode_filter(text: &str) -> Option<Vec<Instruction>> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    Instruction::from_bytes(&bytes)
}
