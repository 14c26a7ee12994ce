//! The network from inside a sandbox: nothing by default; with an allowlist,
//! only the named hosts, only through airlock's proxy, and never the cloud
//! metadata endpoint or a private address.

#[path = "../../crates/airlock-net/tests/common/mod.rs"]
mod servers;

use airlock::{Limit, NetworkVerdict, Policy, PolicySpec, RunRecord, Status};
use airlock_tests::sandbox;
use servers::{Server, TestCa};

fn policy(hosts: &[String], extra: PolicySpec) -> Policy {
    let spec = PolicySpec { allow_hosts: Some(hosts.to_vec()), ..extra };
    Policy::from_spec(&spec, &airlock::host_facts().unwrap()).unwrap()
}

fn run(policy: Policy, code: &str, ca: Option<&TestCa>) -> RunRecord {
    let mut policy = policy;
    if ca.is_some() {
        policy.env.insert("SSL_CERT_FILE".into(), "/work/ca.pem".into());
        policy.env.insert("REQUESTS_CA_BUNDLE".into(), "/work/ca.pem".into());
    }
    let mut sb = sandbox(policy);
    if let Some(ca) = ca {
        sb.write("/work/ca.pem", &std::fs::read(ca.ca_file()).unwrap()).unwrap();
    }
    sb.run(code)
}

/// Each run has a network namespace of its own, the host's never: where a
/// helper made it ahead of the run (as root), as where the run made it. A
/// namespace is told by its cookie (SO_NETNS_COOKIE, Linux 5.14): its inode
/// number is reused once it is freed, a cookie never.
#[test]
fn each_run_has_a_network_namespace_of_its_own_with_loopback_up() {
    const SO_NETNS_COOKIE: i32 = 71;
    let host = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut cookie = 0u64;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cookie`, a u64 on our stack.
        let got = unsafe {
            libc::getsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                libc::SOL_SOCKET,
                SO_NETNS_COOKIE,
                (&raw mut cookie).cast(),
                &raw mut len,
            )
        };
        assert_eq!(got, 0, "SO_NETNS_COOKIE: {}", std::io::Error::last_os_error());
        cookie.to_string()
    };
    let mut sb = sandbox(Policy::default());
    let probe = "import socket\n\
                 s = socket.socket(); s.bind(('127.0.0.1', 7777)); s.listen()\n\
                 socket.create_connection(('127.0.0.1', 7777)).close()\n\
                 print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), 'little'))";
    let mut seen = Vec::new();
    for _ in 0..3 {
        let record = sb.run(probe);
        assert_eq!(record.status, Status::Ok, "{record:?}");
        seen.push(record.stdout.trim().to_owned());
    }
    let record = sandbox(Policy::default()).run(probe);
    seen.push(record.stdout.trim().to_owned());
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), seen.len(), "runs shared a network namespace: {seen:?}");
    assert!(!seen.contains(&host), "a run was in the host's network namespace ({host}): {seen:?}");
}

/// As root, a run's network namespace is made by its helper before the run
/// (see `network::make_ahead_of_run`): it belongs to the host's user
/// namespace, over which the code holds no capability, not to the sandbox's.
#[test]
fn as_root_a_runs_network_namespace_belongs_to_the_hosts_user_namespace() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: an ordinary user's runs make their own network namespace");
        return;
    }
    /// NS_GET_USERNS: the user namespace that owns a namespace, as a new descriptor.
    const NS_GET_USERNS: libc::c_ulong = 0xb701;
    let _alone = airlock_tests::exclusive();
    let host_userns = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
    let before = airlock_tests::leftovers("");
    let mut sb = sandbox(Policy::default());
    let cgroups = airlock_tests::cgroups_made_since(&before);
    assert!(!cgroups.is_empty(), "no cgroup was made for the first run");
    // The owners of the network namespace of each of the run's processes,
    // and each process's own user namespace, as (owner, own) inode pairs.
    let looker = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            let pids: Vec<String> = cgroups
                .iter()
                .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
                .flat_map(|procs| procs.lines().map(str::to_owned).collect::<Vec<_>>())
                .collect();
            let mut seen = Vec::new();
            for pid in &pids {
                let Ok(net) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else { continue };
                let Ok(own) = std::fs::metadata(format!("/proc/{pid}/ns/user")) else { continue };
                // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor or -1.
                let owner = unsafe { libc::ioctl(net.as_raw_fd(), NS_GET_USERNS) };
                assert!(owner >= 0, "NS_GET_USERNS: {}", std::io::Error::last_os_error());
                // SAFETY: `owner` is a descriptor the kernel just returned, owned by nothing else.
                let owner = unsafe { OwnedFd::from_raw_fd(owner) };
                let owner = std::fs::File::from(owner).metadata().unwrap().ino();
                seen.push((owner, own.ino()));
            }
            if !seen.is_empty() {
                return seen;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Vec::new()
    });
    let record = sb.run("import time\ntime.sleep(2)");
    assert_eq!(record.status, Status::Ok, "{record:?}");
    let seen = looker.join().unwrap();
    assert!(!seen.is_empty(), "the run's processes were never seen");
    for (owner, own) in seen {
        assert_ne!(own, host_userns, "a run's process was in the host's user namespace");
        assert_eq!(owner, host_userns, "the run's network namespace belongs to the sandbox's user namespace");
    }
}

const FETCH: &str = r#"
import json, sys, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()[:60]
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception as e:
        return type(e).__name__, str(e)[:80]
"#;

#[test]
fn an_allowed_host_is_reached_through_the_proxy_with_urllib_and_requests() {
    let http = Server::http();
    let ca = TestCa::new();
    let https = Server::https(&ca);
    let hosts = [format!("127.0.0.1:{}", http.port()), format!("127.0.0.1:{}", https.port())];
    let code = format!(
        "{FETCH}\nimport os, requests\nprint(os.environ['HTTPS_PROXY'])\nprint(fetch('http://127.0.0.1:{h}/a'))\nprint(fetch('https://127.0.0.1:{s}/b'))\n\
         r = requests.get('https://127.0.0.1:{s}/c', timeout=10)\nprint(r.status_code, r.text)",
        h = http.port(),
        s = https.port()
    );
    let record = run(policy(&hosts, PolicySpec::default()), &code, Some(&ca));
    assert_eq!(record.status, Status::Ok, "{}\n{:?}", record.stderr, record.message);
    let lines: Vec<&str> = record.stdout.lines().collect();
    assert_eq!(lines[0], "http://127.0.0.1:3128");
    assert_eq!(lines[1], "(200, 'hello from /a')");
    assert_eq!(lines[2], "(200, 'hello from /b')");
    assert_eq!(lines[3], "200 hello from /c");
    let network = record.network.unwrap();
    let allowed: Vec<_> = network.connections.iter().filter(|c| c.verdict == NetworkVerdict::Allowed).collect();
    assert_eq!(allowed.len(), 3, "{network:?}");
    assert!(
        allowed.iter().all(|c| c.resolved.as_deref().is_some_and(|r| r.starts_with("127.0.0.1")) && c.bytes_in > 0)
    );
    assert_eq!(http.requests().len(), 1);
}

#[test]
fn everything_else_is_refused_and_never_dialled() {
    let http = Server::http();
    let other = Server::http();
    let hosts = [format!("127.0.0.1:{}", http.port()), "*.example.org".to_owned()];
    let code = format!(
        "{FETCH}\nfor url in ['http://127.0.0.1:{o}/', 'http://localhost:{h}/', 'http://not-allowed.test/', \
         'http://169.254.169.254/latest/meta-data/', 'http://2852039166/', 'http://0xA9FEA9FE/', \
         'http://0251.0376.0251.0376/', 'http://[::ffff:169.254.169.254]/', 'http://[::ffff:a9fe:a9fe]/', \
         'http://10.0.0.1/', 'http://example.org/']:\n    print(fetch(url))",
        o = other.port(),
        h = http.port()
    );
    let record = run(policy(&hosts, PolicySpec::default()), &code, None);
    assert_eq!(record.status, Status::Ok, "{}", record.stderr);
    for line in record.stdout.lines() {
        assert!(line.starts_with("(403,"), "refused with a 403: {line}\n{}", record.stdout);
    }
    assert_eq!(other.connections(), 0, "a port not allowed was dialled");
    assert_eq!(http.connections(), 0, "a name resolving to loopback was dialled");
    let network = record.network.unwrap();
    assert!(network.connections.iter().all(|c| c.verdict == NetworkVerdict::Denied), "{network:?}");
    assert_eq!(network.connections.len(), 11);
}

#[test]
fn skipping_the_proxy_gets_nowhere() {
    let http = Server::http();
    let hosts = [format!("127.0.0.1:{}", http.port())];
    let code = format!(
        r#"
import socket
out = []
for addr in [("127.0.0.1", {p}), ("8.8.8.8", 53), ("169.254.169.254", 80)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(addr)
        out.append("connected")
    except OSError as e:
        out.append(type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", ("8.8.8.8", 53))
    out.append("sent")
except OSError as e:
    out.append(type(e).__name__)
print(out)
"#,
        p = http.port()
    );
    let record = run(policy(&hosts, PolicySpec::default()), &code, None);
    assert!(!record.stdout.contains("connected") && !record.stdout.contains("sent"), "{}", record.stdout);
    assert_eq!(http.connections(), 0);
}

#[test]
fn the_byte_cap_ends_the_connection_and_is_reported() {
    let http = Server::http();
    let hosts = [format!("127.0.0.1:{}", http.port())];
    let caps = PolicySpec { max_network_bytes_in: Some(100_000), ..PolicySpec::default() };
    let code = format!("{FETCH}\nprint(fetch('http://127.0.0.1:{}/big/1000000'))", http.port());
    let record = run(policy(&hosts, caps), &code, None);
    assert!(record.limits_hit.contains(&Limit::NetworkBytes), "{record:?}");
    let received: u64 = record.network.unwrap().connections.iter().map(|c| c.bytes_in).sum();
    assert!(received <= 100_000, "{received}");
}

#[test]
fn without_rules_there_is_no_proxy_and_no_network_section() {
    let record =
        run(Policy::default(), "import os\nprint(sorted(k for k in os.environ if 'PROXY' in k.upper()))", None);
    assert_eq!(record.stdout.trim(), "[]");
    assert!(record.network.is_none());
}

#[test]
fn plaintext_inside_a_connect_tunnel_must_be_http_for_the_tunnel_s_host() {
    // A tunnel to an allowed host:port, then plaintext HTTP asking the server
    // behind it for another site: refused, closed, and recorded with why.
    let http = Server::http();
    let port = http.port();
    let code = format!(
        r#"
import socket
def tunnel(request):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    s.sendall(request)
    answer = b""
    try:
        while chunk := s.recv(4096):
            answer += chunk
    except OSError:
        pass
    return head.split(b"\r\n")[0].decode(), answer.decode(errors="replace")[-40:]
print(tunnel(b"GET /fronted HTTP/1.1\r\nHost: internal.example\r\n\r\n"))
print(tunnel(b"GET /mine HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"))
"#
    );
    let record = run(policy(&[format!("127.0.0.1:{port}")], PolicySpec::default()), &code, None);
    assert_eq!(record.status, Status::Ok, "{}\n{:?}", record.stderr, record.message);
    let lines: Vec<&str> = record.stdout.lines().collect();
    assert_eq!(lines[0], "('HTTP/1.1 200 Connection established', '')", "{}", record.stdout);
    assert!(lines[1].ends_with("hello from /mine')"), "{}", record.stdout);
    let heads: Vec<String> = http.requests().iter().map(|r| r.head.lines().next().unwrap_or("").to_owned()).collect();
    assert_eq!(heads, ["GET /mine HTTP/1.1"], "only the tunnel's own host's request reached the server");
    let network = record.network.unwrap();
    let refused = &network.connections[0];
    assert_eq!(refused.verdict, NetworkVerdict::Denied, "{network:?}");
    assert!(refused.reason.as_deref().unwrap_or_default().contains("internal.example"), "{refused:?}");
    assert_eq!(refused.bytes_out, 0);
}
