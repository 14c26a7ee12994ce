//! Drives the audit store by hand, as `airlock audit` will:
//!
//! ```text
//! cargo run -p airlock-audit --example audit -- [--db FILE] verify [--anchor SEQ:HASH]
//! cargo run -p airlock-audit --example audit -- [--db FILE] show RUN_ID
//! cargo run -p airlock-audit --example audit -- [--db FILE] list [--status S] [--principal NAME]
//!                                                  [--since TIME] [--until TIME] [--limit N] [--cursor C]
//! cargo run -p airlock-audit --example audit -- [--db FILE] demo N     # append N made-up runs
//! ```
//!
//! Without `--db` it uses the default database in airlock's data directory.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_audit::{AuditStore, ChainHead, ListFilter};
use airlock_policy::{Policy, RunRecord, Status, Usage};
use anyhow::{Context, bail};

fn main() -> anyhow::Result<ExitCode> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let path = match take_option(&mut args, "--db")? {
        Some(path) => PathBuf::from(path),
        None => AuditStore::default_path()?,
    };
    let command = if args.is_empty() { String::new() } else { args.remove(0) };
    // Only `demo` writes; reading a store that is not there is a wrong path.
    let store = if command == "demo" { AuditStore::open(&path)? } else { AuditStore::open_existing(&path)? };
    match command.as_str() {
        "verify" => {
            let report = match take_option(&mut args, "--anchor")? {
                Some(text) => {
                    let anchor = ChainHead::parse(&text).context("--anchor takes SEQ:HASH, as verify prints it")?;
                    store.verify_anchored(&anchor)?
                }
                None => store.verify()?,
            };
            println!("{report}");
            return Ok(if report.is_intact() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        }
        "show" => {
            let [run_id] = args.as_slice() else { bail!("show takes one run id") };
            let run = store.get(run_id)?.with_context(|| format!("no run {run_id} in {}", path.display()))?;
            print!("{}", airlock_audit::render(&run));
        }
        "list" => {
            let filter = ListFilter {
                status: take_option(&mut args, "--status")?
                    .map(|name| Status::parse(&name).with_context(|| format!("{name:?} is not a status")))
                    .transpose()?,
                principal: take_option(&mut args, "--principal")?,
                since: take_option(&mut args, "--since")?,
                until: take_option(&mut args, "--until")?,
                limit: take_option(&mut args, "--limit")?.map(|n| n.parse()).transpose()?,
                cursor: take_option(&mut args, "--cursor")?,
            };
            let page = store.list(&filter)?;
            for run in &page.runs {
                let who = run.principal.as_deref().unwrap_or("-");
                println!("{:>6}  {}  {}  {:<13}  {who}", run.seq, run.started_at, run.run_id, run.status.name());
            }
            if let Some(cursor) = page.next_cursor {
                println!("more: --cursor {cursor}");
            }
        }
        "demo" => {
            let [count] = args.as_slice() else { bail!("demo takes a count") };
            for n in 0..count.parse::<u32>()? {
                let entry = store.append(&made_up_run(n), Some("demo"))?;
                println!("{} {}", entry.seq, entry.run_id);
            }
        }
        _ => bail!("usage: audit [--db FILE] verify [--anchor SEQ:HASH] | show RUN_ID | list [filters] | demo N"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes `--name VALUE` from `args`, returning the value.
fn take_option(args: &mut Vec<String>, name: &str) -> anyhow::Result<Option<String>> {
    let Some(at) = args.iter().position(|arg| arg == name) else {
        return Ok(None);
    };
    if at + 1 >= args.len() {
        bail!("{name} needs a value");
    }
    let value = args.remove(at + 1);
    args.remove(at);
    Ok(Some(value))
}

fn made_up_run(n: u32) -> RunRecord {
    let code = format!("total = sum(range({n}))\nprint(total)\ntotal * 2\n");
    let total: u64 = (0..u64::from(n)).sum();
    RunRecord {
        schema_version: airlock_policy::RECORD_SCHEMA_VERSION,
        id: airlock_core::record::new_id(),
        started_at: airlock_core::record::now_rfc3339(),
        status: Status::Ok,
        exit_code: Some(0),
        stdout: format!("{total}\n"),
        code_sha256: airlock_core::sha256_hex(code.as_bytes()),
        code,
        policy: Policy::default().to_spec(),
        value: Some((total * 2).to_string()),
        usage: Usage {
            wall_ms: 40 + u64::from(n % 7),
            cpu_ms: Some(30),
            peak_memory_bytes: Some(9 << 20),
            ..Usage::default()
        },
        ..RunRecord::default()
    }
}
