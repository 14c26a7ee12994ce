//! `libairlock_fork.so`: the native steps of a forked pool's template and
//! its forks (docs/design.md, "Forked starts"; `airlock_linux::fork`), and
//! the arena allocator every warm driver installs before its preload
//! ([`arena`]; a pooled sandbox loads the library for that alone).
//!
//! The template's driver loads it with `ctypes.CDLL` and calls these
//! functions with integers only: no pointer and no struct crosses from
//! Python, so no layout written by hand can fail open. Each is the cold
//! path's own code. A function returns 0 once its step is in force; on a
//! failure the forks' functions report it (the code's process on its setup
//! pipe, as a cold run's does) and return 125, the exit status the driver
//! then exits with.

use std::os::fd::BorrowedFd;
use std::os::raw::c_int;

mod arena;

use airlock_linux::fork;
use airlock_linux::protocol::{CodeSetup, Failure};

/// The status a fork exits with when a step of its setup failed.
const SETUP_FAILED: c_int = 125;

/// In a warm driver, before its preload: CPython's object arenas from
/// chunks aligned to huge pages, so that the preload's can be collapsed
/// into them ([`arena`]). Returns 0, EEXIST if already installed, or ENOSYS
/// in a process without CPython.
// SAFETY: the symbol's name is this library's own, unique in the process.
#[unsafe(no_mangle)]
pub extern "C" fn airlock_fork_align_arenas() -> c_int {
    arena::install()
}

/// In the template, before its two forks: the PID namespace they are born in.
/// Returns 0, or the errno.
// SAFETY: the symbol's name is this library's own, unique in the process.
#[unsafe(no_mangle)]
pub extern "C" fn airlock_fork_unshare_pid() -> c_int {
    errno_of(fork::unshare_pid())
}

/// In the template, after both forks: back to its own PID namespace for
/// children, `pid_ns` being its `/proc/self/ns/pid`. Returns 0, or the errno.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn airlock_fork_join_pid_namespace(pid_ns: c_int) -> c_int {
    errno_of(fork::join_pid_namespace(pid_ns))
}

/// The first fork: the run's init. Writes one byte on `ready` once
/// confined; never returns unless a step failed (125): the driver exits
/// with it.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn airlock_fork_init(plan: c_int, lifeline: c_int, ready: c_int) -> c_int {
    let Err(failure) = fork::init(plan, lifeline, ready);
    // What failed, instead of the ready byte: the template fails the run with it.
    // SAFETY: the template keeps the ready pipe open at this number (a
    // failed init has closed nothing).
    let pipe = unsafe { BorrowedFd::borrow_raw(ready) };
    let _ = rustix::io::write(pipe, failure.to_string().as_bytes());
    SETUP_FAILED
}

/// The second fork: the code's process. Returns 0 with every layer in
/// force, or 125 once the failed step is written to `setup`.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn airlock_fork_child(plan: c_int, setup: c_int, lifeline: c_int) -> c_int {
    match fork::child(plan, setup, lifeline) {
        Ok(()) => 0,
        Err(failure) => {
            // SAFETY: the template keeps the setup pipe open at this number.
            let pipe = unsafe { BorrowedFd::borrow_raw(setup) };
            airlock_linux::confine::report_setup(pipe, &CodeSetup::Failed(failure));
            SETUP_FAILED
        }
    }
}

fn errno_of(result: Result<(), Failure>) -> c_int {
    match result {
        Ok(()) => 0,
        Err(failure) => failure.errno.filter(|e| *e != 0).unwrap_or(libc_eio()),
    }
}

/// EIO: a failure without an errno of its own.
const fn libc_eio() -> c_int {
    5
}
