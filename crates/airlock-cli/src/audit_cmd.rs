//! `airlock audit`: check the chain, show a run, list runs, and browse them
//! all in the console on loopback.
//!
//! Both binaries of this package include this module. The console (`show
//! --html` and `ui`) is `crate::console`: in `airlock-serve`, which links the
//! server crate it comes from, the console itself; in `airlock`, which does
//! not (for its cold start), an exec of `airlock-serve`.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock::Status;
use airlock::audit::{AuditStore, ChainHead, ListFilter};
use anyhow::Context;
use clap::{Args, Subcommand};

/// The exit status of `airlock audit verify` when the chain is broken.
pub const CHAIN_BROKEN: u8 = 1;

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The audit database [default: audit.sqlite3 in airlock's data directory, AIRLOCK_HOME].
    #[arg(long, value_name = "FILE", global = true)]
    db: Option<PathBuf>,
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Check the hash chain and name the first broken link (exit status 1 if broken).
    Verify {
        /// Also check that this entry, noted earlier as SEQ:HASH, is still there unchanged.
        #[arg(long, value_name = "SEQ:HASH")]
        anchor: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print one run: its code beside its output, status, policy and place in the chain.
    Show {
        /// The run id.
        id: String,
        /// Print the stored entry as JSON.
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Print a self-contained HTML report (figures embedded, readable offline): `> run.html`.
        #[arg(long)]
        html: bool,
    },
    /// Browse the runs in the audit console, served on loopback for you alone.
    Ui {
        /// Where to listen: a loopback address [default: 127.0.0.1:0, a free port].
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Bring a store written by an older airlock to the current schema (the
    /// other commands read it as it is; recording a run migrates it too).
    Migrate,
    /// List runs, newest first.
    List {
        /// Only runs with this status (ok, failed, timeout, memory_limit, cpu_limit, output_limit, sandbox_error, internal_error).
        #[arg(long)]
        status: Option<String>,
        /// Only runs started at or after this time (RFC 3339, or a date).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only runs started before this time (RFC 3339, or a date).
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Only runs asked for by the token of this name.
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// Runs per page (1 to 1000) [default: 50].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// The cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
        /// Print the page as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let path = match args.db {
        Some(path) => path,
        None => AuditStore::default_path()?,
    };
    // Every subcommand but migrate only reads: a missing file is a wrong
    // path, not a store to start, and an older schema is read as it is.
    let store = AuditStore::open_existing(&path)?;
    if let AuditCommand::Migrate = args.command {
        let was_current = store.is_current();
        drop(store);
        let store = AuditStore::open(&path)?;
        let done = if was_current { "already had" } else { "now has" };
        println!("{} {done} audit schema version {}", store.path().display(), airlock::audit::SCHEMA_VERSION);
        return Ok(ExitCode::SUCCESS);
    }
    match args.command {
        AuditCommand::Verify { anchor, json } => {
            let report = match anchor {
                Some(text) => {
                    let anchor = ChainHead::parse(&text)
                        .with_context(|| format!("--anchor {text:?}: write SEQ:HASH, as verify prints the head"))?;
                    store.verify_anchored(&anchor)?
                }
                None => store.verify()?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{report}");
            }
            Ok(if report.is_intact() { ExitCode::SUCCESS } else { ExitCode::from(CHAIN_BROKEN) })
        }
        AuditCommand::Show { id, json, html } => {
            let run = store.get(&id)?.with_context(|| format!("there is no run {id:?} in {}", path.display()))?;
            if html {
                print!("{}", crate::console::report(&run, &store)?);
            } else if json {
                println!("{}", serde_json::to_string_pretty(&run)?);
            } else {
                print!("{}", airlock::audit::render(&run));
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Migrate => Ok(ExitCode::SUCCESS),
        AuditCommand::Ui { listen } => {
            crate::console::ui(store, &listen)?;
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::List { status, since, until, principal, limit, cursor, json } => {
            let status = status
                .map(|name| {
                    Status::parse(&name).with_context(|| {
                        let names: Vec<&str> = Status::ALL.iter().map(|s| s.name()).collect();
                        format!("--status {name:?}: use one of {}", names.join(", "))
                    })
                })
                .transpose()?;
            let page = store.list(&ListFilter { status, since, until, principal, limit, cursor })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&page)?);
                return Ok(ExitCode::SUCCESS);
            }
            for run in &page.runs {
                let who = run.principal.as_deref().unwrap_or("-");
                let language = run.language.map_or("-", |l| l.name());
                println!(
                    "{:>6}  {}  {}  {:<13}  {language:<6}  {}",
                    run.seq,
                    run.started_at,
                    run.run_id,
                    run.status.name(),
                    who.escape_debug()
                );
            }
            if let Some(cursor) = page.next_cursor {
                println!("more: --cursor {cursor}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
