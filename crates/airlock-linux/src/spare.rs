//! A helper started before its request is ready, so that its exec and
//! start-up overlap the supervisor's own work on the other CPU.
//!
//! Each start of `airlock-init` costs about a millisecond before the helper
//! reads a byte: the kernel's exec, the dynamic loader, glibc's CPU feature
//! detection (each `cpuid` traps in a VM). A cold run has two such starts on
//! its path, one after the other: the helper that makes the sandbox, then the
//! helper that makes the run. A spare takes that millisecond off the path:
//! the backend starts one before it probes the host (the setup helper, once
//! the plan is ready), and the setup starts one while the sandbox is built
//! (the run's helper).
//!
//! A spare is an ordinary helper, started as [`spawn_helper`] starts every
//! helper, that has not been sent its request yet: it waits on its socket and
//! does nothing else, so when it was started changes nothing it does. It is
//! used only by the thread that started it, in the process that started it:
//! the helper's `PR_SET_PDEATHSIG` (set once its request comes) fires when
//! the *thread* that forked it ends, so a spare handed to another thread could
//! be killed in the middle of its run when its starter exits; and a fork of
//! the supervisor holds a copy of the socket, not a child. Any other spare is
//! ended and a fresh helper started, as without one.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread::ThreadId;

use crate::supervise::spawn_helper;

/// A started helper, waiting for its request (see the module's comment).
#[derive(Debug)]
pub(crate) struct SpareHelper {
    /// `None` once handed over.
    started: Option<(Child, OwnedFd)>,
    path: PathBuf,
    thread: ThreadId,
    process: u32,
}

impl SpareHelper {
    /// Starts `helper`; `None` if it cannot be (the helper started in its
    /// place, when one is needed, then names the error).
    pub(crate) fn start(helper: &Path) -> Option<SpareHelper> {
        let started = spawn_helper(helper, &[]).ok()?;
        Some(SpareHelper {
            started: Some(started),
            path: helper.to_owned(),
            thread: std::thread::current().id(),
            process: std::process::id(),
        })
    }

    /// The helper, if this thread of this process started it from `helper`
    /// and it is still waiting; otherwise it is ended here and `None`.
    fn claim(mut self, helper: &Path) -> Option<(Child, OwnedFd)> {
        let ours = self.thread == std::thread::current().id() && self.process == std::process::id();
        if !ours || self.path != helper {
            return None;
        }
        let (mut child, socket) = self.started.take()?;
        match child.try_wait() {
            Ok(None) => Some((child, socket)),
            // It has exited (someone killed it): reaped, and a fresh one started.
            _ => None,
        }
    }
}

impl Drop for SpareHelper {
    fn drop(&mut self) {
        if let Some((mut child, socket)) = self.started.take() {
            // Closing the socket alone would end it too (it reads end of
            // file); the kill makes the reap wait for nothing but the kernel.
            // A fork of the supervisor has a copy of the socket, not the
            // child: it closes its copy and leaves the child alone.
            drop(socket);
            if self.process == std::process::id() {
                let _ = child.kill();
                let _ = child.wait();
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

impl HelperSource<'_> {
    /// The helper, with the supervisor's end of its socket.
    pub(crate) fn start(self) -> std::io::Result<(Child, OwnedFd)> {
        match self.spare.and_then(|spare| spare.claim(self.path)) {
            Some(started) => Ok(started),
            None => spawn_helper(self.path, &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HelperSource, SpareHelper};
    use std::path::Path;

    /// A stand-in helper that waits on its socket, as the helper does:
    /// `cat` reads its standard input until end of file.
    const WAITER: &str = "/bin/cat";

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
    }

    #[test]
    fn a_spare_is_used_by_the_thread_that_started_it() {
        let spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = spare.started.as_ref().map(|(child, _)| child.id()).unwrap();
        let (mut child, socket) = HelperSource { path: Path::new(WAITER), spare: Some(spare) }.start().unwrap();
        assert_eq!(child.id(), pid, "the spare was not the helper handed over");
        drop(socket);
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn a_spare_is_never_handed_to_another_thread_nor_for_another_helper() {
        for other_helper in [false, true] {
            let spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
            let pid = spare.started.as_ref().map(|(child, _)| child.id()).unwrap();
            let (mut child, socket) = std::thread::spawn(move || {
                let path = if other_helper { "/usr/bin/cat" } else { WAITER };
                HelperSource { path: Path::new(path), spare: Some(spare) }.start().unwrap()
            })
            .join()
            .unwrap();
            assert_ne!(child.id(), pid, "a spare crossed (another helper: {other_helper})");
            // The spare was killed and reaped, not left running.
            assert!(!alive(pid), "the spare {pid} outlived its refusal");
            drop(socket);
            child.wait().unwrap();
        }
    }

    #[test]
    fn a_spare_that_died_is_replaced() {
        let mut spare = SpareHelper::start(Path::new(WAITER)).expect("cat starts");
        let pid = spare.started.as_ref().map(|(child, _)| child.id()).unwrap();
        if let Some((child, _)) = spare.started.as_mut() {
            child.kill().unwrap();
            // Dead before it is claimed.
            while alive(pid) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let (mut child, socket) = HelperSource { path: Path::new(WAITER), spare: Some(spare) }.start().unwrap();
        assert_ne!(child.id(), pid, "a dead spare was handed over");
        drop(socket);
        child.wait().unwrap();
    }
}
