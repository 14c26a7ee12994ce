//! Getting the files a lock pins: a content-addressed cache on the host,
//! filled by a download step in a sandbox whose only network is the package
//! index, and whose every file is hashed on the host, and refused on a
//! mismatch, before anything reads it.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_core::RuntimeMount;
use airlock_policy::RunRecord;
use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

use super::index::PackageIndex;
use super::lock::LockedFile;
use super::step::{Step, StepLimits, Steps};
use super::tags::normalize;
use crate::Error;
use crate::interpreter::Interpreter;

/// The downloader the step runs, with the host's interpreter.
const FETCH_PY: &str = include_str!("fetch.py");
/// Where the download step writes, inside its sandbox.
const DOWNLOADS: &str = "/opt/airlock-build/downloads";
/// Where the host's CA certificates appear in the download step.
const CA_FILE: &str = "/opt/airlock-build/ca-certificates.crt";

/// A file to have: which package it belongs to (for messages), and its pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub package: String,
    pub file: LockedFile,
}

/// Verified files by SHA-256: `<root>/<sha256>/<file name>`. A file enters
/// only after its hash matched, and is hashed again each time it is used.
#[derive(Clone, Debug)]
pub(crate) struct FileCache {
    pub root: PathBuf,
}

impl FileCache {
    pub fn path(&self, file: &LockedFile) -> PathBuf {
        self.root.join(&file.sha256).join(&file.file_name)
    }

    /// Whether the cache holds `file`, whole: hashed again now. A cached copy
    /// that no longer matches is removed (it is fetched again).
    pub fn holds(&self, file: &LockedFile) -> bool {
        let path = self.path(file);
        match hash_file(&path) {
            Ok((hash, _)) if hash == file.sha256 => true,
            Ok(_) => {
                let _ = fs::remove_file(&path);
                false
            }
            Err(_) => false,
        }
    }
}

/// Makes sure the cache holds every file of `wanted`, fetching the missing
/// ones in one download step. Returns the step's record when there was one.
pub(crate) fn ensure(
    cache: &FileCache,
    wanted: &[Wanted],
    index: &PackageIndex,
    python: &Interpreter,
    steps: &Steps<'_>,
) -> Result<Option<RunRecord>, Error> {
    let mut missing: Vec<&Wanted> = wanted.iter().filter(|w| !cache.holds(&w.file)).collect();
    missing.sort_by(|a, b| a.file.sha256.cmp(&b.file.sha256));
    missing.dedup_by(|a, b| a.file.sha256 == b.file.sha256);
    if missing.is_empty() {
        return Ok(None);
    }
    let fail = |reason: String| Error::ImageBuild { name: String::new(), reason };
    fs::create_dir_all(&cache.root).map_err(|e| fail(format!("creating {}: {e}", cache.root.display())))?;
    let incoming = cache.root.join(format!(".incoming-{}-{}", std::process::id(), unique()));
    create_private_dir(&incoming).map_err(|e| fail(format!("creating {}: {e}", incoming.display())))?;
    let result = download(cache, &missing, index, python, steps, &incoming);
    // Nothing the sandbox wrote stays behind, whatever happened.
    let _ = fs::remove_dir_all(&incoming);
    result
}

fn download(
    cache: &FileCache,
    missing: &[&Wanted],
    index: &PackageIndex,
    python: &Interpreter,
    steps: &Steps<'_>,
    incoming: &Path,
) -> Result<Option<RunRecord>, Error> {
    let fail = |reason: String| Error::ImageBuild { name: String::new(), reason };
    let mut runtime = python.runtime();
    runtime.describe = "an image build's download step".to_owned();
    runtime.mounts.push(RuntimeMount::writable(incoming, DOWNLOADS));
    let cafile = if index.url.starts_with("https://") || missing.iter().any(|w| w.file.url.starts_with("https://")) {
        Some(mount_ca_bundle(&mut runtime)?)
    } else {
        None
    };
    let files: Vec<serde_json::Value> = missing
        .iter()
        .map(|w| {
            serde_json::json!({
                "sha256": w.file.sha256,
                "file_name": w.file.file_name,
                "project": normalize(&w.package),
                // A file on the index's own hosts is fetched as the lock names
                // it; any other is looked up on the index by its file name.
                "url": index.serves(&w.file.url).then_some(&w.file.url),
            })
        })
        .collect();
    let plan = serde_json::json!({ "index": index.url, "out": DOWNLOADS, "cafile": cafile, "files": files });
    let total: u64 = missing.iter().map(|w| w.file.size.unwrap_or(256 << 20)).sum();
    let largest = missing.iter().map(|w| w.file.size.unwrap_or(1 << 30)).max().unwrap_or(0);
    let python_path = python.executable_inside().display().to_string();
    let step = Step {
        what: "download",
        limits: StepLimits {
            wall_time: Duration::from_secs(1800),
            hosts: index.allow_hosts(),
            bytes_in: total + (missing.len() as u64 + 16) * (4 << 20),
            disk_bytes: largest + (256 << 20),
        },
        runtime,
        inputs: vec![
            ("/work/fetch.py".to_owned(), FETCH_PY.as_bytes().to_vec()),
            ("/work/plan.json".to_owned(), plan.to_string().into_bytes()),
        ],
        script: format!("exec {} -I -S /work/fetch.py /work/plan.json\n", shell_quote(&python_path)),
        outputs: Vec::new(),
    };
    let outcome = steps.run(step).map_err(fail)?;
    let dir = open_dir(incoming).map_err(|e| fail(format!("opening {}: {e}", incoming.display())))?;
    // Every file is checked before any is kept: one mismatch keeps none.
    let mut checked = Vec::new();
    for wanted in missing {
        match take_verified(dir.as_fd(), wanted, cache) {
            Ok(tmp) => checked.push((tmp, cache.path(&wanted.file))),
            Err(e) => {
                for (tmp, _) in &checked {
                    let _ = fs::remove_file(tmp);
                }
                return Err(e);
            }
        }
    }
    for (tmp, path) in checked {
        fs::rename(&tmp, &path).map_err(|e| fail(format!("keeping {}: {e}", path.display())))?;
    }
    Ok(Some(outcome.record))
}

/// Copies the downloaded `wanted` out of the download folder into a
/// temporary file in the cache, hashing what it copies, and returns that
/// file if the hash is the lock's. Never follows a link the sandbox made.
fn take_verified(incoming: rustix::fd::BorrowedFd<'_>, wanted: &Wanted, cache: &FileCache) -> Result<PathBuf, Error> {
    let name = &wanted.file.file_name;
    let fail = |reason: String| Error::ImageBuild { name: String::new(), reason };
    let fd = rustix::fs::openat(
        incoming,
        wanted.file.sha256.as_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(format!("the download of {name} (package {}) did not arrive whole: {e}", wanted.package)))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| fail(format!("{name}: {e}")))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(fail(format!("the download of {name} is not a regular file")));
    }
    let dir = cache.root.join(&wanted.file.sha256);
    fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let tmp = dir.join(format!(".{name}.{}-{}.tmp", std::process::id(), unique()));
    let copied = copy_hashing(fs::File::from(fd), &tmp);
    let actual = match copied {
        Ok(hash) => hash,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(fail(format!("copying {name} into the cache: {e}")));
        }
    };
    if actual != wanted.file.sha256 {
        let _ = fs::remove_file(&tmp);
        return Err(Error::HashMismatch {
            package: wanted.package.clone(),
            file: name.clone(),
            expected: wanted.file.sha256.clone(),
            actual,
        });
    }
    Ok(tmp)
}

fn copy_hashing(mut from: fs::File, to: &Path) -> std::io::Result<String> {
    let mut out = fs::OpenOptions::new().write(true).create_new(true).open(to)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])?;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// SHA-256 and size of the regular file at `path`, never following a link.
pub(crate) fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let fd =
        rustix::fs::open(path, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())?;
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut file = fs::File::from(fd);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buffer[..n]);
    }
    Ok((hex::encode(hasher.finalize()), size))
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
}

/// A directory only its owner can enter: nothing a sandbox writes into it
/// is reachable by another user while the build runs.
pub(crate) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(0o700).create(path)
}

/// A number no other call in this process returns.
pub(crate) fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Mounts the host's CA certificates into a step that reaches the index
/// over TLS, and returns where they are inside: the host's trust (a
/// corporate CA, say) is the operator's, and the step checks the index
/// against it.
pub(crate) fn mount_ca_bundle(runtime: &mut airlock_core::Runtime) -> Result<&'static str, Error> {
    let found = ca_bundle().ok_or_else(|| Error::ImageBuild {
        name: String::new(),
        reason: "no CA certificates found on this host (looked for $SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt \
                 and the other usual places) to check the index's TLS certificate with; set SSL_CERT_FILE"
            .to_owned(),
    })?;
    runtime.mounts.push(RuntimeMount::read_only(found, CA_FILE));
    Ok(CA_FILE)
}

/// The host's CA certificates, for the steps' TLS.
fn ca_bundle() -> Option<PathBuf> {
    let from_env = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()).map(PathBuf::from);
    let usual = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ];
    from_env
        .into_iter()
        .chain(usual.iter().map(PathBuf::from))
        .find_map(|p| fs::canonicalize(p).ok().filter(|p| p.is_file()))
}

/// `text` as one word for /bin/sh.
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_file_that_no_longer_matches_is_dropped() {
        let root = tempfile::tempdir().unwrap();
        let cache = FileCache { root: root.path().to_owned() };
        let content = b"wheel bytes";
        let file = LockedFile {
            file_name: "x-1.0-py3-none-any.whl".into(),
            url: "https://files.example/x-1.0-py3-none-any.whl".into(),
            size: Some(content.len() as u64),
            sha256: hex::encode(Sha256::digest(content)),
        };
        assert!(!cache.holds(&file));
        fs::create_dir_all(cache.path(&file).parent().unwrap()).unwrap();
        fs::write(cache.path(&file), content).unwrap();
        assert!(cache.holds(&file));
        fs::write(cache.path(&file), b"tampered").unwrap();
        assert!(!cache.holds(&file));
        assert!(!cache.path(&file).exists(), "the bad copy is removed");
    }

    #[test]
    fn a_link_in_place_of_a_download_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let incoming = root.path().join("in");
        fs::create_dir(&incoming).unwrap();
        let cache = FileCache { root: root.path().join("cache") };
        let secret = root.path().join("secret");
        fs::write(&secret, "host file").unwrap();
        let sha256 = hex::encode(Sha256::digest(b"host file"));
        std::os::unix::fs::symlink(&secret, incoming.join(&sha256)).unwrap();
        let wanted = Wanted {
            package: "x".into(),
            file: LockedFile { file_name: "x-1-py3-none-any.whl".into(), url: String::new(), size: None, sha256 },
        };
        let dir = open_dir(&incoming).unwrap();
        let err = take_verified(dir.as_fd(), &wanted, &cache).unwrap_err().to_string();
        assert!(err.contains("did not arrive"), "{err}");
    }
}
