//! Runs per second of `print(1+1)`, through the HTTP API or the library
//! directly, at the same concurrency. `bench/server.sh` drives it.
//!
//! ```text
//! bench direct       RUNS THREADS              # the library, no audit store
//! bench direct-audit RUNS THREADS AUDIT_DB     # the library, recording every run (as the server does)
//! bench http         RUNS THREADS URL TOKEN    # POST /v1/runs
//! ```
//!
//! Prints one line: `MODE runs=N threads=T seconds=S runs_per_s=R errors=E`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use airlock::audit::AuditStore;
use airlock::{Audit, Policy, Sandbox};
use anyhow::{Context, bail};

const CODE: &str = "print(1+1)";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, runs, threads) = match args.as_slice() {
        [mode, runs, threads, ..] => (mode.as_str(), runs.parse::<usize>()?, threads.parse::<usize>()?),
        _ => bail!("usage: bench direct|direct-audit|http RUNS THREADS [AUDIT_DB | URL TOKEN]"),
    };
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let audit = match mode {
        "direct-audit" => {
            let path = args.get(3).context("direct-audit needs AUDIT_DB")?;
            Some(Arc::new(AuditStore::open(std::path::Path::new(path))?))
        }
        _ => None,
    };
    let runtime = airlock::interpreter::Interpreter::resolve("python3")?.runtime();
    let start = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for _ in 0..threads {
            let (next, errors, audit, runtime) = (next.clone(), errors.clone(), audit.clone(), runtime.clone());
            let args = &args;
            handles.push(scope.spawn(move || -> anyhow::Result<()> {
                let http = reqwest::blocking::Client::new();
                while next.fetch_add(1, Ordering::SeqCst) < runs {
                    let ok = match mode {
                        "direct" | "direct-audit" => {
                            let mut sandbox = Sandbox::with_runtime(Policy::default(), runtime.clone())?;
                            if let Some(store) = &audit {
                                sandbox
                                    .set_audit(Some(Audit { store: store.clone(), principal: Some("bench".into()) }));
                            }
                            let record = sandbox.run_checked(&airlock::RunRequest::python(CODE));
                            record.is_ok_and(|r| r.ok() && r.stdout == "2\n")
                        }
                        "http" => {
                            let (url, token) = (&args[3], &args[4]);
                            let response = http
                                .post(format!("{url}/v1/runs"))
                                .bearer_auth(token)
                                .json(&serde_json::json!({"code": CODE}))
                                .send()?;
                            response.status().is_success()
                                && response.json::<serde_json::Value>()?["stdout"].as_str() == Some("2\n")
                        }
                        other => bail!("unknown mode {other}"),
                    };
                    if !ok {
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(())
            }));
        }
        for handle in handles {
            handle.join().map_err(|_| anyhow::anyhow!("a bench thread panicked"))??;
        }
        Ok(())
    })?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{mode} runs={runs} threads={threads} seconds={seconds:.2} runs_per_s={:.2} errors={}",
        runs as f64 / seconds,
        errors.load(Ordering::SeqCst)
    );
    Ok(())
}
