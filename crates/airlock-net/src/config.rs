//! What the proxy allows, and the decision for one host and port.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use airlock_policy::{HostRule, NetworkPolicy};

use crate::address::{classify, is_this_hosts};
use crate::host::RequestHost;
use crate::resolve::{Resolve, SystemResolver};

/// How long a client may take to send a whole request head, or a whole TLS
/// ClientHello once it has begun one.
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long dialling one upstream address may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything one run's proxy needs: the rules, the caps, and who resolves names.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Hosts and ports the sandbox may reach. Empty: every request is refused.
    pub rules: Vec<HostRule>,
    /// Bytes the sandbox may receive through the proxy, over the whole run.
    pub max_bytes_in: u64,
    /// Bytes the sandbox may send through the proxy, over the whole run.
    pub max_bytes_out: u64,
    /// Connections the sandbox may open to the proxy, over the whole run,
    /// refused ones included.
    pub max_connections: u32,
    /// Resolves names that a rule allows; never asked about any other name.
    pub resolver: Arc<dyn Resolve>,
    /// See [`DEFAULT_HEAD_TIMEOUT`].
    pub head_timeout: Duration,
    /// See [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

impl ProxyConfig {
    /// The proxy for `policy`, resolving names with the host's resolver.
    pub fn from_policy(policy: &NetworkPolicy) -> ProxyConfig {
        ProxyConfig {
            rules: policy.allow.clone(),
            max_bytes_in: policy.max_bytes_in,
            max_bytes_out: policy.max_bytes_out,
            max_connections: policy.max_connections,
            resolver: Arc::new(SystemResolver),
            head_timeout: DEFAULT_HEAD_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Where a request for `host`:`port` may go: the addresses to try, in
    /// order, or why it may go nowhere.
    ///
    /// A name is checked against the rules first and resolved only if a rule
    /// allows it; then each address it resolves to is checked, and one in a
    /// forbidden class (loopback, private, link-local...) or one of this
    /// host's own is dropped unless a rule names that exact IP and port. An
    /// IP literal goes only where a rule
    /// names it exactly. The caller dials only the addresses returned, so a
    /// second lookup (DNS rebinding) never comes into it.
    pub fn route(&self, host: &RequestHost, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        match host {
            RequestHost::Ip(ip) => {
                let ip = ip.to_canonical();
                if self.allows_ip(ip, port) {
                    Ok(vec![SocketAddr::new(ip, port)])
                } else {
                    Err(Refusal::NotAllowed(format!("{}:{port} is not in the allowlist{}", host, class_note(ip))))
                }
            }
            RequestHost::Name(name) => {
                if !self.rules.iter().any(|rule| rule.allows_name(name, port)) {
                    return Err(Refusal::NotAllowed(format!("{name}:{port} is not in the allowlist")));
                }
                let resolved = self
                    .resolver
                    .resolve(name)
                    .map_err(|e| Refusal::Unresolvable(format!("{name} could not be resolved: {e}")))?;
                let mut allowed = Vec::new();
                let mut refused = Vec::new();
                for ip in resolved.into_iter().map(|ip| ip.to_canonical()) {
                    if self.allows_ip(ip, port) {
                        allowed.push(SocketAddr::new(ip, port));
                    } else if classify(ip).is_forbidden() {
                        refused.push(format!("{ip}{}", class_note(ip)));
                    } else {
                        match is_this_hosts(ip) {
                            Ok(false) => allowed.push(SocketAddr::new(ip, port)),
                            Ok(true) => refused.push(format!("{ip} (an address of this host)")),
                            Err(e) => refused.push(format!("{ip} (whether it is this host's could not be asked: {e})")),
                        }
                    }
                }
                if !allowed.is_empty() {
                    Ok(allowed)
                } else if refused.is_empty() {
                    Err(Refusal::Unresolvable(format!("{name} resolves to no address")))
                } else {
                    Err(Refusal::NotAllowed(format!(
                        "{name} resolves only to addresses a name rule never reaches: {}",
                        refused.join(", ")
                    )))
                }
            }
        }
    }

    /// Whether a rule names `ip` (canonical) and `port` exactly, in either
    /// IPv4 or IPv4-mapped IPv6 spelling.
    fn allows_ip(&self, ip: IpAddr, port: u16) -> bool {
        let mapped = match ip {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(_) => ip,
        };
        self.rules.iter().any(|rule| rule.allows_ip(ip, port) || rule.allows_ip(mapped, port))
    }
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("rules", &self.rules.iter().map(ToString::to_string).collect::<Vec<_>>())
            .field("max_bytes_in", &self.max_bytes_in)
            .field("max_bytes_out", &self.max_bytes_out)
            .field("max_connections", &self.max_connections)
            .field("head_timeout", &self.head_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

/// Why a request may go nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The policy does not allow it (403; never dialled, never resolved if a name).
    NotAllowed(String),
    /// The policy allows the name but it has no address (502).
    Unresolvable(String),
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::NotAllowed(reason) | Refusal::Unresolvable(reason) => reason,
        }
    }
}

/// ` (link-local ...)` for an address in a forbidden class, else nothing.
fn class_note(ip: IpAddr) -> String {
    let class = classify(ip);
    if class.is_forbidden() { format!(" ({class})") } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::parse_host;
    use crate::resolve::StaticResolver;

    fn config(rules: &[&str], resolver: Arc<StaticResolver>) -> ProxyConfig {
        let policy = NetworkPolicy {
            allow: rules.iter().map(|r| HostRule::parse(r).unwrap()).collect(),
            max_bytes_out: 1,
            max_bytes_in: 1,
            max_connections: 1,
        };
        ProxyConfig { resolver, ..ProxyConfig::from_policy(&policy) }
    }

    fn route(config: &ProxyConfig, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        config.route(&parse_host(host).unwrap(), port)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_no_rule_allows_are_never_resolved() {
        let resolver = Arc::new(StaticResolver::new().with("evil.test", &[ip("93.184.216.34")]));
        let config = config(&["api.example.com", "*.example.org:8443"], resolver.clone());
        assert!(matches!(route(&config, "evil.test", 443), Err(Refusal::NotAllowed(_))));
        assert!(matches!(route(&config, "api.example.com", 8080), Err(Refusal::NotAllowed(_))));
        assert!(matches!(route(&config, "example.org", 8443), Err(Refusal::NotAllowed(_))));
        assert!(resolver.lookups().is_empty());
    }

    #[test]
    fn allowed_names_go_only_to_public_addresses() {
        let resolver = Arc::new(
            StaticResolver::new()
                .with("api.example.com", &[ip("10.0.0.1"), ip("93.184.216.34"), ip("::ffff:169.254.169.254")])
                .with("rebind.example.com", &[ip("127.0.0.1"), ip("::ffff:a9fe:a9fe"), ip("fd00::1")]),
        );
        let config = config(&["*.example.com"], resolver.clone());
        assert_eq!(route(&config, "API.example.com.", 443), Ok(vec![SocketAddr::new(ip("93.184.216.34"), 443)]));
        let refusal = route(&config, "rebind.example.com", 80).unwrap_err();
        assert!(matches!(refusal, Refusal::NotAllowed(_)));
        for needle in ["127.0.0.1 (loopback)", "169.254.169.254 (link-local", "fd00::1 (private)"] {
            assert!(refusal.reason().contains(needle), "{refusal:?} should name {needle}");
        }
        assert_eq!(resolver.lookups(), vec!["api.example.com", "rebind.example.com"]);
    }

    #[test]
    fn an_exact_ip_rule_opens_that_address_and_port_only() {
        let resolver = Arc::new(StaticResolver::new().with("svc.test", &[ip("127.0.0.1"), ip("127.0.0.2")]));
        let config = config(&["127.0.0.1:8080", "svc.test:8080", "[::1]:9000"], resolver);
        assert_eq!(route(&config, "127.0.0.1", 8080), Ok(vec![SocketAddr::new(ip("127.0.0.1"), 8080)]));
        assert_eq!(route(&config, "[::ffff:127.0.0.1]", 8080), Ok(vec![SocketAddr::new(ip("127.0.0.1"), 8080)]));
        assert_eq!(route(&config, "2130706433", 8080), Ok(vec![SocketAddr::new(ip("127.0.0.1"), 8080)]));
        assert_eq!(route(&config, "svc.test", 8080), Ok(vec![SocketAddr::new(ip("127.0.0.1"), 8080)]));
        assert_eq!(route(&config, "[::1]", 9000), Ok(vec![SocketAddr::new(ip("::1"), 9000)]));
        for (host, port) in [("127.0.0.1", 8081), ("127.0.0.2", 8080), ("[::1]", 8080), ("169.254.169.254", 80)] {
            assert!(matches!(route(&config, host, port), Err(Refusal::NotAllowed(_))), "{host}:{port}");
        }
    }

    #[test]
    fn a_name_that_does_not_resolve_is_not_a_policy_refusal() {
        let config = config(&["missing.test"], Arc::new(StaticResolver::new()));
        assert!(matches!(route(&config, "missing.test", 443), Err(Refusal::Unresolvable(_))));
    }
}
