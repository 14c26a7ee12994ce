//! A driver to trace pooled runs by (issue 15, bench/results/pool.md): `N`
//! pooled `print(1+1)` runs through `Pool::run`, one at a time with the
//! pool refilled and settled before each, every run bracketed by a `statx`
//! of `/MARK-start-I` and `/MARK-end-I` so that a trace can be cut to it.
//! Prints each run's time and its record's usage.
//!
//! usage: AIRLOCK_INIT=target/release/airlock-init [POOL_MODE=forked] [NO_AUDIT=1] \
//!     strace -f -ttt -o trace.txt target/release/examples/pool_trace [IMAGE] [N]

use std::time::{Duration, Instant};

use airlock::{Audit, BackendKind, Policy, Pool, PoolMode, PoolOptions, RunRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let image = args.next().unwrap_or_else(|| "python-data".to_owned());
    let runs: usize = args.next().map_or(Ok(5), |n| n.parse()).map_err(|e| format!("N: {e}"))?;
    let mode_name = std::env::var("POOL_MODE").unwrap_or_else(|_| "pooled".to_owned());
    let mode = PoolMode::parse(&mode_name).ok_or("POOL_MODE is pooled or forked")?;
    let dir = std::env::temp_dir().join(format!("airlock-pool-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = airlock::resolve_runtime(BackendKind::Linux, Some(&image), None, &mut |_| {})?;
    let audit = match std::env::var_os("NO_AUDIT") {
        Some(_) => None,
        None => {
            let store = airlock::audit::AuditStore::open(&dir.join("audit.sqlite3"))?;
            Some(Audit { store: std::sync::Arc::new(store), principal: None })
        }
    };
    let options = PoolOptions { size: 1, mode, ..PoolOptions::default() };
    let backend = airlock::backend_for(BackendKind::Linux)?;
    let pool = Pool::with_backend(backend, Policy::default(), runtime, options, audit);
    let request = RunRequest::python("print(1+1)");
    for i in 0..runs {
        if !pool.wait_ready(1, Duration::from_secs(60)) {
            return Err(format!("the pool did not refill: {:?}", pool.stats()).into());
        }
        // The refill's last steps (its thread, the kernel's) settle.
        std::thread::sleep(Duration::from_millis(300));
        let _ = std::fs::metadata(format!("/MARK-start-{i}"));
        let began = Instant::now();
        let record = pool.run(pool.policy(), &[], &request)?;
        let ms = began.elapsed().as_secs_f64() * 1000.0;
        let _ = std::fs::metadata(format!("/MARK-end-{i}"));
        eprintln!("run {i}: {ms:.2} ms {:?} {:?}", record.status, record.usage);
    }
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
