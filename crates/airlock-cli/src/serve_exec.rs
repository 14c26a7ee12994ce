//! `airlock serve`, `airlock mcp` and the audit console (`airlock audit ui`,
//! `airlock audit show --html`): an exec of `airlock-serve`, the binary that
//! runs them, found beside this one.
//!
//! The server (HTTP, MCP, the console's templates) is a binary of its own so
//! that `airlock` does not link it: linked in, it cost every cold `airlock
//! run` about 0.2 ms at its start (more relocations to apply and pages to
//! fault in before `main`), for subcommands a run never uses.

use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use airlock::audit::{AuditStore, StoredRun};
use anyhow::anyhow;

use crate::entry::STARTED_BY_ENV;

/// The environment variable naming `airlock-serve`, for installs where it is
/// not beside the `airlock` program.
pub const SERVE_ENV: &str = "AIRLOCK_SERVE";
/// The server binary's file name.
pub const SERVE_NAME: &str = "airlock-serve";

/// How to get the server binary, said wherever it cannot be run.
const FIX: &str = "build it beside airlock (`scripts/build` or `cargo build --release` builds both binaries of \
                   airlock-cli, airlock and airlock-serve), or set AIRLOCK_SERVE to its path";

/// Replaces this process with `airlock-serve`, given this command's
/// arguments unchanged (`airlock serve --config X` runs `airlock-serve serve
/// --config X`) and its environment and descriptors. The process keeps its
/// pid: an MCP client that started `airlock mcp` talks to the server over
/// the pipes it gave it, and a signal sent to the pid it spawned reaches the
/// server. Returns only if the exec failed, with what to do about it.
pub fn exec() -> anyhow::Error {
    let (path, origin) = match server_path() {
        Ok(found) => found,
        Err(error) => return error,
    };
    // Named to it so that, should it refuse arguments this program accepted
    // (a stale airlock-serve), it says the builds differ (`entry`).
    let airlock = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("airlock"));
    let error = Command::new(&path).args(std::env::args_os().skip(1)).env(STARTED_BY_ENV, airlock).exec();
    let shown = path.display();
    if error.kind() == ErrorKind::NotFound && !path.is_file() {
        anyhow!("this subcommand is run by {SERVE_NAME}, {origin} {shown}, which is missing: {FIX}")
    } else {
        anyhow!("this subcommand is run by {SERVE_NAME}, {origin} {shown}, which could not be started: {error}; {FIX}")
    }
}

/// Where `airlock-serve` is, and how it was found: the path in
/// [`SERVE_ENV`], else the file of that name beside the running program
/// (its real folder: `current_exe` follows a link to `airlock`).
fn server_path() -> anyhow::Result<(PathBuf, String)> {
    if let Some(path) = std::env::var_os(SERVE_ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        // Never looked up in PATH or the working directory.
        if !path.is_absolute() {
            return Err(anyhow!(
                "{SERVE_ENV}={} is not an absolute path: name {SERVE_NAME} by its full path",
                path.display()
            ));
        }
        return Ok((path, format!("named by {SERVE_ENV}:")));
    }
    let exe = std::env::current_exe()
        .map_err(|error| anyhow!("finding this program's folder, where {SERVE_NAME} sits, failed: {error}; {FIX}"))?;
    let folder = exe.parent().ok_or_else(|| anyhow!("this program's path, {}, has no folder; {FIX}", exe.display()))?;
    Ok((folder.join(SERVE_NAME), "looked for beside airlock at".to_owned()))
}

/// The audit console, as `audit_cmd` calls it: in this binary, an exec of
/// `airlock-serve` with the same arguments, which shows the run or serves the
/// console itself (its own `console` module).
pub mod console {
    use super::{AuditStore, StoredRun};

    /// Runs `airlock-serve audit show ID --html` in this process's place.
    pub fn report(_run: &StoredRun, _store: &AuditStore) -> anyhow::Result<String> {
        Err(super::exec())
    }

    /// Runs `airlock-serve audit ui` in this process's place, the store
    /// closed first (`airlock-serve` opens it again).
    pub fn ui(store: AuditStore, _listen: &str) -> anyhow::Result<()> {
        drop(store);
        Err(super::exec())
    }
}
