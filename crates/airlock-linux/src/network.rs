//! The network namespace: only loopback, brought up so the code can talk to
//! itself; and, when hosts are allowed, the proxy's listening socket, made
//! inside before any code runs and handed to the supervisor.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;

use rustix::net::{AddressFamily, SocketFlags, SocketType, bind, listen, socket_with};

use crate::protocol::Failure;
use crate::sys;

/// Where the sandbox finds the proxy, inside its own namespace.
pub const PROXY_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3128);

/// Child side: brings up `lo`, the only interface a new namespace has.
pub fn loopback_up() -> Result<(), Failure> {
    sys::loopback_up().map_err(|e| Failure::new("bring up loopback", "lo", &e))
}

/// Helper side, in a helper started ahead of a run's request (`spare`):
/// moves it into a new network namespace with `lo` up, which the run's
/// processes then inherit instead of one made when the run is asked for.
/// Creating a network namespace is the dearest of a run's (0.3 to 0.5 ms
/// here, the `clone3` of the init's others together about as much), and a
/// spare waits for its request anyway. The namespace belongs to the host's
/// user namespace, whose root made it: the run's processes, in the
/// sandbox's, have no capability over it at all (they could not bring `lo`
/// up; the helper has). Whether it was made: only root may make one
/// outside a user namespace, so an ordinary user's helpers go on without
/// one and the run makes its own, as every helper not started ahead does.
pub fn make_ahead_of_run() -> bool {
    // SAFETY: a new network namespace for this single-threaded helper;
    // nothing about its descriptor table changes.
    let made = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) };
    made.is_ok() && sys::loopback_up().is_ok()
}

/// Child side: listens on [`PROXY_ADDR`] inside the sandbox's namespace.
pub fn listen_proxy() -> Result<OwnedFd, Failure> {
    let step = "listen for the proxy";
    let fd = socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| Failure::new(step, "socket", &e.into()))?;
    bind(&fd, &PROXY_ADDR).map_err(|e| Failure::new(step, PROXY_ADDR.to_string(), &e.into()))?;
    listen(&fd, 128).map_err(|e| Failure::new(step, "listen", &e.into()))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::make_ahead_of_run;

    /// As root a helper's network namespace made ahead of its run is a new
    /// one with `lo` up; an ordinary user's is refused, and the helper stays
    /// where it was (its run makes its own).
    #[test]
    fn a_network_namespace_made_ahead_is_new_and_has_loopback_up() {
        // In a thread of its own: the namespace is the calling thread's.
        std::thread::spawn(|| {
            let own = || std::fs::read_link("/proc/thread-self/ns/net").expect("this thread's network namespace");
            let before = own();
            let made = make_ahead_of_run();
            if !rustix::process::geteuid().is_root() {
                assert!(!made);
                assert_eq!(own(), before);
                return;
            }
            assert!(made);
            assert_ne!(own(), before, "the helper's namespace is the one it was in");
            // `lo` is up: a listener on it takes a connection.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        })
        .join()
        .unwrap();
    }
}
