//! The engine every guest runs on, and the compiling of the interpreter
//! for it into the cache (`cache.rs`). Only the worker binary has this
//! (the `worker` feature): the supervisor asks a worker (`compile.rs`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use wasmtime::{Config, Engine, Module};

use crate::cache::{CacheError, WASMTIME_VERSION, cache_path, check_path, open_checked, stamp, write_json};
use crate::install::{InstallProgress, InstalledInterpreter, check_file_sha256};

/// The guest's wasm stack: CPython's recursion needs more than the default.
const WASM_STACK: usize = 8 << 20;
/// The fiber stack the guest runs on: the wasm stack plus room for host calls.
const ASYNC_STACK: usize = 16 << 20;

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

fn write_record(cache: &Path, sha256: &str, meta: &fs::Metadata, engine: &Engine) -> std::io::Result<()> {
    let record = json!({
        "sha256": sha256,
        "stamp": stamp(meta),
        "wasmtime": WASMTIME_VERSION,
        "engine": engine_hash(engine),
    });
    write_json(cache, &record)
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
