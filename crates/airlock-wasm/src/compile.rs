//! The compiled interpreter is made and checked in a worker process, never
//! in the supervisor.
//!
//! Making sure the cache holds a trusted compiled interpreter
//! (`engine::ensure`) needs wasmtime and Cranelift: an engine, whose
//! configuration hash the cache's record is checked against, and the
//! compiler, for a first use. The supervisor runs it as a child:
//! `airlock-wasm-worker --compile <interpreter>`, which writes one JSON
//! [`Message`] per line on its standard output, its progress and then its
//! answer. So no front door runs wasmtime, and almost none of it is linked
//! into one (about 140 KB of its 15 MB stay, kept by its statics): it lives
//! in the worker binary, which hosts every guest anyway. In the `airlock`
//! command its code and relocations cost every cold run of the Linux
//! backend about 0.4 ms before `main` (bench/results/startup.md, stop 37);
//! and the compiler, fed the snapshot after its SHA-256 matched, now runs in
//! a process of its own rather than inside the supervisor.
//!
//! The price is a process per supervisor, at its first use of the backend:
//! a few milliseconds beside a wasm run's tens.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::cache::{self, CacheError};
use crate::install::{InstallProgress, InstalledInterpreter};

/// The worker's argument that asks for `worker_main`, followed by the
/// supervisor's pid and the installed interpreter as JSON.
pub const COMPILE_ARG: &str = "--compile";

/// The longest line the supervisor reads from the worker: a message is a
/// few hundred bytes.
const MAX_LINE: u64 = 1 << 20;

/// One line of the worker's standard output.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    Progress(InstallProgress),
    /// The cache file, checked (and compiled first if it had to be).
    Ready(PathBuf),
    /// Why not, as [`CacheError`] says it.
    Failed(String),
}

/// The worker, killed and reaped if the supervisor stops reading it early.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `engine::ensure`, in `worker`: returns the checked cache file's path,
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
    let mut child = Worker(
        Command::new(worker)
            .arg(COMPILE_ARG)
            .arg(std::process::id().to_string())
            .arg(interpreter)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(started)?,
    );
    let stdout = child.0.stdout.take().ok_or_else(|| CacheError::Worker("no pipe from the worker".to_owned()))?;
    let mut lines = BufReader::new(stdout);
    let mut last = None;
    loop {
        let mut line = Vec::new();
        let read = (&mut lines).take(MAX_LINE).read_until(b'\n', &mut line);
        let read = read.map_err(|e| CacheError::Io { context: "reading the worker's answer".to_owned(), source: e })?;
        if read == 0 {
            break;
        }
        // The first line that is not a message, or the first failure, is the answer.
        match serde_json::from_slice::<Message>(&line) {
            Ok(Message::Progress(step)) => progress(step),
            Ok(Message::Ready(path)) => last = Some(path),
            Ok(Message::Failed(why)) => return Err(CacheError::Worker(why)),
            Err(e) => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                return Err(CacheError::Worker(format!("it wrote {shown:?}, not a message: {e}")));
            }
        }
    }
    let status =
        child.0.wait().map_err(|e| CacheError::Io { context: "waiting for the worker".to_owned(), source: e })?;
    let expected = cache::cache_path(installed);
    match last {
        Some(path) if status.success() && path == expected => Ok(path),
        Some(path) if status.success() => Err(CacheError::Worker(format!(
            "it answered {}, not the cache file {}",
            path.display(),
            expected.display()
        ))),
        _ => Err(CacheError::Worker(format!(
            "{} {COMPILE_ARG} ended ({status}) without an answer: its standard error, above, says why (a worker \
             from another airlock version does not know {COMPILE_ARG})",
            worker.display()
        ))),
    }
}

#[cfg(feature = "worker")]
/// The worker's side: `airlock-wasm-worker --compile <supervisor pid>
/// <interpreter as JSON>`. Exits 0 with [`Message::Ready`] last, else 1 with
/// [`Message::Failed`]. It dies with the supervisor (a first compile takes
/// a minute and 2 GB, for no one once the supervisor is gone), and holds no
/// descriptor of the supervisor's but its three standard ones.
pub fn worker_main() -> ! {
    match prepare() {
        // Not answered, it is not ready: the supervisor stopped reading.
        Ok(path) => std::process::exit(if say(&Message::Ready(path)) { 0 } else { 1 }),
        Err(why) => {
            say(&Message::Failed(why));
            std::process::exit(1)
        }
    }
}

/// What [`worker_main`] answers.
#[cfg(feature = "worker")]
fn prepare() -> Result<PathBuf, String> {
    airlock_linux::confine::close_from_except(3, -1).map_err(|e| format!("closing inherited descriptors: {e}"))?;
    let mut args = std::env::args().skip(2);
    let (supervisor, interpreter) = (args.next().unwrap_or_default(), args.next().unwrap_or_default());
    let supervisor = supervisor.parse().map_err(|_| format!("{COMPILE_ARG} takes the supervisor's pid first"))?;
    airlock_linux::confine::die_with_parent(Some(supervisor)).map_err(|e| e.to_string())?;
    let installed = serde_json::from_str::<InstalledInterpreter>(&interpreter)
        .map_err(|e| format!("{COMPILE_ARG} takes the installed interpreter as JSON: {e}"))?;
    let engine = crate::engine::engine().map_err(|e| e.to_string())?;
    // A step not told is no matter: the answer is what counts.
    let mut progress = |step| {
        let _ = say(&Message::Progress(step));
    };
    crate::engine::ensure(&engine, &installed, &mut progress).map_err(|e| e.to_string())
}

/// Writes `message` as one line on standard output; false if the supervisor
/// stopped reading it.
#[cfg(feature = "worker")]
fn say(message: &Message) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, message).is_ok() && out.write_all(b"\n").is_ok() && out.flush().is_ok()
}
