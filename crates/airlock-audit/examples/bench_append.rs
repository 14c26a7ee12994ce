//! What recording a run costs: `AuditStore::append` against a plain SQLite
//! insert of the same JSON, with the same durability (WAL, synchronous=FULL)
//! and without it (synchronous=NORMAL). Rounds alternate the variants
//! (A B C A B C ...), each on a fresh file in `--dir`. Run it through
//! `bench/append.sh`, which builds in release mode and keeps the output.
//!
//! ```text
//! bench_append [--dir DIR] [--rounds N] [--appends N] [--stdout-bytes N]
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_audit::AuditStore;
use airlock_policy::{Policy, RunRecord, Status};
use anyhow::Context;
use rusqlite::Connection;

#[derive(Clone, Copy, Debug)]
enum Variant {
    /// The audit store: hash chain, duplicate check, head row, WAL + FULL.
    Store,
    /// One INSERT of the same JSON per run in its own transaction, WAL + FULL.
    PlainFull,
    /// The same with synchronous=NORMAL: what the fsync per run costs.
    PlainNormal,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Store => "audit store (FULL)",
            Variant::PlainFull => "plain insert (FULL)",
            Variant::PlainNormal => "plain insert (NORMAL)",
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let option = |name: &str, default: &str| -> String {
        args.iter().position(|a| a == name).and_then(|at| args.get(at + 1)).cloned().unwrap_or(default.to_owned())
    };
    let dir = PathBuf::from(option("--dir", "/tmp"));
    let rounds: usize = option("--rounds", "5").parse().context("--rounds")?;
    let appends: usize = option("--appends", "200").parse().context("--appends")?;
    let stdout_bytes: usize = option("--stdout-bytes", "2000").parse().context("--stdout-bytes")?;
    let variants = [Variant::Store, Variant::PlainFull, Variant::PlainNormal];

    println!(
        "{appends} appends per round, {rounds} rounds, stdout {stdout_bytes} B per run, files in {}",
        dir.display()
    );
    let mut means: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut all: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        for (index, variant) in variants.iter().enumerate() {
            let folder = tempfile::tempdir_in(&dir)?;
            let path = folder.path().join("audit.sqlite3");
            let latencies = run(*variant, &path, appends, stdout_bytes, round)?;
            means[index].push(latencies.iter().sum::<Duration>() / appends as u32);
            all[index].extend(latencies);
        }
    }
    let baseline = median(&mut means[1].clone());
    println!("{:<24} {:>12} {:>12} {:>12} {:>16}", "variant", "median mean", "p50", "p99", "vs plain FULL");
    for (index, variant) in variants.iter().enumerate() {
        let mean = median(&mut means[index]);
        all[index].sort();
        let p50 = all[index][all[index].len() / 2];
        let p99 = all[index][all[index].len() * 99 / 100];
        println!(
            "{:<24} {:>12.3?} {:>12.3?} {:>12.3?} {:>15.4}x",
            variant.name(),
            mean,
            p50,
            p99,
            mean.as_secs_f64() / baseline.as_secs_f64()
        );
    }

    // Verifying: the whole chain of a store with rounds x appends entries.
    let folder = tempfile::tempdir_in(&dir)?;
    let path = folder.path().join("audit.sqlite3");
    let total = rounds * appends;
    run(Variant::Store, &path, total, stdout_bytes, 0)?;
    let store = AuditStore::open(&path)?;
    let started = Instant::now();
    let report = store.verify()?;
    let took = started.elapsed();
    anyhow::ensure!(report.is_intact(), "{report}");
    println!(
        "verify: {} entries in {took:.3?} ({:.0} entries/s)",
        report.entries_checked,
        report.entries_checked as f64 / took.as_secs_f64()
    );
    Ok(())
}

/// Per-append latencies of `count` appends with `variant` into a fresh `path`.
fn run(
    variant: Variant,
    path: &Path,
    count: usize,
    stdout_bytes: usize,
    round: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(count);
    match variant {
        Variant::Store => {
            let store = AuditStore::open(path)?;
            for n in 0..count {
                let record = made_up_run(&format!("{round}-{n}"), stdout_bytes);
                let started = Instant::now();
                store.append(&record, Some("bench"))?;
                latencies.push(started.elapsed());
            }
        }
        Variant::PlainFull | Variant::PlainNormal => {
            let connection = Connection::open(path)?;
            let _: String = connection.pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))?;
            let synchronous = if matches!(variant, Variant::PlainFull) { "FULL" } else { "NORMAL" };
            connection.pragma_update(None, "synchronous", synchronous)?;
            connection.execute_batch("CREATE TABLE runs (seq INTEGER PRIMARY KEY, run_id TEXT, record TEXT)")?;
            for n in 0..count {
                let record = made_up_run(&format!("{round}-{n}"), stdout_bytes);
                let started = Instant::now();
                // The serialisation is timed in both variants: append does it too.
                let json = serde_json::to_string(&record)?;
                connection.execute("INSERT INTO runs (run_id, record) VALUES (?1, ?2)", [&record.id, &json])?;
                latencies.push(started.elapsed());
            }
        }
    }
    Ok(latencies)
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn made_up_run(id: &str, stdout_bytes: usize) -> RunRecord {
    let code = "import statistics\nprint(statistics.mean(range(1000)))\n".to_owned();
    RunRecord {
        schema_version: airlock_policy::RECORD_SCHEMA_VERSION,
        id: id.to_owned(),
        started_at: airlock_core::record::now_rfc3339(),
        status: Status::Ok,
        exit_code: Some(0),
        stdout: "x".repeat(stdout_bytes),
        code_sha256: airlock_core::sha256_hex(code.as_bytes()),
        code,
        policy: Policy::default().to_spec(),
        ..RunRecord::default()
    }
}
