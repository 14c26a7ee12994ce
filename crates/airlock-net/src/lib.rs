//! airlock's egress proxy: the one way out of a sandbox.
//!
//! A sandbox has no network but its own loopback. When its policy allows
//! hosts, the supervisor hands this crate a listening socket that lives in
//! the sandbox's namespace (127.0.0.1:3128 there); the code finds it through
//! `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` ([`proxy_environment`]). The
//! proxy serves HTTP CONNECT (for TLS) and plain HTTP forwarding, and dials
//! out from the host's namespace only:
//!
//! - to a host and port a rule allows ([`airlock_policy::HostRule`]); a name
//!   is checked against the rules before it is resolved, so a refused name is
//!   never looked up;
//! - at an address it checked itself ([`ProxyConfig::route`]): a name never
//!   reaches loopback, private, link-local (cloud metadata), CGNAT, multicast
//!   or reserved space, in IPv4 or IPv6 ([`classify`]); only a rule written as
//!   that exact IP literal opens such an address;
//! - for a host read strictly ([`parse_host`]): every `inet_aton` spelling of
//!   an IPv4 address is that address, never a name;
//! - within the run's caps on bytes each way and on connections.
//!
//! Every connection, allowed or refused, lands in the run's
//! [`airlock_policy::NetworkRecord`] through [`ProxyHandle::finish`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use airlock_net::{Proxy, ProxyConfig};
//! let policy = airlock_policy::Policy::default();
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?; // in the sandbox's namespace, really
//! let proxy = Proxy::start(listener, ProxyConfig::from_policy(&policy.network))?;
//! // ... run the code ...
//! let outcome = proxy.finish();
//! println!("{:?} {:?}", outcome.record, outcome.limits_hit);
//! # Ok(())
//! # }
//! ```

mod address;
mod config;
mod error;
mod host;
mod http;
mod proxy;
mod resolve;
mod tls;

use std::net::SocketAddr;

pub use address::{AddressClass, IPV4_RANGES, IPV6_RANGES, classify, embedded_ipv4, is_forbidden, is_this_hosts};
pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEAD_TIMEOUT, ProxyConfig, Refusal};
pub use error::NetError;
pub use host::{AbsoluteUrl, HostError, RequestHost, parse_absolute_url, parse_authority, parse_host, parse_ipv4};
pub use http::{MAX_HEAD_BYTES, MAX_HEADERS};
pub use proxy::{Proxy, ProxyHandle, ProxyOutcome};
pub use resolve::{Resolve, StaticResolver, SystemResolver};
pub use tls::{HelloScan, MAX_CLIENT_HELLO, scan_client_hello};

/// The variables that point a sandbox's HTTP clients at the proxy listening
/// at `proxy` (inside the sandbox), upper and lower case since clients differ
/// in which they read. Set them only when hosts are allowed.
pub fn proxy_environment(proxy: SocketAddr) -> Vec<(&'static str, String)> {
    let url = format!("http://{proxy}");
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
        .into_iter()
        .map(|name| (name, url.clone()))
        .collect()
}
