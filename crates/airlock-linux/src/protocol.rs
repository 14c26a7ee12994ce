//! The messages between the supervisor and the helper: a typed list, sent as
//! JSON datagrams over a SOCK_SEQPACKET socket, with descriptors attached.
//!
//! The supervisor sends one [`Request`]. Plans can be large (they carry the
//! code), so a request's body travels in a memfd attached to the message.
//! Only the helper answers, with [`Reply`]s: small messages, some with
//! descriptors (namespaces, the init's pidfd, the report FIFO). A run is
//! two steps: the helper makes the sandbox ready ([`Reply::Ready`]) and,
//! when the plan says so, waits until the supervisor releases the code
//! ([`Control::Release`]).

use std::io::{self, IoSlice, IoSliceMut, Read, Seek, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use airlock_policy::Layer;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::seccomp::Instruction;

/// The most descriptors one message carries: a run's request has the plan's
/// memfd, five fixed descriptors and up to four cgroup `tasks` files.
pub const MAX_FDS: usize = 16;
/// The largest reply; replies are a few hundred bytes.
const MAX_MESSAGE: usize = 64 * 1024;

/// What the supervisor asks of a freshly started helper.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Make a sandbox's user and mount namespaces and its work directory.
    /// Replies [`Reply::SetupDone`] with [user ns, mount ns, stage root, /work, /tmp].
    Setup(SetupPlan),
    /// Run code in the sandbox whose namespaces come attached:
    /// [user ns, mount ns, stdin, stdout, stderr], then the cgroup's
    /// descriptors (see [`CgroupEntry`]).
    Run(Box<RunPlan>),
    /// Open a file below the attached folder as the sandbox's user, for a
    /// supervisor that cannot be that user itself (an ordinary user's
    /// subordinate id). Attached: [user ns, folder]. Replies
    /// [`Reply::Opened`] with the file.
    Open(OpenPlan),
}

/// Which file to open for the supervisor, and how.
#[derive(Debug, Serialize, Deserialize)]
pub struct OpenPlan {
    pub supervisor_pid: i32,
    /// Relative to the attached folder, checked as a `SandboxPath` is.
    pub path: String,
    /// Create it (and its parents) for writing, rather than open it to read.
    pub write: bool,
}

/// How to make a sandbox's persistent part.
#[derive(Debug, Serialize, Deserialize)]
pub struct SetupPlan {
    pub supervisor_pid: i32,
    /// Who the sandbox's user is on the host.
    pub ids: crate::hostid::IdMapping,
    /// Size and inode caps of the tmpfs holding /work, /tmp and the layout.
    pub tmpfs_bytes: u64,
    pub tmpfs_inodes: u64,
    /// Entries to create in the sandbox's root, in order.
    pub layout: Vec<LayoutEntry>,
    /// Host trees bound into the root, read-only unless marked writable.
    pub binds: Vec<Bind>,
}

/// One entry of the root's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayoutEntry {
    /// A directory (parents created), with its mode.
    Dir { path: String, mode: u32 },
    /// An empty file, to bind a host file onto.
    MountFile { path: String },
    /// A symbolic link.
    Symlink { path: String, target: String },
    /// A small generated file (/etc/passwd).
    File { path: String, content: String },
}

/// A bind mount of a host path into the sandbox: read-only, or writable for
/// the one directory an image build fills.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub writable: bool,
    /// Nothing below it may be executed (the driver's folder, which is only
    /// read); the interpreter's own trees are executable.
    #[serde(default)]
    pub noexec: bool,
}

/// How Landlock should restrict the code.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Directories the code may write below.
    pub writable_dirs: Vec<String>,
    /// Files (devices, the report FIFO) the code may open for writing.
    pub writable_files: Vec<String>,
    /// Fail instead of running unrestricted when the kernel lacks Landlock.
    pub required: bool,
}

/// How to run one job.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunPlan {
    pub supervisor_pid: i32,
    /// How the run enters its cgroup.
    pub cgroup: CgroupEntry,
    /// How many cgroup descriptors follow the five fixed ones; the helper
    /// refuses a request that lost any.
    pub cgroup_fds: usize,
    pub hostname: String,
    /// Name and content of each file of the run's program in
    /// `driver::PROGRAM_DIR`: the code, and the driver's sources when the
    /// runtime has no driver folder bound in the sandbox.
    #[serde(with = "airlock_core::driver::files_in_base64")]
    pub program_files: Vec<(String, Vec<u8>)>,
    /// Whether to make the report FIFO and hand it to the supervisor.
    pub report_fifo: bool,
    /// Whether to make the ready FIFO (`driver::READY_FILE`), on which the
    /// driver says when its preload is imported and when the code's first
    /// instruction runs, and hand it to the supervisor.
    #[serde(default)]
    pub ready_fifo: bool,
    /// Whether to make the code FIFO (`driver::CODE_FIFO`), through which a
    /// warm sandbox's driver receives the code once a run claims it, and
    /// hand it to the supervisor.
    #[serde(default)]
    pub code_fifo: bool,
    /// Whether to listen on 127.0.0.1:3128 inside and hand the socket over.
    pub proxy_listener: bool,
    /// Whether the helper, once the sandbox is ready, holds the code until
    /// [`Control::Release`]: when the supervisor has something to start
    /// first (the proxy; a pool of ready sandboxes, a claim). Otherwise it
    /// releases the code itself, which saves two hand-offs per run.
    pub hold_for_release: bool,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub rlimits: Vec<Rlimit>,
    pub landlock: Option<LandlockPlan>,
    /// The compiled filter, sent as the kernel reads it (base64 of the
    /// `sock_filter` array): a few kilobytes rather than a long JSON list.
    #[serde(with = "bpf_base64")]
    pub seccomp: Vec<Instruction>,
    /// The code's process is a forked pool's template (see `fork`): it keeps
    /// CAP_SYS_ADMIN in the sandbox's user namespace (ambient, so that it
    /// survives the exec) and enters no Landlock domain; its forks do both.
    #[serde(default)]
    pub template: bool,
    /// The request brings the native library's sealed memfd after the
    /// code's streams, for the code's process at `native::NATIVE_FD`, where
    /// its driver loads it (a template's steps, a pooled sandbox's arena
    /// allocator) and closes it before any user code.
    #[serde(default)]
    pub native_library: bool,
}

/// A fork's plan (the forked mode, see `fork`): what the template's fork
/// puts in force to become one run's sandbox. The supervisor writes it into
/// a memfd; the template hands the memfd to its two forks unread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForkPlan {
    pub hostname: String,
    /// Size and inode caps of the run's tmpfs, which holds /work and /tmp.
    pub disk_bytes: u64,
    pub disk_inodes: u64,
    pub rlimits: Vec<Rlimit>,
    pub landlock: Option<LandlockPlan>,
    /// The run's own filter, stacked on the template's.
    #[serde(with = "bpf_base64")]
    pub seccomp: Vec<Instruction>,
}

/// What the supervisor asks of a template, on its control socket (the
/// template's standard input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToTemplate {
    /// Fork one run's sandbox. Attached, in order: the plan's memfd, the
    /// run's socket (on which the template answers, [`FromTemplate`], and
    /// the supervisor releases the fork, [`Control::Release`]), then the
    /// fork's standard input, output and error, and the write end of its
    /// report pipe, the write end of its ready pipe, the read end of its
    /// code pipe.
    Fork,
}

/// The descriptors a [`ToTemplate::Fork`] carries.
pub const FORK_FDS: usize = 8;

/// What a template says: [`FromTemplate::Ready`] once on its control
/// socket, the rest on each run's socket, in this order.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromTemplate {
    /// The preload is imported and the template serves forks. Attached: its
    /// own pidfd.
    Ready,
    /// The run's init (PID 1 of a fresh PID namespace) and the code's
    /// process (PID 2, the template's child) exist, their pids in the
    /// template's namespace; attached, their pidfds. The code's process
    /// waits for [`Control::Release`], sent once both are in the run's cgroup.
    Forked { init_pid: i32, code_pid: i32 },
    /// The code's process finished its setup, its own report as a cold
    /// run's code process writes it (JSON lines of [`CodeSetup`]): the
    /// driver then waits for its code.
    Setup { report: String },
    /// The code's process ended, then the init: as [`Reply::Ended`].
    Ended { code: ProcessEnd, init_first: Option<ProcessEnd> },
    /// A step of the template's failed; nothing after it ran.
    Failed(Failure),
}

/// How the helper puts the run into its cgroup; the descriptors follow the
/// five fixed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupEntry {
    /// No cgroup (the policy allowed running without one).
    None,
    /// cgroup v1: the run's init and the code each write "0" to each
    /// attached `tasks` file, moving themselves, before anything else. The
    /// helper stays outside: nothing the run does to its cgroup reaches it.
    EnterTasks,
    /// cgroup v2: the helper makes the init and the code with
    /// CLONE_INTO_CGROUP and the attached directory.
    CloneInto,
}

/// One resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub resource: RlimitResource,
    pub soft: u64,
    pub hard: u64,
}

/// The resources airlock limits with rlimits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RlimitResource {
    Core,
    NoFile,
    FileSize,
    Cpu,
    NProc,
    AddressSpace,
    MemLock,
}

/// What the helper reports, in this order for a run.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    SetupDone {
        /// Host paths the sandbox's mount table still shows (see `mounts`).
        host_paths_shown: Vec<String>,
    },
    /// The file asked for with [`Request::Open`] comes attached.
    Opened,
    /// The run's init exists; its pidfd comes attached. Killing it ends the
    /// run: every process of the run's PID namespace dies with it.
    Started { pid1: i32 },
    /// The sandbox is ready for the code, which waits for
    /// [`Control::Release`]. Attached, in order: the report FIFO, the ready
    /// FIFO, the code FIFO, each if asked for, then the proxy listener if
    /// asked for. (Between the init and the helper, the init's own word that
    /// the helper may make the code's process, with its namespaces first and
    /// the seal of its root next: the init finishes the root meanwhile, and
    /// the code's process joins nothing of the init's before the seal.)
    Ready,
    /// The code's process was released and has executed the program. It is
    /// the helper's child, outside the init's reach.
    CodeStarted { code_pid: i32, layers: Vec<Layer>, landlock_abi: Option<u32> },
    /// The code's process ended, and with it the run: how it ended, as its
    /// parent saw it, and how the init ended if it died first; and when
    /// (CLOCK_MONOTONIC, ns, taken just after) the helper reaped the code's
    /// process, before it ended the rest of the run.
    Ended { code: ProcessEnd, init_first: Option<ProcessEnd>, code_reaped_ns: Option<u64> },
    /// A step failed; nothing after it ran.
    Failed(Failure),
}

/// What the supervisor tells the helper once the sandbox is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Start the code.
    Release,
}

/// How a process ended, from its wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessEnd {
    Exited(i32),
    Killed(i32),
}

impl ProcessEnd {
    pub fn from_status(status: &rustix::process::WaitIdStatus) -> ProcessEnd {
        match (status.exit_status(), status.terminating_signal()) {
            (_, Some(signal)) => ProcessEnd::Killed(signal),
            (Some(code), None) => ProcessEnd::Exited(code),
            (None, None) => ProcessEnd::Exited(-1),
        }
    }
}

/// What the code's process tells the helper before it executes the program,
/// one JSON line each, on a pipe that its exec closes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CodeSetup {
    /// How much of Landlock it put in force.
    Landlock(crate::landlock::Enforced),
    /// A step failed; the program was not executed.
    Failed(Failure),
}

/// A setup step that failed, with the errno the kernel gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{step}: {detail}{}", errno.map(|e| format!(" ({})", io::Error::from_raw_os_error(e))).unwrap_or_default())]
pub struct Failure {
    pub step: String,
    pub errno: Option<i32>,
    pub detail: String,
}

impl Failure {
    pub fn new(step: &str, detail: impl Into<String>, error: &io::Error) -> Failure {
        Failure { step: step.to_owned(), errno: error.raw_os_error(), detail: detail.into() }
    }

    pub fn plain(step: &str, detail: impl Into<String>) -> Failure {
        Failure { step: step.to_owned(), errno: None, detail: detail.into() }
    }
}

/// Sends a small message with descriptors.
pub fn send<T: Serialize>(socket: BorrowedFd<'_>, message: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    rustix::net::sendmsg(socket, &[IoSlice::new(&body)], &mut control, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one message and its descriptors; `Ok(None)` when the peer is gone.
pub fn recv<T: DeserializeOwned>(socket: BorrowedFd<'_>) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::other("message too long"));
    }
    // Descriptors the buffer could not hold are dropped by the kernel: never
    // act on a message that lost some.
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(io::Error::other("a message came with more descriptors than expected"));
    }
    let value = serde_json::from_slice(&buf[..got.bytes]).map_err(io::Error::other)?;
    Ok(Some((value, fds)))
}

/// Sends a request whose body travels in a memfd (a [`Request`], or the
/// wasm worker's plan).
pub fn send_request<T: Serialize>(socket: BorrowedFd<'_>, request: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(request).map_err(io::Error::other)?;
    let memfd = rustix::fs::memfd_create("airlock-plan", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(&body)?;
    file.rewind()?;
    let mut all = vec![file.as_fd()];
    all.extend_from_slice(fds);
    send(socket, &"request", &all)
}

/// Receives the request and its descriptors (the body's memfd removed).
pub fn recv_request<T: DeserializeOwned>(socket: BorrowedFd<'_>) -> io::Result<(T, Vec<OwnedFd>)> {
    let (_, mut fds) = recv::<String>(socket)?.ok_or_else(|| io::Error::other("the supervisor hung up"))?;
    if fds.is_empty() {
        return Err(io::Error::other("the request came without its body"));
    }
    let mut body = Vec::new();
    std::fs::File::from(fds.remove(0)).read_to_end(&mut body)?;
    let request = serde_json::from_slice(&body).map_err(io::Error::other)?;
    Ok((request, fds))
}

/// (De)serializes a BPF program as base64 of its `sock_filter` bytes.
mod bpf_base64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::seccomp::Instruction;

    pub fn serialize<S: Serializer>(program: &[Instruction], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(Instruction::to_bytes(program)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Instruction>, D::Error> {
        let text = String::deserialize(deserializer)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)?;
        Instruction::from_bytes(&bytes)
            .ok_or_else(|| serde::de::Error::custom("a BPF program is a whole number of 8-byte instructions"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_survives_the_trip() {
        let program = crate::seccomp::default_program();
        let plan = RunPlan {
            supervisor_pid: 1,
            cgroup: CgroupEntry::None,
            cgroup_fds: 0,
            hostname: "airlock".into(),
            program_files: vec![
                ("main.py".into(), "print('é')".into()),
                // Code is bytes, not always UTF-8.
                ("main.sh".into(), vec![0xa7, 0x0d, 0, 0xff]),
            ],
            report_fifo: true,
            ready_fifo: true,
            code_fifo: false,
            proxy_listener: false,
            hold_for_release: false,
            argv: vec!["python".into()],
            env: vec!["A=b".into()],
            cwd: "/work".into(),
            rlimits: vec![],
            landlock: None,
            seccomp: program.clone(),
            template: false,
            native_library: false,
        };
        let json = serde_json::to_string(&plan).unwrap();
        let back: RunPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(back.seccomp, program);
        assert_eq!(back.program_files, plan.program_files);
        assert!(json.len() < 20_000, "{}", json.len());
    }
}
