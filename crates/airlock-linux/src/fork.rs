//! The forked mode's child half (docs/design.md, "Forked starts"): what the
//! two forks of a pool's template do to become one run's sandbox.
//!
//! The template is a sandbox like any other (its own host ids, namespaces,
//! mounts, cgroup, rlimits), whose interpreter imported the preload and
//! kept CAP_SYS_ADMIN in the sandbox's user namespace, no Landlock domain
//! and the template's seccomp filter (`seccomp/template.toml`). It never
//! runs user code. For each run it forks twice with Python's own `os.fork`
//! (so CPython's at-fork hooks run) and each fork calls into this module
//! through the `airlock-fork` library, with descriptors and integers only:
//!
//! 1. [`unshare_pid`] in the template; the first fork is PID 1 of the new
//!    PID namespace and becomes the run's [`init`]; the second, PID 2, the
//!    code's process; [`join_pid_namespace`] takes the template back to its
//!    own for the next run's forks.
//! 2. The code's process, once the supervisor has moved both into the run's
//!    cgroup, runs [`child`]: a fresh mount namespace with its own /work,
//!    /tmp and /proc, then a nested user namespace (which leaves it no
//!    capability over the template's namespaces), fresh network, IPC, UTS
//!    and cgroup namespaces, rlimits, every capability dropped, Landlock,
//!    only its descriptors, the run's filter stacked on the template's. It
//!    returns into Python, which reseeds its generators and runs the driver.
//!
//! The supervisor takes none of this on the fork's word: it checks the
//! code's process from outside before it releases any code (`forked`).

use std::convert::Infallible;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::thread::UnshareFlags;

use crate::protocol::{CodeSetup, Failure, ForkPlan};
use crate::{caps, landlock, limits, mounts, network, process, sys, userns};

/// The descriptors the code's process keeps, at these numbers, as the
/// template arranges them before [`child`]: 0 to 2 its streams, then the
/// report pipe, the ready pipe, the code pipe (the driver's), and the setup
/// pipe (closed by the driver once its generators are reseeded).
pub const KEPT_FDS: RawFd = 7;

/// The namespaces the code's process makes once inside the nested user
/// namespace, which owns them, so that it may set them up without any
/// capability over the template's (the cgroup namespace after the move
/// into the run's cgroup, which is then its root).
const INNER_NAMESPACES: UnshareFlags =
    UnshareFlags::NEWNET.union(UnshareFlags::NEWIPC).union(UnshareFlags::NEWUTS).union(UnshareFlags::NEWCGROUP);

/// In the template: the PID namespace its next children are born in.
pub fn unshare_pid() -> Result<(), Failure> {
    // SAFETY: CLONE_NEWPID changes only the namespace of this process's
    // future children: nothing Rust or Python holds is unshared.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID) }
        .map_err(|e| Failure::new("make the run's PID namespace", "unshare(CLONE_NEWPID)", &e.into()))
}

/// In the template, after both forks: back to its own PID namespace for
/// children (`fd`, its `/proc/self/ns/pid`), without which the kernel
/// refuses the next run's `unshare(CLONE_NEWPID)`.
pub fn join_pid_namespace(fd: RawFd) -> Result<(), Failure> {
    // SAFETY: the caller passes a descriptor it keeps open for the call.
    let ns = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::thread::move_into_link_name_space(ns, Some(rustix::thread::LinkNameSpaceType::ProcessID))
        .map_err(|e| Failure::new("rejoin the template's PID namespace", "setns", &e.into()))
}

/// The first fork, PID 1 of the run's namespace: leaves the template's
/// session, catches no signal, holds no capability, is undumpable, has the run's filter, says
/// so on `ready`, keeps no descriptor, and reaps orphans until the template kills it at the run's
/// end, which ends every process of the run. As a cold run's init, it
/// observes and reports nothing: the code may signal it, never fool it.
pub fn init(plan: RawFd, lifeline: RawFd, ready: RawFd) -> Result<Infallible, Failure> {
    process::die_with_parent(None)?;
    // SAFETY: the template hands this fork its copy of the lifeline's read end.
    process::exit_if_parent_gone(unsafe { OwnedFd::from_raw_fd(lifeline) })?;
    let plan = read_plan(plan)?;
    rustix::process::setsid().map_err(|e| Failure::new("leave the template's session", "setsid", &e.into()))?;
    process::not_dumpable()?;
    sys::default_caught_signals()
        .map_err(|e| Failure::new("drop the interpreter's signal handlers", "sigaction", &e))?;
    caps::drop_all()?;
    sys::install_seccomp(&plan.seccomp).map_err(|e| Failure::new("seccomp for init", "", &e))?;
    // SAFETY: the template keeps the ready pipe open at this number for the call.
    let ready = unsafe { BorrowedFd::borrow_raw(ready) };
    shed_the_templates_memory();
    // The interpreter is gone from here on: a failure exits, never returns
    // into Python (nor unwinds through it). The template takes an init that
    // ended before its byte, or after it, as the run's failure.
    let exit = || -> ! {
        // SAFETY: ends this process at once, running nothing of Python's.
        unsafe { libc::_exit(SHED_INIT_FAILED) }
    };
    if rustix::io::write(ready, b"1").is_err() {
        exit();
    }
    // Last, every descriptor. This process never returns into Python,
    // whose objects held none of them.
    if sys::close_from_except(0, -1).is_err() {
        exit();
    }
    sys::reap_orphans_forever()
}

/// The init's exit status when a step after [`shed_the_templates_memory`]
/// failed (the forks' library returns 125 for the steps before).
const SHED_INIT_FAILED: i32 = 125;

/// The most mappings [`shed_the_templates_memory`] unmaps (one line of
/// `/proc/self/maps` each, after a preload of numpy, pandas and matplotlib
/// about 900); past that, the rest stay.
const MAX_SHED: usize = 4096;

/// In the init, before it says it is ready: unmaps what it inherited of
/// the template and never touches again (the interpreter, the preload's
/// libraries and memory), so that its death at the run's end, which the
/// run's record waits for, has little to free. A fork of a template that
/// imported pandas took 2.7 ms to die against 0.6 ms for a fork of a bare
/// interpreter (`bench/fork_exit.py`, median of 40, this machine); the
/// unmapping costs the same work, done before any run claims the fork.
///
/// Kept: what this library and its reaping loop run on, all resolved at
/// load (BIND_NOW): this library, libc, libgcc_s and the loader, found by
/// the addresses of their own symbols and kept whole (every mapping of the
/// same file, whatever its name: `libc.so.6`, `libc-2.31.so`), with the
/// anonymous bss right after each; the heap, the stack, the thread's
/// control block and TLS, and every named kernel mapping (`[vdso]`...). An
/// optimisation only, so it does nothing where it cannot be sure: if this
/// library, libc or the loader is not found in the map, if the map cannot
/// be read, or where a shadow stack (an unnamed mapping every `ret` reads)
/// may be in force (x86 with `shstk` on; other architectures, not checked,
/// skip it).
fn shed_the_templates_memory() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let shadow_stack = std::fs::read_to_string("/proc/self/status").map_or(true, |status| {
        status.lines().any(|line| line.starts_with("x86_Thread_features:") && line.contains("shstk"))
    });
    if shadow_stack {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    // SAFETY: getauxval reads this process's auxiliary vector; dlsym reads
    // a NUL-terminated name. Neither dereferences what it returns.
    let (loader, unwinder) = unsafe {
        (libc::getauxval(libc::AT_BASE) as usize, libc::dlsym(libc::RTLD_DEFAULT, c"_Unwind_Resume".as_ptr()) as usize)
    };
    let this_library = shed_the_templates_memory as *const () as usize;
    let libc = libc::munmap as *const () as usize;
    // The files whose every mapping stays: (device, inode), found by address.
    let mut kept_files: [Option<(&str, &str)>; 4] = [None; 4];
    for mapping in maps.lines().filter_map(Mapping::parse) {
        for (slot, address) in kept_files.iter_mut().zip([this_library, libc, loader, unwinder]) {
            if address != 0 && !mapping.path.is_empty() && (mapping.start..mapping.end).contains(&address) {
                *slot = Some((mapping.device, mapping.inode));
            }
        }
    }
    if kept_files[..3].iter().any(Option::is_none) {
        return;
    }
    // The thread's control block and static TLS (glibc's errno lives
    // there), and this function's stack frame.
    // SAFETY: returns the address of this thread's errno; nothing is read.
    let tls = unsafe { libc::__errno_location() } as usize;
    let stack = &raw const maps as usize;
    // Collected on the stack: a heap buffer this large may be a mapping of
    // its own, which the loop below could unmap under itself.
    let mut shed = [(0usize, 0usize); MAX_SHED];
    let mut count = 0;
    let mut kept_file_end = 0;
    for mapping in maps.lines().filter_map(Mapping::parse) {
        let Mapping { start, end, device, inode, path } = mapping;
        let keep = if path.is_empty() {
            // A kept library's bss, or the control block, or this stack.
            start == kept_file_end || (start..end).contains(&tls) || (start..end).contains(&stack)
        } else {
            path.starts_with('[') || kept_files.contains(&Some((device, inode)))
        };
        if !path.is_empty() {
            kept_file_end = if keep { end } else { 0 };
        } else if keep && start == kept_file_end {
            kept_file_end = end;
        }
        if !keep && count < MAX_SHED {
            shed[count] = (start, end - start);
            count += 1;
        }
    }
    // Never freed: the init allocates nothing more, and its buffer may lie
    // in a mapping unmapped below.
    std::mem::forget(maps);
    for &(start, length) in &shed[..count] {
        // SAFETY: each range is a mapping this process inherited from the
        // template and that none of the code it runs from here on reaches
        // (see above); nothing Rust owns points into it (the one buffer
        // that might is forgotten above).
        unsafe { libc::munmap(start as *mut libc::c_void, length) };
    }
}

/// One line of `/proc/self/maps`: `start-end perms offset device inode path`.
struct Mapping<'a> {
    start: usize,
    end: usize,
    device: &'a str,
    inode: &'a str,
    /// Empty for an anonymous mapping.
    path: &'a str,
}

impl<'a> Mapping<'a> {
    fn parse(line: &'a str) -> Option<Mapping<'a>> {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
        let (_perms, _offset) = (fields.next()?, fields.next()?);
        let (device, inode) = (fields.next()?, fields.next()?);
        Some(Mapping { start, end, device, inode, path: fields.next().unwrap_or("") })
    }
}

/// The second fork, the code's process (PID 2), once in the run's cgroup:
/// its standard streams and descriptors as [`KEPT_FDS`] says, a session of
/// its own. Returns with every layer in force, or the step that failed.
pub fn child(plan: RawFd, setup: RawFd, lifeline: RawFd) -> Result<(), Failure> {
    process::die_with_parent(None)?;
    // SAFETY: the template hands this fork its copy of the lifeline's read end.
    process::exit_if_parent_gone(unsafe { OwnedFd::from_raw_fd(lifeline) })?;
    let plan = read_plan(plan)?;
    // With the template's CAP_SYS_ADMIN, in the sandbox's user namespace.
    // SAFETY: CLONE_NEWNS copies the mount table only: no descriptor table
    // or memory is unshared.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
        .map_err(|e| Failure::new("make the run's namespaces", "unshare(CLONE_NEWNS)", &e.into()))?;
    mounts::build_fork_root(plan.disk_bytes, plan.disk_inodes)?;
    userns::enter_nested()?;
    // SAFETY: as above: namespaces only.
    unsafe { rustix::thread::unshare_unsafe(INNER_NAMESPACES) }
        .map_err(|e| Failure::new("make the run's namespaces", "unshare", &e.into()))?;
    rustix::system::sethostname(plan.hostname.as_bytes())
        .map_err(|e| Failure::new("set the hostname", "", &e.into()))?;
    network::loopback_up()?;
    limits::apply(&plan.rlimits)?;
    caps::drop_all()?;
    process::not_dumpable()?;
    if let Some(landlock) = &plan.landlock {
        // SAFETY: the template keeps the setup pipe open at this number until the driver closes it.
        let setup = unsafe { BorrowedFd::borrow_raw(setup) };
        process::report_setup(setup, &CodeSetup::Landlock(landlock::restrict(landlock)?));
    }
    rustix::process::chdir("/work").map_err(|e| Failure::new("enter /work", "chdir", &e.into()))?;
    // Everything past the kept ones goes (the plan's memfd among them).
    // Python holds none of them: the template passed them as numbers.
    sys::close_from_except(KEPT_FDS, -1).map_err(|e| Failure::new("close descriptors", "", &e))?;
    sys::install_seccomp(&plan.seccomp).map_err(|e| Failure::new("seccomp", "", &e))
}

/// The plan from its memfd, read from its start: both forks read the same
/// file, whose offset they share.
fn read_plan(fd: RawFd) -> Result<ForkPlan, Failure> {
    let step = "read the fork's plan";
    // SAFETY: the template keeps the memfd open at this number for the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut body = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = rustix::io::pread(fd, &mut buf, body.len() as u64).map_err(|e| Failure::new(step, "", &e.into()))?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
        if body.len() > 1024 * 1024 {
            return Err(Failure::plain(step, "the plan is larger than 1 MiB"));
        }
    }
    serde_json::from_slice(&body).map_err(|e| Failure::plain(step, e.to_string()))
}
