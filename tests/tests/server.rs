//! `airlock serve` and `airlock mcp` end to end: a real server process on
//! loopback, a real HTTP client, the official MCP Python SDK as the MCP
//! client, the audit store checked through `airlock audit`, and nothing
//! left behind on the host.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use airlock_server::token_sha256;
use airlock_tests::{airlock_command, data_image, leftovers_of, mcp_sdk_client};
use base64::Engine as _;
use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

const ALICE: &str = "alice-token-5f1e8a";
const BOB: &str = "bob-token-c03d77";
const AUDITOR: &str = "auditor-token-99aa10";

/// A running `airlock serve`, stopped and checked for leftovers when dropped.
struct Server {
    child: Option<Child>,
    pid: u32,
    address: String,
    dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server whose config is `extra` plus three tokens and an
    /// audit database of its own.
    fn start(extra: &str, args: &[&str]) -> Server {
        Server::launch(extra, args, false)
    }

    /// Starts a server whose audit store is on a 3 MiB disk of its own: a
    /// tmpfs in a mount namespace of the server's (this needs root).
    fn start_on_a_small_disk(extra: &str) -> Server {
        Server::launch(extra, &[], true)
    }

    fn launch(extra: &str, args: &[&str], small_disk: bool) -> Server {
        let _ = data_image();
        let dir = tempfile::tempdir().unwrap();
        let audit_dir = if small_disk { dir.path().join("small-disk") } else { dir.path().to_owned() };
        std::fs::create_dir_all(&audit_dir).unwrap();
        let config = format!(
            "listen = \"127.0.0.1:0\"\naudit_db = {db:?}\n{extra}\n\
             [[tokens]]\nname = \"alice\"\nsha256 = \"{alice}\"\n\
             [[tokens]]\nname = \"bob\"\nsha256 = \"{bob}\"\n\
             [[tokens]]\nname = \"auditor\"\nsha256 = \"{auditor}\"\nsee_all_runs = true\n",
            db = audit_dir.join("audit.sqlite3").display().to_string(),
            alice = token_sha256(ALICE),
            bob = token_sha256(BOB),
            auditor = token_sha256(AUDITOR),
        );
        let config_path = dir.path().join("airlock.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = airlock_command();
        if small_disk {
            // unshare and sh exec in turn: the pid stays the server's.
            let mut wrapped = Command::new("unshare");
            wrapped
                .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg("mount -t tmpfs -o size=3m,mode=0700 srvtest \"$0\" && exec \"$@\"")
                .arg(&audit_dir)
                .arg(airlock_tests::airlock_bin())
                .envs(command.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))));
            command = wrapped;
        }
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(args)
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
        Server { child: Some(child), pid, address, dir, log }
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

    /// The audit database (of a server not on a small disk).
    fn db(&self) -> PathBuf {
        self.dir.path().join("audit.sqlite3")
    }

    fn post_run(&self, token: &str, body: &Value) -> Response {
        client().post(self.url("/v1/runs")).bearer_auth(token).json(body).send().unwrap()
    }

    fn get(&self, token: &str, path: &str) -> Response {
        client().get(self.url(path)).bearer_auth(token).send().unwrap()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// SIGTERM, then waits for the server to exit.
    fn stop(&mut self) -> ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        self.wait(Duration::from_secs(60))
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("the server is running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(start.elapsed() < limit, "the server did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

/// Asserts that nothing of server `pid` outlived it: cgroups, mounts, and
/// processes whose command line holds `marker`.
fn assert_nothing_left(pid: u32, marker: &str) {
    for _ in 0..100 {
        if leftovers_of(pid, marker).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = leftovers_of(pid, marker);
    assert!(left.is_empty(), "left behind on the host: {left:#?}");
}

fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// Checks a body against the schema of that name in the served document.
fn conforms(document: &Value, schema: &str, body: &Value) {
    if let Err(error) = airlock_server::openapi::validate(document, schema, body) {
        panic!("the {schema} does not match /openapi.json: {error}\n{body:#}");
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The weighted median of price by units in sales.csv, computed here
/// independently of pandas.
fn expected_weighted_median() -> f64 {
    let text = std::fs::read_to_string(examples().join("sales.csv")).unwrap();
    let mut rows: Vec<(f64, u64)> = text
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (fields[3].parse().unwrap(), fields[2].parse().unwrap())
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let half = rows.iter().map(|r| r.1).sum::<u64>() as f64 / 2.0;
    let mut cumulative = 0u64;
    rows.iter()
        .find(|(_, units)| {
            cumulative += units;
            cumulative as f64 >= half
        })
        .unwrap()
        .0
}

/// The weighted-median job with a figure of the price distribution.
fn weighted_median_with_figure() -> String {
    let job = std::fs::read_to_string(examples().join("weighted_median.py")).unwrap();
    let (body, last) = job.trim_end().rsplit_once('\n').unwrap();
    format!(
        "{body}\nimport matplotlib.pyplot as plt\nplt.hist(sales['price'], bins=30, weights=sales['units'])\n\
         plt.axvline(weighted_median, color='red')\nplt.title('price by units')\n{last}\n"
    )
}

fn airlock_audit(db: &Path, args: &[&str]) -> (i32, String, String) {
    let output = airlock_command().arg("audit").arg("--db").arg(db).args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn runs_end_to_end_with_files_outputs_figures_and_the_audit_trail() {
    let server = Server::start("", &[]);
    let document: Value = client().get(server.url("/openapi.json")).send().unwrap().json().unwrap();
    let csv = std::fs::read(examples().join("sales.csv")).unwrap();
    let body = json!({
        "code": weighted_median_with_figure(),
        "files": [{"path": "/work/sales.csv", "content_base64": base64::engine::general_purpose::STANDARD.encode(&csv)}],
        "outputs": ["/work/out.json"],
        "policy": {"timeout_s": 15, "memory_mb": 400},
    });
    let (status, record) = json_of(server.post_run(ALICE, &body));
    assert_eq!(status, StatusCode::OK, "{record:#}");
    conforms(&document, "RunRecord", &record);
    assert_eq!(record["status"], "ok", "{record:#}");
    let expected = expected_weighted_median();
    let value: f64 = record["value"].as_str().unwrap().parse().unwrap();
    assert_eq!(value, expected);
    assert_eq!(record["policy"]["timeout_s"], 15.0);
    assert_eq!(record["policy"]["memory_mb"], 400);
    assert_eq!(record["inputs"][0]["path"], "/work/sales.csv");
    let out = base64::engine::general_purpose::STANDARD
        .decode(record["artifacts"][0]["content_base64"].as_str().unwrap())
        .unwrap();
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["weighted_median"].as_f64(), Some(expected));
    assert_eq!(out["rows"], 4000);
    let png = base64::engine::general_purpose::STANDARD.decode(record["figures"][0]["png_base64"].as_str().unwrap());
    assert!(png.unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));

    // A shell run and a failing run, for the listing.
    let (_, shell) = json_of(server.post_run(ALICE, &json!({"code": "echo hi; exit 3", "language": "sh"})));
    assert_eq!((shell["status"].as_str(), shell["exit_code"].as_i64()), (Some("failed"), Some(3)));
    assert_eq!(shell["stdout"], "hi\n");

    // The stored run: contents dropped, hashes kept, under alice's name.
    let id = record["id"].as_str().unwrap();
    let (status, stored) = json_of(server.get(ALICE, &format!("/v1/runs/{id}")));
    assert_eq!(status, StatusCode::OK);
    conforms(&document, "StoredRun", &stored);
    assert_eq!(stored["entry"]["principal"], "alice");
    assert_eq!(stored["hash_matches"], true);
    assert_eq!(stored["record"]["code_sha256"], record["code_sha256"]);
    assert_eq!(stored["record"]["figures"][0]["sha256"], record["figures"][0]["sha256"]);
    assert!(stored["record"]["figures"][0].get("png_base64").is_none());
    assert_eq!(stored["record"]["artifacts"][0]["sha256"], record["artifacts"][0]["sha256"]);

    // Paging and filters.
    let (status, page) = json_of(server.get(ALICE, "/v1/runs?limit=1"));
    assert_eq!(status, StatusCode::OK);
    conforms(&document, "Page", &page);
    assert_eq!(page["runs"][0]["run_id"], shell["id"], "newest first");
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, older) = json_of(server.get(ALICE, &format!("/v1/runs?limit=1&cursor={cursor}")));
    assert_eq!(older["runs"][0]["run_id"], record["id"]);
    assert!(older["next_cursor"].is_null());
    let (_, failed) = json_of(server.get(ALICE, "/v1/runs?status=failed"));
    assert_eq!(failed["runs"].as_array().unwrap().len(), 1);
    let (_, future) = json_of(server.get(ALICE, "/v1/runs?since=2999-01-01"));
    assert!(future["runs"].as_array().unwrap().is_empty());
    let (_, past) = json_of(server.get(ALICE, "/v1/runs?until=2000-01-01T00:00:00Z"));
    assert!(past["runs"].as_array().unwrap().is_empty());

    // Health and metrics.
    let (status, health) = json_of(client().get(server.url("/healthz")).send().unwrap());
    assert_eq!(status, StatusCode::OK);
    conforms(&document, "Health", &health);
    assert_eq!(health["status"], "ok");
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    for line in [
        "airlock_runs_total{status=\"ok\"} 1\n",
        "airlock_runs_total{status=\"failed\"} 1\n",
        "airlock_run_duration_seconds_count 2\n",
        "airlock_queue_depth 0\n",
        "airlock_sandboxes_active 0\n",
    ] {
        assert!(metrics.contains(line), "{line:?} missing from\n{metrics}");
    }
}

#[test]
fn every_documented_route_answers_and_no_other() {
    let server = Server::start("", &[]);
    let document: Value = client().get(server.url("/openapi.json")).send().unwrap().json().unwrap();
    let mut documented = BTreeSet::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
            let url = server.url(&path.replace("{id}", "0000").replace("{index}", "0"));
            let request = match method.as_str() {
                "get" => client().get(&url),
                "post" => client().post(&url).header("content-type", "application/json").body("{}"),
                "delete" => client().delete(&url),
                other => panic!("unexpected method {other}"),
            };
            let response = request.bearer_auth(ALICE).header("accept", "application/json, text/event-stream").send();
            let status = response.unwrap().status();
            // /v1/runs/0000 is a real route answering "no such run"; /mcp
            // without a session answers 400 (GET, DELETE) as the transport does.
            let real = status != StatusCode::METHOD_NOT_ALLOWED
                && (status != StatusCode::NOT_FOUND || path.contains("{id}") || path == "/mcp");
            assert!(real, "{method} {path} is documented but answers {status}");
        }
    }
    let routes: BTreeSet<(String, String)> =
        airlock_server::http::ROUTES.iter().map(|(m, p)| ((*m).to_owned(), (*p).to_owned())).collect();
    assert_eq!(documented, routes);
    for path in ["/v1/run", "/v2/runs", "/admin", "/v1/runs/1/2"] {
        assert_eq!(server.get(ALICE, path).status(), StatusCode::NOT_FOUND, "{path}");
    }
    // A method a route does not take: 405 with Allow, and a body like every error.
    let response = client().delete(server.url("/v1/runs")).bearer_auth(ALICE).send().unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(response.headers()["allow"].to_str().unwrap().contains("POST"));
    let (_, answer) = json_of(response);
    assert_eq!(answer["error"]["code"], "method_not_allowed");
}

#[test]
fn bad_requests_get_400_naming_the_reason() {
    let server = Server::start("max_body_bytes = 65536\nmax_code_bytes = 4096\n[defaults]\ndisk_inodes = 64", &[]);
    let post = |body: &str| {
        client()
            .post(server.url("/v1/runs"))
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .unwrap()
    };
    let cases: [(&str, &str); 11] = [
        ("{\"code\": ", "EOF"),
        ("[1, 2]", "must be object"),
        ("{\"code\": \"1\", \"bogus\": 1}", "bogus"),
        ("{\"code\": 1}", "code"),
        ("{}", "code"),
        ("{\"code\": \"1\", \"language\": \"ruby\"}", "ruby"),
        ("{\"code\": \"1\", \"policy\": {\"memroy_mb\": 5}}", "memroy_mb"),
        ("{\"code\": \"1\", \"policy\": {\"memory_mb\": \"lots\"}}", "memory_mb"),
        ("{\"code\": \"1\", \"files\": [{\"path\": \"a\", \"content_base64\": \"%%%\"}]}", "files[0].content_base64"),
        ("{\"code\": \"1\", \"files\": [{\"path\": \"/etc/passwd\", \"content_base64\": \"\"}]}", "files[0].path"),
        ("{\"code\": \"1\", \"outputs\": [\"../x\"]}", "outputs[0]"),
    ];
    for (body, reason) in cases {
        let (status, answer) = json_of(post(body));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let text = answer.to_string();
        assert!(text.contains(reason), "{body}: the answer should name {reason:?}: {answer}");
        assert_eq!(answer["error"]["code"], "bad_request");
    }
    let (status, answer) = json_of(post("{\"code\": \"1\", \"policy\": {\"timeout_s\": -1}}"));
    assert_eq!((status, answer["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("policy.timeout_s")));
    let (status, answer) = json_of(post("{\"code\": \"1\", \"policy\": {\"memory_mb\": 1}}"));
    assert_eq!((status, answer["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("policy.memory_mb")));
    // Code past max_code_bytes (the audit store keeps and indexes every
    // run's code: before, one 30 MiB code grew it by 170 MiB).
    let (status, answer) = json_of(post(&format!("{{\"code\": \"{}\"}}", "1".repeat(5000))));
    assert_eq!((status, answer["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("code")), "{answer}");
    // More files, or more outputs, than /work can hold (64 files and
    // folders here): refused before any is copied or read. Before, the
    // files were checked in a time that grew with the square of their
    // number, and the outputs were each read back.
    let files: Vec<String> = (0..65).map(|n| format!("{{\"path\": \"f{n}\", \"content_base64\": \"\"}}")).collect();
    let (status, answer) = json_of(post(&format!("{{\"code\": \"1\", \"files\": [{}]}}", files.join(","))));
    assert_eq!((status, answer["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("policy.disk_inodes")));
    let outputs: Vec<String> = (0..65).map(|n| format!("\"f{n}\"")).collect();
    let (status, answer) = json_of(post(&format!("{{\"code\": \"1\", \"outputs\": [{}]}}", outputs.join(","))));
    assert_eq!((status, answer["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("outputs")), "{answer}");
    // Too large: 413, whether the length is declared or streamed.
    let big = format!("{{\"code\": \"{}\"}}", "x".repeat(70_000));
    assert_eq!(post(&big).status(), StatusCode::PAYLOAD_TOO_LARGE);
    // A reader makes a chunked body, with no length declared.
    let streamed = client()
        .post(server.url("/v1/runs"))
        .bearer_auth(ALICE)
        .header("content-type", "application/json")
        .body(reqwest::blocking::Body::new(std::io::Cursor::new(big.into_bytes())))
        .send()
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Not JSON at all.
    let response = client().post(server.url("/v1/runs")).bearer_auth(ALICE).body("code=1").send().unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Bad listing filters.
    for query in ["?status=exploded", "?limit=0", "?limit=x", "?since=yesterday", "?cursor=abc", "?bogus=1"] {
        let (status, answer) = json_of(server.get(ALICE, &format!("/v1/runs{query}")));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {answer}");
    }
    // None of these ran anything.
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metrics.contains("airlock_run_duration_seconds_count 0\n"), "{metrics}");
}

#[test]
fn tokens_authenticate_and_never_reach_a_log_or_a_record() {
    let mut server = Server::start("", &[]);
    let run = json!({"code": "print('hello')"});
    let unauthorised: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("a wrong token", Some(format!("Bearer {ALICE}x"))),
        ("an empty bearer", Some("Bearer ".to_owned())),
        ("another scheme", Some(format!("Basic {ALICE}"))),
        ("no scheme", Some(ALICE.to_owned())),
        ("lower-case scheme and junk", Some(format!("bearer {ALICE} extra"))),
    ];
    for (what, header) in unauthorised {
        for (method, path) in [("post", "/v1/runs"), ("get", "/v1/runs"), ("get", "/metrics"), ("post", "/mcp")] {
            let mut request = match method {
                "post" => client().post(server.url(path)).json(&run),
                _ => client().get(server.url(path)),
            };
            if let Some(header) = &header {
                request = request.header("authorization", header);
            }
            let response = request.send().unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what} on {method} {path}");
            let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
            assert!(challenge.starts_with("Bearer realm=\"airlock\""), "{challenge}");
            // RFC 6750: no credentials, no error code; credentials that fail, invalid_token.
            assert_eq!(challenge.contains("error=\"invalid_token\""), header.is_some(), "{what}: {challenge}");
        }
    }
    // A header that is not even text.
    let response = client()
        .get(server.url("/v1/runs"))
        .header("authorization", reqwest::header::HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap())
        .send()
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Open endpoints need none.
    assert_eq!(client().get(server.url("/healthz")).send().unwrap().status(), StatusCode::OK);
    assert_eq!(client().get(server.url("/openapi.json")).send().unwrap().status(), StatusCode::OK);

    // Runs are recorded under the token's name; a token sees only its own.
    let (_, alices) = json_of(server.post_run(ALICE, &run));
    let (_, bobs) = json_of(server.post_run(BOB, &run));
    let alice_run = format!("/v1/runs/{}", alices["id"].as_str().unwrap());
    assert_eq!(server.get(ALICE, &alice_run).status(), StatusCode::OK);
    assert_eq!(server.get(BOB, &alice_run).status(), StatusCode::NOT_FOUND);
    assert_eq!(server.get(AUDITOR, &alice_run).status(), StatusCode::OK);
    let (_, bob_list) = json_of(server.get(BOB, "/v1/runs"));
    let ids: Vec<&str> = bob_list["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![bobs["id"].as_str().unwrap()]);
    assert_eq!(server.get(BOB, "/v1/runs?principal=alice").status(), StatusCode::FORBIDDEN);
    let (_, all) = json_of(server.get(AUDITOR, "/v1/runs?principal=alice"));
    assert_eq!(all["runs"][0]["principal"], "alice");

    // The code could not see it either: the environment is empty.
    let (_, env) = json_of(server.post_run(ALICE, &json!({"code": "import os; print(dict(os.environ))"})));
    assert!(!env["stdout"].as_str().unwrap().contains(ALICE));

    assert!(server.stop().success());
    let mut stored = std::fs::read(server.db()).unwrap();
    for companion in ["audit.sqlite3-wal", "audit.sqlite3-shm"] {
        stored.extend(std::fs::read(server.dir.path().join(companion)).unwrap_or_default());
    }
    let log = server.log();
    for token in [ALICE, BOB, AUDITOR] {
        assert!(!log.contains(token), "a token reached the server's log:\n{log}");
        assert!(!stored.windows(token.len()).any(|w| w == token.as_bytes()), "a token reached the audit store");
        let hash = token_sha256(token);
        assert!(!stored.windows(hash.len()).any(|w| w == hash.as_bytes()), "a token's hash reached the audit store");
    }
    let names = String::from_utf8_lossy(&stored);
    assert!(names.contains("alice") && names.contains("bob"), "the names are recorded");
}

#[test]
fn a_request_may_lower_a_limit_but_never_raise_one_past_the_ceiling() {
    let server = Server::start(
        "[defaults]\ntimeout_s = 3\nmemory_mb = 200\n\
         [ceiling]\ntimeout_s = 6\nmemory_mb = 300\nallow_hosts = [\"*.example.org\"]\nallow_degraded = [\"landlock\"]",
        &[],
    );
    let refused: [(Value, &str); 8] = [
        (json!({"timeout_s": 6.5}), "policy.timeout_s"),
        (json!({"memory_mb": 301}), "policy.memory_mb"),
        (json!({"cpu_time_s": 21}), "policy.cpu_time_s"),
        (json!({"pids": 1000}), "policy.pids"),
        (json!({"max_output_bytes": 2_000_000}), "policy.max_output_bytes"),
        (json!({"allow_hosts": ["example.com"]}), "policy.allow_hosts"),
        (json!({"allow_hosts": ["a.example.org:22"]}), "policy.allow_hosts"),
        (json!({"allow_degraded": ["cgroups"]}), "policy.allow_degraded"),
    ];
    for (policy, field) in refused {
        let (status, answer) = json_of(server.post_run(ALICE, &json!({"code": "1", "policy": policy.clone()})));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{policy}: {answer}");
        assert!(answer["error"]["field"].as_str().unwrap().starts_with(field), "{policy}: {answer}");
        let bare = field.trim_start_matches("policy.");
        assert!(answer["error"]["message"].as_str().unwrap().contains(bare), "{answer}");
    }
    // Nothing asked: the operator's defaults.
    let (status, record) = json_of(server.post_run(ALICE, &json!({"code": "1"})));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (record["policy"]["timeout_s"].as_f64(), record["policy"]["memory_mb"].as_u64()),
        (Some(3.0), Some(200))
    );
    // Up to the ceiling, and below the defaults.
    let (status, record) =
        json_of(server.post_run(ALICE, &json!({"code": "1", "policy": {"timeout_s": 6, "memory_mb": 64}})));
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!((record["policy"]["timeout_s"].as_f64(), record["policy"]["memory_mb"].as_u64()), (Some(6.0), Some(64)));
    // A lowered limit is enforced.
    let (_, record) =
        json_of(server.post_run(ALICE, &json!({"code": "import time; time.sleep(5)", "policy": {"timeout_s": 1}})));
    assert_eq!(record["status"], "timeout");
    let (_, record) = json_of(server.post_run(
        ALICE,
        &json!({"code": "x = []\nwhile True: x.append(bytearray(8 << 20))", "policy": {"memory_mb": 100}}),
    ));
    assert_eq!(record["status"], "memory_limit", "{record}");
}

#[test]
fn a_burst_past_the_slots_and_the_queue_gets_429_with_retry_after() {
    // Four places (one slot, three waiting) and three tokens: Alice's burst
    // takes two, and one is kept for each of Bob and the auditor, who hold none.
    // Before places were kept, her burst took all four and Bob's run got 429.
    let server = Server::start("concurrency = 1\nqueue = 3", &[]);
    let body = json!({"code": "import time; time.sleep(1.5)"});
    let (answers, bob): (Vec<(StatusCode, Option<String>, Value)>, _) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    let response = server.post_run(ALICE, &body);
                    let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
                    let (status, json) = json_of(response);
                    (status, retry, json)
                })
            })
            .collect();
        // Once Alice's burst is in (each of her runs sleeps 1.5 s).
        std::thread::sleep(Duration::from_millis(500));
        let bob = json_of(server.post_run(BOB, &json!({"code": "print('bob ran')"})));
        (handles.into_iter().map(|h| h.join().unwrap()).collect(), bob)
    });
    let ok: Vec<_> = answers.iter().filter(|a| a.0 == StatusCode::OK).collect();
    let busy: Vec<_> = answers.iter().filter(|a| a.0 == StatusCode::TOO_MANY_REQUESTS).collect();
    assert_eq!(ok.len() + busy.len(), 6, "only 200 and 429: {answers:#?}");
    assert_eq!(ok.len(), 2, "two places of four, the rest kept for the other tokens: {answers:#?}");
    for (_, retry, json) in &busy {
        let seconds: u64 = retry.as_deref().unwrap().parse().unwrap();
        assert!((1..=60).contains(&seconds), "{seconds}");
        assert_eq!(json["error"]["code"], "busy");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("kept for callers that have none"), "{message}");
    }
    assert_eq!(bob.0, StatusCode::OK, "Alice's burst left Bob no place: {:#}", bob.1);
    assert_eq!(bob.1["stdout"], "bob ran\n", "{:#}", bob.1);
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metrics.contains("airlock_runs_rejected_total{reason=\"busy\"} 4\n"), "{metrics}");
}

#[test]
fn a_load_of_short_runs_loses_no_record_and_leaves_nothing_behind() {
    const CLIENTS: usize = 16;
    const RUNS_EACH: usize = 20;
    let mut server = Server::start("", &[]);
    let started = Instant::now();
    let results: Vec<(Vec<String>, usize, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| {
                    let (mut ids, mut busy, mut errors) = (Vec::new(), 0usize, Vec::new());
                    let mut done = 0;
                    // Bounded: each client stops after its runs or 10 minutes.
                    while done < RUNS_EACH && started.elapsed() < Duration::from_secs(600) {
                        let response = server.post_run(ALICE, &json!({"code": "print(1+1)"}));
                        match response.status() {
                            StatusCode::OK => {
                                let record: Value = response.json().unwrap();
                                if record["status"] != "ok" || record["stdout"] != "2\n" {
                                    errors.push(record.to_string());
                                }
                                ids.push(record["id"].as_str().unwrap().to_owned());
                                done += 1;
                            }
                            StatusCode::TOO_MANY_REQUESTS => {
                                busy += 1;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            other => {
                                errors.push(format!("{other}: {}", response.text().unwrap_or_default()));
                                done += 1;
                            }
                        }
                    }
                    (ids, busy, errors)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    let ids: BTreeSet<String> = results.iter().flat_map(|r| r.0.iter().cloned()).collect();
    let busy: usize = results.iter().map(|r| r.1).sum();
    let errors: Vec<&String> = results.iter().flat_map(|r| r.2.iter()).collect();
    assert!(errors.is_empty(), "errors other than 429: {errors:#?}");
    assert_eq!(ids.len(), CLIENTS * RUNS_EACH, "every run answered once, with its own id");
    eprintln!("{} runs in {elapsed:?}, {busy} answers 429", ids.len());
    assert!(server.stop().success());
    assert_nothing_left(server.pid, "");

    // Every run is in the audit store, once, and the chain holds.
    let (code, out, err) = airlock_audit(&server.db(), &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("{} entries", ids.len())), "{out}");
    let mut recorded = BTreeSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["list", "--json", "--limit", "1000"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c]);
        }
        let (code, out, err) = airlock_audit(&server.db(), &args);
        assert_eq!(code, 0, "{err}");
        let page: Value = serde_json::from_str(&out).unwrap();
        for run in page["runs"].as_array().unwrap() {
            assert_eq!(run["principal"], "alice");
            recorded.insert(run["run_id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(recorded, ids, "the audit store holds exactly the runs answered");
}

/// Python that becomes a long sleep whose command line holds `marker`.
fn sleeper(marker: &str) -> String {
    format!("import os\nos.execvp('sleep', ['{marker}', '1000'])")
}

#[test]
fn shutdown_lets_runs_finish_within_the_grace_period_then_kills_the_rest() {
    let marker = airlock_tests::marker("server-shutdown");
    let mut server = Server::start("grace_period_s = 5\nconcurrency = 2", &[]);
    let quick = json!({"code": "sleep 3; echo finished", "language": "sh"});
    let stuck = json!({"code": sleeper(&marker), "policy": {"timeout_s": 20}});
    let (quick_answer, stuck_answer, after) = std::thread::scope(|scope| {
        let quick = scope.spawn(|| json_of(server.post_run(ALICE, &quick)));
        let stuck = scope.spawn(|| json_of(server.post_run(ALICE, &stuck)));
        let start = Instant::now();
        loop {
            let (_, health) = json_of(client().get(server.url("/healthz")).send().unwrap());
            if health["sandboxes_active"] == 2 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "the runs did not start together");
            std::thread::sleep(Duration::from_millis(20));
        }
        server.signal(rustix::process::Signal::TERM);
        std::thread::sleep(Duration::from_millis(300));
        // Shutting down: no new runs, and /healthz says so while the runs drain.
        let after = client().post(server.url("/v1/runs")).bearer_auth(ALICE).json(&json!({"code": "1"})).send();
        let (health_status, health) = json_of(client().get(server.url("/healthz")).send().unwrap());
        assert_eq!(
            (health_status, health["status"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("shutting_down"))
        );
        (quick.join().unwrap(), stuck.join().unwrap(), after.map(|r| r.status()))
    });
    let stopped_in = Instant::now();
    let status = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(stopped_in.elapsed() < Duration::from_secs(15));
    match after {
        Ok(status) => assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE),
        Err(error) => assert!(error.is_connect() || error.is_request(), "{error}"),
    }
    assert_eq!(quick_answer.0, StatusCode::OK);
    assert_eq!(
        (quick_answer.1["status"].as_str(), quick_answer.1["stdout"].as_str()),
        (Some("ok"), Some("finished\n"))
    );
    // Killed at the end of the grace period: told apart from a failure of
    // the code or the sandbox (503 `stopped`, not 200 `sandbox_error`).
    assert_eq!(stuck_answer.0, StatusCode::SERVICE_UNAVAILABLE, "{}", stuck_answer.1);
    assert_eq!(stuck_answer.1["error"]["code"], "stopped", "{}", stuck_answer.1);
    assert!(stuck_answer.1["error"]["message"].as_str().unwrap().contains("grace period"), "{}", stuck_answer.1);
    let stopped_id = stuck_answer.1["error"]["run_id"].as_str().unwrap().to_owned();
    assert_nothing_left(server.pid, &marker);
    // Both runs were recorded before the server went.
    let (code, out, _) = airlock_audit(&server.db(), &["verify"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 entries"), "{out}");
    let (_, shown, _) = airlock_audit(&server.db(), &["show", &stopped_id]);
    assert!(shown.contains("stopped on request"), "{shown}");
}

#[test]
fn a_crashed_server_is_cleaned_up_after_at_the_next_start() {
    let marker = airlock_tests::marker("server-crash");
    let mut crashed = Server::start("", &[]);
    let stuck = json!({"code": sleeper(&marker)});
    std::thread::scope(|scope| {
        let answer = scope.spawn(|| client().post(crashed.url("/v1/runs")).bearer_auth(ALICE).json(&stuck).send());
        let start = Instant::now();
        while json_of(client().get(crashed.url("/healthz")).send().unwrap()).1["sandboxes_active"] != 1 {
            assert!(start.elapsed() < Duration::from_secs(30), "the run did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        crashed.signal(rustix::process::Signal::KILL);
        assert!(answer.join().unwrap().is_err(), "the connection dies with the server");
    });
    crashed.wait(Duration::from_secs(10));
    // The sandbox died with its supervisor; a cgroup may remain until the next start.
    let next = Server::start("", &[]);
    assert_nothing_left(crashed.pid, &marker);
    drop(next);
}

#[test]
fn the_audit_chain_verifies_then_an_edit_of_the_file_is_caught() {
    let mut server = Server::start("", &[]);
    let mut ids = Vec::new();
    for n in 0..3 {
        let (_, record) = json_of(server.post_run(ALICE, &json!({"code": format!("print('tamper-{n}')")})));
        ids.push(record["id"].as_str().unwrap().to_owned());
    }
    assert!(server.stop().success());
    let db = server.db();
    let (code, out, err) = airlock_audit(&db, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("intact") && out.contains("3 entries"), "{out}");
    let (code, shown, _) = airlock_audit(&db, &["show", &ids[1]]);
    assert_eq!(code, 0);
    assert!(shown.contains("print('tamper-1')") && shown.contains("tamper-1\n"), "code beside output:\n{shown}");

    // Edit the second run's output in the database, as anyone who can
    // write the file can.
    let connection = rusqlite::Connection::open(&db).unwrap();
    let changed = connection
        .execute(
            "UPDATE runs SET record = replace(record, '\"stdout\":\"tamper-1', '\"stdout\":\"tamperX1') WHERE seq = 2",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(connection);
    let (code, out, err) = airlock_audit(&db, &["verify"]);
    assert_eq!(code, 1, "a broken chain fails the command: {out}{err}");
    assert!(out.contains("BROKEN at entry 2"), "names the first broken link: {out}");
    assert!(out.contains(&ids[1]), "{out}");
}

fn weighted_median_calls() -> Value {
    json!([
        {"name": "run_python", "arguments": {"code": weighted_median_with_figure(), "outputs": ["/work/out.json"]}},
        {"name": "run_python", "arguments": {"code": "import time\ntime.sleep(10)", "timeout_s": 1}},
        {"name": "run_python", "arguments": {"code": "1", "memory_mb": 1_000_000}},
        {"name": "run_shell", "arguments": {
            "code": "ls /work; wc -l < /work/sales.csv; head -c 3000 /dev/urandom > /work/blob.bin",
            "outputs": ["/work/blob.bin"],
        }},
    ])
}

/// What every MCP transport must show for [`weighted_median_calls`].
fn check_mcp_session(session: &Value) {
    let tools: Vec<&str> = session["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tools, ["run_python", "run_shell"]);
    let description = session["tools"][0]["description"].as_str().unwrap();
    for needle in ["pandas", "numpy", "matplotlib", "no network", "/work/sales.csv", "20 s wall time", "512 MiB"] {
        assert!(description.contains(needle), "the description should say {needle:?}: {description}");
    }
    assert_eq!(session["tools"][0]["inputSchema"]["required"], json!(["code"]));

    let median = &session["results"][0];
    assert_eq!(median["isError"], false, "{median:#}");
    let content = median["content"].as_array().unwrap();
    let text = content[0]["text"].as_str().unwrap();
    let expected = expected_weighted_median();
    assert!(text.contains(" 1 │ # The weighted median"), "the code with line numbers:\n{text}");
    assert!(text.contains(&format!("weighted median price: {expected}")), "{text}");
    assert!(text.contains("── value") && text.contains("── status") && text.contains("ok · exit 0"), "{text}");
    let images: Vec<&Value> = content.iter().filter(|c| c["type"] == "image").collect();
    assert_eq!(images.len(), 1, "one figure");
    assert_eq!(images[0]["mimeType"], "image/png");
    let png = base64::engine::general_purpose::STANDARD.decode(images[0]["data"].as_str().unwrap()).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000);
    let artefact = content
        .iter()
        .filter_map(|c| c["text"].as_str())
        .find_map(|text| text.strip_prefix("── /work/out.json ──\n"))
        .expect("out.json comes back inline");
    let artefact: Value = serde_json::from_str(artefact).unwrap();
    assert_eq!(artefact["weighted_median"].as_f64(), Some(expected));
    let record = &median["structuredContent"];
    assert_eq!(record["status"], "ok");
    assert_eq!(record["value"].as_str().unwrap().parse::<f64>().unwrap(), expected);
    assert!(record["figures"][0]["uri"].as_str().unwrap().starts_with("airlock://runs/"), "{record}");
    // The structured content carries the report itself, so that a client
    // handing the model the structured content shows it the same text.
    assert_eq!(record["report"].as_str(), Some(text), "structuredContent mirrors the text");
    assert!(
        session["tools"][0].get("annotations").is_none_or(|a| a.get("idempotentHint").is_none()),
        "{}",
        session["tools"][0]
    );

    let timeout = &session["results"][1];
    assert_eq!(timeout["isError"], true, "a run that fails is a tool error, not a protocol error");
    let text = timeout["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("timeout (stopped by the wall_time limit)"), "{text}");
    assert_eq!(timeout["structuredContent"]["status"], "timeout");

    let refused = &session["results"][2];
    assert_eq!(refused["isError"], true);
    assert!(refused["content"][0]["text"].as_str().unwrap().contains("memory_mb"), "{refused}");

    let shell = &session["results"][3];
    assert_eq!(shell["isError"], false);
    assert!(shell["content"][0]["text"].as_str().unwrap().contains("sales.csv\n4001"), "{shell}");
    // A binary artefact comes back as an embedded resource, whole, named by
    // the link that reads it again.
    let blob = shell["content"].as_array().unwrap().iter().find(|c| c["type"] == "resource").expect("blob.bin");
    assert!(blob["uri"].as_str().unwrap().starts_with("airlock://runs/"), "{blob}");
    assert!(blob["uri"].as_str().unwrap().ends_with("/artifacts/0"), "{blob}");
    assert_eq!(blob["mimeType"], "application/octet-stream");
    let bytes = base64::engine::general_purpose::STANDARD.decode(blob["blob"].as_str().unwrap()).unwrap();
    assert_eq!(bytes.len(), 3000);
    assert_eq!(shell["structuredContent"]["artifacts"][0]["bytes"], 3000);
}

#[test]
fn mcp_over_stdio_with_the_official_python_sdk() {
    let _ = data_image();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, format!("audit_db = {:?}\n", dir.path().join("audit.sqlite3").display().to_string()))
        .unwrap();
    let sales = examples().join("sales.csv");
    let airlock = airlock_tests::airlock_bin();
    let session = mcp_sdk_client(
        &[
            "stdio",
            airlock.to_str().unwrap(),
            "mcp",
            "--config",
            config.to_str().unwrap(),
            "--file",
            &format!("{}:/work/sales.csv", sales.display()),
            "--principal",
            "stdio-agent",
        ],
        &weighted_median_calls(),
    )
    .unwrap_or_else(|error| panic!("the MCP client failed: {error}"));
    check_mcp_session(&session);
    let (code, out, err) = airlock_audit(&dir.path().join("audit.sqlite3"), &["list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let page: Value = serde_json::from_str(&out).unwrap();
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "three runs, the refused call ran nothing");
    assert!(runs.iter().all(|r| r["principal"] == "stdio-agent"));
}

#[test]
fn mcp_over_streamable_http_with_the_official_python_sdk() {
    let sales = examples().join("sales.csv");
    let server = Server::start("", &["--file", &format!("{}:/work/sales.csv", sales.display())]);
    let session = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &weighted_median_calls())
        .unwrap_or_else(|error| panic!("the MCP client failed: {error}"));
    check_mcp_session(&session);
    let (_, page) = json_of(server.get(ALICE, "/v1/runs"));
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r["principal"] == "alice"), "recorded under the token's name");
    // Without a token the MCP endpoint is closed like the rest.
    // (The SDK does not say the status; the auth test checks the 401 itself.)
    let refused = mcp_sdk_client(&["http", &server.url("/mcp"), "wrong"], &json!([])).unwrap_err();
    assert!(refused.contains("initialize"), "{refused}");
}

#[test]
fn a_config_that_cannot_serve_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("listen = \"127.0.0.1:0\"\n", "[[tokens]]"),
        (
            &*format!("[ceiling]\ntimeout_s = 5\n[[tokens]]\nname = \"a\"\nsha256 = \"{}\"\n", token_sha256(ALICE)),
            "defaults.timeout_s",
        ),
        ("[[tokens]]\nname = \"a\"\nsha256 = \"the-token-itself\"\n", "tokens[0].sha256"),
        ("concurency = 2\n", "concurency"),
    ];
    for (config, needle) in cases {
        let path = dir.path().join("airlock.toml");
        std::fs::write(&path, config).unwrap();
        let output = airlock_command().arg("serve").arg("--config").arg(&path).output().unwrap();
        assert_eq!(output.status.code(), Some(125), "{config}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{config}: the error should name {needle:?}: {stderr}");
    }
}

#[test]
fn a_run_that_cannot_be_recorded_is_not_returned() {
    let mut server = Server::start_on_a_small_disk("");
    // Each record keeps about 900 KB of output: a few fill the 3 MiB disk.
    let loud = json!({"code": "print('x' * 900_000)"});
    let mut recorded = Vec::new();
    let mut refused = None;
    for _ in 0..20 {
        let (status, answer) = json_of(server.post_run(ALICE, &loud));
        match status {
            StatusCode::OK => recorded.push(answer["id"].as_str().unwrap().to_owned()),
            StatusCode::INSUFFICIENT_STORAGE => {
                refused = Some(answer);
                break;
            }
            other => panic!("{other}: {answer}"),
        }
    }
    let refused = refused.expect("the disk filled within 20 runs");
    assert!(!recorded.is_empty(), "the first runs fit");
    assert_eq!(refused["error"]["code"], "audit_disk_full");
    assert!(refused["error"]["message"].as_str().unwrap().contains("disk is full"), "{refused}");
    let lost = refused["error"]["run_id"].as_str().unwrap();
    // Not returned, and not half-written: the store holds exactly the runs answered.
    assert_eq!(server.get(ALICE, &format!("/v1/runs/{lost}")).status(), StatusCode::NOT_FOUND);
    let (_, page) = json_of(server.get(ALICE, "/v1/runs"));
    let listed: Vec<&str> =
        page["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap()).rev().collect();
    assert_eq!(listed, recorded.iter().map(String::as_str).collect::<Vec<_>>());
    for id in &recorded {
        let (_, stored) = json_of(server.get(ALICE, &format!("/v1/runs/{id}")));
        assert_eq!(stored["hash_matches"], true);
    }
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metrics.contains("airlock_audit_failures_total 1\n"), "{metrics}");
    assert!(server.stop().success());
    assert_nothing_left(server.pid, "");
}

/// `airlock mcp` over stdio, driven line by line as a client would, its
/// standard input held open.
struct StdioMcp {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
    db: PathBuf,
}

impl StdioMcp {
    fn start(config: &str) -> StdioMcp {
        let _ = data_image();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.sqlite3");
        let path = dir.path().join("airlock.toml");
        std::fs::write(&path, format!("audit_db = {:?}\n{config}", db.display().to_string())).unwrap();
        let mut child = airlock_command()
            .args(["mcp", "--config"])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let mut mcp = StdioMcp { child, stdin, lines, _dir: dir, db };
        mcp.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
        let answer = mcp.lines.recv_timeout(Duration::from_secs(120)).expect("initialize is answered");
        assert!(answer.contains("\"id\":1"), "{answer}");
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn call(&mut self, id: u64, code: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": code}}}));
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits for the process to exit, standard input still open.
    fn exits_within(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < limit, "airlock mcp did not exit within {limit:?} of the signal, stdin open");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for StdioMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).into_owned())
        .filter(|cmdline| cmdline.contains(marker))
        .collect()
}

/// Waits until a process whose command line holds `marker` runs.
fn wait_for_process(marker: &str) {
    let start = Instant::now();
    while processes_with(marker).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "the run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn mcp_over_stdio_stops_on_sigterm_and_sigint_while_stdin_is_open() {
    // Idle: SIGTERM.
    let mut idle = StdioMcp::start("");
    idle.signal(rustix::process::Signal::TERM);
    idle.exits_within(Duration::from_secs(10));

    // Mid-run: SIGINT (Ctrl-C). The run is killed at once, recorded, and gone.
    let marker = airlock_tests::marker("mcp-sigint");
    let mut busy = StdioMcp::start("");
    busy.call(2, &sleeper(&marker));
    wait_for_process(&marker);
    let signalled = Instant::now();
    busy.signal(rustix::process::Signal::INT);
    busy.exits_within(Duration::from_secs(10));
    assert!(signalled.elapsed() < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200));
    assert!(processes_with(&marker).is_empty(), "the sandbox died with the server");
    let (code, out, err) = airlock_audit(&busy.db, &["list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let page: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["runs"].as_array().unwrap().len(), 1, "the killed run was recorded: {out}");
}

#[test]
fn mcp_cancellation_stops_the_run_and_frees_its_slot() {
    // One slot: the second call can only run once the first has let go of it.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.sqlite3");
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, format!("concurrency = 1\naudit_db = {:?}\n", db.display().to_string())).unwrap();
    let marker = airlock_tests::marker("mcp-cancel");
    let airlock = airlock_tests::airlock_bin();
    let calls = json!([
        {"name": "run_python", "arguments": {"code": sleeper(&marker), "timeout_s": 20}, "abandon_after": 3},
        {"name": "run_python", "arguments": {"code": "print('second')"}},
    ]);
    let _ = data_image();
    let session =
        mcp_sdk_client(&["stdio", airlock.to_str().unwrap(), "mcp", "--config", config.to_str().unwrap()], &calls)
            .unwrap_or_else(|error| panic!("the MCP client failed: {error}"));
    let second = &session["results"][1];
    assert_eq!(second["isError"], false, "{second}");
    assert!(second["content"][0]["text"].as_str().unwrap().contains("second"));
    assert!(second["seconds"].as_f64().unwrap() < 10.0, "the slot was freed at once, not at the 20 s limit: {second}");
    assert!(processes_with(&marker).is_empty(), "the cancelled run is gone");
    let (_, out, _) = airlock_audit(&db, &["list", "--json"]);
    let page: Value = serde_json::from_str(&out).unwrap();
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "both runs recorded: {out}");
    assert!(runs[1]["wall_ms"].as_u64().unwrap() < 10_000, "stopped well before its limit: {out}");
}

#[test]
fn mcp_results_fit_the_operators_budget_and_link_the_rest() {
    let server = Server::start("mcp_result_bytes = 65536\n[defaults]\nmax_file_bytes = 8388608", &[]);
    let code = "import os\nprint('x' * 1_000_000)\nopen('/work/big.bin', 'wb').write(os.urandom(6_000_000))\n\
                open('/work/small.txt', 'w').write('hello')";
    let calls = json!([
        {"name": "run_python", "arguments": {"code": code, "outputs": ["/work/big.bin", "/work/small.txt"]}},
    ]);
    let session = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &calls).unwrap();
    let result = &session["results"][0];
    assert_eq!(result["isError"], false, "{result:#}");
    assert!(result["bytes"].as_u64().unwrap() < 65536 + 16384, "a result within the budget: {} bytes", result["bytes"]);
    let content = result["content"].as_array().unwrap();
    let text = content[0]["text"].as_str().unwrap();
    assert!(text.contains("stdout cut at"), "the output is cut, and says so: {}", &text[..500.min(text.len())]);
    assert!(text.contains("xxxxxxxxxx"), "the output is there, cut");
    let link = content.iter().find(|c| c["type"] == "resource_link").expect("the big file is linked");
    assert_eq!(link["size"], 6_000_000);
    let uri = link["uri"].as_str().unwrap().to_owned();
    assert!(content.iter().any(|c| c["text"].as_str() == Some("── /work/small.txt ──\nhello")), "small text inline");
    // stdout is in the result once (the structured content is a summary, not the record).
    let structured = result["structuredContent"].to_string();
    assert!(!structured.contains("\"stdout\""), "{}", &structured[..300]);
    // The link is read over MCP in parts a client takes (its messages are
    // capped at 1 MiB), and over HTTP by the run's id, whole.
    let reads = json!([{"read": uri}, {"read": format!("{uri}?offset=5767168")}]);
    let read = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &reads).unwrap();
    let part = |n: usize| {
        let blob = read["results"][n]["contents"][0]["blob"].as_str().unwrap_or_else(|| panic!("bytes: {read}"));
        base64::engine::general_purpose::STANDARD.decode(blob).unwrap().len()
    };
    assert_eq!((part(0), part(1)), (524_288, 6_000_000 - 5_767_168));
    let note = read["results"][0]["contents"][1]["text"].as_str().unwrap();
    assert!(note.contains("?offset=524288") && note.contains("GET /v1/runs/"), "{note}");
    let run_id = result["structuredContent"]["run_id"].as_str().unwrap();
    let whole = server.get(ALICE, &format!("/v1/runs/{run_id}/artifacts/0"));
    assert_eq!(whole.status(), StatusCode::OK);
    assert_eq!(whole.bytes().unwrap().len(), 6_000_000);
    // Another token may not read it.
    assert_eq!(server.get(BOB, &format!("/v1/runs/{run_id}/artifacts/0")).status(), StatusCode::NOT_FOUND);
    let refused = mcp_sdk_client(&["http", &server.url("/mcp"), BOB], &json!([{"read": uri}])).unwrap();
    assert!(refused["results"][0]["error"].is_string(), "{refused}");
}

/// One token's runs fill the artefact store; another token's artefact,
/// older than all of them, is still there to fetch. Before each token's
/// artefacts were trimmed apart, Bob's runs pushed Alice's out (410).
#[test]
fn one_tokens_artefacts_never_push_out_anothers() {
    let server = Server::start("artifact_store_bytes = 1000000", &[]);
    let write = |bytes: usize| {
        json!({"code": format!("import os\nopen('/work/out.bin', 'wb').write(os.urandom({bytes}))"),
               "outputs": ["/work/out.bin"]})
    };
    let (status, alice) = json_of(server.post_run(ALICE, &write(300_000)));
    assert_eq!(status, StatusCode::OK, "{alice:#}");
    let alices = format!("/v1/runs/{}/artifacts/0", alice["id"].as_str().unwrap());
    let mut bobs = Vec::new();
    for _ in 0..4 {
        let (status, bob) = json_of(server.post_run(BOB, &write(300_000)));
        assert_eq!(status, StatusCode::OK, "{bob:#}");
        bobs.push(format!("/v1/runs/{}/artifacts/0", bob["id"].as_str().unwrap()));
    }
    let kept = server.get(ALICE, &alices);
    assert_eq!(kept.status(), StatusCode::OK, "Bob's runs pushed Alice's artefact out: {:?}", kept.text());
    assert_eq!(kept.bytes().unwrap().len(), 300_000);
    // Bob's own oldest went to make room, and says so.
    let gone = server.get(BOB, &bobs[0]);
    assert_eq!(gone.status(), StatusCode::GONE, "{:?}", gone.text());
    assert_eq!(server.get(BOB, &bobs[3]).status(), StatusCode::OK);
}

#[test]
fn the_tool_description_tells_the_truth_about_limits() {
    let server = Server::start("[defaults]\ntimeout_s = 10\n[ceiling]\ntimeout_s = 60\nmemory_mb = 1024", &[]);
    let calls = json!([
        {"name": "run_python", "arguments": {"code": "1", "timeout_s": 60, "memory_mb": 1024}},
        {"name": "run_python", "arguments": {"code": "1", "timeout_s": 61}},
    ]);
    let session = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &calls).unwrap();
    let description = session["tools"][0]["description"].as_str().unwrap();
    assert!(!description.contains("may ask for less"), "{description}");
    assert!(description.contains("up to 60 s") && description.contains("1024 MiB"), "{description}");
    assert!(description.contains("10 s wall time"), "{description}");
    let schema = &session["tools"][0]["inputSchema"]["properties"];
    assert_eq!(schema["timeout_s"]["maximum"], 60.0);
    assert_eq!(session["results"][0]["isError"], false, "the ceiling is honoured as described");
    assert_eq!(session["results"][1]["isError"], true);
    assert!(session["results"][1]["content"][0]["text"].as_str().unwrap().contains("timeout_s"));
}

#[test]
fn strict_mode_schemas_let_the_model_leave_every_limit_null() {
    let server = Server::start("", &[]);
    let calls = json!([{"name": "run_python", "arguments": {
        "code": "6 * 7", "outputs": null, "timeout_s": null, "cpu_time_s": null, "memory_mb": null}}]);
    let session = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &calls).unwrap();
    for tool in session["tools"].as_array().unwrap() {
        let schema = &tool["inputSchema"];
        assert_eq!(schema["additionalProperties"], false);
        for (name, property) in schema["properties"].as_object().unwrap() {
            let nullable = property["type"].as_array().is_some_and(|t| t.contains(&json!("null")));
            assert_eq!(nullable, name != "code", "{name}: {property}");
        }
    }
    assert_eq!(session["results"][0]["isError"], false, "{}", session["results"][0]);
    assert_eq!(session["results"][0]["structuredContent"]["value"], "42");
}

#[test]
fn no_operator_advice_reaches_the_model() {
    let server = Server::start("", &[]);
    let calls = json!([{"name": "run_python", "arguments": {"code": "import sklearn"}}]);
    let session = mcp_sdk_client(&["http", &server.url("/mcp"), ALICE], &calls).unwrap();
    let result = &session["results"][0];
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("ModuleNotFoundError") && text.contains("does not have it"), "{text}");
    assert!(!text.contains("airlock image build"), "advice for the operator, shown to the model: {text}");
    assert!(!result["structuredContent"].to_string().contains("airlock image build"));
    // The operator still finds it in the record.
    let id = result["structuredContent"]["run_id"].as_str().unwrap();
    let (_, stored) = json_of(server.get(ALICE, &format!("/v1/runs/{id}")));
    assert!(stored["record"]["error"]["message"].as_str().unwrap().contains("airlock image build"));
}

#[test]
fn bearer_is_read_in_any_case_and_a_bad_token_is_an_invalid_token() {
    let server = Server::start("", &[]);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let response = client().get(server.url("/v1/runs")).header("authorization", format!("{scheme} {ALICE}")).send();
        assert_eq!(response.unwrap().status(), StatusCode::OK, "{scheme}");
    }
    let wrong = client().get(server.url("/v1/runs")).header("authorization", "Bearer nope").send().unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let challenge = wrong.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer ") && challenge.contains("error=\"invalid_token\""), "{challenge}");
}

#[test]
fn retry_after_follows_the_run_time() {
    let server = Server::start("concurrency = 1\nqueue = 1", &[]);
    // One run of about 3 s sets the mean.
    let (status, _) = json_of(server.post_run(ALICE, &json!({"code": "import time; time.sleep(3)"})));
    assert_eq!(status, StatusCode::OK);
    let body = json!({"code": "import time; time.sleep(3)"});
    let retries: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| server.post_run(ALICE, &body))).collect();
        handles
            .into_iter()
            .filter_map(|h| {
                h.join().unwrap().headers().get("retry-after").map(|v| v.to_str().unwrap().parse().unwrap())
            })
            .collect()
    });
    assert!(!retries.is_empty(), "past one running and one waiting, the rest are told to wait");
    // Two runs ahead (the slot and the queue), about 3 s each, one slot.
    assert!(retries.iter().all(|&s| (5..=60).contains(&s)), "{retries:?}");
}

#[test]
fn delete_mcp_closes_the_session_as_the_sdk_expects() {
    let server = Server::start("", &[]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let response = client()
        .post(server.url("/mcp"))
        .bearer_auth(ALICE)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let closed = client()
        .delete(server.url("/mcp"))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .unwrap();
    assert_eq!(closed.status(), StatusCode::NO_CONTENT, "the official SDK warns on anything but 200 and 204");
    // What the transport refuses is an error body like every other, with its status.
    let refused = client().post(server.url("/mcp")).bearer_auth(ALICE).json(&init).send().unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_ACCEPTABLE);
    let (_, answer) = json_of(refused);
    assert_eq!(answer["error"]["code"], "not_acceptable");
    // An oversized chunked body to /mcp: 413, not 500.
    assert_eq!(chunked_status(&server, "/mcp", 40 << 20), "413", "{}", server.log());
}

/// The status a chunked POST of `bytes` to `path` gets, over a bare socket:
/// the server answers and closes before the body ends, which an HTTP
/// client reports as a failed send, not as the answer it read.
fn chunked_status(server: &Server, path: &str, bytes: usize) -> String {
    use std::io::Read as _;
    let mut socket = server.connect();
    socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        server.address
    );
    socket.write_all(head.as_bytes()).unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, " ".repeat(64 << 10));
    // Until the server stops reading and closes: its answer is already here.
    let _ = (0..bytes / (64 << 10)).try_for_each(|_| socket.write_all(chunk.as_bytes()));
    let _ = socket.write_all(b"0\r\n\r\n");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.split_whitespace().nth(1).unwrap_or_else(|| panic!("no answer: {answer:?}")).to_owned()
}

#[test]
fn the_server_accepts_nothing_its_document_forbids() {
    let server = Server::start("", &[]);
    let refused: [(Value, &str); 6] = [
        (json!(["print(42)"]), ""),
        (json!({"code": "print(42)", "policy": [1.5, 1, 64]}), "policy"),
        (json!({"code": "1", "stdin_base64": "AB=="}), "stdin_base64"),
        (json!({"code": "1", "policy": {"timeout_s": 5e-324}}), "policy.timeout_s"),
        (json!({"code": "1", "policy": {"max_connections": 0}}), "policy.max_connections"),
        (json!({"code": 1}), "code"),
    ];
    for (body, field) in refused {
        let (status, answer) = json_of(server.post_run(ALICE, &body));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["field"].as_str().unwrap_or(""), field, "{body}: the field is named: {answer}");
    }
    // An empty cursor is refused as the document says (it has a pattern).
    let document: Value = client().get(server.url("/openapi.json")).send().unwrap().json().unwrap();
    let cursor = document["paths"]["/v1/runs"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "cursor")
        .cloned()
        .unwrap();
    assert!(cursor["schema"]["pattern"].is_string());
    assert_eq!(server.get(ALICE, "/v1/runs?cursor=").status(), StatusCode::BAD_REQUEST);
}

/// The pool's ready gauge, from /metrics.
fn pool_ready(server: &Server) -> u64 {
    let text = server.get(ALICE, "/metrics").text().unwrap();
    let line = text.lines().find(|l| l.starts_with("airlock_pool_ready ")).expect("the server keeps a pool");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn wait_pool_ready(server: &Server, n: u64) {
    let start = Instant::now();
    while pool_ready(server) < n {
        assert!(start.elapsed() < Duration::from_secs(120), "the pool did not refill: {}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_pooled_server_answers_warm_shrinks_and_refills_under_load_and_leaves_nothing_behind() {
    let mut server = Server::start("[pool]\nsize = 2\npreload = [\"numpy\", \"pandas\"]\n", &[]);
    let job = json!({"code": "import pandas as pd\nprint(pd.DataFrame({'x': [1, 2, 3]}).x.sum())"});
    for _ in 0..3 {
        wait_pool_ready(&server, 1);
        let (status, record) = json_of(server.post_run(ALICE, &job));
        assert_eq!(status, StatusCode::OK, "{record}");
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["stdout"], "6\n");
        assert_eq!(record["usage"]["start"], "pooled", "{}", record["isolation"]);
    }
    // A lower memory limit is applied to a ready sandbox at its claim;
    // another CPU bandwidth is not, and runs cold.
    wait_pool_ready(&server, 1);
    let (_, record) = json_of(server.post_run(ALICE, &json!({"code": "print(1)", "policy": {"memory_mb": 256}})));
    assert_eq!(record["usage"]["start"], "pooled", "{}", record["isolation"]);
    assert_eq!(record["policy"]["memory_mb"], 256);
    let (_, record) = json_of(server.post_run(ALICE, &json!({"code": "print(1)", "policy": {"cpus": 0.5}})));
    assert_eq!(record["usage"]["start"], "cold");
    assert!(record["isolation"]["details"]["pool"].as_str().unwrap().contains("limits"), "{record}");

    // A burst past the pool: every run answers, warm or cold, none lost; the
    // pool runs empty (runs served "empty"), then refills.
    wait_pool_ready(&server, 2);
    let records: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6).map(|_| scope.spawn(|| json_of(server.post_run(ALICE, &job)).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for record in &records {
        assert_eq!(record["stdout"], "6\n", "{record}");
    }
    let warm = records.iter().filter(|r| r["usage"]["start"] == "pooled").count();
    assert!(warm >= 1, "no run of the burst was warm");
    let metric = |text: &str, name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metric(&metrics, "airlock_pool_runs_total{served=\"empty\"} ") >= 1.0, "the pool never ran out: {metrics}");
    wait_pool_ready(&server, 2);
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metrics.contains(&format!("airlock_pool_runs_total{{served=\"warm\"}} {}", 4 + warm)), "{metrics}");
    assert_eq!(metric(&metrics, "airlock_pool_size "), 2.0);
    // Two interpreters with pandas imported: tens of MiB each, in their cgroups.
    let held = metric(&metrics, "airlock_pool_memory_bytes ");
    assert!(held > (2u64 * (32 << 20)) as f64, "{held} bytes held by two ready sandboxes: {metrics}");
    let refills = metric(&metrics, "airlock_pool_refills_total{result=\"ok\"} ");
    assert!(refills >= (2 + 4 + warm) as f64, "{metrics}");
    assert!(metric(&metrics, "airlock_pool_refill_seconds_total ") > 0.0, "{metrics}");
    assert!(metric(&metrics, "airlock_pool_last_refill_seconds ") > 0.0, "{metrics}");

    // Every process the server started (helpers, inits, interpreters, the
    // ready ones among them) ends with it, with its cgroups and mounts.
    let started = descendants(server.pid);
    assert!(started.len() >= 2 * 3, "two ready sandboxes and their processes: {started:?}");
    assert!(server.stop().success());
    assert_nothing_left(server.pid, "");
    let alive: Vec<_> = started.iter().filter(|p| still_running(p)).collect();
    assert!(alive.is_empty(), "outlived the server: {alive:?}");
}

/// `[pool] mode = "forked"`: the server's ready sandboxes are forks of one
/// template; a burst past the pool is answered, warm or cold, and SIGTERM
/// ends the template and every fork with the server.
#[test]
fn a_forked_pool_server_answers_from_forks_and_leaves_nothing_behind() {
    let mut server = Server::start("[pool]\nsize = 2\nmode = \"forked\"\npreload = [\"numpy\", \"pandas\"]\n", &[]);
    let job = json!({"code": "import pandas as pd\nprint(pd.DataFrame({'x': [1, 2, 3]}).x.sum())"});
    for _ in 0..3 {
        wait_pool_ready(&server, 1);
        let (status, record) = json_of(server.post_run(ALICE, &job));
        assert_eq!(status, StatusCode::OK, "{record}");
        assert_eq!((record["status"].as_str(), record["stdout"].as_str()), (Some("ok"), Some("6\n")), "{record}");
        assert_eq!(record["usage"]["start"], "forked", "{}", record["isolation"]);
    }
    wait_pool_ready(&server, 2);
    let records: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6).map(|_| scope.spawn(|| json_of(server.post_run(ALICE, &job)).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for record in &records {
        assert_eq!(record["stdout"], "6\n", "{record}");
    }
    assert!(records.iter().any(|r| r["usage"]["start"] == "forked"), "no run of the burst was forked");
    wait_pool_ready(&server, 2);
    // One template served every fork, and its memory is on the scrape.
    let metrics = server.get(ALICE, "/metrics").text().unwrap();
    assert!(metrics.contains("airlock_pool_templates_total 1\n"), "{metrics}");
    let template_memory: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("airlock_pool_template_memory_bytes "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no template memory on the scrape: {metrics}"));
    assert!(template_memory > 0, "{metrics}");
    let started = descendants(server.pid);
    assert!(server.stop().success());
    assert_nothing_left(server.pid, "");
    let alive: Vec<_> = started.iter().filter(|p| still_running(p)).collect();
    assert!(alive.is_empty(), "outlived the server: {alive:?}");
}

/// A process as /proc shows it: pid, start time (clock ticks since boot), command line.
#[derive(Debug, PartialEq)]
struct Proc {
    pid: u32,
    start: u64,
    cmdline: String,
}

/// (parent, start time) of `pid`, from /proc/PID/stat.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields follow the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every process below `root` now.
fn descendants(root: u32) -> Vec<Proc> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(|pid| stat_of(pid).map(|(parent, start)| (pid, parent, start)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(all.iter().filter(|(_, p, _)| *p == parent).map(|(pid, _, _)| *pid));
        i += 1;
    }
    all.iter()
        .filter(|(pid, _, _)| *pid != root && found.contains(pid))
        .map(|(pid, _, start)| Proc {
            pid: *pid,
            start: *start,
            cmdline: String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
                .replace('\0', " "),
        })
        .collect()
}

/// Whether the same process (pid and start time) still runs; a zombie does not.
fn still_running(process: &Proc) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{}/stat", process.pid)).unwrap_or_default();
    let zombie = state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    !zombie && stat_of(process.pid).is_some_and(|(_, start)| start == process.start)
}

/// The server starts with its open-files limit raised to the hard limit:
/// each run's proxied connections are its descriptors, and under systemd's
/// soft 1,024 four runs of idle tunnels made a fifth one's sandbox fail
/// (EMFILE). Started here under a soft limit of 1,024, as a service is.
#[test]
fn the_server_raises_its_open_files_limit_to_the_hard_one() {
    let _ = data_image();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\naudit_db = {:?}\n[[tokens]]\nname = \"alice\"\nsha256 = \"{}\"\n",
            dir.path().join("audit.sqlite3").display().to_string(),
            token_sha256(ALICE)
        ),
    )
    .unwrap();
    let command = airlock_command();
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -Sn 1024 && exec \"$@\"", "sh"])
        .arg(airlock_tests::airlock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .envs(command.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let serving = BufReader::new(stderr).lines().map_while(Result::ok).any(|line| line.starts_with("airlock: serving"));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(serving, "the server did not start");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "soft and hard limits differ: {line}");
    assert_ne!(fields[3], "1024", "{line}");
}

// `airlock serve` under denial-of-service attacks, run for real against a
// server process on loopback: idle, half-sent and unread connections, slow
// and stalled request bodies, and a flood of MCP sessions. Each test
// measures the server itself (its open descriptors, its resident memory,
// what it answers) while the attack is held.

/// A client that gives up soon: an attack test waits on the server's
/// answer, never for minutes.
fn quick_client() -> Client {
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
        match quick_client().get(server.url("/healthz")).timeout(Duration::from_secs(2)).send() {
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
    let server = Server::start("max_connections = 50\nheader_timeout_s = 1\n", &[]);
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
    let server = Server::start("max_connections = 20\nheader_timeout_s = 1\nwrite_timeout_s = 1\n", &[]);
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
    let server = Server::start("max_body_bytes = 4096\nbody_bytes_in_flight = 16384\nbody_timeout_s = 20\n", &[]);
    let request = held_body(ALICE, 4096);
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = server.connect();
        stream.write_all(&request).unwrap();
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let response = quick_client()
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
    let server = Server::start(
        &format!("max_body_bytes = {BODY}\nbody_bytes_in_flight = {}\nbody_timeout_s = 3\n", 2 * BODY),
        &[],
    );
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
    let runs = quick_client().get(server.url("/v1/runs")).bearer_auth(ALICE).send().unwrap();
    assert_eq!(runs.status(), StatusCode::OK, "{}", server.log());
}

/// A JSON-RPC `initialize` to `/mcp` with `token`: the status and answer.
fn mcp_initialize(server: &Server, token: &str) -> (StatusCode, Option<String>, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}
    });
    let response = quick_client()
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
    let response = quick_client()
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
    let server = Server::start("max_mcp_sessions = 8\nmax_mcp_sessions_per_token = 3\n", &[]);
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
        quick_client().delete(server.url("/mcp")).bearer_auth(BOB).header("Mcp-Session-Id", &alice[0]).send().unwrap();
    assert_eq!(deleted.status(), StatusCode::NOT_FOUND, "bob ended alice's session");

    // Ending a session gives its place back.
    let deleted = quick_client()
        .delete(server.url("/mcp"))
        .bearer_auth(ALICE)
        .header("Mcp-Session-Id", &alice[0])
        .send()
        .unwrap();
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
