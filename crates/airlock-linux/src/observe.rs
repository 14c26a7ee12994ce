//! The helper's watch over a run, from outside it: the parent of both the
//! run's init and the code's process, in a PID namespace neither can see
//! into, so nothing of the run can signal, trace, limit or outlive it. What
//! it reports of the code's end is the kernel's word, not the code's.

use std::os::fd::BorrowedFd;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Signal, WaitId, WaitIdOptions, pidfd_send_signal, waitid};

use crate::protocol::{Failure, ProcessEnd};

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub code: ProcessEnd,
    /// How the init ended, when it died before the code did (the kernel
    /// then killed every process of the run, the code among them).
    pub init_first: Option<ProcessEnd>,
    /// When the code's process was reaped (CLOCK_MONOTONIC, ns, taken just
    /// after): before the rest of the run was ended, which may take as long
    /// as the code's other processes make it.
    pub code_reaped_ns: u64,
}

/// Helper side: waits until the code's process has ended, then ends the run
/// (killing the init ends every process the code left behind) and reaps the
/// init. If the supervisor goes away first, kills the run and reports
/// nothing.
///
/// `init_socket` is the helper's end of a socket the init holds until it
/// dies: a dying process closes its descriptors before the kernel kills the
/// rest of its PID namespace, so when the code's end is seen, the socket
/// has already hung up if the init died first.
pub fn until_ended(
    code: BorrowedFd<'_>,
    init: BorrowedFd<'_>,
    init_socket: BorrowedFd<'_>,
    supervisor: BorrowedFd<'_>,
) -> Result<Ended, Failure> {
    let step = "watch the code";
    let mut code_end = None;
    let mut code_reaped_ns = 0;
    let mut init_end = None;
    let mut init_died_first = false;
    while code_end.is_none() || init_end.is_none() {
        // Only what is still awaited is polled: a reaped child's pidfd
        // reports POLLHUP whatever is asked, and polling it would spin this
        // loop while the kernel tears the run down.
        let mut fds = vec![PollFd::new(&supervisor, PollFlags::empty())];
        if code_end.is_none() {
            fds.push(PollFd::new(&code, PollFlags::IN));
        }
        if init_end.is_none() {
            fds.push(PollFd::new(&init, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                kill(init, code);
                return Err(Failure::new(step, "poll", &e.into()));
            }
        }
        let supervisor_gone = fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR);
        let mut rest = fds[1..].iter().map(|fd| !fd.revents().is_empty());
        let code_ready = code_end.is_none() && rest.next().unwrap_or(false);
        let init_ready = init_end.is_none() && rest.next().unwrap_or(false);
        drop(fds);
        if supervisor_gone {
            kill(init, code);
            return Err(Failure::plain(step, "the supervisor went away"));
        }
        // The code first: a dying init waits, in the kernel, until the
        // helper has reaped the code (a child of the helper, not of the init).
        if code_ready {
            code_end = reap(code).map_err(|e| Failure::new(step, "wait for the code", &e.into()))?;
            if code_end.is_some() {
                code_reaped_ns = crate::sys::monotonic_ns();
                init_died_first = hung_up(init_socket);
                // The code is done: end whatever it left behind.
                let _ = pidfd_send_signal(init, Signal::KILL);
            }
        }
        if init_ready {
            init_end = reap(init).map_err(|e| Failure::new(step, "wait for the init", &e.into()))?;
        }
    }
    match code_end {
        Some(code) => Ok(Ended { code, init_first: init_end.filter(|_| init_died_first), code_reaped_ns }),
        None => Err(Failure::plain(step, "the code's end was not seen")),
    }
}

/// Whether the peer of `socket` has closed it.
fn hung_up(socket: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&socket, PollFlags::empty())];
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    poll(&mut fds, Some(&zero)).is_ok() && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
}

/// The end of a child that exited, if it has.
fn reap(child: BorrowedFd<'_>) -> rustix::io::Result<Option<ProcessEnd>> {
    loop {
        match waitid(WaitId::PidFd(child), WaitIdOptions::EXITED | WaitIdOptions::NOHANG) {
            Ok(status) => return Ok(status.as_ref().map(ProcessEnd::from_status)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn kill(init: BorrowedFd<'_>, code: BorrowedFd<'_>) {
    let _ = pidfd_send_signal(init, Signal::KILL);
    let _ = pidfd_send_signal(code, Signal::KILL);
}
