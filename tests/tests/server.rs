//! `airlock serve` and `airlock mcp` end to end: a real server process on
//! loopback, a real HTTP client, the official MCP Python SDK as the MCP
//! client, the audit store checked through `airlock audit`, and nothing
//! left behind on the host.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use airlock_server::token_sha256;
use airlock_tests::{airlock_command, data_image, leftovers_of};
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
    let mut seen = BTreeSet::new();
    if let Err(error) = airlock_server::openapi::validate(document, schema, body, &mut seen) {
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
            let url = server.url(&path.replace("{id}", "0000"));
            let request = match method.as_str() {
                "get" => client().get(&url),
                "post" => client().post(&url).header("content-type", "application/json").body("{}"),
                other => panic!("unexpected method {other}"),
            };
            let response = request.bearer_auth(ALICE).header("accept", "application/json, text/event-stream").send();
            let status = response.unwrap().status();
            // /v1/runs/0000 is a real route answering "no such run".
            let real =
                status != StatusCode::METHOD_NOT_ALLOWED && (status != StatusCode::NOT_FOUND || path.contains("{id}"));
            assert!(real, "{method} {path} is documented but answers {status}");
        }
    }
    let routes: BTreeSet<(String, String)> =
        airlock_server::http::ROUTES.iter().map(|(m, p)| ((*m).to_owned(), (*p).to_owned())).collect();
    assert_eq!(documented, routes);
    for path in ["/v1/run", "/v2/runs", "/admin", "/v1/runs/1/2"] {
        assert_eq!(server.get(ALICE, path).status(), StatusCode::NOT_FOUND, "{path}");
    }
    let response = client().delete(server.url("/v1/runs")).bearer_auth(ALICE).send().unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn bad_requests_get_400_naming_the_reason() {
    let server = Server::start("max_body_bytes = 65536", &[]);
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
        ("[1, 2]", "invalid type"),
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
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
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
        assert_eq!(answer["error"]["field"], field, "{policy}: {answer}");
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
    let server = Server::start("concurrency = 1\nqueue = 1", &[]);
    let body = json!({"code": "import time; time.sleep(1.5)"});
    let answers: Vec<(StatusCode, Option<String>, Value)> = std::thread::scope(|scope| {
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
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<_> = answers.iter().filter(|a| a.0 == StatusCode::OK).collect();
    let busy: Vec<_> = answers.iter().filter(|a| a.0 == StatusCode::TOO_MANY_REQUESTS).collect();
    assert_eq!(ok.len() + busy.len(), 6, "only 200 and 429: {answers:#?}");
    assert_eq!(ok.len(), 2, "one running and one queued: {answers:#?}");
    for (_, retry, json) in &busy {
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(json["error"]["code"], "busy");
    }
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
        // Shutting down: no new runs (refused, or the connection is).
        let after = client().post(server.url("/v1/runs")).bearer_auth(ALICE).json(&json!({"code": "1"})).send();
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
    assert_eq!(stuck_answer.0, StatusCode::OK, "{}", stuck_answer.1);
    assert_ne!(stuck_answer.1["status"], "ok", "killed at the end of the grace period");
    assert!(stuck_answer.1["usage"]["wall_ms"].as_u64().unwrap() < 20_000);
    assert_nothing_left(server.pid, &marker);
    // Both runs were recorded before the server went.
    let (code, out, _) = airlock_audit(&server.db(), &["verify"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 entries"), "{out}");
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

/// Runs the MCP client of the official Python SDK with `calls`; its
/// output, or its error output when it failed.
fn mcp_client(mode_args: &[&str], calls: &Value) -> Result<Value, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/client.py");
    let probe = Command::new("python3").args(["-c", "import mcp"]).output().unwrap();
    assert!(probe.status.success(), "the MCP Python SDK is missing: pip install 'mcp==2.3.0'");
    let mut child = Command::new("python3")
        .arg(script)
        .args(mode_args)
        .env("AIRLOCK_INIT", airlock_tests::helper())
        .env("AIRLOCK_HOME", airlock_tests::test_home())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(calls.to_string().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap())
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
    assert_eq!(record["figures"][0]["sha256"].as_str().unwrap().len(), 64);

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
    // A binary artefact comes back as an embedded resource, whole.
    let blob = shell["content"].as_array().unwrap().iter().find(|c| c["type"] == "resource").expect("blob.bin");
    assert_eq!(
        (blob["uri"].as_str(), blob["mimeType"].as_str()),
        (Some("file:///work/blob.bin"), Some("application/octet-stream"))
    );
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
    let session = mcp_client(
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
    let session = mcp_client(&["http", &server.url("/mcp"), ALICE], &weighted_median_calls())
        .unwrap_or_else(|error| panic!("the MCP client failed: {error}"));
    check_mcp_session(&session);
    let (_, page) = json_of(server.get(ALICE, "/v1/runs"));
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r["principal"] == "alice"), "recorded under the token's name");
    // Without a token the MCP endpoint is closed like the rest.
    // (The SDK does not say the status; the auth test checks the 401 itself.)
    let refused = mcp_client(&["http", &server.url("/mcp"), "wrong"], &json!([])).unwrap_err();
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
