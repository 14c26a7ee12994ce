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

/// Child side: listens on [`PROXY_ADDR`] inside the sandbox's namespace.
pub fn listen_proxy() -> Result<OwnedFd, Failure> {
    let step = "listen for the proxy";
    let fd = socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| Failure::new(step, "socket", &e.into()))?;
    bind(&fd, &PROXY_ADDR).map_err(|e| Failure::new(step, PROXY_ADDR.to_string(), &e.into()))?;
    listen(&fd, 128).map_err(|e| Failure::new(step, "listen", &e.into()))?;
    Ok(fd)
}
