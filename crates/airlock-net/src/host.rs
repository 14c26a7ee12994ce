//! Reading the host and port a request names, the way the strictest reader
//! of the same text would.
//!
//! A request host is either an IP literal or a DNS name, and the two must
//! never be confused: `2852039166`, `0xA9FEA9FE`, `0251.0376.0251.0376` and
//! `169.254.43518` all spell 169.254.169.254 to `inet_aton` (and to browsers'
//! URL parser), so any host whose last label is a number is read as an IPv4
//! literal with those rules or refused. Such a host never reaches a resolver.
//! Names are then held to the letters, digits, `-` and `_` of DNS, which
//! leaves no room for percent-encoding, userinfo or backslash tricks.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use airlock_policy::normalize_name;

/// A host as a request names it, read strictly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestHost {
    /// An IP literal in any spelling, in canonical form: an IPv4-mapped IPv6
    /// literal is its IPv4 address.
    Ip(IpAddr),
    /// A DNS name, lower case, without a trailing dot.
    Name(String),
}

impl fmt::Display for RequestHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            RequestHost::Ip(ip) => write!(f, "{ip}"),
            RequestHost::Name(name) => f.write_str(name),
        }
    }
}

/// Why a host, authority or URL was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("{0:?} ends in a number but is not a valid IPv4 address")]
    BadIpv4(String),
    #[error("{0:?} is not a valid bracketed IPv6 address")]
    BadIpv6(String),
    #[error("{0:?} is not a valid host name")]
    BadName(String),
    #[error("{0:?} carries user information ('@'); put credentials in headers, not in the host")]
    Userinfo(String),
    #[error("port {0:?} is not a number from 1 to 65535")]
    BadPort(String),
    #[error("{0:?} has no port")]
    MissingPort(String),
    #[error("{0:?} is not an absolute http:// URL; send requests to the proxy as GET http://host/path")]
    NotAbsolute(String),
    #[error("the scheme {0:?} cannot be proxied as plain HTTP; https goes through CONNECT, other schemes not at all")]
    Scheme(String),
}

/// Reads a host: a name, an IPv4 literal in any `inet_aton` spelling, or a
/// bracketed IPv6 literal. One trailing dot is allowed; case is ignored.
pub fn parse_host(text: &str) -> Result<RequestHost, HostError> {
    if text.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(inner) = text.strip_prefix('[') {
        let literal = inner.strip_suffix(']').ok_or_else(|| HostError::BadIpv6(text.to_owned()))?;
        // A zone id (`%eth0`) names an interface of this host: never.
        let ip: Ipv6Addr = literal.parse().map_err(|_| HostError::BadIpv6(text.to_owned()))?;
        return Ok(RequestHost::Ip(IpAddr::V6(ip).to_canonical()));
    }
    let trimmed = text.strip_suffix('.').unwrap_or(text);
    if ends_in_number(trimmed) {
        return parse_ipv4(trimmed)
            .map(|ip| RequestHost::Ip(IpAddr::V4(ip)))
            .ok_or_else(|| HostError::BadIpv4(text.to_owned()));
    }
    // `normalize_name` would forgive further trailing dots; an empty label is not a name.
    if trimmed.is_empty() || trimmed.ends_with('.') {
        return Err(HostError::BadName(text.to_owned()));
    }
    normalize_name(trimmed).map(RequestHost::Name).map_err(|_| HostError::BadName(text.to_owned()))
}

/// Reads `host[:port]`, where host may be a bracketed IPv6 literal. The port
/// is `None` when absent (or empty, which RFC 3986 allows to mean the same).
pub fn parse_authority(text: &str) -> Result<(RequestHost, Option<u16>), HostError> {
    if text.contains('@') {
        return Err(HostError::Userinfo(text.to_owned()));
    }
    let (host, port) = split_port(text)?;
    let port = match port {
        None | Some("") => None,
        Some(digits) => Some(parse_port(digits)?),
    };
    Ok((parse_host(host)?, port))
}

/// The host text and the port text of an authority.
pub(crate) fn split_port(text: &str) -> Result<(&str, Option<&str>), HostError> {
    if text.starts_with('[') {
        let end = text.find(']').ok_or_else(|| HostError::BadIpv6(text.to_owned()))?;
        let (host, rest) = text.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if rest.is_empty() => Ok((host, None)),
            None => Err(HostError::BadIpv6(text.to_owned())),
        };
    }
    match text.split_once(':') {
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((text, None)),
    }
}

/// A port: 1 to 65535 in decimal digits, nothing else (no sign, no spaces).
pub fn parse_port(digits: &str) -> Result<u16, HostError> {
    let valid = !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit());
    digits.parse::<u16>().ok().filter(|port| valid && *port != 0).ok_or_else(|| HostError::BadPort(digits.to_owned()))
}

/// An absolute-form request target split into what the proxy needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsoluteUrl {
    /// The authority as written, for the record and a missing Host header.
    pub authority: String,
    pub host: RequestHost,
    pub port: u16,
    /// The origin-form target to send upstream: path and query, never empty,
    /// without a fragment.
    pub path: String,
}

/// Reads `http://host[:port]/path?query` as a proxy receives it.
pub fn parse_absolute_url(target: &str) -> Result<AbsoluteUrl, HostError> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(HostError::NotAbsolute(target.to_owned()));
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HostError::Scheme(scheme.to_owned()));
    }
    let end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if path.starts_with('\\') {
        return Err(HostError::BadName(rest.to_owned()));
    }
    let (host, port) = parse_authority(authority)?;
    let path = path.split('#').next().unwrap_or_default();
    let path = match path.chars().next() {
        None => "/".to_owned(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_owned(),
    };
    Ok(AbsoluteUrl { authority: authority.to_owned(), host, port: port.unwrap_or(80), path })
}

/// Whether a host's last label is a number, which makes the whole host an
/// IPv4 literal (the URL standard's "ends in a number" rule).
fn ends_in_number(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or(host);
    if let Some(hex) = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
}

/// Reads an IPv4 address as `inet_aton` and the URL standard do: one to four
/// parts, each decimal, octal (leading 0) or hex (leading 0x); the last part
/// fills the bytes the others leave.
pub fn parse_ipv4(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let numbers: Vec<u64> = parts.iter().map(|part| parse_ipv4_number(part)).collect::<Option<_>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|n| *n > 255) {
        return None;
    }
    let last_bytes = 4 - leading.len() as u32;
    if *last >= 1u64 << (8 * last_bytes) {
        return None;
    }
    let high = leading.iter().enumerate().fold(0u64, |acc, (i, n)| acc | (n << (8 * (3 - i as u32))));
    u32::try_from(high | last).ok().map(Ipv4Addr::from)
}

fn parse_ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    digits.chars().try_fold(0u64, |acc, c| {
        let digit = c.to_digit(radix)?;
        acc.checked_mul(u64::from(radix))?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const METADATA: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254));

    #[test]
    fn every_spelling_of_the_metadata_address_is_that_literal() {
        for spelling in [
            "169.254.169.254",
            "169.254.169.254.",
            "2852039166",
            "0xA9FEA9FE",
            "0xa9fea9fe",
            "0XA9FEA9FE",
            "0251.0376.0251.0376",
            "0251.254.0xa9.254",
            "169.254.43518",
            "169.16689662",
            "0xa9.0376.43518",
            "0x0000000000a9.254.169.254",
            "[::ffff:169.254.169.254]",
            "[::ffff:a9fe:a9fe]",
            "[::FFFF:A9FE:A9FE]",
        ] {
            assert_eq!(parse_host(spelling), Ok(RequestHost::Ip(METADATA)), "{spelling}");
        }
    }

    #[test]
    fn numeric_hosts_that_are_not_addresses_are_refused_not_resolved() {
        for bad in [
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "1.2.65536",
            "4294967296",
            "08",
            "0x100000000",
            "1..2",
            "example.0x",
            "example.123",
            "09.1.1.1",
            "99999999999999999999999",
        ] {
            assert!(matches!(parse_host(bad), Err(HostError::BadIpv4(_))), "{bad}: {:?}", parse_host(bad));
        }
    }

    #[test]
    fn names_are_normalised_and_checked() {
        assert_eq!(parse_host("API.Example.COM."), Ok(RequestHost::Name("api.example.com".into())));
        assert_eq!(parse_host("1e100.net"), Ok(RequestHost::Name("1e100.net".into())));
        assert_eq!(parse_host("0x.example"), Ok(RequestHost::Name("0x.example".into())));
        // Not hex, so not a number: a name, as the URL standard and inet_aton agree.
        assert_eq!(parse_host("0x1g"), Ok(RequestHost::Name("0x1g".into())));
        for bad in [
            "exa%6dple.com",
            "a..b",
            "example.com..",
            ".",
            "a b",
            "evil.com\\",
            "-x.com",
            "[::1",
            "[fe80::1%eth0]",
            "::1",
        ] {
            assert!(parse_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn authorities_split_host_and_port() {
        let localhost = RequestHost::Ip("127.0.0.1".parse().unwrap());
        assert_eq!(parse_authority("127.0.0.1:8080"), Ok((localhost.clone(), Some(8080))));
        assert_eq!(parse_authority("127.0.0.1"), Ok((localhost.clone(), None)));
        assert_eq!(parse_authority("127.0.0.1:"), Ok((localhost, None)));
        assert_eq!(parse_authority("[::1]:443"), Ok((RequestHost::Ip("::1".parse().unwrap()), Some(443))));
        assert_eq!(
            parse_authority("[::ffff:7f00:1]:80"),
            Ok((RequestHost::Ip("127.0.0.1".parse().unwrap()), Some(80)))
        );
        for bad in
            ["a.com:0", "a.com:65536", "a.com:+80", "a.com: 80", "a.com:80:81", "[::1]x", "::1:443", "user@a.com:80"]
        {
            assert!(parse_authority(bad).is_err(), "{bad}");
        }
        assert!(matches!(parse_authority("good.com@evil.com"), Err(HostError::Userinfo(_))));
    }

    #[test]
    fn absolute_urls_give_authority_and_origin_form() {
        let url = parse_absolute_url("http://Example.com:8080/a/b?c=d#frag").unwrap();
        assert_eq!(url.host, RequestHost::Name("example.com".into()));
        assert_eq!(url.port, 8080);
        assert_eq!(url.path, "/a/b?c=d");
        assert_eq!(url.authority, "Example.com:8080");
        let url = parse_absolute_url("HTTP://example.com?q").unwrap();
        assert_eq!((url.port, url.path.as_str()), (80, "/?q"));
        assert_eq!(parse_absolute_url("http://example.com").unwrap().path, "/");
        assert_eq!(parse_absolute_url("http://2852039166/latest").unwrap().host, RequestHost::Ip(METADATA));
    }

    #[test]
    fn url_tricks_are_refused() {
        for bad in [
            "http://allowed.com@evil.com/",
            "http://allowed.com:80@evil.com/",
            "http://evil.com\\@allowed.com/",
            "http://evil.com%2f@allowed.com/",
            "http://allowed.com%2eevil.com/",
            "http://[::1/",
            "http://:80/",
            "http://example.com:99999/",
        ] {
            assert!(parse_absolute_url(bad).is_err(), "{bad}");
        }
        assert!(matches!(parse_absolute_url("/path"), Err(HostError::NotAbsolute(_))));
        assert!(matches!(parse_absolute_url("https://example.com/"), Err(HostError::Scheme(_))));
        assert!(matches!(parse_absolute_url("ftp://example.com/"), Err(HostError::Scheme(_))));
    }
}
