//! A helper started before its request is ready, so that its exec and
//! start-up overlap the supervisor's own work on the other CPU.
//!
//! Each start of `airlock-init` costs time before the helper reads a byte:
//! the kernel's exec, and where it is built for glibc the dynamic loader and
//! glibc's CPU feature detection (each `cpuid` traps in a VM): about a
//! millisecond, against 0.2 ms for the static musl build airlock-build makes
//! where it can. A cold run has two such starts on its path, one after the
//! other: the helper that makes the sandbox, then the helper that makes the
//! run. A spare takes them off the path: the backend starts two while it
//! probes the host, the setup's helper (used once the plan is ready) and
//! the first run's helper, which makes the run's network namespace while it
//! waits (see `network`). The first run's starts with the probe: a
//! cold run is almost wholly serial, and during the probe the second CPU
//! is idle, where while the sandbox is built three processes (the command,
//! the setup's helper and this one making a network namespace, 0.5 ms of
//! CPU) shared two CPUs: a cold `airlock run` went from 1.37x bare Python
//! to 1.35x (bench/results/startup.md, stop 36). A later sandbox's setup,
//! and the first one's made on another thread, starts its run's helper
//! while the sandbox is built; a pooled sandbox's, whose run is made on a
//! thread of its own, starts none (`Backend::create_to_start_ahead`).
//!
//! A spare is an ordinary helper, started as [`spawn_helper`] starts every
//! helper, that has not been sent its request yet: it closes everything but
//! its socket and waits. At its start it takes what every helper takes (the
//! supervisor's cgroup, credentials, rlimits, seccomp state, security
//! label), and airlock changes none of these between a spare's start and its
//! use: the one move, into a systemd scope, comes before the first spare.
//! It is used only by the thread that started it, in the process that
//! started it: the helper's `PR_SET_PDEATHSIG` (set once its request comes)
//! fires when the *thread* that forked it ends, so a spare handed to another
//! thread could be killed in the middle of its run when its starter exits;
//! and a fork of the supervisor holds a copy of the socket, not a child. Any
//! other spare is refused: its socket is closed, so it exits by itself, and
//! it is handed back to be reaped later, off the caller's path (waiting for
//! it at once cost 0.4 ms here); a fresh helper is started in its place.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread::ThreadId;

use crate::supervise::{Ending, spawn_helper};

/// A started helper, waiting for its request (see the module's comment).
#[derive(Debug)]
pub(crate) struct SpareHelper {
    /// `None` once handed over or refused.
    started: Option<(Child, OwnedFd)>,
    path: PathBuf,
    thread: ThreadId,
    process: u32,
}

impl SpareHelper {
    /// Starts `helper`; `None` if it cannot be (the helper started in its
    /// place, when one is needed, then names the error).
    pub(crate) fn start(helper: &Path) -> Option<SpareHelper> {
        SpareHelper::spawn(helper, &[])
    }

    /// Starts `helper` for a run: it makes the run's network namespace
    /// while it waits ([`crate::child::RUN_SPARE_ARG`]).
    pub(crate) fn start_for_run(helper: &Path) -> Option<SpareHelper> {
        SpareHelper::spawn(helper, &[crate::child::RUN_SPARE_ARG])
    }

    /// Whether the calling thread started it: only that thread may use it.
    pub(crate) fn started_on_this_thread(&self) -> bool {
        self.thread == std::thread::current().id() && self.process == std::process::id()
    }

    /// Hands it back unused: its socket closed, so it exits by itself, and
    /// its process to reap later where it is this process's child (a
    /// fork's copy leaves it to its parent).
    pub(crate) fn refuse(mut self) -> Option<Ending> {
        let (child, socket) = self.started.take()?;
        drop(socket);
        // Made only when it is ours: an `Ending` dropped kills and reaps.
        if self.process == std::process::id() { Some(Ending::new(child)) } else { None }
    }

    fn spawn(helper: &Path, args: &[&str]) -> Option<SpareHelper> {
        let started = spawn_helper(helper, args).ok()?;
        Some(SpareHelper {
            started: Some(started),
            path: helper.to_owned(),
            thread: std::thread::current().id(),
            process: std::process::id(),
        })
    }

    /// The helper, if this thread of this process started it from `helper`
    /// and it is still waiting. Otherwise `Err`, with the spare to reap
    /// later where it is this process's child and has not been reaped.
    fn claim(mut self, helper: &Path) -> Result<(Child, OwnedFd), Option<Ending>> {
        if !self.started_on_this_thread() || self.path != helper {
            return Err(self.refuse());
        }
        let (mut child, socket) = self.started.take().ok_or(None)?;
        match child.try_wait() {
            Ok(None) => Ok((child, socket)),
            // It has exited (someone killed it), and is reaped now.
            Ok(Some(_)) => Err(None),
            Err(_) => Err(Some(Ending::new(child))),
        }
    }
}

impl Drop for SpareHelper {
    /// A spare never claimed ends with what held it (a sandbox, the backend).
    fn drop(&mut self) {
        if let Some((child, socket)) = self.started.take() {
            drop(socket);
            if self.process == std::process::id() {
                drop(Ending::new(child));
            }
        }
    }
}

/// Where the helper for a request comes from: `spare`, where this thread may
/// use it, else a fresh start of `path`.
#[derive(Debug)]
pub(crate) struct HelperSource<'a> {
    pub(crate) path: &'a Path,
    pub(crate) spare: Option<SpareHelper>,
}

/// A helper ready for its request.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) child: Child,
    /// The supervisor's end of its socket.
    pub(crate) socket: OwnedFd,
    /// A spare refused on the way, ending: the caller reaps it later.
    pub(crate) refused: Option<Ending>,
}

impl HelperSource<'_> {
    pub(crate) fn start(self) -> std::io::Result<Started> {
        let refused = match self.spare.map(|spare| spare.claim(self.path)) {
            Some(Ok((child, socket))) => return Ok(Started { child, socket, refused: None }),
            Some(Err(refused)) => refused,
            None => None,
        };
        let (child, socket) = spawn_helper(self.path, &[])?;
        Ok(Started { child, socket, refused })
    }
}

#[cfg(test)]
mod tests {
    use super::{HelperSource, SpareHelper, Started};
    use std::os::fd::OwnedFd;
    use std::path::Path;

    /// A stand-in helper that waits on its socket, as the helper does:
    /// `cat` reads its standard input until end of file.
    const WAITER: &str = "/bin/cat";

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
    }

    fn pid_of(spare: &SpareHelper) -> u32 {
        spare.started.as_ref().map(|(child, _)| child.id()).expect("a started spare")
    }

    /// Waits for `done`, failing the test rather than hanging it.
    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}: still not so after 10 s");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The parent's side of a spare whose copy a fork holds.
    struct ParentsSpare {
        pid: u32,
        socket: OwnedFd,
    }

    impl ParentsSpare {
        /// Its socket closed, the spare exits, and the parent reaps it.
        fn end(self) {
            drop(self.socket);
            let pid = rustix::process::Pid::from_raw(self.pid as i32).unwrap();
            rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()).unwrap();
        }
    }

    /// A spare, and the copy a fork of this process holds: the same fields,
    /// but its process id is another's, and its socket a copy (the parent
    /// keeps its own).
    fn a_forks_copy() -> (SpareHelper, ParentsSpare) {
        let mut spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = pid_of(&spare);
        let (child, socket) = spare.started.take().unwrap();
        let copy = SpareHelper {
            started: Some((child, socket.try_clone().unwrap())),
            path: spare.path.clone(),
            thread: spare.thread,
            process: std::process::id().wrapping_add(1),
        };
        (copy, ParentsSpare { pid, socket })
    }

    fn end(started: Started) {
        let Started { mut child, socket, refused } = started;
        drop((socket, refused));
        child.wait().unwrap();
    }

    #[test]
    fn a_spare_is_used_by_the_thread_that_started_it() {
        let spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = pid_of(&spare);
        let started = HelperSource { path: Path::new(WAITER), spare: Some(spare) }.start().unwrap();
        assert_eq!(started.child.id(), pid, "the spare was not the helper handed over");
        assert!(started.refused.is_none());
        end(started);
    }

    /// Refused: another thread, another helper binary. The spare is not
    /// handed over, and ends by itself once its socket is closed.
    #[test]
    fn a_spare_is_never_handed_to_another_thread_nor_for_another_helper() {
        let take = |spare, path: &'static str| HelperSource { path: Path::new(path), spare: Some(spare) }.start();
        let other_thread = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let other_helper = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pids = [pid_of(&other_thread), pid_of(&other_helper)];
        let from_thread = std::thread::spawn(move || take(other_thread, WAITER).unwrap()).join().unwrap();
        // The same file by another path: the spare must be of the very path asked for.
        let from_path = take(other_helper, "/bin/../bin/cat").unwrap();
        for (started, pid) in [from_thread, from_path].into_iter().zip(pids) {
            assert_ne!(started.child.id(), pid, "a spare crossed");
            let mut refused = started.refused.expect("the refused spare, handed back to be reaped");
            // Its socket was closed: it reads end of file and exits, unkilled.
            eventually("the refused spare ended by itself", || refused.try_reap());
            assert!(!alive(pid));
            end(Started { refused: None, ..started });
        }
    }

    /// The backend's spare for a first run is used only where it may be:
    /// by the thread that started it (see `LinuxBackend::create`).
    #[test]
    fn a_spare_says_whether_this_thread_started_it() {
        let spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        assert!(spare.started_on_this_thread());
        let spare = std::thread::spawn(move || {
            assert!(!spare.started_on_this_thread(), "another thread took a spare for its own");
            spare
        })
        .join()
        .unwrap();
        assert!(spare.started_on_this_thread());
        let started = HelperSource { path: Path::new(WAITER), spare: Some(spare) }.start().unwrap();
        end(started);
    }

    /// A refused spare: its socket closed, it exits by itself and is
    /// handed back to be reaped; a fork's copy is left to its parent.
    #[test]
    fn a_refused_spare_ends_by_itself_and_is_reaped() {
        let spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = pid_of(&spare);
        let mut refused = spare.refuse().expect("this process's child, to reap");
        eventually("the refused spare ended by itself", || refused.try_reap());
        assert!(!alive(pid));

        let (copy, parents) = a_forks_copy();
        assert!(copy.refuse().is_none(), "a fork would reap its parent's child");
        assert!(alive(parents.pid), "a fork's refusal ended its parent's spare");
        parents.end();
    }

    #[test]
    fn a_spare_that_died_is_replaced() {
        let mut spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = pid_of(&spare);
        if let Some((child, _)) = spare.started.as_mut() {
            child.kill().unwrap();
            eventually("the killed spare died", || !alive(pid));
        }
        let started = HelperSource { path: Path::new(WAITER), spare: Some(spare) }.start().unwrap();
        assert_ne!(started.child.id(), pid, "a dead spare was handed over");
        end(started);
    }

    /// A fork of the supervisor holds a copy of the spare: it neither uses
    /// it nor kills it nor reaps it (the spare is its parent's child).
    #[test]
    fn a_forks_copy_of_a_spare_is_left_to_its_parent() {
        let (copy, parents) = a_forks_copy();
        let started = HelperSource { path: Path::new(WAITER), spare: Some(copy) }.start().unwrap();
        assert_ne!(started.child.id(), parents.pid, "a fork used its parent's spare");
        assert!(started.refused.is_none(), "a fork would reap its parent's child");
        assert!(alive(parents.pid), "a fork killed its parent's spare");
        end(started);
        parents.end();
    }
}
