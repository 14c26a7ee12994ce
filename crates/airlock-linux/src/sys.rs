//! The few system calls rustix does not wrap. Every `unsafe` in this crate
//! lives here, each with the invariant that makes it sound.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::seccomp::Instruction;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Which side of a fork-like call this process is on.
#[derive(Debug)]
pub enum Forked {
    Parent { pid: i32, pidfd: Option<OwnedFd> },
    Child,
}

/// `clone3` with `flags` (namespaces), a pidfd for the child, and SIGCHLD on
/// exit, returning like `fork`.
///
/// # Safety
/// The caller must be single-threaded: the child is a copy of this one
/// thread, and may then allocate and run arbitrary code only because no other
/// thread can have held a lock at the moment of the copy.
pub unsafe fn clone_with_namespaces(flags: u64, into_cgroup: Option<BorrowedFd<'_>>) -> io::Result<Forked> {
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    const CLONE_PIDFD: u64 = 0x1000;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: flags | CLONE_PIDFD,
        pidfd: &raw mut pidfd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(cgroup) = into_cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cgroup.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args (CLONE_ARGS_SIZE_VER2) of the size
    // passed, `pidfd` outlives the call, and the cgroup descriptor is borrowed
    // for it. With no stack given, the child runs on a copy of
    // this stack, exactly as after fork(); the caller guarantees we are
    // single-threaded (see the function's safety section).
    let ret = check(unsafe { libc::syscall(libc::SYS_clone3, &raw mut args, std::mem::size_of::<CloneArgs>()) })?;
    if ret == 0 {
        return Ok(Forked::Child);
    }
    // SAFETY: with CLONE_PIDFD the kernel stored a new descriptor that this
    // process now owns and nothing else refers to.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok(Forked::Parent { pid: ret as i32, pidfd })
}

/// `fork()`.
///
/// # Safety
/// As for [`clone_with_namespaces`]: the caller must be single-threaded.
pub unsafe fn fork() -> io::Result<Forked> {
    // SAFETY: the caller is single-threaded, so the child may run any code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { pid, pidfd: None }),
    }
}

/// Sets this thread's filesystem uid and gid, returning the previous ones.
/// The raw system calls, not glibc's wrappers: they change this thread
/// alone, where glibc would change every thread of the process.
pub fn set_thread_fs_ids(uid: u32, gid: u32) -> io::Result<(u32, u32)> {
    // setfsuid and setfsgid return the previous id whether or not they
    // succeeded; asking again with -1 (never a valid id) tells which.
    let set = |call: libc::c_long, id: u32| {
        // SAFETY: the call takes one integer and changes only this thread's
        // credentials; it touches no memory.
        let previous = unsafe { libc::syscall(call, id) } as u32;
        // SAFETY: as above; -1 changes nothing and returns the current id.
        let now = unsafe { libc::syscall(call, u32::MAX) } as u32;
        if now == id { Ok(previous) } else { Err(io::Error::from(io::ErrorKind::PermissionDenied)) }
    };
    // The group first, while the uid may still be root's.
    let previous_gid = set(libc::SYS_setfsgid, gid)?;
    let previous_uid = set(libc::SYS_setfsuid, uid).inspect_err(|_| {
        let _ = set(libc::SYS_setfsgid, previous_gid);
    })?;
    Ok((previous_uid, previous_gid))
}

/// `fcntl(fd, F_OFD_SETLK, lock)`: takes (or fails at once to take) a lock
/// that belongs to this open file description, not to the process.
pub fn set_ofd_lock(fd: BorrowedFd<'_>, lock: &libc::flock) -> io::Result<()> {
    // SAFETY: `lock` is a valid `struct flock` borrowed for the call, which
    // only reads it for F_OFD_SETLK; `fd` is open for as long as it is borrowed.
    let ret = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, std::ptr::from_ref(lock)) };
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Installs a seccomp filter on this thread (the process is single-threaded).
pub fn install_seccomp(program: &[Instruction]) -> io::Result<()> {
    #[repr(C)]
    struct SockFprog {
        len: libc::c_ushort,
        filter: *const Instruction,
    }
    let len = libc::c_ushort::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    let prog = SockFprog { len, filter: program.as_ptr() };
    const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
    // SAFETY: `prog` points at `program`, whose `Instruction` has the layout
    // of `struct sock_filter` (repr(C): u16, u8, u8, u32); the kernel copies
    // the filter during the call, so nothing needs to outlive it.
    check(unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0 as libc::c_ulong, &raw const prog) })
        .map(drop)
}

/// Flags for [`mount_setattr`].
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// `mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, set)`: sets mount
/// attributes on the tree at `fd` and every mount below it.
pub fn mount_setattr_recursive(fd: BorrowedFd<'_>, set: u64) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let attr = MountAttr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: `attr` is a valid mount_attr of the size passed; the empty
    // path is a NUL-terminated static string; `fd` is borrowed for the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Puts every signal this process catches back to its default action. A
/// fork of the interpreter keeps CPython's handlers (SIGINT's); a PID 1
/// receives from its own namespace exactly the signals it catches, so a
/// forked run's init must catch none the code could send it.
pub fn default_caught_signals() -> io::Result<()> {
    // 1 to 64: the kernel's signals (_NSIG); the ones glibc reserves, and
    // SIGKILL and SIGSTOP, are refused by sigaction and skipped.
    for signal in 1..=64 {
        // SAFETY: sigaction is plain data; all-zero is a valid value to be filled in.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: only reads the current action into `current`, which lives across the call.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &raw mut current) } != 0 {
            continue;
        }
        if current.sa_sigaction == libc::SIG_DFL || current.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: as above; SIG_DFL with no flags is the default action.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: `default` is a valid, initialised action; the old one is not asked for.
        if unsafe { libc::sigaction(signal, &raw const default, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Closes every descriptor from `first` up, but `keep`.
pub fn close_from_except(first: RawFd, keep: RawFd) -> io::Result<()> {
    let close = |from: RawFd, to: libc::c_uint| {
        // SAFETY: closing descriptors of this process. Callers call this only
        // where no live Rust object (OwnedFd, File) refers to the closed
        // range: right after start-up, or right before exec.
        check(unsafe { libc::syscall(libc::SYS_close_range, from as libc::c_uint, to, 0 as libc::c_uint) }).map(drop)
    };
    if keep > first {
        close(first, (keep - 1) as libc::c_uint)?;
    }
    close(first.max(keep + 1), libc::c_uint::MAX)
}

/// `execve`; returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let argv_ptrs: Vec<*const libc::c_char> =
        argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp_ptrs: Vec<*const libc::c_char> =
        envp.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    // SAFETY: both arrays are NULL-terminated and point at NUL-terminated
    // strings that `argv` and `envp` keep alive for the call.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Brings the loopback interface up in this network namespace.
pub fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket(rustix::net::AddressFamily::INET, rustix::net::SocketType::DGRAM, None)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // (The request's type is the C library's: an unsigned long in glibc, an
    // int in musl, whose static build of the helper starts fastest.)
    // SAFETY: SIOCGIFFLAGS reads into `req`, a valid ifreq naming "lo".
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &raw mut req) }.into())?;
    // SAFETY: reading the flags union member SIOCGIFFLAGS just filled.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`, a valid ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &raw const req) }.into()).map(drop)
}

/// CLOCK_MONOTONIC now, in nanoseconds: a time the helper and the
/// supervisor (processes of one host, in one time namespace) compare.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// The Landlock ABI version of the running kernel, or `None` without Landlock.
pub fn landlock_abi() -> Option<u32> {
    landlock_version().ok()
}

/// The Landlock ABI version, or the kernel's answer without Landlock:
/// `ENOSYS` when it was built without it, `EOPNOTSUPP` when it has it but
/// did not start it (landlock left out of the `lsm=` boot list).
pub fn landlock_version() -> Result<u32, rustix::io::Errno> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer and size 0, this flag only asks
    // the kernel for its ABI version and touches no memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    match u32::try_from(ret) {
        Ok(version) if version > 0 => Ok(version),
        _ => {
            Err(rustix::io::Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(rustix::io::Errno::NOSYS))
        }
    }
}

/// Waits for child `pid` and returns the CPU time (user + system) it and the
/// descendants it reaped used, and how it ended, in words.
pub fn wait4_cpu_time(pid: i32) -> io::Result<(std::time::Duration, String)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid for writes for the call.
        let ret = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
        if ret == pid {
            break;
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
    let time = |tv: libc::timeval| std::time::Duration::new(tv.tv_sec as u64, (tv.tv_usec as u32) * 1000);
    let ended = if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit status {}", libc::WEXITSTATUS(status))
    };
    Ok((time(usage.ru_utime) + time(usage.ru_stime), ended))
}

/// The run's init, its work done: reaps whatever is orphaned to it, for
/// ever. SIGCHLD is blocked and waited for, so it sleeps until a child ends
/// and wakes for nothing else; the helper outside ends it with SIGKILL.
pub fn reap_orphans_forever() -> ! {
    // SAFETY: sigset_t is plain data; all-zero is a valid value, which
    // sigemptyset then initialises.
    let mut sigchld: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `sigchld` is a valid sigset_t owned here; SIGCHLD is a valid
    // signal number. The init is single-threaded, so the process mask is
    // this thread's.
    unsafe {
        libc::sigemptyset(&raw mut sigchld);
        libc::sigaddset(&raw mut sigchld, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &raw const sigchld, std::ptr::null_mut());
    }
    loop {
        // Every child that has ended, then sleep until the next one does (a
        // SIGCHLD sent between the two stays pending and wakes it at once).
        while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
        // SAFETY: `sigchld` is a valid, initialised set; no siginfo is asked for.
        unsafe { libc::sigwaitinfo(&raw const sigchld, std::ptr::null_mut()) };
    }
}
