//! The compiled-module cache: where the compiled interpreter is kept, and
//! whether a file there is one this code wrote. Making it, and the engine it
//! is made for, is the worker's (`engine.rs`): no front door links wasmtime.
//!
//! Compiling the 100 MB interpreter module takes about a minute and 2 GB of
//! memory, so it is done once and the native code kept at
//! `<install>/compiled-<wasmtime version>-<snapshot sha256 prefix>.cwasm`,
//! with a record beside it (`.check`): the file's SHA-256, taken when it was
//! written, its identity stamp (device, inode, size, mtime, ctime), and a
//! hash of the engine configuration it was compiled for.
//!
//! Mapping a `.cwasm` runs whatever native code it holds, so a file is used
//! only when it is one this code wrote: its stamp matches the record (no write
//! since, as a write moves ctime, which no user call can set back), or else its
//! whole content hashes to the recorded SHA-256. Anything else, including a
//! file wasmtime itself rejects, is deleted and compiled again. The
//! supervisor checks the file and opens it ([`open`]); each guest's worker
//! maps it read-only from that descriptor, so the supervisor itself never
//! loads the interpreter.

use std::fs::{self, File};
use std::io::{Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::install::{InstalledInterpreter, hash_reader};

/// The wasmtime version compiled modules are made by; part of the cache key.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Why the module could not be loaded or compiled.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("wasmtime refused the engine configuration: {0}")]
    Engine(String),
    #[error("compiling {module} failed: {reason}")]
    Compile { module: PathBuf, reason: String },
    #[error("the snapshot does not match its listed SHA-256; reinstall with `airlock backend install wasm`: {0}")]
    Snapshot(#[from] crate::install::InstallError),
    #[error(
        "the compiled interpreter {cache} cannot be used ({reason}); run `airlock backend install wasm` to compile it again"
    )]
    Untrusted { cache: PathBuf, reason: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// From the worker that checks and compiles it (`compile.rs`).
    #[error("the worker that checks the compiled interpreter: {0}")]
    Worker(String),
}

/// The cache file for `installed`.
pub fn cache_path(installed: &InstalledInterpreter) -> PathBuf {
    cache_path_for(&installed.dir, &installed.snapshot_sha256)
}

/// The cache file in the install folder `dir` for the snapshot with this SHA-256.
pub fn cache_path_for(dir: &Path, snapshot_sha256: &str) -> PathBuf {
    let key = snapshot_sha256.get(..16).unwrap_or(snapshot_sha256);
    dir.join(format!("compiled-{WASMTIME_VERSION}-{key}.cwasm"))
}

pub(crate) fn check_path(cache: &Path) -> PathBuf {
    cache.with_extension("check")
}

/// The cached module, opened read-only for a worker to map, after checking
/// it is the file this code wrote.
pub fn open(cache: &Path) -> Result<File, CacheError> {
    let refused = |reason: String| CacheError::Untrusted { cache: cache.to_owned(), reason };
    let (file, _) = open_checked(cache).map_err(refused)?.ok_or_else(|| refused("it is missing".to_owned()))?;
    Ok(file)
}

/// The identity of a file as the filesystem reports it.
pub(crate) fn stamp(meta: &fs::Metadata) -> serde_json::Value {
    json!({
        "dev": meta.dev(),
        "ino": meta.ino(),
        "size": meta.size(),
        "mtime": [meta.mtime(), meta.mtime_nsec()],
        "ctime": [meta.ctime(), meta.ctime_nsec()],
    })
}

/// Opens the cache file and checks it against its record; returns it with
/// the record, `Ok(None)` when there is no file.
pub(crate) fn open_checked(cache: &Path) -> Result<Option<(File, serde_json::Value)>, String> {
    let mut file = match File::open(cache) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    // Checked on the open descriptor, which is what wasmtime maps: a rename
    // over the path after this point does not change what is loaded.
    let meta = file.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file".to_owned());
    }
    let mut record: serde_json::Value = fs::read(check_path(cache))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or("its check record is missing or unreadable")?;
    if record.get("stamp") != Some(&stamp(&meta)) {
        let recorded =
            record.get("sha256").and_then(|v| v.as_str()).ok_or("its check record has no sha256")?.to_owned();
        let found = hash_reader(&mut file).map_err(|e| format!("cannot read it: {e}"))?;
        if found != recorded {
            return Err(format!("its SHA-256 is {found}, not the {recorded} it was written with"));
        }
        // Same content, new identity (copied, restored from a backup): trust
        // it under its new stamp; the engine is checked again.
        record = json!({ "sha256": recorded, "stamp": stamp(&meta), "wasmtime": WASMTIME_VERSION });
        let _ = write_json(cache, &record);
        file.rewind().map_err(|e| format!("cannot read it: {e}"))?;
    }
    Ok(Some((file, record)))
}

pub(crate) fn write_json(cache: &Path, record: &serde_json::Value) -> std::io::Result<()> {
    let path = check_path(cache);
    let tmp = path.with_extension("check.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(record.to_string().as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, &path)
}
