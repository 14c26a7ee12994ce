//! A small W3C WebDriver client for Debian's chromium-driver: enough to
//! drive headless Chromium the way a person uses the console (open a page,
//! type, click), read what they would see, run a probe script, take a
//! screenshot and read the browser's console log.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::blocking::Client;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session in it; both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    http: Client,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium
    /// session, with the flags Chromium needs as root on this closed network.
    pub fn start() -> Browser {
        for program in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: the console's browser tests need Debian's chromium and chromium-driver \
                 (apt-get install chromium chromium-driver; .ci/run installs them)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let stdout = driver.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let started = Instant::now();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("started successfully") => break,
                Some(Ok(_)) => {}
                _ => panic!("chromedriver did not start"),
            }
            assert!(started.elapsed() < Duration::from_secs(30), "chromedriver did not start in 30 s");
        }
        // Keep reading its output, so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let profile = tempfile::tempdir().unwrap();
        let http = Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let url = format!("http://127.0.0.1:{port}/session");
        let answer: Value = http.post(&url).json(&capabilities).send().unwrap().json().unwrap();
        let session = answer["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {answer}"));
        Browser { driver, base: format!("{url}/{session}"), http, _profile: profile }
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let request = self.http.request(method, format!("{}{path}", self.base));
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        let answer: Value = request.send().unwrap().json().unwrap();
        if let Some(error) = answer["value"].get("error") {
            panic!("WebDriver {path}: {error}: {}", answer["value"]["message"]);
        }
        answer["value"].clone()
    }

    fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body))
    }

    fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None)
    }

    pub fn open(&self, url: &str) {
        self.post("/url", json!({"url": url}));
    }

    pub fn url(&self) -> String {
        self.get("/url").as_str().unwrap_or_default().to_owned()
    }

    pub fn find(&self, css: &str) -> Element {
        let found = self.post("/element", json!({"using": "css selector", "value": css}));
        let Some(id) = found[ELEMENT].as_str() else {
            let page = self.get("/source");
            panic!("no element {css} on {}: {found}\n{}", self.url(), page.as_str().unwrap_or_default());
        };
        Element(id.to_owned())
    }

    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self.post("/elements", json!({"using": "css selector", "value": css}));
        found.as_array().unwrap().iter().map(|e| Element(e[ELEMENT].as_str().unwrap().to_owned())).collect()
    }

    /// The element's text as rendered: what a person reads.
    pub fn text(&self, element: &Element) -> String {
        self.get(&format!("/element/{}/text", element.0)).as_str().unwrap_or_default().to_owned()
    }

    pub fn type_into(&self, element: &Element, text: &str) {
        self.post(&format!("/element/{}/value", element.0), json!({"text": text}));
    }

    pub fn click(&self, element: &Element) {
        self.post(&format!("/element/{}/click", element.0), json!({}));
    }

    /// Waits until `done` holds for this page, up to `limit`; says whether it
    /// did. A click that submits a form may return before the browser has
    /// left the page, so what it leads to is waited for, never assumed.
    pub fn wait_for(&self, limit: Duration, done: impl Fn(&Browser) -> bool) -> bool {
        let started = Instant::now();
        loop {
            if done(self) {
                return true;
            }
            if started.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `script` (a function body) in the page, outside its CSP.
    pub fn eval(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
    }

    /// Saves a screenshot of the window as PNG.
    pub fn screenshot(&self, path: &Path) {
        let png = self.get("/screenshot");
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// The browser console's messages since the last call.
    pub fn console_log(&self) -> Vec<String> {
        let entries = self.post("/se/log", json!({"type": "browser"}));
        entries
            .as_array()
            .map(|entries| {
                entries.iter().map(|entry| entry["message"].as_str().unwrap_or_default().to_owned()).collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(&self.base).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
