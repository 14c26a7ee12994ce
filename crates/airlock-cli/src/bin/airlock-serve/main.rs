//! `airlock-serve`: airlock served to agents, as the HTTP API and MCP, and
//! the audit console.
//!
//! `airlock serve`, `airlock mcp`, `airlock audit ui` and `airlock audit show
//! --html` exec this binary, which sits beside `airlock`, with their
//! arguments unchanged. The server (HTTP, MCP, the console's templates) is
//! linked here alone: in `airlock` it cost every cold `airlock run` about
//! 0.2 ms at its start, in relocations and page faults before `main`.

#[path = "../../audit_cmd.rs"]
mod audit_cmd;
mod console;
#[path = "../../entry.rs"]
mod entry;
#[path = "../../serve_args.rs"]
mod serve_args;
mod serve_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::serve_args::ServerCommand;

/// Serve airlock to agents: the HTTP API, and MCP over HTTP or stdio.
/// `airlock serve` and `airlock mcp` run this.
#[derive(Debug, Parser)]
#[command(name = "airlock-serve", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands: `airlock`'s that use the server crate.
#[derive(Debug, Subcommand)]
enum Command {
    /// `serve` and `mcp`, as `airlock` documents them.
    #[command(flatten)]
    Server(ServerCommand),
    /// `airlock audit`, run here for `audit ui` and `audit show --html`,
    /// which use the console; not listed, since `airlock audit` is its name.
    #[command(hide = true)]
    Audit(audit_cmd::AuditArgs),
}

fn main() -> ExitCode {
    entry::main(|cli: Cli| match cli.command {
        Command::Server(ServerCommand::Serve(args)) => serve_cmd::serve(args).map(|()| ExitCode::SUCCESS),
        Command::Server(ServerCommand::Mcp(args)) => serve_cmd::mcp(args).map(|()| ExitCode::SUCCESS),
        Command::Audit(args) => audit_cmd::run(args),
    })
}
