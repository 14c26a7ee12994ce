//! Allowlist rules for the network proxy: which host and port a run may reach.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// Ports a rule without an explicit port allows.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// Which hosts a rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this DNS name (lower case, no trailing dot).
    Name(String),
    /// Any name strictly below this domain: `*.example.org` matches
    /// `a.example.org` and `a.b.example.org`, not `example.org` itself.
    Subdomains(String),
    /// Exactly this address, written as an IP literal. Only an IP literal can
    /// open a private, loopback or link-local address.
    Ip(IpAddr),
}

/// One allowlist entry: a host pattern and the ports it opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRule {
    pub host: HostPattern,
    pub ports: Vec<u16>,
}

/// Why a rule could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostRuleError {
    #[error("it is empty; write a host such as api.example.com or api.example.com:443")]
    Empty,
    #[error("port {0:?} is not a number from 1 to 65535")]
    BadPort(String),
    #[error("{0:?} is not a valid host name: use letters, digits, '-' and '.', at most 253 characters")]
    BadName(String),
    #[error("a wildcard may only be a leading '*.' followed by a domain with at least two labels, as in *.example.org")]
    BadWildcard,
    #[error("a URL is not a host; write only the host and port, e.g. example.com:443")]
    LooksLikeUrl,
}

impl HostRule {
    /// Parses `HOST`, `HOST:PORT`, `*.DOMAIN[:PORT]`, `IPV4[:PORT]`, `IPV6`
    /// or `[IPV6]:PORT`.
    pub fn parse(entry: &str) -> Result<HostRule, HostRuleError> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(HostRuleError::Empty);
        }
        if entry.contains("://") || entry.contains('/') {
            return Err(HostRuleError::LooksLikeUrl);
        }
        // A bare IPv6 literal has colons but no port.
        if let Ok(ip) = entry.parse::<Ipv6Addr>() {
            return Ok(HostRule { host: HostPattern::Ip(IpAddr::V6(ip)), ports: DEFAULT_PORTS.to_vec() });
        }
        let (host, port) = split_port(entry)?;
        let ports = match port {
            Some(p) => vec![p],
            None => DEFAULT_PORTS.to_vec(),
        };
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let ip = inner.parse::<Ipv6Addr>().map_err(|_| HostRuleError::BadName(host.to_owned()))?;
            return Ok(HostRule { host: HostPattern::Ip(IpAddr::V6(ip)), ports });
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(HostRule { host: HostPattern::Ip(ip), ports });
        }
        if let Some(domain) = host.strip_prefix("*.") {
            let domain = normalize_name(domain)?;
            if domain.split('.').count() < 2 {
                return Err(HostRuleError::BadWildcard);
            }
            return Ok(HostRule { host: HostPattern::Subdomains(domain), ports });
        }
        if host.contains('*') {
            return Err(HostRuleError::BadWildcard);
        }
        Ok(HostRule { host: HostPattern::Name(normalize_name(host)?), ports })
    }

    /// Whether this rule allows `port` on the DNS name `name` (already
    /// normalised with [`normalize_name`]).
    pub fn allows_name(&self, name: &str, port: u16) -> bool {
        self.ports.contains(&port)
            && match &self.host {
                HostPattern::Name(n) => n == name,
                HostPattern::Subdomains(domain) => {
                    name.strip_suffix(domain.as_str()).is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.'))
                }
                HostPattern::Ip(_) => false,
            }
    }

    /// Whether everything `narrower` allows, this rule allows too: each of its
    /// ports, and every host its pattern can match.
    pub fn covers(&self, narrower: &HostRule) -> bool {
        narrower.ports.iter().all(|port| self.ports.contains(port))
            && match (&self.host, &narrower.host) {
                (HostPattern::Ip(mine), HostPattern::Ip(theirs)) => mine == theirs,
                (HostPattern::Name(mine), HostPattern::Name(theirs)) => mine == theirs,
                (HostPattern::Subdomains(_), HostPattern::Name(name)) => {
                    narrower.ports.first().is_some_and(|port| self.allows_name(name, *port))
                }
                (HostPattern::Subdomains(mine), HostPattern::Subdomains(theirs)) => {
                    mine == theirs || theirs.strip_suffix(mine.as_str()).is_some_and(|prefix| prefix.ends_with('.'))
                }
                _ => false,
            }
    }

    /// Whether this rule allows `port` on the IP literal `ip`.
    pub fn allows_ip(&self, ip: IpAddr, port: u16) -> bool {
        self.ports.contains(&port) && matches!(&self.host, HostPattern::Ip(allowed) if *allowed == ip)
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Name(n) => n.clone(),
            HostPattern::Subdomains(d) => format!("*.{d}"),
            HostPattern::Ip(IpAddr::V4(ip)) => ip.to_string(),
            HostPattern::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
        };
        if self.ports == DEFAULT_PORTS {
            // Round-trips: a bare IPv6 literal is written in brackets, which parses back.
            f.write_str(&host)
        } else {
            let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            write!(f, "{host}:{}", ports.join(","))
        }
    }
}

fn split_port(entry: &str) -> Result<(&str, Option<u16>), HostRuleError> {
    // `[v6]:port` or `host:port`; a bracketed literal without a port has no colon after ']'.
    let colon = if entry.starts_with('[') {
        entry.find(']').and_then(|end| entry[end..].find(':').map(|c| end + c))
    } else {
        entry.rfind(':')
    };
    match colon {
        None => Ok((entry, None)),
        Some(at) => {
            let port_text = &entry[at + 1..];
            let port = port_text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| HostRuleError::BadPort(port_text.to_owned()))?;
            Ok((&entry[..at], Some(port)))
        }
    }
}

/// Lower-cases a DNS name, drops one trailing dot, and checks its characters.
pub fn normalize_name(name: &str) -> Result<String, HostRuleError> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let valid = !lower.is_empty()
        && lower.len() <= 253
        && lower.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if valid { Ok(lower) } else { Err(HostRuleError::BadName(name.to_owned())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let r = HostRule::parse("API.Example.com").unwrap();
        assert_eq!(r.host, HostPattern::Name("api.example.com".into()));
        assert_eq!(r.ports, vec![443, 80]);
        let r = HostRule::parse("*.example.org:8443").unwrap();
        assert_eq!(r.host, HostPattern::Subdomains("example.org".into()));
        assert_eq!(r.ports, vec![8443]);
        let r = HostRule::parse("127.0.0.1:8080").unwrap();
        assert_eq!(r.host, HostPattern::Ip("127.0.0.1".parse().unwrap()));
        let r = HostRule::parse("[::1]:9000").unwrap();
        assert_eq!(r.host, HostPattern::Ip("::1".parse().unwrap()));
        assert_eq!(r.ports, vec![9000]);
        let r = HostRule::parse("::1").unwrap();
        assert_eq!(r.ports, vec![443, 80]);
    }

    #[test]
    fn refuses_bad_rules() {
        for bad in
            ["", "http://x.com", "x.com:0", "x.com:99999", "*", "*.com", "a*.b.com", "a..b", "-a.com", "x.com:port"]
        {
            assert!(HostRule::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn wildcard_matches_only_below() {
        let r = HostRule::parse("*.example.org").unwrap();
        assert!(r.allows_name("a.example.org", 443));
        assert!(r.allows_name("a.b.example.org", 80));
        assert!(!r.allows_name("example.org", 443));
        assert!(!r.allows_name("badexample.org", 443));
        assert!(!r.allows_name("a.example.org", 22));
    }

    #[test]
    fn covers_only_what_is_inside() {
        let rule = |text: &str| HostRule::parse(text).unwrap();
        assert!(rule("*.example.org").covers(&rule("a.example.org:443")));
        assert!(rule("*.example.org").covers(&rule("*.a.example.org")));
        assert!(rule("*.example.org").covers(&rule("*.example.org:80")));
        assert!(!rule("*.example.org").covers(&rule("example.org")), "the wildcard is strictly below");
        assert!(!rule("*.example.org").covers(&rule("a.example.org:22")), "a port the rule does not open");
        assert!(!rule("*.a.example.org").covers(&rule("*.example.org")), "wider than the rule");
        assert!(!rule("*.example.org").covers(&rule("*.badexample.org")));
        assert!(rule("example.com").covers(&rule("EXAMPLE.com:443")));
        assert!(!rule("example.com:443").covers(&rule("example.com")), "80 is not opened");
        assert!(!rule("example.com").covers(&rule("*.example.com")));
        assert!(rule("10.0.0.1:8080").covers(&rule("10.0.0.1:8080")));
        assert!(!rule("10.0.0.1:8080").covers(&rule("10.0.0.2:8080")));
        assert!(!rule("*.example.org").covers(&rule("93.184.216.34")), "a name never covers an address");
    }

    #[test]
    fn display_round_trips() {
        for text in ["example.com", "*.example.org:8443", "127.0.0.1:80", "[::1]:9000", "[::1]"] {
            let rule = HostRule::parse(text).unwrap();
            assert_eq!(HostRule::parse(&rule.to_string()).unwrap(), rule, "{text}");
        }
    }
}
