//! The engine and the compiled-module cache.
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
use std::time::Instant;

use serde_json::json;
use wasmtime::{Config, Engine, Module};

use crate::install::{InstallProgress, InstalledInterpreter, check_file_sha256, hash_reader};

/// The wasmtime version compiled modules are made by; part of the cache key.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// The guest's wasm stack: CPython's recursion needs more than the default.
const WASM_STACK: usize = 8 << 20;
/// The fiber stack the guest runs on: the wasm stack plus room for host calls.
const ASYNC_STACK: usize = 16 << 20;

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

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CacheError {
    move |source| CacheError::Io { context: context.into(), source }
}

/// The one engine configuration every module is compiled and run with.
///
/// No epoch interruption: the guest's time is kept from outside its worker,
/// which the supervisor kills at the wall-time or CPU-time limit, so nothing
/// in the worker ever advanced an epoch. Its checks, compiled into every
/// loop and function entry of the interpreter, cost CPU time on every run
/// and stopped nothing.
pub fn engine() -> Result<Engine, CacheError> {
    let mut config = Config::new();
    config.wasm_exceptions(true).max_wasm_stack(WASM_STACK).async_stack_size(ASYNC_STACK);
    Engine::new(&config).map_err(|e| CacheError::Engine(format!("{e:#}")))
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

fn check_path(cache: &Path) -> PathBuf {
    cache.with_extension("check")
}

/// Makes sure the cache holds a trusted compiled interpreter for this
/// engine, compiling it first if not; returns the cache file's path.
pub fn ensure(
    engine: &Engine,
    installed: &InstalledInterpreter,
    progress: &mut dyn FnMut(InstallProgress),
) -> Result<PathBuf, CacheError> {
    let cache = cache_path(installed);
    match check(engine, &cache) {
        Ok(true) => return Ok(cache),
        Ok(false) => {}
        Err(reason) => {
            progress(InstallProgress::CacheRejected { cache: cache.clone(), reason });
            let _ = fs::remove_file(&cache);
            let _ = fs::remove_file(check_path(&cache));
        }
    }
    compile(engine, installed, &cache, progress)?;
    match check(engine, &cache) {
        Ok(true) => Ok(cache),
        Ok(false) => Err(CacheError::Compile {
            module: installed.snapshot.clone(),
            reason: format!("{} vanished right after it was written", cache.display()),
        }),
        Err(reason) => Err(CacheError::Compile { module: installed.snapshot.clone(), reason }),
    }
}

/// The cached module, opened read-only for a worker to map, after checking
/// it is the file this code wrote.
pub fn open(cache: &Path) -> Result<File, CacheError> {
    let refused = |reason: String| CacheError::Untrusted { cache: cache.to_owned(), reason };
    let (file, _) = open_checked(cache).map_err(refused)?.ok_or_else(|| refused("it is missing".to_owned()))?;
    Ok(file)
}

/// The identity of a file as the filesystem reports it.
fn stamp(meta: &fs::Metadata) -> serde_json::Value {
    json!({
        "dev": meta.dev(),
        "ino": meta.ino(),
        "size": meta.size(),
        "mtime": [meta.mtime(), meta.mtime_nsec()],
        "ctime": [meta.ctime(), meta.ctime_nsec()],
    })
}

/// A hash of the configuration modules are compiled for: a module compiled
/// for another configuration would be refused by wasmtime when mapped.
fn engine_hash(engine: &Engine) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Whether a usable module is in the cache: `Ok(false)` when there is none;
/// `Err(why)` when there is one that must not be used.
fn check(engine: &Engine, cache: &Path) -> Result<bool, String> {
    let Some((file, record)) = open_checked(cache)? else { return Ok(false) };
    if record.get("engine").and_then(|v| v.as_str()) == Some(engine_hash(engine).as_str()) {
        return Ok(true);
    }
    // Written for another configuration, or before the record named one:
    // wasmtime itself says whether it fits, once, and the record learns it.
    // SAFETY: `file` holds native code this module compiled and wrote: its
    // stamp or its full SHA-256 matches the record taken when it was
    // written (`open_checked`), so its content is what
    // `Engine::precompile_module` produced; wasmtime checks version and
    // configuration compatibility itself. The cache is only ever replaced by
    // rename, never written in place, so the mapped file cannot change under
    // the module.
    let module = unsafe { Module::deserialize_open_file(engine, file) };
    drop(module.map_err(|e| format!("wasmtime refused it: {e:#}"))?);
    let sha256 = record.get("sha256").and_then(|v| v.as_str()).unwrap_or_default();
    let meta = fs::metadata(cache).map_err(|e| format!("cannot stat it: {e}"))?;
    let _ = write_record(cache, sha256, &meta, engine);
    Ok(true)
}

/// Opens the cache file and checks it against its record; returns it with
/// the record, `Ok(None)` when there is no file.
fn open_checked(cache: &Path) -> Result<Option<(File, serde_json::Value)>, String> {
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

fn write_record(cache: &Path, sha256: &str, meta: &fs::Metadata, engine: &Engine) -> std::io::Result<()> {
    let record = json!({
        "sha256": sha256,
        "stamp": stamp(meta),
        "wasmtime": WASMTIME_VERSION,
        "engine": engine_hash(engine),
    });
    write_json(cache, &record)
}

fn write_json(cache: &Path, record: &serde_json::Value) -> std::io::Result<()> {
    let path = check_path(cache);
    let tmp = path.with_extension("check.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(record.to_string().as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, &path)
}

/// Compiles the snapshot and writes the cache atomically, with its record.
fn compile(
    engine: &Engine,
    installed: &InstalledInterpreter,
    cache: &Path,
    progress: &mut dyn FnMut(InstallProgress),
) -> Result<(), CacheError> {
    let failed = |reason: String| CacheError::Compile { module: installed.snapshot.clone(), reason };
    check_file_sha256(&installed.snapshot, &installed.snapshot_sha256)?;
    progress(InstallProgress::Compiling { module: installed.snapshot.clone() });
    let started = Instant::now();
    let wasm = fs::read(&installed.snapshot).map_err(io_err(format!("reading {}", installed.snapshot.display())))?;
    let native = engine.precompile_module(&wasm).map_err(|e| failed(format!("{e:#}")))?;
    drop(wasm);
    let sha256 = airlock_core::sha256_hex(&native);
    let dir = cache.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".compiled-")
        .tempfile_in(dir)
        .map_err(io_err(format!("making a temporary file in {}", dir.display())))?;
    tmp.write_all(&native).and_then(|()| tmp.as_file().sync_all()).map_err(io_err("writing the compiled module"))?;
    drop(native);
    tmp.persist(cache).map_err(|e| io_err(format!("moving the compiled module to {}", cache.display()))(e.error))?;
    // The stamp is taken after the rename, which may itself move ctime.
    let meta = fs::metadata(cache).map_err(io_err(format!("reading {}", cache.display())))?;
    write_record(cache, &sha256, &meta, engine).map_err(io_err("writing the cache's check record"))?;
    progress(InstallProgress::Compiled { cache: cache.to_owned(), seconds: started.elapsed().as_secs_f64() });
    Ok(())
}
