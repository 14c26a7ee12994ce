//! How long the console's pages take with 100,000 runs in the store, against
//! the same pages over a store of 1,000 (the baseline, in the same run):
//! a page that walked the store would grow with it a hundredfold.
//!
//! Both stores are filled through `AuditStore::append`, the server's own
//! path, on a RAM disk (fsync costs nothing there; it is not what this
//! measures) and kept for the next run. Both consoles are served in this
//! process on loopback; a blocking HTTP client signs in on each and asks
//! for each page in turn, small store then large, round after round, and
//! the medians are compared. Run it through `bench/console.sh`.
//!
//! ```text
//! console_list [--dir DIR] [--runs N] [--baseline N] [--rounds N]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::audit::AuditStore;
use airlock::{Language, Limit, RunRecord, Status};
use airlock_server::console::{Authenticate, Console, ConsoleOptions, Viewer};
use anyhow::Context;

const ANALYSTS: usize = 20;
const SEE_ALL: &str = "auditor-token";
const ONE_ANALYST: &str = "analyst-7-token";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: &str| -> String {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or(default.to_owned())
    };
    let dir = PathBuf::from(value("--dir", "/dev/shm/airlock-console-bench"));
    let runs: u64 = value("--runs", "100000").parse().context("--runs")?;
    let baseline: u64 = value("--baseline", "1000").parse().context("--baseline")?;
    let rounds: usize = value("--rounds", "15").parse().context("--rounds")?;
    std::fs::create_dir_all(&dir)?;

    let small = filled(&dir.join(format!("audit-{baseline}.sqlite3")), baseline)?;
    let large = filled(&dir.join(format!("audit-{runs}.sqlite3")), runs)?;
    let probe_id =
        large.browse(&airlock::audit::Browse { limit: 1, ..Default::default() })?.runs[0].summary.run_id.clone();
    let small_id =
        small.browse(&airlock::audit::Browse { limit: 1, ..Default::default() })?.runs[0].summary.run_id.clone();
    let db_size = std::fs::metadata(large.path())?.len();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let small_url = runtime.block_on(serve(small, &runtime))?;
    let large_url = runtime.block_on(serve(large, &runtime))?;
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(300))
        .build()?;
    let sessions = [
        (sign_in(&client, &small_url, SEE_ALL)?, sign_in(&client, &small_url, ONE_ANALYST)?),
        (sign_in(&client, &large_url, SEE_ALL)?, sign_in(&client, &large_url, ONE_ANALYST)?),
    ];
    let middle = runs / 2;
    let small_middle = baseline / 2;
    // (what, path in the small store, path in the large one, as one analyst)
    let pages: Vec<(&str, String, String, bool)> = vec![
        ("the newest runs (the list as it opens)", "/ui/runs".into(), "/ui/runs".into(), false),
        ("a page in the middle", format!("/ui/runs?before={small_middle}"), format!("/ui/runs?before={middle}"), false),
        ("one analyst's own runs", "/ui/runs".into(), "/ui/runs".into(), true),
        ("status = timeout (2 % of runs)", "/ui/runs?status=timeout".into(), "/ui/runs?status=timeout".into(), false),
        ("who asked = analyst-3", "/ui/runs?principal=analyst-3".into(), "/ui/runs?principal=analyst-3".into(), false),
        (
            "one day",
            "/ui/runs?since=2026-06-10&until=2026-06-11".into(),
            "/ui/runs?since=2026-06-10&until=2026-06-11".into(),
            false,
        ),
        (
            "code contains a word in 1 % of runs",
            "/ui/runs?q=weighted_median".into(),
            "/ui/runs?q=weighted_median".into(),
            false,
        ),
        ("code contains text in no run", "/ui/runs?q=no_such_name".into(), "/ui/runs?q=no_such_name".into(), false),
        ("one run's page", format!("/ui/runs/{small_id}"), format!("/ui/runs/{probe_id}"), false),
    ];
    let mut table = Vec::new();
    for (what, small_path, large_path, analyst) in &pages {
        let mut times = [Vec::new(), Vec::new()];
        let mut rows = [0usize, 0usize];
        for _ in 0..rounds {
            for (side, (base, path)) in [(&small_url, small_path), (&large_url, large_path)].into_iter().enumerate() {
                let cookie = if *analyst { &sessions[side].1 } else { &sessions[side].0 };
                let start = Instant::now();
                let response = client.get(format!("{base}{path}")).header("cookie", cookie).send()?;
                let status = response.status();
                let body = response.text()?;
                times[side].push(start.elapsed());
                anyhow::ensure!(status.is_success(), "{path}: {status}: {body}");
                rows[side] = body.matches("<tr>").count();
            }
        }
        let small_ms = median(&mut times[0]);
        let large_ms = median(&mut times[1]);
        table.push(format!(
            "| {what} | {small_ms:.1} ms ({} rows) | {large_ms:.1} ms ({} rows) | {:.2}x |",
            rows[0],
            rows[1],
            large_ms / small_ms
        ));
    }
    println!("console pages, median of {rounds} rounds, {runs} runs ({} MiB store) against {baseline}", db_size >> 20);
    println!("| page | {baseline} runs | {runs} runs | ratio |\n|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
    Ok(())
}

fn median(times: &mut [Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1000.0
}

/// The store at `path`, filled to `count` runs if it holds fewer.
fn filled(path: &Path, count: u64) -> anyhow::Result<AuditStore> {
    let store = AuditStore::open(path)?;
    let have = store.head()?.map_or(0, |head| head.seq);
    let started = Instant::now();
    for n in have + 1..=count {
        let (record, principal) = record(n, count);
        store.append(&record, Some(&principal))?;
        if n % 10_000 == 0 {
            eprintln!("{}: {n} runs ({:.0} s)", path.display(), started.elapsed().as_secs_f64());
        }
    }
    Ok(store)
}

/// Run `n` of `count`: mostly ok, some failed, a few stopped by limits; 20 analysts;
/// code of 6 to 30 lines; one run in a hundred computes a weighted median.
fn record(n: u64, count: u64) -> (RunRecord, String) {
    let status = match n % 50 {
        0 => Status::Timeout,
        1 => Status::MemoryLimit,
        2..=11 => Status::Failed,
        _ => Status::Ok,
    };
    let mut code = String::from("import pandas as pd\ndf = pd.read_csv('sales.csv')\n");
    for line in 0..(n % 25 + 4) {
        code.push_str(&format!("total_{line} = df['amount_{}'].sum() * {line}\n", n % 97));
    }
    if n % 100 == 42 {
        code.push_str("result = weighted_median(df['amount'], df['weight'])\n");
    }
    code.push_str("print(total_0)\n");
    // The runs of a store span 180 days, in the order they were recorded.
    let day = 1 + (n * 180 / count).min(179);
    let (month, day_of_month) = (1 + (day - 1) / 30, 1 + (day - 1) % 30);
    let record = RunRecord {
        schema_version: airlock::RECORD_SCHEMA_VERSION,
        id: format!("{n:08x}{:024x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        started_at: format!("2026-{month:02}-{day_of_month:02}T{:02}:{:02}:00.000Z", n % 24, n % 60),
        status,
        limits_hit: status.stopping_limit().into_iter().chain((n % 7 == 0).then_some(Limit::Pids)).collect(),
        exit_code: Some(if status == Status::Ok { 0 } else { 1 }),
        stdout: format!("{}\n", n * 17),
        stderr: if status == Status::Failed {
            "Traceback (most recent call last):\nKeyError: 'x'\n".into()
        } else {
            String::new()
        },
        code_sha256: airlock_core::sha256_hex(code.as_bytes()),
        code,
        language: Language::Python,
        usage: airlock::Usage {
            wall_ms: 300 + n % 900,
            cpu_ms: Some(200 + n % 700),
            peak_memory_bytes: Some(60 << 20),
            ..airlock::Usage::default()
        },
        ..RunRecord::default()
    };
    (record, format!("analyst-{}", n as usize % ANALYSTS))
}

/// Serves a console over `store` on a loopback port; returns its base URL.
async fn serve(store: AuditStore, runtime: &tokio::runtime::Runtime) -> anyhow::Result<String> {
    let authenticate: Authenticate = Arc::new(|token: &str| match token {
        SEE_ALL => Some(Viewer { name: "auditor".into(), see_all_runs: true }),
        ONE_ANALYST => Some(Viewer { name: "analyst-7".into(), see_all_runs: false }),
        _ => None,
    });
    let console = Console::new(ConsoleOptions { store: Arc::new(store), authenticate, tls: false });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    runtime.spawn(airlock_server::console::serve(console, listener, std::future::pending()));
    Ok(url)
}

/// Signs in on the login form; returns the session's Cookie header.
fn sign_in(client: &reqwest::blocking::Client, base: &str, token: &str) -> anyhow::Result<String> {
    let cookie_of = |response: &reqwest::blocking::Response, name: &str| -> anyhow::Result<String> {
        let prefix = format!("{name}=");
        response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(|value| value.strip_prefix(&prefix).map(|rest| rest.split(';').next().unwrap_or("").to_owned()))
            .with_context(|| format!("no {name} cookie"))
    };
    let form = client.get(format!("{base}/ui/login")).send()?;
    let login = cookie_of(&form, "airlock_login")?;
    let html = form.text()?;
    let csrf =
        html.split("name=\"csrf\" value=\"").nth(1).and_then(|rest| rest.split('"').next()).context("no csrf")?;
    let answer = client
        .post(format!("{base}/ui/login"))
        .header("cookie", format!("airlock_login={login}"))
        .form(&[("csrf", csrf), ("token", token), ("next", "/ui/runs")])
        .send()?;
    Ok(format!("airlock_session={}", cookie_of(&answer, "airlock_session")?))
}
