//! Turning an allowed name into addresses, on the host side.
//!
//! The proxy checks a name against the rules BEFORE it asks any resolver, so
//! a name no rule allows never becomes a DNS query: nothing about it leaves
//! the host, not even its spelling. Numeric hosts (`2852039166`) are IP
//! literals and never reach a resolver at all (see [`crate::parse_host`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::Mutex;

/// Resolves DNS names to addresses. The proxy calls it only for names a rule
/// allows, and checks every address it returns before dialling one.
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (lower case, no trailing dot), in the order to
    /// try them. An error or an empty list means the name cannot be reached.
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>>;
}

/// The host's own resolver (`getaddrinfo`, through the standard library).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let mut addresses: Vec<IpAddr> = Vec::new();
        for address in (name, 0u16).to_socket_addrs()? {
            let ip = address.ip().to_canonical();
            if !addresses.contains(&ip) {
                addresses.push(ip);
            }
        }
        Ok(addresses)
    }
}

/// A fixed table of names, for tests and for callers that pin names to
/// addresses. It remembers every name it was asked for, so a test can prove a
/// refused name was never looked up.
#[derive(Debug, Default)]
pub struct StaticResolver {
    table: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl StaticResolver {
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Makes `name` resolve to `addresses`, in that order.
    pub fn with(mut self, name: &str, addresses: &[IpAddr]) -> StaticResolver {
        self.table.insert(name.to_ascii_lowercase(), addresses.to_vec());
        self
    }

    /// Every name asked for so far, in order, repeats included.
    pub fn lookups(&self) -> Vec<String> {
        self.asked.lock().map(|asked| asked.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        match self.asked.lock() {
            Ok(mut asked) => asked.push(name.to_owned()),
            Err(poisoned) => poisoned.into_inner().push(name.to_owned()),
        }
        self.table
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} is not in the static table")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_resolver_answers_from_its_table_and_counts() {
        let resolver = StaticResolver::new().with("Evil.Test", &["10.0.0.1".parse().unwrap()]);
        assert_eq!(resolver.resolve("evil.test").unwrap(), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(resolver.resolve("other.test").is_err());
        assert_eq!(resolver.lookups(), vec!["evil.test", "other.test"]);
    }

    #[test]
    fn system_resolver_reads_the_hosts_file() {
        let addresses = SystemResolver.resolve("localhost").unwrap();
        assert!(addresses.iter().all(|ip| ip.is_loopback()), "{addresses:?}");
        assert!(!addresses.is_empty());
    }
}
