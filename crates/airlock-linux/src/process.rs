//! Processes of a run, child side: tying a child's life to its parent, and
//! the last steps of the code's process: a new session, only its three
//! descriptors, seccomp last, exec.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::process::{Signal, set_parent_process_death_signal};

use crate::landlock::Enforced;
use crate::native::NATIVE_FD;
use crate::protocol::{CodeSetup, Failure};
use crate::seccomp::Instruction;
use crate::sys;

/// Child side: die with the parent. `expected_parent` guards the race in
/// which the parent died before the request was registered (for children
/// whose parent is in their own PID namespace; the others use a lifeline).
pub fn die_with_parent(expected_parent: Option<i32>) -> Result<(), Failure> {
    set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| Failure::new("die with the supervisor", "prctl(PR_SET_PDEATHSIG)", &e.into()))?;
    if let Some(expected) = expected_parent {
        let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
        if parent != Some(expected) {
            return Err(Failure::plain("die with the supervisor", "the supervisor is already gone"));
        }
    }
    Ok(())
}

/// A pipe that tells a child of the helper whether the helper still lives:
/// the helper holds the write end (the second) until it exits. The child's
/// parent is outside its PID namespace, where getppid cannot see it.
pub fn lifeline() -> Result<(OwnedFd, OwnedFd), Failure> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new("create the run's processes", "pipe", &e.into()))
}

/// Child side: fails if the helper, its parent, is gone already, as the end
/// of `parent_alive` hanging up shows. Call it after [`die_with_parent`], and
/// after closing this process's copy of the write end.
pub fn exit_if_parent_gone(parent_alive: OwnedFd) -> Result<(), Failure> {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&parent_alive, PollFlags::IN)];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    let _ = poll(&mut fds, Some(&zero));
    if fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
        return Err(Failure::plain("die with the supervisor", "the helper is already gone"));
    }
    Ok(())
}

/// Child side: makes this process undumpable, so the code (same user) cannot
/// open its /proc entries or ptrace it.
pub fn not_dumpable() -> Result<(), Failure> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| Failure::new("make init undumpable", "", &e.into()))
}

/// The code to execute, prepared before forking.
pub struct Exec {
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
}

impl Exec {
    pub fn new(argv: &[String], env: &[String], cwd: &str) -> Result<Exec, Failure> {
        let c = |s: &str| {
            CString::new(s).map_err(|_| Failure::plain("prepare the command", format!("{s:?} contains a NUL byte")))
        };
        if argv.is_empty() {
            return Err(Failure::plain("prepare the command", "empty argv"));
        }
        Ok(Exec {
            argv: argv.iter().map(|a| c(a)).collect::<Result<_, _>>()?,
            env: env.iter().map(|e| c(e)).collect::<Result<_, _>>()?,
            cwd: c(cwd)?,
        })
    }
}

/// The pipe on which the code's process reports its setup to the helper
/// (read end, write end). Close-on-exec: its end of file, with no failure
/// on it, says the program was executed.
pub fn setup_pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Failure::new("start the code", "pipe", &e.into()))
}

/// In the code's process: one line of its setup report.
pub fn report_setup(pipe: BorrowedFd<'_>, message: &CodeSetup) {
    if let Ok(mut line) = serde_json::to_vec(message) {
        line.push(b'\n');
        let _ = rustix::io::write(pipe, &line);
    }
}

/// Helper side: reads the code's setup report until its exec closes the
/// pipe. Returns what Landlock put in force, or the step that failed.
pub fn read_setup(pipe: OwnedFd, program: &CString) -> Result<Option<Enforced>, Failure> {
    let mut text = String::new();
    std::fs::File::from(pipe)
        .read_to_string(&mut text)
        .map_err(|e| Failure::new("start the code", "read its setup", &e))?;
    parse_setup(&text, program)
}

/// The code's setup report, read whole: what Landlock put in force, or the
/// step that failed.
pub fn parse_setup(text: &str, program: &CString) -> Result<Option<Enforced>, Failure> {
    let mut landlock = None;
    for line in text.lines() {
        match serde_json::from_str::<CodeSetup>(line) {
            Ok(CodeSetup::Landlock(enforced)) => landlock = Some(enforced),
            Ok(CodeSetup::Failed(mut failure)) => {
                if failure.step == EXEC_STEP {
                    failure.detail = format!("{}: {}", program.to_string_lossy(), failure.detail);
                }
                return Err(failure);
            }
            Err(e) => return Err(Failure::plain("start the code", format!("a garbled setup report: {e}"))),
        }
    }
    Ok(landlock)
}

const EXEC_STEP: &str = "execute the code";

/// The layers in force for the code once its setup is done: every one of a
/// cold run's (seccomp was its last step), Landlock where the kernel put it
/// in force.
pub fn layers_in_force(landlock: Option<Enforced>) -> Vec<airlock_policy::Layer> {
    use airlock_policy::Layer;
    let mut layers = crate::probe::NAMESPACE_LAYERS.to_vec();
    layers.extend([Layer::Seccomp, Layer::NoNewPrivs, Layer::Rlimits]);
    if matches!(landlock, Some(Enforced::Fully | Enforced::Partially)) {
        layers.push(Layer::Landlock);
    }
    layers
}

/// In the code's process, last: a session of its own with no terminal,
/// `stdio` as 0, 1, 2, `native` (the native library's memfd, see `native`)
/// as 3 if given, and nothing else but the setup pipe (closed on exec), the
/// working directory, the seccomp filter, exec. Returns only on failure.
pub fn exec_code(
    exec: &Exec,
    stdio: &[OwnedFd; 3],
    native: Option<BorrowedFd<'_>>,
    setup: BorrowedFd<'_>,
    seccomp: &[Instruction],
) -> Failure {
    let fail = |detail: String, e: &dyn std::fmt::Display| Failure::plain(EXEC_STEP, format!("{detail}: {e}"));
    if let Err(e) = rustix::process::setsid() {
        return fail("setsid".to_owned(), &e);
    }
    let [stdin, stdout, stderr] = stdio;
    let dups = rustix::stdio::dup2_stdin(stdin.as_fd())
        .and_then(|()| rustix::stdio::dup2_stdout(stdout.as_fd()))
        .and_then(|()| rustix::stdio::dup2_stderr(stderr.as_fd()));
    if let Err(e) = dups {
        return fail("standard streams".to_owned(), &e);
    }
    let mut first_closed = NATIVE_FD;
    if let Some(native) = native {
        if let Err(detail) = place_native(native, setup) {
            return fail("the native library's descriptor".to_owned(), &detail);
        }
        first_closed = NATIVE_FD + 1;
    }
    // Everything else goes: the code starts with exactly its three streams
    // (and its driver closes the native library's before any user code).
    // This process never returns into the frames that own the descriptors
    // closed here: it executes the program or exits.
    if let Err(e) = sys::close_from_except(first_closed, setup.as_raw_fd()) {
        return fail("close descriptors".to_owned(), &e);
    }
    if let Err(e) = rustix::process::chdir(exec.cwd.as_c_str()) {
        return fail(format!("working directory {}", exec.cwd.to_string_lossy()), &e);
    }
    if let Err(e) = sys::install_seccomp(seccomp) {
        return fail("seccomp".to_owned(), &e);
    }
    let error = sys::execve(&exec.argv[0], &exec.argv, &exec.env);
    Failure::new(EXEC_STEP, "", &error)
}

/// Puts `native` at [`NATIVE_FD`], open across the exec. The setup pipe
/// must not be there: its failure reports would then go nowhere. (It never
/// is: 3 is the helper's socket to the supervisor, which it holds for the
/// whole run, `take_socket`; the code's copy of it is what goes here.)
fn place_native(native: BorrowedFd<'_>, setup: BorrowedFd<'_>) -> Result<(), String> {
    if setup.as_raw_fd() == NATIVE_FD {
        return Err(format!("the setup pipe is at descriptor {NATIVE_FD}, which the library takes"));
    }
    if native.as_raw_fd() != NATIVE_FD {
        // SAFETY: replaces whatever descriptor is at NATIVE_FD (not the
        // setup pipe, checked above). This process only executes the
        // program or exits from here, so no object that owned the number
        // is used again.
        if unsafe { libc::dup2(native.as_raw_fd(), NATIVE_FD) } < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    // A copy made by dup2 stays open across exec; one already at the number
    // keeps its close-on-exec, cleared here.
    // SAFETY: NATIVE_FD is open (the library, placed above) until exec.
    let placed = unsafe { BorrowedFd::borrow_raw(NATIVE_FD) };
    rustix::io::fcntl_setfd(placed, rustix::io::FdFlags::empty()).map_err(|e| e.to_string())
}
