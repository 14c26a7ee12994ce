//! The package index an image build may reach: named by the operator (a
//! flag, or the host's own pip or uv configuration), never by anything
//! inside a sandbox. The build's sandbox may reach its host and nothing else.

use std::path::PathBuf;

use crate::Error;

/// PyPI's simple index, used when the operator names none.
pub const PYPI: &str = "https://pypi.org/simple";
/// Where PyPI keeps the files its index links to.
const PYPI_FILES: &str = "files.pythonhosted.org:443";

/// The index, and where its URL came from (for messages and records).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageIndex {
    /// The simple-API root, without a trailing slash.
    pub url: String,
    /// `--index-url`, `PIP_INDEX_URL`, `/etc/pip.conf`, `the default`...
    pub source: String,
    scheme: String,
    host: String,
    port: u16,
}

impl PackageIndex {
    /// PyPI.
    pub fn pypi() -> PackageIndex {
        PackageIndex {
            url: PYPI.to_owned(),
            source: "the default (PyPI)".to_owned(),
            scheme: "https".to_owned(),
            host: "pypi.org".to_owned(),
            port: 443,
        }
    }

    /// `url`, as the operator gave it: an `http` or `https` URL with a host,
    /// and without credentials (they would have to go into the sandbox).
    pub fn parse(url: &str, source: &str) -> Result<PackageIndex, Error> {
        let fail = |why: &str| Error::Index { url: url.to_owned(), origin: source.to_owned(), reason: why.to_owned() };
        let url = url.trim().trim_end_matches('/');
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| fail("it is not a URL (http://... or https://...)"))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => return Err(fail("only http and https indexes are supported")),
        };
        let authority = rest.split('/').next().unwrap_or("");
        if authority.contains('@') {
            return Err(fail(
                "it holds credentials, which airlock never passes into a sandbox; use an index (or a mirror of one) \
                 that needs none",
            ));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| fail("it has no valid host and port"))?;
        Ok(PackageIndex {
            url: url.to_owned(),
            source: source.to_owned(),
            scheme: scheme.to_owned(),
            host,
            port: port.unwrap_or(default_port),
        })
    }

    /// The index the operator named: `flag` (`--index-url`) first, then the
    /// host's uv and pip configuration (environment, then files), else PyPI.
    pub fn from_operator(flag: Option<&str>) -> Result<PackageIndex, Error> {
        if let Some(url) = flag {
            return PackageIndex::parse(url, "--index-url");
        }
        for variable in ["UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"] {
            if let Some(url) = std::env::var(variable).ok().filter(|v| !v.trim().is_empty()) {
                return PackageIndex::parse(&url, variable);
            }
        }
        for path in uv_config_files() {
            if let Some(url) = std::fs::read_to_string(&path).ok().and_then(|text| uv_index(&text)) {
                return PackageIndex::parse(&url, &path.display().to_string());
            }
        }
        // pip reads its files in this order, a later one winning.
        let mut found = None;
        for path in pip_config_files() {
            if let Some(url) = std::fs::read_to_string(&path).ok().and_then(|text| pip_index(&text)) {
                found = Some((url, path));
            }
        }
        match found {
            Some((url, path)) => PackageIndex::parse(&url, &path.display().to_string()),
            None => Ok(PackageIndex::pypi()),
        }
    }

    /// Whether this is PyPI.
    pub fn is_pypi(&self) -> bool {
        self.url == PYPI
    }

    /// The hosts a build's sandbox may reach: the index's, and for PyPI the
    /// host its files live on, by name; and the addresses those names have
    /// now, as this host resolves them, by IP literal. The proxy never lets
    /// a name reach a private address, but an operator's index may well be
    /// on one (a mirror on the LAN, a registry gateway): the operator named
    /// that host, so its own addresses are allowed, on its port only. A
    /// link-local address (where cloud metadata lives) never is.
    pub fn allow_hosts(&self) -> Vec<String> {
        let mut hosts = vec![self.host_port()];
        if self.is_pypi() {
            hosts.push(PYPI_FILES.to_owned());
        }
        let mut addresses = Vec::new();
        for host_port in &hosts {
            let resolved = std::net::ToSocketAddrs::to_socket_addrs(host_port.as_str()).into_iter().flatten();
            for address in resolved {
                let ip = address.ip().to_canonical();
                let link_local = match ip {
                    std::net::IpAddr::V4(v4) => v4.is_link_local(),
                    std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
                };
                let literal = match ip {
                    std::net::IpAddr::V4(v4) => format!("{v4}:{}", address.port()),
                    std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", address.port()),
                };
                if !link_local && !ip.is_unspecified() && !addresses.contains(&literal) && !hosts.contains(&literal) {
                    addresses.push(literal);
                }
            }
        }
        hosts.extend(addresses);
        hosts
    }

    /// The index's hosts by name only, for deciding which URLs it serves.
    fn named_hosts(&self) -> Vec<String> {
        let mut hosts = vec![self.host_port()];
        if self.is_pypi() {
            hosts.push(PYPI_FILES.to_owned());
        }
        hosts
    }

    /// Whether `url` is on a host this index's builds may reach, so a file
    /// can be fetched from it as the lock gives it.
    pub fn serves(&self, url: &str) -> bool {
        let Some((scheme, rest)) = url.split_once("://") else { return false };
        let authority = rest.split('/').next().unwrap_or("");
        let default_port = if scheme == "https" { 443 } else { 80 };
        let Some((host, port)) = split_host_port(authority) else { return false };
        let host_port = format!("{host}:{}", port.unwrap_or(default_port));
        scheme == self.scheme && self.named_hosts().contains(&host_port)
    }

    fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, lower-cased.
fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        (format!("[{inside}]"), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => None,
    };
    Some((host.to_ascii_lowercase(), port))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

fn xdg_config() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".config")))
}

/// uv's configuration files, the user's before the system's (uv's own order).
fn uv_config_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(path) = std::env::var_os("UV_CONFIG_FILE").filter(|p| !p.is_empty()) {
        files.push(PathBuf::from(path));
    }
    if let Some(config) = xdg_config() {
        files.push(config.join("uv/uv.toml"));
    }
    files.push(PathBuf::from("/etc/uv/uv.toml"));
    files
}

/// The default index of a uv.toml: `index-url`, `[pip] index-url`, or the
/// `[[index]]` marked `default = true`.
fn uv_index(text: &str) -> Option<String> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let string = |v: Option<&toml::Value>| v.and_then(toml::Value::as_str).map(str::to_owned);
    if let Some(url) = string(table.get("index-url")) {
        return Some(url);
    }
    if let Some(url) = string(table.get("pip").and_then(|p| p.get("index-url"))) {
        return Some(url);
    }
    table.get("index")?.as_array()?.iter().find_map(|index| {
        (index.get("default").and_then(toml::Value::as_bool) == Some(true)).then(|| string(index.get("url")))?
    })
}

/// pip's configuration files, in the order pip reads them.
fn pip_config_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/etc/xdg/pip/pip.conf"), PathBuf::from("/etc/pip.conf")];
    if let Some(home) = home() {
        files.push(home.join(".pip/pip.conf"));
    }
    if let Some(config) = xdg_config() {
        files.push(config.join("pip/pip.conf"));
    }
    if let Some(path) = std::env::var_os("PIP_CONFIG_FILE").filter(|p| !p.is_empty()) {
        files.push(PathBuf::from(path));
    }
    files
}

/// `index-url` of a pip.conf's `[global]` or `[install]` section.
fn pip_index(text: &str) -> Option<String> {
    let mut section = String::new();
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_owned();
        } else if let Some((key, value)) = line.split_once(['=', ':']) {
            let key = key.trim().replace('_', "-");
            if key == "index-url" && (section == "global" || section == "install") {
                found = Some(value.trim().to_owned());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pypi_reaches_its_files_host_and_nothing_else() {
        let pypi = PackageIndex::pypi();
        assert_eq!(pypi.allow_hosts()[..2], ["pypi.org:443", "files.pythonhosted.org:443"]);
        assert!(pypi.serves("https://files.pythonhosted.org/packages/0a/x.whl"));
        assert!(!pypi.serves("http://files.pythonhosted.org/packages/0a/x.whl"));
        assert!(!pypi.serves("https://evil.example/x.whl"));
        let local = PackageIndex::parse("http://127.0.0.1:8123/simple/", "test").unwrap();
        assert_eq!(local.url, "http://127.0.0.1:8123/simple");
        assert_eq!(local.allow_hosts(), vec!["127.0.0.1:8123"]);
        assert!(local.serves("http://127.0.0.1:8123/files/a.whl"));
        assert!(!local.serves("http://127.0.0.1:8124/files/a.whl"));
    }

    #[test]
    fn bad_index_urls_are_refused_with_the_reason() {
        for (url, needle) in [
            ("https://user:secret@mirror.example/simple", "credentials"),
            ("ftp://mirror.example/simple", "http"),
            ("mirror.example/simple", "not a URL"),
            ("https://mirror.example:99999/simple", "host and port"),
        ] {
            let err = PackageIndex::parse(url, "--index-url").unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("--index-url"), "{url}: {err}");
        }
    }

    #[test]
    fn host_configuration_is_read() {
        assert_eq!(
            pip_index("[global]\nindex-url = https://m.example/simple\n").as_deref(),
            Some("https://m.example/simple")
        );
        assert_eq!(pip_index("[freeze]\nindex-url = https://m.example/simple\n"), None);
        assert_eq!(uv_index("index-url = \"https://a.example/simple\"\n").as_deref(), Some("https://a.example/simple"));
        assert_eq!(
            uv_index("[[index]]\nurl = \"https://b.example/simple\"\n[[index]]\nurl = \"https://c.example/simple\"\ndefault = true\n").as_deref(),
            Some("https://c.example/simple")
        );
    }
}
