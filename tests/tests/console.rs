//! The audit console in a real browser: Debian's headless Chromium, driven
//! through chromium-driver, against a real `airlock serve` whose store holds
//! real runs. It signs in as a person does, reads what a person would see
//! (the code lines, the output, the figure as drawn, the error's line
//! marked), and attacks the page with everything a run can print.
//! Screenshots go to target/test-artefacts/console/.

// A test: a failure to set up or a surprise is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "console/webdriver.rs"]
mod webdriver;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use airlock::audit::AuditStore;
use airlock_server::token_sha256;
use airlock_tests::{airlock_command, bin_dir, data_image};
use base64::Engine as _;
use reqwest::StatusCode;
use reqwest::blocking::Client;
use serde_json::{Value, json};
use webdriver::Browser;

const ALICE: &str = "alice-console-token-41d2";
const BOB: &str = "bob-console-token-9e07";
const AUDITOR: &str = "auditor-console-token-c5a1";

/// A figure, a JSON artefact, an input, and an error on line 12.
const EVERYDAY: &str = r#"import json
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = open("sales.csv").read().splitlines()[1:]
xs = [int(row.split(",")[1]) for row in rows]
plt.plot(range(len(xs)), xs)
plt.title("sales")
plt.show()
json.dump({"total": sum(xs)}, open("result.json", "w"))
print("total", sum(xs))
print(xs[10])
"#;

/// Everything a run can print, aimed at the page that shows it.
const ATTACK: &str = r#"import sys
# <script>window.__pwned = 1</script> <img src=x onerror="window.__pwned=2">
link = '<a href="javascript:window.__pwned=3">click me</a>'
print("<script>window.__pwned=4</script>", link)
print("\x1b[31mred\x1b[0m\x1b]0;owned\x07 <img src=x onerror=window.__pwned=5>")
sys.stderr.write("<svg onload=window.__pwned=6></svg>\n")
open("<img src=x onerror=window.__pwned=7>.txt", "w").write("<script>window.__pwned=8</script>")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2])
plt.title("<script>window.__pwned=9</script>")
plt.show()
raise ValueError('<img src=x onerror=window.__pwned=10> javascript:window.__pwned=11')
"#;

/// What the page would show had anything of the run executed.
const PROBE: &str = "return {
    flag: window.__pwned === undefined ? null : String(window.__pwned),
    scripts: document.scripts.length,
    handlers: document.querySelectorAll('[onerror],[onload],[onclick],[onmouseover]').length,
    javascript_links: Array.from(document.querySelectorAll('a[href]'))
        .filter(a => a.href.toLowerCase().startsWith('javascript:')).length,
    title: document.title,
};";

/// A running `airlock serve` with three tokens and its own store.
struct Server {
    child: Child,
    address: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let _ = data_image();
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "listen = \"127.0.0.1:0\"\naudit_db = {db:?}\nimage = \"python-data\"\n\
             [[tokens]]\nname = \"alice\"\nsha256 = \"{}\"\n\
             [[tokens]]\nname = \"bob\"\nsha256 = \"{}\"\n\
             [[tokens]]\nname = \"auditor\"\nsha256 = \"{}\"\nsee_all_runs = true\n",
            token_sha256(ALICE),
            token_sha256(BOB),
            token_sha256(AUDITOR),
            db = dir.path().join("audit.sqlite3").display().to_string(),
        );
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        let mut child = airlock_command()
            .arg("serve")
            .arg("--config")
            .arg(dir.path().join("airlock.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start airlock serve");
        let (found, address) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("airlock: serving http://") {
                    let _ = found.send(rest.split(' ').next().unwrap_or_default().to_owned());
                }
            }
        });
        let address = address.recv_timeout(Duration::from_secs(120)).expect("the server did not start");
        Server { child, address, dir }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn store(&self) -> AuditStore {
        AuditStore::open_existing(&self.dir.path().join("audit.sqlite3")).unwrap()
    }

    /// A real run through the API, as `token`; returns its record.
    fn run(&self, token: &str, code: &str, inputs: &[(&str, &str)], outputs: &[&str]) -> Value {
        let files: Vec<Value> = inputs
            .iter()
            .map(|(path, text)| {
                json!({"path": path, "content_base64": base64::engine::general_purpose::STANDARD.encode(text)})
            })
            .collect();
        let body = json!({"code": code, "files": files, "outputs": outputs});
        let response = client().post(self.url("/v1/runs")).bearer_auth(token).json(&body).send().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(120)).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn screenshots() -> PathBuf {
    bin_dir().parent().unwrap().join("test-artefacts/console")
}

/// Signs in on the browser's login form, as a person would.
fn sign_in(browser: &Browser, server: &Server, token: &str, then: &str) {
    browser.open(&server.url(then));
    assert!(browser.url().contains("/ui/login"), "signed out, {then} leads to the login form: {}", browser.url());
    browser.type_into(&browser.find("#token"), token);
    browser.click(&browser.find("form button[type=submit]"));
    // The click may return before the form's POST and its redirect are done:
    // wait for the page to leave the form, or for the form to say why not.
    let left = browser.wait_for(Duration::from_secs(60), |browser| {
        !browser.url().contains("/ui/login") || !browser.find_all(".problem").is_empty()
    });
    if !left || browser.url().contains("/ui/login") {
        let problem = browser.find_all(".problem").first().map(|p| browser.text(p)).unwrap_or_default();
        panic!("signing in failed: {problem} {:?}", browser.eval("return document.cookie"));
    }
}

/// Signs in over plain HTTP; returns the Cookie header of the session.
fn http_session(server: &Server, token: &str) -> String {
    try_session(server, token).unwrap_or_else(|status| panic!("signing in answered {status}"))
}

/// Signs in over plain HTTP: the session's Cookie header, or the status of
/// the refusal.
fn try_session(server: &Server, token: &str) -> Result<String, StatusCode> {
    let form = client().get(server.url("/ui/login")).send().unwrap();
    let login_cookie = cookie_of(&form, "airlock_login");
    let html = form.text().unwrap();
    let csrf = html.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let answer = client()
        .post(server.url("/ui/login"))
        .header("cookie", format!("airlock_login={login_cookie}"))
        .form(&[("csrf", csrf.as_str()), ("token", token), ("next", "/ui/runs")])
        .send()
        .unwrap();
    match answer.status() {
        StatusCode::SEE_OTHER => Ok(format!("airlock_session={}", cookie_of(&answer, "airlock_session"))),
        status => Err(status),
    }
}

fn cookie_of(response: &reqwest::blocking::Response, name: &str) -> String {
    let prefix = format!("{name}=");
    let header = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|value| value.to_str().unwrap().to_owned())
        .find(|value| value.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} cookie"));
    assert!(header.contains("HttpOnly") && header.contains("SameSite=Strict"), "{header}");
    header[prefix.len()..].split(';').next().unwrap().to_owned()
}

fn get(server: &Server, cookie: &str, path: &str) -> reqwest::blocking::Response {
    client().get(server.url(path)).header("cookie", cookie).send().unwrap()
}

/// CSP violations and errors the browser reported.
fn complaints(browser: &Browser) -> Vec<String> {
    browser
        .console_log()
        .into_iter()
        .filter(|line| {
            let lower = line.to_lowercase();
            lower.contains("content security policy") || lower.contains("refused") || lower.contains("error")
        })
        .collect()
}

#[test]
fn a_person_reads_a_run_beside_its_code_in_a_real_browser() {
    let server = Server::start();
    let sales = "day,amount\n".to_owned() + &(1..=8).map(|n| format!("{n},{}\n", n * n)).collect::<String>();
    let record = server.run(ALICE, EVERYDAY, &[("sales.csv", &sales)], &["result.json"]);
    let id = record["id"].as_str().unwrap();
    assert_eq!(record["error"]["line"], 12, "{record:#}");
    let browser = Browser::start();

    sign_in(&browser, &server, ALICE, &format!("/ui/runs/{id}"));
    assert!(browser.url().ends_with(&format!("/ui/runs/{id}")), "back at the run after signing in: {}", browser.url());
    let lines = browser.find_all(".listing tr");
    assert_eq!(lines.len(), EVERYDAY.lines().count(), "every line of the code, numbered");
    assert_eq!(browser.text(&browser.find("#L8 .src")), "plt.title(\"sales\")");
    let marked = browser.find_all(".listing tr.marked");
    assert_eq!(marked.len(), 1, "one line marked");
    assert_eq!(browser.eval("return document.querySelector('.listing tr.marked').id"), "L12");
    assert!(browser.text(&marked[0]).contains("error"), "the mark is a word too, not colour alone");
    assert_eq!(browser.text(&browser.find("pre.stdout")), "total 204");
    let error = browser.text(&browser.find(".error-title"));
    assert!(error.contains("IndexError") && error.contains("line 12"), "{error}");
    let figure = browser.eval(
        "const img = document.querySelector('figure img');
         return [img.complete, img.naturalWidth, img.naturalHeight];",
    );
    assert_eq!(figure, json!([true, 640, 480]), "the figure is drawn at its natural size");
    let files = browser.text(&browser.find("section.files"));
    assert!(files.contains("/work/result.json") && files.contains("{\"total\": 204}"), "{files}");
    let sales_sha = airlock_core::sha256_hex(sales.as_bytes());
    assert!(files.contains("/work/sales.csv") && files.contains(&sales_sha), "{files}");
    let chain = browser.text(&browser.find("section.entry"));
    assert!(chain.contains("holds") && chain.contains("latest"), "{chain}");
    browser.screenshot(&screenshots().join("run.png"));
    assert_eq!(complaints(&browser), Vec::<String>::new(), "the page's own code breaks no policy");

    // The list, and its filter on text in the code.
    browser.open(&server.url("/ui/runs"));
    let row = browser.text(&browser.find("table.runs tbody tr"));
    assert!(
        row.contains("failed") && row.contains("alice") && row.contains("import json") && row.contains(id),
        "{row}"
    );
    browser.type_into(&browser.find("input[name=q]"), "xs[10]");
    browser.click(&browser.find(".filters button[type=submit]"));
    assert!(
        browser.wait_for(Duration::from_secs(60), |browser| browser.url().contains("q=")),
        "the filter was not applied"
    );
    assert_eq!(browser.find_all("table.runs tbody tr").len(), 1);
    browser.screenshot(&screenshots().join("runs.png"));
    browser.open(&server.url("/ui/runs?q=no+such+code+anywhere"));
    assert_eq!(browser.text(&browser.find("p.empty")), "No runs match.");

    // The chain, verified from the page by a token that may see every
    // run, the verdict shown to alice with who made it; its head to note.
    browser.open(&server.url("/ui/chain"));
    assert!(browser.find_all(".verify button[type=submit]").is_empty(), "alice may not verify");
    let auditor = http_session(&server, AUDITOR);
    let page = get(&server, &auditor, "/ui/chain").text().unwrap();
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let verified = client()
        .post(server.url("/ui/chain/verify"))
        .header("cookie", &auditor)
        .form(&[("csrf", csrf.as_str()), ("back", "/ui/chain")])
        .send()
        .unwrap();
    assert_eq!(verified.status(), StatusCode::SEE_OTHER);
    browser.open(&server.url("/ui/chain"));
    let state = browser.text(&browser.find("p.state"));
    assert!(state.starts_with("Intact") && state.contains("by auditor, without an anchor"), "{state}");
    let head = server.store().head().unwrap().unwrap().to_string();
    assert_eq!(browser.text(&browser.find("#head")), head);
    browser.screenshot(&screenshots().join("chain.png"));

    // The report: one file, opened with no server behind it.
    let cookie = http_session(&server, ALICE);
    let report = get(&server, &cookie, &format!("/ui/runs/{id}/report.html"));
    assert_eq!(report.status(), StatusCode::OK);
    assert!(report.headers()["content-disposition"].to_str().unwrap().starts_with("attachment"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.html");
    std::fs::write(&file, report.text().unwrap()).unwrap();
    drop(server);
    browser.open(&format!("file://{}", file.display()));
    let offline = browser.eval(
        "const img = document.querySelector('figure img');
         const mark = getComputedStyle(document.querySelector('.listing tr.marked')).backgroundColor;
         return [img.naturalWidth, img.src.startsWith('data:image/png;base64,'), mark];",
    );
    assert_eq!(offline[0], 640, "the figure is embedded: {offline}");
    assert_eq!(offline[1], true);
    assert_ne!(offline[2], "rgba(0, 0, 0, 0)", "its own stylesheet applies under its policy");
    assert!(browser.text(&browser.find("pre.stdout")).contains("total 204"));
    browser.screenshot(&screenshots().join("report.png"));
    assert_eq!(complaints(&browser), Vec::<String>::new());
}

#[test]
fn an_attack_run_renders_as_text_and_runs_nothing() {
    let server = Server::start();
    let hostile_input = "<b onmouseover=window.__pwned=12>.csv";
    let record = server.run(ALICE, ATTACK, &[(hostile_input, "a,b\n")], &["<img src=x onerror=window.__pwned=7>.txt"]);
    let real_id = record["id"].as_str().unwrap().to_owned();
    // What a run cannot make through the driver (it cleans figure names),
    // written into the store as a damaged or older airlock might: a figure
    // named and made of HTML, a hostile id, value, message and details.
    let store = server.store();
    let mut forged = store.get(&real_id).unwrap().unwrap().record;
    forged.id = "forged\"><script>window.__pwned=17</script>".to_owned();
    let fake_png = b"<script>window.__pwned=14</script>".to_vec();
    forged.figures[0].name = "<img src=x onerror=window.__pwned=13>".to_owned();
    forged.figures[0].sha256 = airlock_core::sha256_hex(&fake_png);
    forged.figures[0].png_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&fake_png));
    forged.value = Some("<a href=\"javascript:window.__pwned=15\">x</a>".to_owned());
    forged.message = Some("<script>window.__pwned=16</script>".to_owned());
    forged.isolation.details.insert("<script>".to_owned(), "onerror=window.__pwned=18".to_owned());
    store.append(&forged, Some("alice")).unwrap();
    let forged_path = format!("/ui/runs/{}", "forged%22%3E%3Cscript%3Ewindow.__pwned%3D17%3C%2Fscript%3E");

    let browser = Browser::start();
    // The probe can fail: a page that does run a script sets the flag.
    browser.open("data:text/html,<script>window.__pwned='canary'</script>");
    assert_eq!(browser.eval(PROBE)["flag"], "canary");

    sign_in(&browser, &server, ALICE, "/ui/runs");
    let _ = browser.console_log();
    for path in ["/ui/runs".to_owned(), format!("/ui/runs/{real_id}"), forged_path.clone()] {
        browser.open(&server.url(&path));
        let seen = browser.eval(PROBE);
        assert_eq!(seen["flag"], Value::Null, "{path}: a script of the run ran: {seen}");
        assert_eq!(
            (&seen["scripts"], &seen["handlers"], &seen["javascript_links"]),
            (&json!(0), &json!(0), &json!(0)),
            "{path}: {seen}"
        );
        assert_eq!(complaints(&browser), Vec::<String>::new(), "{path}: nothing was even attempted");
    }
    browser.open(&server.url(&format!("/ui/runs/{real_id}")));
    let code = browser.text(&browser.find(".listing"));
    assert!(code.contains("# <script>window.__pwned = 1</script> <img src=x onerror=\"window.__pwned=2\">"), "{code}");
    let stdout = browser.text(&browser.find("pre.stdout"));
    assert!(stdout.contains("<script>window.__pwned=4</script> <a href=\"javascript:window.__pwned=3\">"), "{stdout}");
    assert!(
        stdout.contains("\\u{1b}[31mred\\u{1b}[0m\\u{1b}]0;owned\\u{7}"),
        "terminal escapes shown as text: {stdout}"
    );
    let files = browser.text(&browser.find("section.files"));
    assert!(
        files.contains("/work/<img src=x onerror=window.__pwned=7>.txt") && files.contains(hostile_input),
        "{files}"
    );
    let error = browser.text(&browser.find("pre.error"));
    assert_eq!(error, "<img src=x onerror=window.__pwned=10> javascript:window.__pwned=11");
    browser.screenshot(&screenshots().join("attack.png"));

    browser.open(&server.url(&forged_path));
    assert!(browser.text(&browser.find("h1")).contains("forged\"><script>window.__pwned=17</script>"));
    let figure = browser.eval("return document.querySelector('figure img').naturalWidth");
    assert_eq!(figure, 0, "HTML dressed as a figure is not drawn");
    assert!(browser.text(&browser.find("figcaption")).contains("<img src=x onerror=window.__pwned=13>"));
    browser.screenshot(&screenshots().join("attack-forged.png"));
    let cookie = http_session(&server, ALICE);
    let served = get(&server, &cookie, &format!("{forged_path}/figures/0"));
    assert_eq!(served.status(), StatusCode::UNPROCESSABLE_ENTITY, "not served as an image");
    assert_eq!(served.headers()["x-content-type-options"], "nosniff");
    let artefact = get(&server, &cookie, &format!("/ui/runs/{real_id}/artifacts/0"));
    assert_eq!(artefact.headers()["content-type"], "application/octet-stream");
    let disposition = artefact.headers()["content-disposition"].to_str().unwrap().to_owned();
    assert_eq!(disposition, "attachment; filename=\"_img_src_x_onerror_window.__pwned_7_.txt\"");
    let page = get(&server, &cookie, &format!("/ui/runs/{real_id}"));
    let policy = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(policy.starts_with("default-src 'none'") && policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(page.headers()["x-frame-options"], "DENY");

    // The reports of both, opened as files.
    let dir = tempfile::tempdir().unwrap();
    for (name, path) in [("real", format!("/ui/runs/{real_id}")), ("forged", forged_path)] {
        let file = dir.path().join(format!("{name}.html"));
        std::fs::write(&file, get(&server, &cookie, &format!("{path}/report.html")).text().unwrap()).unwrap();
        browser.open(&format!("file://{}", file.display()));
        let seen = browser.eval(PROBE);
        assert_eq!(seen["flag"], Value::Null, "{name} report: {seen}");
        assert_eq!((&seen["scripts"], &seen["handlers"]), (&json!(0), &json!(0)), "{name} report: {seen}");
    }
}

#[test]
fn another_principals_run_is_not_reachable_by_url() {
    let server = Server::start();
    let record = server.run(ALICE, EVERYDAY, &[("sales.csv", "day,amount\n1,1\n")], &["result.json"]);
    let id = record["id"].as_str().unwrap();
    let run = format!("/ui/runs/{id}");

    let browser = Browser::start();
    sign_in(&browser, &server, BOB, &run);
    assert_eq!(browser.text(&browser.find("main h1")), "No such run");
    browser.open(&server.url("/ui/runs"));
    assert_eq!(browser.text(&browser.find("p.empty")), "No runs match.", "bob lists only his own runs");
    browser.open(&server.url("/ui/runs?principal=alice"));
    assert_eq!(browser.text(&browser.find("p.empty")), "No runs match.", "and cannot ask for another's");

    let bob = http_session(&server, BOB);
    for path in [run.clone(), format!("{run}/figures/0"), format!("{run}/artifacts/0"), format!("{run}/report.html")] {
        assert_eq!(get(&server, &bob, &path).status(), StatusCode::NOT_FOUND, "bob: {path}");
        let signed_out = client().get(server.url(&path)).send().unwrap();
        assert_eq!(signed_out.status(), StatusCode::SEE_OTHER, "signed out: {path}");
        assert!(signed_out.headers()["location"].to_str().unwrap().starts_with("/ui/login?next="));
        let forged = get(&server, "airlock_session=00000000000000000000000000000000", &path);
        assert_eq!(forged.status(), StatusCode::SEE_OTHER, "a made-up session: {path}");
    }
    let auditor = http_session(&server, AUDITOR);
    assert_eq!(get(&server, &auditor, &run).status(), StatusCode::OK, "a token that may see all runs sees it");
    assert_eq!(get(&server, &auditor, &format!("{run}/figures/0")).headers()["content-type"], "image/png");

    // Forms that change something need the session's CSRF token and a
    // request from this site.
    let verify = |cookie: &str, origin: Option<&str>, csrf: &str| {
        let mut request = client().post(server.url("/ui/chain/verify")).header("cookie", cookie);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.form(&[("csrf", csrf), ("back", "/ui/chain")]).send().unwrap().status()
    };
    assert_eq!(verify(&bob, None, ""), StatusCode::FORBIDDEN, "no CSRF token");
    assert_eq!(verify(&bob, None, "0123"), StatusCode::FORBIDDEN, "a wrong one");
    let page = get(&server, &bob, "/ui/chain").text().unwrap();
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert_eq!(verify(&bob, Some("http://evil.example"), &csrf), StatusCode::FORBIDDEN, "from another site");
    assert_eq!(verify(&bob, None, &csrf), StatusCode::FORBIDDEN, "the console's own form, but bob may not see all");
    let page = get(&server, &auditor, "/ui/chain").text().unwrap();
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert_eq!(verify(&auditor, None, &csrf), StatusCode::SEE_OTHER, "the console's own form");
    let login = client()
        .post(server.url("/ui/login"))
        .form(&[("csrf", "made-up"), ("token", ALICE), ("next", "/ui/runs")])
        .send()
        .unwrap();
    assert_eq!(login.status(), StatusCode::FORBIDDEN, "a login form the console did not make");
}

/// A record with one figure whose bytes start as a PNG does, kept in a
/// store of its own.
fn store_with_a_figure(dir: &std::path::Path) -> (PathBuf, String) {
    let path = dir.join("audit.sqlite3");
    let store = AuditStore::open(&path).unwrap();
    let png = b"\x89PNG\r\n\x1a\n-not-drawn-but-a-png-by-its-signature".to_vec();
    let record = airlock::RunRecord {
        id: "local-run-1".to_owned(),
        started_at: "2026-12-01T09:00:00.000Z".to_owned(),
        code: "print(1 + 1)\n".to_owned(),
        stdout: "2\n".to_owned(),
        figures: vec![airlock::FigureRecord {
            name: "figure-1.png".to_owned(),
            width: 1,
            height: 1,
            bytes: png.len() as u64,
            sha256: airlock_core::sha256_hex(&png),
            saved_to: None,
            png_base64: Some(base64::engine::general_purpose::STANDARD.encode(&png)),
        }],
        ..airlock::RunRecord::default()
    };
    store.append(&record, None).unwrap();
    (path, record.id)
}

#[test]
fn audit_show_html_is_one_inert_file_and_audit_ui_serves_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let (db, id) = store_with_a_figure(dir.path());
    let shown = airlock_command().arg("audit").arg("--db").arg(&db).args(["show", &id, "--html"]).output().unwrap();
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let html = String::from_utf8(shown.stdout).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..200.min(html.len())]);
    // The template engine writes the policy's quotes as &#39;: the same attribute to a browser.
    let policy = "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src &#39;none&#39;; img-src data:;";
    assert!(html.contains(policy), "{}", &html[..600.min(html.len())]);
    assert!(html.contains("src=\"data:image/png;base64,iVBORw0KGgo"), "the figure is embedded");
    assert!(!html.contains("<script") && !html.contains("http://") && !html.contains("https://"), "nothing to fetch");

    let refused =
        airlock_command().arg("audit").arg("--db").arg(&db).args(["ui", "--listen", "0.0.0.0:0"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("loopback only"), "{refused:?}");

    let mut ui = airlock_command()
        .arg("audit")
        .arg("--db")
        .arg(&db)
        .arg("ui")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(ui.stderr.take().unwrap()).lines().map_while(Result::ok);
    let base = lines.next().unwrap().strip_prefix("airlock: console at ").unwrap().trim_end_matches("/ui").to_owned();
    let token = lines.next().unwrap().strip_prefix("airlock: sign in with the token ").unwrap().to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let server = Server { child: ui, address: base.trim_start_matches("http://").to_owned(), dir };
    assert_eq!(client().get(server.url("/ui/runs")).send().unwrap().status(), StatusCode::SEE_OTHER);
    let cookie = http_session(&server, &token);
    let page = get(&server, &cookie, "/ui/runs").text().unwrap();
    assert!(page.contains("local-run-1"), "{page}");
    assert_eq!(get(&server, &cookie, "/ui/runs/local-run-1/figures/0").headers()["content-type"], "image/png");
    assert_eq!(try_session(&server, "not-the-token"), Err(StatusCode::UNAUTHORIZED));
}
