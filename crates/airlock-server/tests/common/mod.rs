//! A console for tests: a real [`airlock_server::console`] on a loopback
//! listener, over a real store in a temporary folder, and a client that
//! signs in through the login form as a browser does.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock::audit::AuditStore;
use airlock_server::console::{self, Authenticate, ConsoleOptions, Viewer};
use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};

/// Viewers by token: `NAME-token` signs in as NAME; the auditors see all.
fn authenticate() -> Authenticate {
    Arc::new(|token: &str| {
        let name = token.strip_suffix("-token")?;
        let see_all_runs = match name {
            "alice" | "bob" => false,
            "auditor" | "second-auditor" => true,
            _ => return None,
        };
        Some(Viewer { name: name.to_owned(), see_all_runs })
    })
}

pub struct Console {
    pub address: String,
    pub db: PathBuf,
    pub dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A record as a run makes it: `run-N`, printing N.
pub fn record(n: usize) -> airlock::RunRecord {
    airlock::RunRecord {
        id: format!("run-{n}"),
        started_at: format!("2026-12-01T09:00:{:02}.000Z", n % 60),
        code: format!("print({n})\n"),
        stdout: format!("{n}\n"),
        ..airlock::RunRecord::default()
    }
}

impl Console {
    /// A console over a store of `runs` runs, odd ones alice's, even ones bob's.
    pub fn start(runs: usize) -> Console {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.sqlite3");
        let store = AuditStore::open(&db).unwrap();
        for n in 1..=runs {
            store.append(&record(n), Some(if n % 2 == 1 { "alice" } else { "bob" })).unwrap();
        }
        Console::serve(dir, db, Arc::new(store))
    }

    /// A console over `store`, which lives in `dir`.
    pub fn serve(dir: tempfile::TempDir, db: PathBuf, store: Arc<AuditStore>) -> Console {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, address) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                bound.send(listener.local_addr().unwrap().to_string()).unwrap();
                let console = console::Console::new(ConsoleOptions { store, authenticate: authenticate(), tls: false });
                console::serve(console, listener, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let address = address.recv_timeout(Duration::from_secs(30)).unwrap();
        Console { address, db, dir, stop: Some(stop), thread: Some(thread) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Signs in as `name`; returns the session's Cookie header.
    pub fn sign_in(&self, name: &str) -> String {
        let form = client().get(self.url("/ui/login")).send().unwrap();
        let login_cookie = cookie_of(&form, "airlock_login");
        let html = form.text().unwrap();
        let csrf = between(&html, "name=\"csrf\" value=\"", "\"").to_owned();
        let token = format!("{name}-token");
        let answer = client()
            .post(self.url("/ui/login"))
            .header("cookie", format!("airlock_login={login_cookie}"))
            .form(&[("csrf", csrf.as_str()), ("token", token.as_str()), ("next", "/ui/runs")])
            .send()
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "signing in as {name}");
        format!("airlock_session={}", cookie_of(&answer, "airlock_session"))
    }

    pub fn get(&self, cookie: &str, path: &str) -> Response {
        client().get(self.url(path)).header("cookie", cookie).send().unwrap()
    }

    /// Posts the verify form with `anchor`; returns the answer's status.
    pub fn verify(&self, cookie: &str, csrf: &str, anchor: &str) -> StatusCode {
        let form = [("csrf", csrf), ("anchor", anchor), ("back", "/ui/chain")];
        client().post(self.url("/ui/chain/verify")).header("cookie", cookie).form(&form).send().unwrap().status()
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The chain page as `cookie` sees it, and its CSRF token.
pub fn chain_page(console: &Console, cookie: &str) -> (String, String) {
    let page = console.get(cookie, "/ui/chain");
    assert_eq!(page.status(), StatusCode::OK);
    let page = page.text().unwrap();
    let csrf = between(&page, "name=\"csrf\" value=\"", "\"").to_owned();
    (page, csrf)
}

pub fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(60)).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The text of `text` between the first `start` and the next `end`.
pub fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let rest = text.split_once(start).unwrap_or_else(|| panic!("no {start:?} in {text}")).1;
    rest.split_once(end).map_or(rest, |(inside, _)| inside)
}

fn cookie_of(response: &Response, name: &str) -> String {
    let prefix = format!("{name}=");
    let header = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|value| value.to_str().unwrap().to_owned())
        .find(|value| value.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} cookie"));
    header[prefix.len()..].split(';').next().unwrap().to_owned()
}
