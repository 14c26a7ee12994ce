//! `airlock serve` under denial-of-service attacks, run for real against a
//! server process on loopback: idle and half-sent connections, slow and
//! stalled request bodies, and a flood of MCP sessions. Each test measures
//! the server itself (its open descriptors, its resident memory, what it
//! answers) while the attack is held.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use airlock_server::token_sha256;
use airlock_tests::{airlock_command, data_image};
use reqwest::StatusCode;
use reqwest::blocking::Client;
use serde_json::{Value, json};

const ALICE: &str = "alice-token-5f1e8a";
const BOB: &str = "bob-token-c03d77";
const AUDITOR: &str = "auditor-token-99aa10";

/// A running `airlock serve`, killed when dropped (the harness of
/// tests/tests/server.rs, cut to what these tests need).
struct Server {
    child: Child,
    pid: u32,
    address: String,
    _dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server whose config is `extra` plus three tokens and an
    /// audit database of its own.
    fn start(extra: &str) -> Server {
        let _ = data_image();
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "listen = \"127.0.0.1:0\"\naudit_db = {db:?}\n{extra}\n\
             [[tokens]]\nname = \"alice\"\nsha256 = \"{alice}\"\n\
             [[tokens]]\nname = \"bob\"\nsha256 = \"{bob}\"\n\
             [[tokens]]\nname = \"auditor\"\nsha256 = \"{auditor}\"\nsee_all_runs = true\n",
            db = dir.path().join("audit.sqlite3").display().to_string(),
            alice = token_sha256(ALICE),
            bob = token_sha256(BOB),
            auditor = token_sha256(AUDITOR),
        );
        let config_path = dir.path().join("airlock.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut child = airlock_command()
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start airlock serve");
        let pid = child.id();
        let log = Arc::new(Mutex::new(String::new()));
        let (found, address) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.strip_prefix("airlock: serving http://") {
                        let _ = found.send(rest.split(' ').next().unwrap_or_default().to_owned());
                    }
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
            }
        });
        let address = match address.recv_timeout(Duration::from_secs(120)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start: {}", log.lock().unwrap());
            }
        };
        Server { child, pid, address, _dir: dir, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn connect(&self) -> TcpStream {
        TcpStream::connect(&self.address).unwrap()
    }

    /// The server's resident memory, bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    /// How many descriptors the server holds open.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).unwrap().count()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(5)).build().unwrap()
}

/// Whether the server has closed `stream`: a read sees the end or a reset
/// (the server may also have reset it), not a timeout.
fn closed_by_server(mut stream: &TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // An answer (a 408 for a half-sent head, say): read on to the close.
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

/// `/healthz` answers 200 within `limit`, retrying a refused connection.
fn healthz_within(server: &Server, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        match client().get(server.url("/healthz")).timeout(Duration::from_secs(2)).send() {
            Ok(response) if response.status() == StatusCode::OK => return Ok(start.elapsed()),
            Ok(response) => last = format!("status {}", response.status()),
            Err(error) => last = error.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last)
}

/// Idle connections, half-sent request lines and idle keep-alive
/// connections are closed within the head timeout; connections past
/// `max_connections` cost the server no descriptor; `/healthz` answers
/// while 650 of them are held.
#[test]
fn idle_and_half_sent_connections_are_closed_and_healthz_still_answers() {
    let server = Server::start("max_connections = 50\nheader_timeout_s = 1\n");
    let baseline = server.fds();
    // One keep-alive connection that asked once and then idles.
    let mut kept = server.connect();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = [0u8; 1024];
    let n = kept.read(&mut answer).unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
    let mut held = Vec::new();
    for i in 0..650 {
        let mut stream = server.connect();
        if i % 2 == 1 {
            stream.write_all(b"POST /v1/ru").unwrap();
        }
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let fds = server.fds();
    let answered = healthz_within(&server, Duration::from_secs(8));
    eprintln!("650 idle connections: the server held {fds} descriptors ({baseline} before); /healthz: {answered:?}");
    assert!(answered.is_ok(), "/healthz did not answer while 650 idle connections were held: {answered:?}");
    assert!(
        fds <= baseline + 50 + 5,
        "the server held {fds} descriptors ({baseline} before the attack) for a cap of 50 connections"
    );
    // The head timeout is 1 s: give it slack, then every one is closed.
    std::thread::sleep(Duration::from_millis(2500));
    let open = held.iter().filter(|stream| !closed_by_server(stream)).count();
    assert_eq!(open, 0, "{open} of 650 idle or half-sent connections were still open 2.8 s after a 1 s head timeout");
    assert!(closed_by_server(&kept), "an idle keep-alive connection was still open after the head timeout");
    assert!(server.fds() <= baseline + 2, "descriptors left: {} (baseline {baseline})", server.fds());
    assert!(healthz_within(&server, Duration::from_secs(2)).is_ok(), "{}", server.log());
}

/// Connections that pipeline requests and never read an answer hold their
/// places only for the write timeout: before, the head timeout did not
/// cover a blocked answer, and twenty such connections (512 at the
/// defaults), no token needed, shut everyone out for as long as they liked.
#[test]
fn clients_that_never_read_their_answers_lose_their_places() {
    let server = Server::start("max_connections = 20\nheader_timeout_s = 1\nwrite_timeout_s = 1\n");
    let requests = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(400);
    let held: Vec<TcpStream> = (0..20)
        .map(|_| {
            let stream = server.connect();
            // Written from a thread of its own: the server stops reading
            // once its answers back up, and so would this write.
            let mut writer = stream.try_clone().unwrap();
            let requests = requests.clone();
            std::thread::spawn(move || {
                let _ = writer.write_all(&requests);
            });
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Held, none read: within a few write timeouts the places are free.
    let answered = healthz_within(&server, Duration::from_secs(8));
    assert!(answered.is_ok(), "/healthz did not answer while 20 unread connections were held: {answered:?}");
    drop(held);
}

/// A request head and all but the last byte of a JSON body of `len` bytes.
fn held_body(token: &str, len: usize) -> Vec<u8> {
    let mut body = b"{\"code\":\"1\",\"stdin_base64\":\"".to_vec();
    body.resize(len - 2, b'A');
    body.extend_from_slice(b"\"}");
    let mut request = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
    .into_bytes();
    request.extend_from_slice(&body[..len - 1]);
    request
}

/// The status line and body of an answer, read until the server closes or
/// `limit` passes; None when nothing came.
fn answer_within(stream: &mut TcpStream, limit: Duration) -> Option<(u16, String)> {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut text = Vec::new();
    let mut buffer = [0u8; 8192];
    let start = Instant::now();
    while start.elapsed() < limit {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                text.extend_from_slice(&buffer[..n]);
                if text.windows(4).any(|w| w == b"\r\n\r\n") && text.ends_with(b"}") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    Some((status, text))
}

/// Alice stalls four uploads as large as the server takes; Bob's run and
/// his MCP `initialize` still get in: a token's stalled bodies hold at most
/// its share of `body_bytes_in_flight` (here a third of 16 KiB, at least one
/// 4 KiB body). Before, her four took the whole budget and Bob got 429.
#[test]
fn one_tokens_stalled_uploads_leave_the_others_their_share() {
    let server = Server::start("max_body_bytes = 4096\nbody_bytes_in_flight = 16384\nbody_timeout_s = 20\n");
    let request = held_body(ALICE, 4096);
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = server.connect();
        stream.write_all(&request).unwrap();
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let response = client()
        .post(server.url("/v1/runs"))
        .bearer_auth(BOB)
        .json(&json!({"code": "print('bob ran')"}))
        .timeout(Duration::from_secs(30))
        .send()
        .unwrap();
    let status = response.status();
    let body: Value = response.json().unwrap_or_default();
    assert_eq!(status, StatusCode::OK, "Alice's stalled uploads shut Bob out: {body}");
    assert_eq!(body["stdout"], "bob ran\n", "{body}");
    let (status, _, text) = mcp_initialize(&server, BOB);
    assert_eq!(status, StatusCode::OK, "{text}");
    // Alice's uploads past her share were refused, naming why.
    let refused = held
        .iter_mut()
        .filter_map(|stream| answer_within(stream, Duration::from_millis(500)))
        .filter(|(status, text)| *status == 429 && text.contains("its share of body_bytes_in_flight"))
        .count();
    assert!(refused >= 2, "{refused} of Alice's four uploads refused for a share of 5,461 bytes");
}

/// Sixteen connections each send all but the last byte of an 8 MiB body:
/// the server reads at most `body_bytes_in_flight` (16 MiB) of them at
/// once, refuses the rest with 429 naming the setting, and drops the ones
/// it took when they stall past `body_timeout_s`, with 408; so is any body
/// that stalls.
#[test]
fn slow_large_bodies_stay_within_the_budget_and_stalled_ones_are_dropped() {
    const BODY: usize = 8 << 20;
    let server =
        Server::start(&format!("max_body_bytes = {BODY}\nbody_bytes_in_flight = {}\nbody_timeout_s = 3\n", 2 * BODY));
    let before = server.rss();
    let request = Arc::new(held_body(BOB, BODY));
    let (sent, arrived) = mpsc::channel();
    for _ in 0..16 {
        let request = request.clone();
        let mut stream = server.connect();
        let sent = sent.clone();
        std::thread::spawn(move || {
            stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            // A refused body is not read to its end: the write may fail.
            let _ = stream.write_all(&request);
            let _ = sent.send(stream);
        });
    }
    drop(sent);
    let mut streams: Vec<TcpStream> = arrived.iter().collect();
    assert_eq!(streams.len(), 16);
    std::thread::sleep(Duration::from_millis(500));
    let held = server.rss().saturating_sub(before);
    let mut refused = 0;
    let mut timed_out = 0;
    let mut unanswered = 0;
    let deadline = Instant::now() + Duration::from_secs(6);
    for stream in &mut streams {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
        match answer_within(stream, left) {
            Some((429, text)) => {
                assert!(text.contains("body_bytes_in_flight"), "the 429 does not name the setting: {text}");
                refused += 1;
            }
            Some((408, text)) => {
                assert!(text.contains("body_timeout_s"), "the 408 does not name the setting: {text}");
                assert!(closed_by_server(stream), "a stalled body's connection was kept open");
                timed_out += 1;
            }
            Some((status, text)) => panic!("unexpected answer {status}: {text}"),
            None => unanswered += 1,
        }
    }
    eprintln!("16 bodies of 8 MiB: {refused} refused, {timed_out} timed out; server RSS grew {} MiB", held >> 20);
    assert_eq!(unanswered, 0, "{unanswered} stalled bodies were neither refused nor dropped within 6 s");
    // At most two fit; racing for the budget, a third's partial read may
    // get one of them refused too.
    assert!(refused >= 14, "only {refused} of 16 bodies were refused for a budget of two ({timed_out} timed out)");
    assert!(
        held < (2 * BODY as u64) * 2 + (16 << 20),
        "the server's RSS grew by {} MiB holding sixteen 8 MiB bodies (budget 16 MiB)",
        held >> 20
    );
    // A body that stalls is dropped body_timeout_s after the server began to read it.
    let mut stalled = server.connect();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"code\":"
    );
    stalled.write_all(head.as_bytes()).unwrap();
    let start = Instant::now();
    let answer = answer_within(&mut stalled, Duration::from_secs(8));
    let waited = start.elapsed();
    let (status, text) = answer.expect("a stalled body got no answer within 8 s");
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("body_timeout_s"), "the 408 does not name the setting: {text}");
    assert!(waited >= Duration::from_millis(2500) && waited < Duration::from_secs(5), "408 after {waited:?}");
    assert!(closed_by_server(&stalled), "a stalled body's connection was kept open");
    // The server still answers, and a token holder's next request is read.
    let runs = client().get(server.url("/v1/runs")).bearer_auth(ALICE).send().unwrap();
    assert_eq!(runs.status(), StatusCode::OK, "{}", server.log());
}

/// A JSON-RPC `initialize` to `/mcp` with `token`: the status and answer.
fn mcp_initialize(server: &Server, token: &str) -> (StatusCode, Option<String>, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}
    });
    let response = client()
        .post(server.url("/mcp"))
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .json(&body)
        .send()
        .unwrap();
    let status = response.status();
    let session = response.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    (status, session, response.text().unwrap())
}

/// `notifications/initialized` on `session` with `token`: the status and answer.
fn mcp_notify(server: &Server, token: &str, session: &str) -> (StatusCode, String) {
    let response = client()
        .post(server.url("/mcp"))
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", session)
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .unwrap();
    let status = response.status();
    (status, response.text().unwrap())
}

/// MCP sessions are capped per token and in all, refused past the cap
/// with an answer naming the setting, and bound to the token that made
/// them; a flood of `initialize` leaves the server's memory where it was.
#[test]
fn mcp_sessions_are_capped_per_token_and_in_all_and_bound_to_their_token() {
    let server = Server::start("max_mcp_sessions = 8\nmax_mcp_sessions_per_token = 3\n");
    let mut alice = Vec::new();
    for _ in 0..3 {
        let (status, session, text) = mcp_initialize(&server, ALICE);
        assert_eq!(status, StatusCode::OK, "{text}");
        alice.push(session.expect("a session id"));
    }
    let (status, session, text) = mcp_initialize(&server, ALICE);
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "a 4th session for a cap of 3 per token: {text}");
    assert!(session.is_none());
    let refusal: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(refusal["error"]["code"], "busy", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_mcp_sessions_per_token"), "{message}");

    // Another token still gets sessions; nobody may use alice's.
    let (status, bobs, text) = mcp_initialize(&server, BOB);
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = mcp_notify(&server, BOB, &alice[0]);
    assert_eq!(status, StatusCode::NOT_FOUND, "bob used alice's session: {text}");
    let (status, text) = mcp_notify(&server, ALICE, &alice[0]);
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let (status, text) = mcp_notify(&server, ALICE, bobs.as_deref().unwrap());
    assert_eq!(status, StatusCode::NOT_FOUND, "alice used bob's session: {text}");
    let deleted =
        client().delete(server.url("/mcp")).bearer_auth(BOB).header("Mcp-Session-Id", &alice[0]).send().unwrap();
    assert_eq!(deleted.status(), StatusCode::NOT_FOUND, "bob ended alice's session");

    // Ending a session gives its place back.
    let deleted =
        client().delete(server.url("/mcp")).bearer_auth(ALICE).header("Mcp-Session-Id", &alice[0]).send().unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let (status, _, text) = mcp_initialize(&server, ALICE);
    assert_eq!(status, StatusCode::OK, "a session ended gave no place back: {text}");

    // The cap in all: alice 3, bob 1, auditor 3, bob 1 more is 8; then none.
    for _ in 0..3 {
        let (status, _, text) = mcp_initialize(&server, AUDITOR);
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let (status, _, text) = mcp_initialize(&server, BOB);
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, _, text) = mcp_initialize(&server, BOB);
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "a 9th session for a cap of 8: {text}");
    assert!(text.contains("max_mcp_sessions"), "{text}");

    // A flood makes no sessions and holds no memory.
    let before = server.rss();
    let start = Instant::now();
    let mut made = 0;
    for _ in 0..1000 {
        if mcp_initialize(&server, ALICE).0 == StatusCode::OK {
            made += 1;
        }
    }
    let grown = server.rss().saturating_sub(before);
    eprintln!("1000 initializes past the cap: {made} sessions made, RSS grew {} KiB", grown >> 10);
    assert_eq!(made, 0, "the flood made {made} sessions past the cap");
    assert!(grown < 16 << 20, "1000 refused initializes grew the server's RSS by {} MiB", grown >> 20);
    assert!(start.elapsed() < Duration::from_secs(60));
}
