//! Processes inside the sandbox: tying the helper's life to its parent, and
//! starting the code in a new session with only its three descriptors.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::process::{Signal, WaitOptions, set_parent_process_death_signal};

use crate::protocol::Failure;
use crate::seccomp::Instruction;
use crate::sys::{self, Forked};

/// Child side: die with the parent. `expected_parent` guards the race in
/// which the parent died before the request was registered.
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

/// Child side (the sandbox's init): fails if the helper, its parent, is gone
/// already, as the end of `parent_alive` hanging up shows.
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

/// Child side (sandbox init): forks the code. The child becomes a session
/// leader with no terminal, gets `stdio` as 0, 1, 2 and nothing else, installs
/// the seccomp filter last, and execs. Returns the code's pid once exec has
/// succeeded.
pub fn spawn_code(exec: &Exec, stdio: [OwnedFd; 3], seccomp: &[Instruction]) -> Result<i32, Failure> {
    let step = "start the code";
    let (error_read, error_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| Failure::new(step, "pipe", &e.into()))?;
    // SAFETY: the sandbox's init is single-threaded (a fresh exec that starts
    // no threads), so the child may run any code.
    match unsafe { sys::fork() }.map_err(|e| Failure::new(step, "fork", &e))? {
        Forked::Child => {
            let error = exec_code(exec, stdio, &error_write, seccomp);
            let _ = rustix::io::write(&error_write, error.as_bytes());
            std::process::exit(127);
        }
        Forked::Parent { pid, .. } => {
            drop(error_write);
            drop(stdio);
            let mut message = String::new();
            let _ = std::fs::File::from(error_read).read_to_string(&mut message);
            if message.is_empty() {
                Ok(pid)
            } else {
                Err(Failure::plain("execute the code", format!("{}: {message}", exec.argv[0].to_string_lossy())))
            }
        }
    }
}

/// In the forked child: returns only on failure.
fn exec_code(exec: &Exec, stdio: [OwnedFd; 3], error_pipe: &OwnedFd, seccomp: &[Instruction]) -> String {
    if let Err(e) = rustix::process::setsid() {
        return format!("setsid: {e}");
    }
    let [stdin, stdout, stderr] = stdio;
    let dups = rustix::stdio::dup2_stdin(stdin.as_fd())
        .and_then(|()| rustix::stdio::dup2_stdout(stdout.as_fd()))
        .and_then(|()| rustix::stdio::dup2_stderr(stderr.as_fd()));
    if let Err(e) = dups {
        return format!("standard streams: {e}");
    }
    // Everything but 0, 1, 2 and the close-on-exec error pipe goes: the
    // code starts with exactly its three streams.
    drop((stdin, stdout, stderr));
    if let Err(e) = sys::close_from_except(3, error_pipe.as_raw_fd()) {
        return format!("close descriptors: {e}");
    }
    if let Err(e) = rustix::process::chdir(exec.cwd.as_c_str()) {
        return format!("working directory {}: {e}", exec.cwd.to_string_lossy());
    }
    if let Err(e) = sys::install_seccomp(seccomp) {
        return format!("seccomp: {e}");
    }
    let error = sys::execve(&exec.argv[0], &exec.argv, &exec.env);
    format!("{error}")
}

/// How the code's process ended, as the sandbox's init saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CodeExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Some process of the run held as many descriptors as its limit allows.
    pub open_files_hit: bool,
}

/// How often the init looks at the run's open descriptors.
const FD_SAMPLE: rustix::time::Timespec = rustix::time::Timespec { tv_sec: 0, tv_nsec: 10_000_000 };

/// Child side (sandbox init): reaps every process until `code` exits, and
/// returns how it ended. Meanwhile it samples, every 10 ms, how many
/// descriptors each process holds: the kernel counts no EMFILE failures, so
/// this is how a run that reached its open-file limit is told apart (a
/// process that reaches the limit and lets go within 10 ms can be missed).
pub fn reap_until(code: i32, open_files: u64) -> CodeExit {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut exit = CodeExit::default();
    let pidfd = rustix::process::Pid::from_raw(code)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok());
    loop {
        // Reap whatever ended: the code, or orphans it left to us.
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == code => {
                    exit.code = status.exit_status();
                    exit.signal = status.terminating_signal();
                    return exit;
                }
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // ECHILD: nothing left, which cannot happen before `code` is reaped.
                Err(_) => return exit,
            }
        }
        if !exit.open_files_hit {
            exit.open_files_hit = any_process_at_fd_limit(open_files);
        }
        match &pidfd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                let _ = poll(&mut fds, Some(&FD_SAMPLE));
            }
            None => {
                let _ = rustix::thread::nanosleep(&FD_SAMPLE);
            }
        }
    }
}

fn any_process_at_fd_limit(limit: u64) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs.flatten().any(|entry| {
        let name = entry.file_name();
        let is_pid = name.to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()) && n != "1");
        is_pid && std::fs::read_dir(entry.path().join("fd")).map(|fds| fds.count() as u64 >= limit).unwrap_or(false)
    })
}
