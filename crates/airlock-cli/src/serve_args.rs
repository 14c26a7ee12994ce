//! The arguments of `airlock serve` (HTTP API and MCP at /mcp) and `airlock
//! mcp` (MCP over stdio), shared by both binaries of this package: `airlock`
//! parses them, so that its help documents them and misuse is refused as
//! before, then hands the command to `airlock-serve`, which runs the server.
//!
//! Nothing here may use airlock_server: `airlock` includes this module, and
//! linking the server into it slowed every cold `airlock run` (see
//! `serve_exec`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// The subcommands that serve agents.
#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    /// Serve the HTTP API, and MCP over streamable HTTP at /mcp.
    Serve(ServeArgs),
    /// Serve MCP on standard input and output, for an agent that starts airlock itself.
    Mcp(McpArgs),
}

/// The arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The operator's config: defaults, ceilings, tokens, files (TOML; see `airlock_server::config`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen on this address instead of the config's [default: 127.0.0.1:8750].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Copy a host file into every run's /work: HOST_PATH[:SANDBOX_PATH]. Repeatable.
    #[arg(long = "file", value_name = "HOST[:SANDBOX]")]
    pub files: Vec<String>,
}

/// The arguments of `mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The operator's config: defaults, ceilings, files (TOML). Tokens are not used over stdio.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Copy a host file into every run's /work: HOST_PATH[:SANDBOX_PATH]. Repeatable.
    #[arg(long = "file", value_name = "HOST[:SANDBOX]")]
    pub files: Vec<String>,
    /// The name runs are recorded under in the audit store.
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// Sandboxes kept ready, preload imported, so that a run answers in
    /// milliseconds [default: the config's [pool], else 1]; 0: every run cold.
    #[arg(long, value_name = "N")]
    pub pool: Option<usize>,
}
