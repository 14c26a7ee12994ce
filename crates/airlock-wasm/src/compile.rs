//! The compiled interpreter is made and checked in a worker process, never
//! in the supervisor.
//!
//! Making sure the cache holds a trusted compiled interpreter
//! ([`cache::ensure`]) needs wasmtime and Cranelift: an engine, whose
//! configuration hash the cache's record is checked against, and the
//! compiler, for a first use. The supervisor runs it as a child:
//! `airlock-wasm-worker --compile <interpreter>`, which writes one JSON
//! [`Message`] per line on its standard output, its progress and then its
//! answer. So no front door links wasmtime: it lives only in the worker
//! binary, which hosts every guest anyway. That keeps it out of the
//! `airlock` command, where its code and relocations cost every cold run of
//! the Linux backend about 0.4 ms before `main` (bench/results/startup.md,
//! stop 37); and the compiler, fed the snapshot after its SHA-256 matched,
//! runs in a process of its own rather than inside the supervisor.
//!
//! The price is a process per supervisor, at its first use of the backend:
//! a few milliseconds beside a wasm run's tens.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::cache::{self, CacheError};
use crate::install::{InstallProgress, InstalledInterpreter};

/// The worker's argument that asks for [`worker_main`].
pub const COMPILE_ARG: &str = "--compile";

/// One line of the worker's standard output.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    Progress(InstallProgress),
    /// The cache file, checked (and compiled first if it had to be).
    Ready(PathBuf),
    /// Why not, as [`CacheError`] says it.
    Failed(String),
}

/// [`cache::ensure`], in `worker`: returns the checked cache file's path,
/// passing the worker's progress on to `progress`.
pub fn ensure_in_worker(
    worker: &Path,
    installed: &InstalledInterpreter,
    progress: &mut dyn FnMut(InstallProgress),
) -> Result<PathBuf, CacheError> {
    let interpreter = serde_json::to_string(installed).map_err(|e| CacheError::Worker(e.to_string()))?;
    let started = |e: std::io::Error| CacheError::Io { context: format!("starting {}", worker.display()), source: e };
    // Its standard error is the caller's, so that a worker that dies
    // (a panic, the memory a first compile takes) says why where the
    // caller's own errors go.
    let mut child = Command::new(worker)
        .arg(COMPILE_ARG)
        .arg(interpreter)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(started)?;
    let mut answer = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line =
                line.map_err(|e| CacheError::Io { context: "reading the worker's answer".to_owned(), source: e })?;
            match serde_json::from_str::<Message>(&line) {
                Ok(Message::Progress(step)) => progress(step),
                Ok(Message::Ready(path)) => answer = Some(Ok(path)),
                Ok(Message::Failed(why)) => answer = Some(Err(CacheError::Worker(why))),
                Err(e) => answer = Some(Err(CacheError::Worker(format!("it wrote {line:?}, not a message: {e}")))),
            }
        }
    }
    let status =
        child.wait().map_err(|e| CacheError::Io { context: "waiting for the worker".to_owned(), source: e })?;
    match answer {
        Some(Ok(path)) if status.success() => Ok(path),
        Some(Err(e)) => Err(e),
        _ => Err(CacheError::Worker(format!(
            "{} {COMPILE_ARG} ended ({status}) without an answer; its standard error says why",
            worker.display()
        ))),
    }
}

/// The worker's side: `airlock-wasm-worker --compile <interpreter as JSON>`.
/// Exits 0 with [`Message::Ready`] last, else 1 with [`Message::Failed`].
pub fn worker_main() -> ! {
    let mut out = std::io::stdout().lock();
    let mut say = |message: &Message| {
        // Nothing to do if the supervisor stopped reading: it has gone.
        let _ = serde_json::to_writer(&mut out, message).map(|()| out.write_all(b"\n")).map(|_| out.flush());
    };
    let interpreter = std::env::args().nth(2).unwrap_or_default();
    let outcome = serde_json::from_str::<InstalledInterpreter>(&interpreter)
        .map_err(|e| format!("{COMPILE_ARG} takes the installed interpreter as JSON: {e}"))
        .and_then(|installed| {
            let engine = cache::engine().map_err(|e| e.to_string())?;
            cache::ensure(&engine, &installed, &mut |step| say(&Message::Progress(step))).map_err(|e| e.to_string())
        });
    match outcome {
        Ok(path) => {
            say(&Message::Ready(path));
            std::process::exit(0)
        }
        Err(why) => {
            say(&Message::Failed(why));
            std::process::exit(1)
        }
    }
}
