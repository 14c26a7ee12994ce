//! The proxy against real servers and real clients on loopback.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_net::{NetError, Proxy, ProxyConfig, StaticResolver};
use airlock_policy::{Limit, NetworkPolicy, NetworkVerdict};
use common::*;

fn no_names() -> Arc<StaticResolver> {
    Arc::new(StaticResolver::new())
}

fn loopback() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

#[test]
fn plain_http_to_an_allowed_ip_and_port_goes_through_in_origin_form() {
    let server = Server::http();
    let port = server.port();
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), Caps::default());
    let answer = exchange(
        addr,
        format!(
            "GET http://127.0.0.1:{port}/path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic c2VjcmV0\r\n\
             Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Hop\r\nX-Hop: drop me\r\nX-Keep: keep me\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.ends_with("hello from /path?q=1"), "{answer}");

    server.settle(1);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let head = &requests[0].head;
    assert!(head.starts_with("GET /path?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("Host: 127.0.0.1:{port}\r\n")), "{head}");
    assert!(head.contains("X-Keep: keep me\r\n"), "{head}");
    assert!(head.contains("Connection: close\r\n"), "{head}");
    for gone in ["Proxy-", "X-Hop", "keep-alive"] {
        assert!(!head.contains(gone), "{gone} should not reach the server: {head}");
    }

    let outcome = proxy.finish();
    assert_eq!(outcome.record.allowed_hosts, vec![format!("127.0.0.1:{port}")]);
    let events = outcome.record.connections;
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!((event.host.as_str(), event.port, event.verdict), ("127.0.0.1", port, NetworkVerdict::Allowed));
    assert_eq!(event.resolved.as_deref(), Some("127.0.0.1"));
    assert_eq!(event.bytes_in, answer.len() as u64);
    assert!(event.bytes_out > 0);
    assert!(outcome.limits_hit.is_empty());
}

#[test]
fn https_through_connect_reaches_an_allowed_ip_and_an_allowed_name() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("service.test", &[loopback()]));
    let rules = [format!("service.test:{port}"), format!("127.0.0.1:{port}")];
    let (proxy, addr) = start_proxy(&rules, resolver.clone(), Caps::default());

    let (tunnel, head) = connect(addr, &format!("127.0.0.1:{port}"), &format!("Host: 127.0.0.1:{port}\r\n"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A client sends no server name for an IP address.
    let body = https_get(tunnel, ca.client_config(), "127.0.0.1", "/by-ip").unwrap();
    assert!(body.ends_with("hello from /by-ip"), "{body}");

    let (tunnel, head) = connect(addr, &format!("Service.Test.:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = https_get(tunnel, ca.client_config(), "service.test", "/by-name").unwrap();
    assert!(body.ends_with("hello from /by-name"), "{body}");

    server.settle(2);
    assert_eq!(server.log.lock().unwrap().server_names, vec![None, Some("service.test".to_owned())]);
    assert_eq!(resolver.lookups(), vec!["service.test"]);
    let events = proxy.finish().record.connections;
    assert_eq!(events.len(), 2);
    assert!(
        events.iter().all(|e| e.verdict == NetworkVerdict::Allowed && e.bytes_in > 0 && e.bytes_out > 0),
        "{events:?}"
    );
    assert_eq!(events[1].host, "Service.Test.");
    assert_eq!(events[1].resolved.as_deref(), Some("127.0.0.1"));
}

#[test]
fn ipv6_literals_and_names_follow_the_same_rules() {
    let server = Server::http_v6();
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("six.test", &["::1".parse().unwrap()]));
    let (names_only, addr) = start_proxy(&[format!("six.test:{port}")], resolver.clone(), Caps::default());
    let answer =
        exchange(addr, format!("GET http://six.test:{port}/ HTTP/1.1\r\nHost: six.test:{port}\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("::1 (loopback)"), "{answer}");
    let (_, head) = connect(addr, &format!("[::1]:{port}"), "");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(server.connections(), 0);
    drop(names_only);

    let rules = [format!("six.test:{port}"), format!("[::1]:{port}")];
    let (proxy, addr) = start_proxy(&rules, resolver, Caps::default());
    let target = format!("[::1]:{port}");
    let answer = exchange(addr, format!("GET http://{target}/v6 HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    assert!(answer.ends_with("hello from /v6"), "{answer}");
    let (mut tunnel, head) = connect(addr, &format!("six.test:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(format!("GET /tunnel HTTP/1.1\r\nHost: six.test:{port}\r\n\r\n").as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = tunnel.read_to_string(&mut answer);
    assert!(answer.ends_with("hello from /tunnel"), "{answer}");
    let events = proxy.finish().record.connections;
    assert_eq!(events[0].host, "[::1]");
    assert!(events.iter().all(|e| e.resolved.as_deref() == Some("::1")), "{events:?}");
}

#[test]
fn a_port_not_in_the_rules_is_refused_and_never_dialled() {
    let allowed = Server::http();
    let other = Server::http();
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{}", allowed.port())], no_names(), Caps::default());
    let target = format!("127.0.0.1:{}", other.port());
    let answer = exchange(addr, format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("not in the allowlist"), "{answer}");
    let (_, head) = connect(addr, &target, "");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(other.connections(), 0);
    let events = proxy.finish().record.connections;
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e.verdict == NetworkVerdict::Denied && e.resolved.is_none()), "{events:?}");
    assert_eq!(events[0].port, other.port());
}

#[test]
fn a_name_not_allowed_is_refused_without_any_lookup() {
    let server = Server::http();
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("elsewhere.test", &[loopback()]));
    let (proxy, addr) =
        start_proxy(&["*.allowed.test".to_owned(), format!("127.0.0.1:{port}")], resolver.clone(), Caps::default());
    for host in ["elsewhere.test", "allowed.test", "evil-allowed.test", "allowed.test.evil.test"] {
        let answer =
            exchange(addr, format!("GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes());
        assert_eq!(status(&answer), 403, "{host}: {answer}");
        let (_, head) = connect(addr, &format!("{host}:443"), "");
        assert_eq!(status(&head), 403, "{host}: {head}");
    }
    assert!(resolver.lookups().is_empty(), "looked up {:?}", resolver.lookups());
    assert_eq!(server.connections(), 0);
    drop(proxy);
}

#[test]
fn every_spelling_of_the_metadata_address_is_refused_and_never_resolved() {
    let resolver = Arc::new(StaticResolver::new());
    // A wildcard that would match any name: the spellings must not be names.
    let (proxy, addr) =
        start_proxy(&["*.a.test".to_owned(), "169.254.169.254.test".to_owned()], resolver.clone(), Caps::default());
    let spellings = [
        "169.254.169.254",
        "169.254.169.254.",
        "2852039166",
        "0xA9FEA9FE",
        "0xa9.0xfe.0xa9.0xfe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "0251.0xfe.43518",
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
    ];
    for spelling in spellings {
        let answer = exchange(
            addr,
            format!("GET http://{spelling}/latest/meta-data/ HTTP/1.1\r\nHost: {spelling}\r\n\r\n").as_bytes(),
        );
        assert_eq!(status(&answer), 403, "{spelling}: {answer}");
        assert!(answer.contains("169.254.169.254") && answer.contains("link-local"), "{spelling}: {answer}");
        let (_, head) = connect(addr, &format!("{spelling}:80"), "");
        assert_eq!(status(&head), 403, "{spelling}: {head}");
    }
    // Spellings that are not addresses at all are refused as such, not looked up.
    for bad in ["0xA9FEA9FE0", "169.254.169.254.1", "0378.1.1.1"] {
        let (_, head) = connect(addr, &format!("{bad}:80"), "");
        assert_eq!(status(&head), 400, "{bad}: {head}");
    }
    assert!(resolver.lookups().is_empty(), "looked up {:?}", resolver.lookups());
    let outcome = proxy.finish();
    assert_eq!(outcome.record.connections.len(), 2 * spellings.len() + 3);
    assert!(outcome.record.connections.iter().all(|e| e.verdict == NetworkVerdict::Denied && e.resolved.is_none()));
    assert_eq!(outcome.record.connections[8].host, "0xa9.0xfe.0xa9.0xfe");
}

#[test]
fn a_name_that_resolves_to_a_forbidden_address_is_refused_unless_that_ip_is_allowed() {
    let server = Server::http();
    let port = server.port();
    let resolver = Arc::new(
        StaticResolver::new()
            .with("evil.test", &["10.0.0.1".parse().unwrap(), "::ffff:169.254.169.254".parse().unwrap()])
            .with("local.test", &[loopback()]),
    );
    let (proxy_only_names, addr) =
        start_proxy(&[format!("evil.test:{port}"), format!("local.test:{port}")], resolver.clone(), Caps::default());
    let answer =
        exchange(addr, format!("GET http://evil.test:{port}/ HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("10.0.0.1 (private)") && answer.contains("169.254.169.254 (link-local"), "{answer}");
    // The server really is at the address local.test names; the proxy still refuses.
    let answer =
        exchange(addr, format!("GET http://local.test:{port}/ HTTP/1.1\r\nHost: local.test:{port}\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("127.0.0.1 (loopback)"), "{answer}");
    assert_eq!(server.connections(), 0);
    assert_eq!(resolver.lookups(), vec!["evil.test", "local.test"]);
    drop(proxy_only_names);

    // An exact IP rule opens that address to the name.
    let (proxy, addr) =
        start_proxy(&[format!("local.test:{port}"), format!("127.0.0.1:{port}")], resolver, Caps::default());
    let answer = exchange(
        addr,
        format!("GET http://local.test:{port}/ok HTTP/1.1\r\nHost: local.test:{port}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&answer), 200, "{answer}");
    assert_eq!(server.connections(), 1);
    drop(proxy);
}

#[test]
fn a_host_header_that_differs_from_the_target_is_refused() {
    let server = Server::http();
    let port = server.port();
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), Caps::default());
    let target = format!("127.0.0.1:{port}");
    for host in ["evil.example", "127.0.0.2", "127.0.0.1:1"] {
        let (_, head) = connect(addr, &target, &format!("Host: {host}\r\n"));
        assert_eq!(status(&head), 403, "CONNECT with Host {host}: {head}");
        let answer = exchange(addr, format!("GET http://{target}/ HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        assert_eq!(status(&answer), 403, "GET with Host {host}: {answer}");
        assert!(answer.contains("differs"), "{answer}");
    }
    let answer = exchange(
        addr,
        format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nHost: evil.example\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&answer), 400, "{answer}");
    let answer = exchange(addr, format!("GET http://{target}/ HTTP/1.1\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 400, "{answer}");
    assert_eq!(server.connections(), 0);
    drop(proxy);
}

#[test]
fn a_tls_server_name_that_differs_from_the_connect_host_is_refused() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("service.test", &[loopback()]));
    let rules = [format!("127.0.0.1:{port}"), format!("service.test:{port}")];
    let (proxy, addr) = start_proxy(&rules, resolver, Caps::default());

    let (tunnel, head) = connect(addr, &format!("127.0.0.1:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let fronted = https_get(tunnel, ca.client_config(), "localhost", "/fronted");
    assert!(fronted.is_err(), "{fronted:?}");

    let (tunnel, head) = connect(addr, &format!("service.test:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(https_get(tunnel, ca.client_config(), "localhost", "/fronted").is_err());

    // Not one byte of either ClientHello reached the server.
    server.settle(2);
    assert_eq!(server.log.lock().unwrap().bytes, 0);
    assert!(server.requests().is_empty());
    let events = proxy.finish().record.connections;
    assert_eq!(events.len(), 2);
    for event in &events {
        assert_eq!(event.verdict, NetworkVerdict::Denied, "{event:?}");
        assert_eq!(event.bytes_out, 0, "{event:?}");
        let reason = event.reason.as_deref().unwrap_or_default();
        assert!(reason.contains("\"localhost\" differs"), "{reason}");
    }
}

#[test]
fn a_plain_request_carries_its_body_and_nothing_smuggled_after_it() {
    let server = Server::http();
    let port = server.port();
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), Caps::default());
    let target = format!("127.0.0.1:{port}");
    let smuggled = format!("GET /second HTTP/1.1\r\nHost: {target}\r\n\r\n");

    let answer =
        exchange(addr, format!("GET http://{target}/first HTTP/1.1\r\nHost: {target}\r\n\r\n{smuggled}").as_bytes());
    assert!(answer.ends_with("hello from /first"), "{answer}");

    let answer = exchange(
        addr,
        format!("POST http://{target}/echo HTTP/1.1\r\nHost: {target}\r\nContent-Length: 5\r\n\r\nhello{smuggled}")
            .as_bytes(),
    );
    assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");

    let chunked = "5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: t\r\n\r\n";
    let answer = exchange(
        addr,
        format!("POST http://{target}/echo HTTP/1.1\r\nHost: {target}\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}{smuggled}")
            .as_bytes(),
    );
    assert!(answer.ends_with(chunked), "{answer}");

    server.settle(3);
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert!(request.after.is_empty(), "smuggled: {:?}", String::from_utf8_lossy(&request.after));
    }
    assert_eq!(requests[2].body, chunked.as_bytes());

    let answer = exchange(
        addr,
        format!("POST http://{target}/echo HTTP/1.1\r\nHost: {target}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello")
            .as_bytes(),
    );
    assert_eq!(status(&answer), 400, "{answer}");
    assert_eq!(server.connections(), 3);
    drop(proxy);
}

#[test]
fn requests_that_are_not_for_a_proxy_are_bad_requests() {
    let (proxy, addr) = start_proxy(&["127.0.0.1:80".to_owned()], no_names(), Caps::default());
    for request in [
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "GET https://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "GET http://user@127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
        "CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
        "GET http://127.0.0.1/ HTTP/1.1\r\nBad Header: x\r\n\r\n",
        "\x16\x03\x01\x00\x05hello\r\n\r\n",
    ] {
        let answer = exchange(addr, request.as_bytes());
        assert_eq!(status(&answer), 400, "{request:?}: {answer}");
    }
    let outcome = proxy.finish();
    assert!(outcome.record.connections.iter().all(|e| e.verdict == NetworkVerdict::Denied && e.reason.is_some()));
}

#[test]
fn with_no_rules_nothing_leaves() {
    let server = Server::http();
    let port = server.port();
    let (proxy, addr) = start_proxy(&[], no_names(), Caps::default());
    let target = format!("127.0.0.1:{port}");
    let answer = exchange(addr, format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    assert_eq!(status(&answer), 403, "{answer}");
    let (_, head) = connect(addr, &target, "");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(server.connections(), 0);
    let outcome = proxy.finish();
    assert!(outcome.record.allowed_hosts.is_empty());
    assert_eq!(outcome.record.connections.len(), 2);
}

#[test]
fn the_byte_cap_in_ends_the_download_at_the_cap() {
    let server = Server::http();
    let port = server.port();
    let caps = Caps { bytes_in: 1000, ..Caps::default() };
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), caps);
    let target = format!("127.0.0.1:{port}");
    let answer =
        exchange(addr, format!("GET http://{target}/big/100000 HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    assert_eq!(answer.len(), 1000);
    assert!(proxy.limit_hit());
    // The budget is the run's: the next connection gets nothing.
    let answer = exchange(addr, format!("GET http://{target}/small HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    assert_eq!(answer, "");
    let outcome = proxy.finish();
    assert_eq!(outcome.limits_hit, vec![Limit::NetworkBytes]);
    let events = &outcome.record.connections;
    assert_eq!(events[0].bytes_in, 1000);
    assert!(events[0].reason.as_deref().unwrap_or_default().contains("cap of 1000 bytes in"), "{events:?}");
    assert_eq!(events[1].bytes_in, 0);
}

#[test]
fn the_byte_cap_out_stops_an_upload_at_the_cap() {
    let server = Server::http();
    let port = server.port();
    let caps = Caps { bytes_out: 500, ..Caps::default() };
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), caps);
    let target = format!("127.0.0.1:{port}");
    let body = vec![b'u'; 10_000];
    let mut request =
        format!("POST http://{target}/echo HTTP/1.1\r\nHost: {target}\r\nContent-Length: {}\r\n\r\n", body.len())
            .into_bytes();
    request.extend_from_slice(&body);
    let _ = exchange(addr, &request);
    let outcome = proxy.finish();
    assert_eq!(outcome.limits_hit, vec![Limit::NetworkBytes]);
    assert_eq!(outcome.record.connections[0].bytes_out, 500);
    server.settle(1);
    assert_eq!(server.log.lock().unwrap().bytes, 500);
}

#[test]
fn the_connection_cap_refuses_further_connections() {
    let server = Server::http();
    let port = server.port();
    let caps = Caps { connections: 2, ..Caps::default() };
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), caps);
    let target = format!("127.0.0.1:{port}");
    let request = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
    for _ in 0..2 {
        assert_eq!(status(&exchange(addr, request.as_bytes())), 200);
    }
    assert!(!proxy.limit_hit());
    for _ in 0..3 {
        // The refusal is written before the request is read; the client may
        // see it or a reset, but never the server's answer.
        let answer = exchange(addr, request.as_bytes());
        assert!(answer.is_empty() || status(&answer) == 403, "{answer}");
    }
    assert!(proxy.limit_hit());
    assert_eq!(server.connections(), 2);
    let outcome = proxy.finish();
    assert_eq!(outcome.limits_hit, vec![Limit::NetworkConnections]);
    assert_eq!(outcome.record.connections.len(), 3);
    assert!(outcome.record.connections[2].reason.as_deref().unwrap_or_default().contains("cap of 2 connections"));
    assert_eq!(outcome.unlisted_refusals, 2);
}

#[test]
fn slow_and_oversized_request_heads_are_cut_off() {
    let server = Server::http();
    let port = server.port();
    let caps = Caps { head_timeout: Duration::from_millis(300), ..Caps::default() };
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), caps);

    let mut slow = TcpStream::connect(addr).unwrap();
    slow.set_read_timeout(Some(PATIENCE)).unwrap();
    slow.write_all(format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHo").as_bytes()).unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert_eq!(status(&answer), 408, "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    let huge = format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(40 * 1024));
    let answer = exchange(addr, huge.as_bytes());
    assert_eq!(status(&answer), 431, "{answer}");

    // A tunnel whose ClientHello starts and stalls is cut off too.
    let ca = TestCa::new();
    let tls_server = Server::https(&ca);
    let (tls_proxy, tls_addr) = start_proxy(
        &[format!("127.0.0.1:{}", tls_server.port())],
        no_names(),
        Caps { head_timeout: Duration::from_millis(300), ..Caps::default() },
    );
    let (mut tunnel, head) = connect(tls_addr, &format!("127.0.0.1:{}", tls_server.port()), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(&[0x16, 3, 1, 0, 200, 1]).unwrap();
    let mut rest = Vec::new();
    let started = Instant::now();
    let _ = tunnel.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // And a tunnel the client never speaks through: before, it was held
    // (four of the supervisor's descriptors) until the run ended, so a few
    // runs of idle tunnels used up a server's open-files limit.
    let (mut silent, head) = connect(tls_addr, &format!("127.0.0.1:{}", tls_server.port()), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut rest = Vec::new();
    let _ = silent.read_to_end(&mut rest);
    let events = tls_proxy.finish().record.connections;
    assert!(events[0].reason.as_deref().unwrap_or_default().contains("in time"), "{events:?}");
    assert!(events[1].reason.as_deref().unwrap_or_default().contains("sent nothing"), "{events:?}");
    tls_server.settle(1);
    assert_eq!(tls_server.log.lock().unwrap().bytes, 0);
    assert_eq!(server.connections(), 0);
    drop(proxy);
}

#[test]
fn finish_returns_promptly_with_idle_clients_and_open_tunnels() {
    let server = Server::http();
    let port = server.port();
    let (proxy, addr) = start_proxy(&[format!("127.0.0.1:{port}")], no_names(), Caps::default());
    let idle = TcpStream::connect(addr).unwrap();
    let (mut tunnel, head) = connect(addr, &format!("127.0.0.1:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Half a request through the tunnel: the proxy waits for the rest of its
    // head before it checks and passes it on.
    tunnel.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let started = Instant::now();
    let outcome = proxy.finish();
    assert!(started.elapsed() < Duration::from_secs(1), "finish took {:?}", started.elapsed());
    let events = outcome.record.connections;
    assert_eq!(events.len(), 2, "{events:?}");
    for event in &events {
        assert_eq!(event.reason.as_deref(), Some("closed when the run ended"), "{event:?}");
    }
    assert_eq!(events[1].verdict, NetworkVerdict::Allowed);
    assert_eq!(events[1].bytes_out, 0);
    // Both client connections are closed.
    let mut buffer = [0u8; 16];
    tunnel.set_read_timeout(Some(PATIENCE)).unwrap();
    assert_eq!(tunnel.read(&mut buffer).unwrap_or(0), 0);
    drop(idle);
}

#[test]
fn a_socket_that_is_not_listening_is_refused_with_a_reason() {
    use rustix::net::{AddressFamily, SocketType, bind, socket};
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    bind(&fd, &std::net::SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let not_listening = std::net::TcpListener::from(fd);
    let config = ProxyConfig::from_policy(&NetworkPolicy::default());
    match Proxy::start(not_listening, config) {
        Err(NetError::Listener(e)) => assert!(e.to_string().contains("not listening"), "{e}"),
        other => panic!("expected a listener error, got {other:?}"),
    }
}

#[test]
fn plaintext_through_a_tunnel_must_name_the_tunnel_s_host_in_every_request() {
    let server = Server::http();
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("service.test", &[loopback()]));
    // The name resolves to loopback, which only an exact IP rule opens.
    let rules = [format!("service.test:{port}"), format!("127.0.0.1:{port}")];
    let (proxy, addr) = start_proxy(&rules, resolver, Caps::default());
    let tunnel_to = |request: &str| {
        let (mut tunnel, head) = connect(addr, &format!("service.test:{port}"), "");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let _ = tunnel.write_all(request.replace("PORT", &port.to_string()).as_bytes());
        let mut answer = String::new();
        let _ = tunnel.read_to_string(&mut answer);
        answer
    };
    // A request that names the tunnel's host goes through...
    let answer = tunnel_to("GET /mine HTTP/1.1\r\nHost: service.test:PORT\r\n\r\n");
    assert!(answer.ends_with("hello from /mine"), "{answer}");
    // ...and every way of naming another site, or of leaving HTTP, does not.
    let refused = [
        ("GET /other-host HTTP/1.1\r\nHost: other.test\r\n\r\n", "other.test"),
        ("GET http://other.test/absolute HTTP/1.1\r\nHost: service.test:PORT\r\n\r\n", "other.test"),
        ("GET /no-host HTTP/1.0\r\n\r\n", "no Host header"),
        ("GET /default-port HTTP/1.1\r\nHost: service.test\r\n\r\n", "differs"),
        ("CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n", "CONNECT inside"),
        ("GET /ws HTTP/1.1\r\nHost: service.test:PORT\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", "Upgrade"),
        ("SSH-2.0-OpenSSH_9.2p1\r\n", "no HTTP"),
    ];
    for (request, _) in &refused {
        let answer = tunnel_to(request);
        assert!(!answer.contains("hello from"), "{request:?}: {answer}");
    }
    // A good request, then a bad one pipelined behind it: the first only
    // reaches the server, and the tunnel closes at the second (perhaps
    // before the first's answer is back).
    tunnel_to("GET /first HTTP/1.1\r\nHost: service.test:PORT\r\n\r\nGET /second HTTP/1.1\r\nHost: other.test\r\n\r\n");

    server.settle(2 + refused.len());
    let lines: Vec<String> = server.requests().iter().map(|r| r.head.lines().next().unwrap_or("").to_owned()).collect();
    assert_eq!(lines, ["GET /mine HTTP/1.1", "GET /first HTTP/1.1"], "nothing else reached the server");
    assert!(server.requests().iter().all(|r| r.after.is_empty()), "nothing smuggled behind a good request");
    let events = proxy.finish().record.connections;
    assert_eq!(events.len(), 2 + refused.len());
    assert_eq!(events[0].verdict, NetworkVerdict::Allowed, "{:?}", events[0]);
    for (event, (request, reason)) in events[1..].iter().zip(&refused) {
        assert_eq!(event.verdict, NetworkVerdict::Denied, "{request:?}: {event:?}");
        assert_eq!(event.bytes_out, 0, "{request:?}: {event:?}");
        let recorded = event.reason.as_deref().unwrap_or_default();
        assert!(recorded.contains(reason), "{request:?}: {recorded}");
    }
    let pipelined = events.last().unwrap();
    assert_eq!(pipelined.verdict, NetworkVerdict::Denied, "{pipelined:?}");
    assert!(pipelined.reason.as_deref().unwrap_or_default().contains("second request"), "{pipelined:?}");
    // What reached the server was asked to be the connection's last.
    assert!(server.requests().iter().all(|r| r.head.contains("Connection: close\r\n")), "{:?}", server.requests());
}

/// A request whose body is itself a request, for another site, through a
/// plaintext tunnel: the proxy passes the body as a body, but a server that
/// ignores it reads the next bytes of the connection as a request of its
/// own. Before the fix the tunnel kept the server's connection open across
/// requests and passed heads as the client wrote them: the server answered
/// "you asked admin.internal for /internal". Now the head goes rebuilt with
/// `Connection: close`, one request a tunnel, and the server answers once.
#[test]
fn a_request_hidden_in_a_body_never_reaches_the_server_through_a_tunnel() {
    let (port, answered) = server_that_ignores_bodies();
    let target = format!("127.0.0.1:{port}");
    let (proxy, addr) = start_proxy(std::slice::from_ref(&target), no_names(), Caps::default());
    let hidden = "GET /internal HTTP/1.1\r\nHost: admin.internal\r\n\r\n";
    for method in ["GET", "POST"] {
        let (mut tunnel, head) = connect(addr, &target, "");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let request =
            format!("{method} / HTTP/1.1\r\nHost: {target}\r\nContent-Length: {}\r\n\r\n{hidden}", hidden.len());
        tunnel.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = tunnel.read_to_string(&mut answer);
        assert!(answer.ends_with(&format!("you asked {target} for /")), "{method}: {answer}");
        assert!(!answer.contains("admin.internal"), "{method}: {answer}");
    }
    // The server is done with both connections once it has answered them.
    std::thread::sleep(Duration::from_millis(200));
    let expected = vec![format!("you asked {target} for /"); 2];
    assert_eq!(*answered.lock().unwrap(), expected);
    let events = proxy.finish().record.connections;
    assert!(events.iter().all(|e| e.verdict == NetworkVerdict::Allowed), "{events:?}");
}

/// A tunnel that begins with a ClientHello must carry TLS: bytes after the
/// hello are not passed until the server has answered it as a TLS server
/// does, so a line-based service on an allowed port gets no command the
/// code writes after a hello, and the code gets none of its answers. Before
/// the fix, any ClientHello opened a raw relay: the service read `SET key
/// value` and `PING` and answered both. A service that speaks first (a
/// banner) is refused before the client speaks, its banner not passed.
#[test]
fn a_tls_opening_carries_no_other_protocol_after_it() {
    let (target, lines) = line_service(false);
    let (banner_target, banner_lines) = line_service(true);
    let (proxy, addr) = start_proxy(&[target.clone(), banner_target.clone()], no_names(), Caps::default());

    let mut random = [7u8; 32];
    random[10..12].copy_from_slice(b"\r\n");
    let (mut tunnel, head) = connect(addr, &target, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(&[client_hello(&random), b"SET key value\r\nPING\r\n".to_vec()].concat()).unwrap();
    let mut answer = Vec::new();
    let _ = tunnel.read_to_end(&mut answer);
    assert_eq!(String::from_utf8_lossy(&answer), "", "the service's answers reached the client");

    let (mut tunnel, head) = connect(addr, &banner_target, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut answer = Vec::new();
    let _ = tunnel.read_to_end(&mut answer);
    assert_eq!(String::from_utf8_lossy(&answer), "", "the banner reached the client");
    let _ = tunnel.write_all(b"HELO me\r\n");

    std::thread::sleep(Duration::from_millis(200));
    let read = lines.lock().unwrap().clone();
    assert!(!read.iter().any(|l| l.contains("SET key value") || l == "PING"), "the service read {read:?}");
    assert_eq!(*banner_lines.lock().unwrap(), Vec::<String>::new());
    let events = proxy.finish().record.connections;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| e.verdict == NetworkVerdict::Denied && e.bytes_in == 0), "{events:?}");
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_deref().unwrap_or_default()).collect();
    assert!(reasons[0].contains("did not answer the TLS ClientHello with TLS"), "{reasons:?}");
    assert!(reasons[1].contains("before the client did"), "{reasons:?}");
}

#[test]
fn a_tls_tunnel_to_a_name_must_name_it() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let port = server.port();
    let resolver = Arc::new(StaticResolver::new().with("service.test", &[loopback()]));
    let rules = [format!("service.test:{port}"), format!("127.0.0.1:{port}")];
    let (proxy, addr) = start_proxy(&rules, resolver, Caps::default());
    // A client talking to an address sends no server name: through a tunnel
    // opened for a name, that hides which site it asks the server for.
    let (tunnel, head) = connect(addr, &format!("service.test:{port}"), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(https_get(tunnel, ca.client_config(), "127.0.0.1", "/nameless").is_err());
    server.settle(1);
    assert_eq!(server.log.lock().unwrap().bytes, 0);
    let events = proxy.finish().record.connections;
    assert_eq!(events[0].verdict, NetworkVerdict::Denied, "{events:?}");
    assert!(events[0].reason.as_deref().unwrap_or_default().contains("names no server"), "{events:?}");
}

/// A request's body is the client's to fill: to a line-based service on an
/// allowed port, it is a list of commands. The service reads them (the
/// proxy cannot tell a body from a command), but its answer, which is not
/// HTTP, never reaches the client, forwarded or through a tunnel; nor does
/// a banner a service sends first, whether the client's request came with
/// its CONNECT or the client half-closed the tunnel at once. Before the fix
/// the client got "+OK SET key value" back both ways, and the banner too.
#[test]
fn a_plaintext_request_gets_an_answer_only_from_an_http_server() {
    let (target, _) = line_service(false);
    let (banner_target, _) = line_service(true);
    let http = Server::http();
    let http_target = format!("127.0.0.1:{}", http.port());
    let rules = [target.clone(), banner_target.clone(), http_target.clone()];
    let (proxy, addr) = start_proxy(&rules, no_names(), Caps::default());
    let commands = "SET key value\r\nPING\r\n";
    let post = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nHost: {target}\r\nContent-Length: {}\r\n\r\n{commands}", commands.len())
    };

    let forwarded = exchange(addr, post(&format!("http://{target}/")).as_bytes());
    let (mut tunnel, head) = connect(addr, &target, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(post("/").as_bytes()).unwrap();
    let mut tunnelled = String::new();
    let _ = tunnel.read_to_string(&mut tunnelled);
    // A request sent with the CONNECT, before the proxy's answer.
    let pipelined = exchange(
        addr,
        format!("CONNECT {banner_target} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: {banner_target}\r\n\r\n").as_bytes(),
    );
    let (mut tunnel, _) = connect(addr, &banner_target, "");
    tunnel.shutdown(std::net::Shutdown::Write).unwrap();
    let mut half_closed = String::new();
    let _ = tunnel.read_to_string(&mut half_closed);
    for (how, answer) in [("forwarded", &forwarded), ("tunnelled", &tunnelled), ("pipelined", &pipelined)] {
        assert!(!answer.contains("+OK") && !answer.contains(BANNER.trim_end()), "{how}: {answer:?}");
    }
    assert_eq!(half_closed, "", "the banner reached a client that had sent nothing");

    // An HTTP server's answer passes, told to be the connection's last.
    let answer =
        exchange(addr, format!("GET http://{http_target}/page HTTP/1.1\r\nHost: {http_target}\r\n\r\n").as_bytes());
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\nConnection: close\r\n"), "{answer}");
    assert!(answer.ends_with("hello from /page"), "{answer}");

    let events = proxy.finish().record.connections;
    let refusals: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    let not_http = refusals.iter().filter(|r| r.contains("did not answer as an HTTP server")).count();
    assert_eq!(not_http, 3, "{events:?}");
}

/// A name that resolves to one of the host's own public addresses never
/// reaches the host's own services: here, in a network namespace of this
/// test thread's own (threads and children made from it share it), a
/// service on 45.45.45.45, an address of its loopback. Before, the proxy
/// dialled it (a public address) and the code got the host-only page.
#[test]
fn an_allowed_name_never_reaches_the_hosts_own_addresses() {
    assert!(rustix::process::geteuid().is_root(), "this test makes a network namespace: run it as root");
    std::thread::spawn(|| {
        // SAFETY: NEWNET alone changes this thread's network namespace; it
        // shares no descriptor table or memory anew, which is what the
        // function's other flags could break.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }.expect("a network namespace");
        // The host's own address, a whole local range whose route names
        // another source, and a local IPv6 range (the last two got through
        // a check that compared a route's source with its destination).
        let setup: [&[&str]; 4] = [
            &["link", "set", "lo", "up"],
            &["addr", "add", "45.45.45.45/32", "dev", "lo"],
            &["route", "add", "local", "46.46.0.0/16", "dev", "lo", "src", "45.45.45.45"],
            &["-6", "route", "add", "local", "2a00:1450:5000::/48", "dev", "lo"],
        ];
        for args in setup {
            let done = std::process::Command::new("ip").args(args).status().expect("ip");
            assert!(done.success(), "ip {args:?}");
        }
        // Every address, both families: what a service bound to all gets.
        let service = std::net::TcpListener::bind("[::]:0").unwrap();
        let port = service.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in service.incoming().flatten() {
                let mut stream = stream;
                let mut head = [0u8; 1024];
                let _ = stream.read(&mut head);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nhost-only admin page");
            }
        });
        let resolver = Arc::new(
            StaticResolver::new()
                .with("self.test", &[IpAddr::from([45, 45, 45, 45])])
                .with("range.test", &[IpAddr::from([46, 46, 0, 1])])
                .with("six.test", &["2a00:1450:5000::1".parse().unwrap()]),
        );
        let names = ["self.test", "range.test", "six.test"];
        let rules: Vec<String> = names.iter().map(|name| format!("{name}:{port}")).collect();
        let (proxy, addr) = start_proxy(&rules, resolver, Caps::default());
        for name in names {
            let request = format!("GET http://{name}:{port}/ HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n");
            let answer = exchange(addr, request.as_bytes());
            assert!(!answer.contains("host-only"), "the code reached the host's own service through {name}: {answer}");
            assert_eq!(status(&answer), 403, "{name}: {answer}");
        }
        for event in proxy.finish().record.connections {
            let reason = event.reason.clone().unwrap_or_default();
            assert!(reason.contains("an address of this host"), "{}: {reason}", event.host);
        }
        // The same address named exactly by a rule: the operator's choice.
        let (proxy, addr) = start_proxy(&[format!("45.45.45.45:{port}")], no_names(), Caps::default());
        let answer = exchange(
            addr,
            format!("GET http://45.45.45.45:{port}/ HTTP/1.1\r\nHost: 45.45.45.45:{port}\r\n\r\n").as_bytes(),
        );
        assert!(answer.contains("host-only"), "{answer}");
        drop(proxy);
    })
    .join()
    .expect("the test thread");
}
