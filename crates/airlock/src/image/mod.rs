//! Runtime images: Python environments built from a lock, inside a sandbox,
//! mounted read-only into every run.
//!
//! # How an image is built, and why it can be trusted
//!
//! 1. **Locked** ([`lock`]): a PEP 751 `pylock.toml` names every
//!    distribution at its exact version and every file by its SHA-256. The
//!    host picks the one wheel the interpreter takes from the lock alone.
//! 2. **Fetched in a sandbox, hashed on the host** (`fetch`): files not in
//!    the cache are downloaded by a sandbox whose only network is the package
//!    index the operator named ([`PackageIndex`]), through the egress proxy;
//!    the host hashes each before anything reads it and refuses a mismatch.
//!    uv itself is one of those files, pinned twice (`uv`).
//! 3. **Installed in a sandbox** (`build`): the new environment is the
//!    sandbox's one writable tree; uv installs the checked wheels there
//!    without network, and every post-install step (bytecode, the listing of
//!    what was installed, matplotlib's font cache) runs there too. Nothing
//!    from a package ever runs or is imported on the host.
//! 4. **Sealed** ([`manifest`]): the host takes the tree back from the
//!    sandbox's user, refuses special files, hashes every file into
//!    `files.txt`, writes the manifest, and renames the folder into place.
//! 5. **Checked at use**: a name pins its manifest's hash, which is checked
//!    each time the image is opened; `airlock image verify` re-hashes every file.
//!
//! An image lives in `<images>/<hash>/`, where the hash covers its inputs
//! (the interpreter and the exact files installed), so the same inputs give
//! the same image and a rebuild reuses it at no cost. Names
//! (`<images>/names/<NAME>`) point at a hash and the manifest's own hash.
//! Each build step's record goes into the audit store like any run.

mod build;
mod extras;
mod fetch;
mod index;
pub mod lock;
pub mod manifest;
mod marker;
mod resolve;
mod step;
mod tags;
mod uv;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_core::{Backend, Runtime};
use airlock_policy::ImageRef;

pub use build::{BuildOptions, Built};
pub use extras::PreparedImage;
pub use index::{PYPI, PackageIndex};
pub use lock::{Lock, LockError};
pub use manifest::{Differences, ImageLink, Manifest, Package};
pub use resolve::{LockOptions, Locked, lock_header};
pub use uv::UV_VERSION;

use crate::Error;
use crate::sandbox::Audit;

/// The image `airlock run` uses unless told otherwise.
pub const DEFAULT_IMAGE: &str = "python-data";
/// What the default image is made from: the loose requirements...
pub const DEFAULT_REQUIREMENTS: &str = include_str!("python-data.in");
/// ...and their lock, made with `airlock image lock python-data.in --universal`.
pub const DEFAULT_LOCK: &str = include_str!("python-data.pylock.toml");
/// The extra packages a run in the default image may ask for (`--with`).
pub const DEFAULT_VETTED: &str = include_str!("python-data-vetted.pylock.toml");
/// Where an image's environment appears inside the sandbox (and where it is
/// built, so every path baked into it is right).
pub const IMAGE_MOUNT: &str = "/opt/airlock/image";
/// Where an image's extra packages appear inside the sandbox.
pub const LAYER_MOUNT: &str = "/opt/airlock/layer";

/// A built image, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub name: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// For an image with extra packages: the image it layers on.
    pub base: Option<Box<Image>>,
}

/// Progress of a build, for a progress display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildEvent {
    /// Step `index` of `total` begins.
    Step {
        index: usize,
        total: usize,
        what: String,
    },
    /// File `index` of `total` was checked against its hash.
    Package {
        index: usize,
        total: usize,
        name: String,
    },
    /// The image already existed with the same inputs.
    Reused {
        hash: String,
    },
    Done {
        hash: String,
        size_bytes: u64,
    },
}

/// The images in airlock's data directory, and how builds are made.
#[derive(Clone)]
pub struct ImageStore {
    root: PathBuf,
    backend: Option<&'static dyn Backend>,
    audit: Option<Audit>,
    /// Record builds in the default audit store, opened when a build starts.
    default_audit: bool,
    index: Option<PackageIndex>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore").field("root", &self.root).field("index", &self.index).finish_non_exhaustive()
    }
}

impl ImageStore {
    /// The store in airlock's data directory; builds are recorded in the
    /// audit store beside it.
    pub fn open_default() -> Result<ImageStore, Error> {
        let data = airlock_core::paths::data_dir()?;
        Ok(ImageStore { default_audit: true, ..ImageStore::at(data.join("images")) })
    }

    /// A store at `root`, recording nothing until given an audit store.
    pub fn at(root: impl Into<PathBuf>) -> ImageStore {
        ImageStore { root: root.into(), backend: None, audit: None, default_audit: false, index: None }
    }

    /// Builds with this backend (a Linux backend with its helper elsewhere).
    pub fn with_backend(mut self, backend: &'static dyn Backend) -> ImageStore {
        self.backend = Some(backend);
        self
    }

    /// Records every build step in `audit`.
    pub fn with_audit(mut self, audit: Audit) -> ImageStore {
        self.audit = Some(audit);
        self
    }

    /// Fetches from this index instead of the one the host's configuration names.
    pub fn with_index(mut self, index: PackageIndex) -> ImageStore {
        self.index = Some(index);
        self
    }

    /// Where build steps are recorded: the audit store given, else the
    /// default one for the default store.
    fn build_audit(&self) -> Result<Option<Audit>, Error> {
        if self.audit.is_some() || !self.default_audit {
            return Ok(self.audit.clone());
        }
        let fail = |e: airlock_audit::AuditError| Error::ImageBuild {
            name: String::new(),
            reason: format!("opening the audit store, where every build is recorded: {e}"),
        };
        let store =
            airlock_audit::AuditStore::open(&airlock_audit::AuditStore::default_path().map_err(fail)?).map_err(fail)?;
        Ok(Some(Audit { store: Arc::new(store), principal: Some(BUILD_PRINCIPAL.to_owned()) }))
    }

    /// The backend build steps run on.
    fn build_backend(&self) -> Result<&'static dyn Backend, Error> {
        match self.backend {
            Some(backend) => Ok(backend),
            None => crate::backend_for(airlock_policy::BackendKind::Linux),
        }
    }

    /// The index builds fetch from: the one given, else the operator's.
    pub fn index(&self) -> Result<PackageIndex, Error> {
        match &self.index {
            Some(index) => Ok(index.clone()),
            None => PackageIndex::from_operator(None),
        }
    }

    fn name_file(&self, name: &str) -> PathBuf {
        self.root.join("names").join(name)
    }

    fn cache_dir(&self) -> PathBuf {
        self.root.join(".cache")
    }

    /// Makes `name` point at `hash` and its manifest, atomically.
    fn point(&self, name: &str, hash: &str, manifest_sha256: &str) -> Result<(), Error> {
        let file = self.name_file(name);
        let tmp = self.root.join("names").join(format!(".{name}.{}-{}.tmp", std::process::id(), fetch::unique()));
        fs::create_dir_all(self.root.join("names"))
            .and_then(|()| fs::write(&tmp, format!("{hash} {manifest_sha256}\n")))
            .and_then(|()| fs::rename(&tmp, &file))
            .map_err(|e| Error::ImageBuild { name: name.to_owned(), reason: format!("naming the image: {e}") })
    }

    /// The image called `name`, its manifest checked against the hash its
    /// name pins.
    pub fn get(&self, name: &str) -> Result<Image, Error> {
        check_name(name)?;
        let image = self.open(name, &self.name_file(name))?;
        // Its runtime binds the installation of the interpreter it was built
        // with, which may have come to hold a private folder (an image built
        // before airlock refused such an interpreter).
        image.base.as_deref().unwrap_or(&image).manifest.python.check_image_installation()?;
        Ok(image)
    }

    fn open(&self, name: &str, pointer: &Path) -> Result<Image, Error> {
        let text = match fs::read_to_string(pointer) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::ImageMissing { name: name.to_owned() });
            }
            Err(e) => return Err(corrupt(name, format!("reading its name: {e}"))),
        };
        match text.split_whitespace().collect::<Vec<_>>()[..] {
            [hash, manifest] => self.open_hash(name, hash, manifest),
            [_] => Err(corrupt(
                name,
                "it was built by an earlier airlock, before images were built in a sandbox from a hashed lock"
                    .to_owned(),
            )),
            _ => Err(corrupt(name, format!("its name holds {text:?}, not an image hash"))),
        }
    }

    /// Image `hash`, its manifest checked against `manifest_sha256`, and the
    /// image it layers on, checked the same way.
    fn open_hash(&self, name: &str, hash: &str, manifest_sha256: &str) -> Result<Image, Error> {
        if !is_hash(hash) {
            return Err(corrupt(name, format!("its name points at {hash:?}, which is not an image hash")));
        }
        let dir = self.root.join(hash);
        let manifest = read_manifest(&dir, hash, manifest_sha256).map_err(|reason| corrupt(name, reason))?;
        let base = match &manifest.base {
            Some(link) => Some(Box::new(self.open_hash(name, &link.hash, &link.manifest_sha256)?)),
            None => None,
        };
        Ok(Image { name: name.to_owned(), dir, manifest, base })
    }

    /// Every named image.
    pub fn list(&self) -> Result<Vec<Result<Image, Error>>, Error> {
        let names = match fs::read_dir(self.root.join("names")) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::Io { context: format!("listing {}", self.root.display()), source: e }),
        };
        let mut names: Vec<String> =
            names.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| !n.starts_with('.')).collect();
        names.sort();
        Ok(names.iter().map(|n| self.get(n)).collect())
    }

    /// Removes the name; removes the image too when no other name uses it.
    pub fn remove(&self, name: &str) -> Result<(), Error> {
        check_name(name)?;
        let file = self.name_file(name);
        let text = fs::read_to_string(&file).map_err(|_| Error::ImageMissing { name: name.to_owned() })?;
        let hash = text.split_whitespace().next().unwrap_or("").to_owned();
        fs::remove_file(&file).map_err(|e| Error::Io { context: format!("removing {}", file.display()), source: e })?;
        let still_used = fs::read_dir(self.root.join("names")).map_or(true, |entries| {
            entries
                .flatten()
                .any(|e| fs::read_to_string(e.path()).is_ok_and(|h| h.split_whitespace().next() == Some(hash.as_str())))
        });
        if !still_used && is_hash(&hash) {
            let dir = self.root.join(&hash);
            // Renamed first, so a half-removed image is never found under its hash.
            let trash = self.root.join(format!(".trash-{hash}-{}", std::process::id()));
            if fs::rename(&dir, &trash).is_ok() {
                fs::remove_dir_all(&trash)
                    .map_err(|e| Error::Io { context: format!("removing {}", trash.display()), source: e })?;
            }
        }
        Ok(())
    }

    /// Re-hashes every file of image `name` (and of the image it layers on)
    /// against its file list, and says which changed.
    pub fn verify(&self, name: &str) -> Result<Differences, Error> {
        let image = self.get(name)?;
        let mut all = Differences::default();
        let mut next = Some(&image);
        while let Some(image) = next {
            let found = image.verify().map_err(|reason| corrupt(name, reason))?;
            let prefix = |paths: Vec<String>| paths.into_iter().map(|p| image.dir.join(p).display().to_string());
            all.checked += found.checked;
            all.changed.extend(prefix(found.changed));
            all.missing.extend(prefix(found.missing));
            all.added.extend(prefix(found.added));
            next = image.base.as_deref();
        }
        Ok(all)
    }

    /// The image `name`. The default image is built first (with `progress`)
    /// when it does not exist yet, or was built from another lock than this
    /// airlock's (an older airlock's image is never used as it is).
    pub fn get_or_build_default(&self, name: &str, progress: &mut dyn FnMut(BuildEvent)) -> Result<Image, Error> {
        let current = airlock_core::sha256_hex(DEFAULT_LOCK.as_bytes());
        match self.get(name) {
            Ok(image) if name != DEFAULT_IMAGE || image.manifest.lock_sha256 == current => Ok(image),
            Err(Error::ImageMissing { .. } | Error::ImageCorrupt { .. }) | Ok(_) if name == DEFAULT_IMAGE => {
                let options = BuildOptions::default_image();
                Ok(self.build(name, &options, progress)?.image)
            }
            other => other,
        }
    }
}

/// The principal build steps are recorded under in the audit store.
pub const BUILD_PRINCIPAL: &str = "airlock image build";

impl Image {
    /// The runtime that runs code in this image.
    pub fn runtime(&self) -> Runtime {
        let base = self.base.as_deref().unwrap_or(self);
        let python = &base.manifest.python;
        // Its venv at IMAGE_MOUNT, its interpreter at a fixed path too:
        // nothing at a host path.
        let mut runtime = python.venv_runtime(&base.dir.join("venv"), Path::new(IMAGE_MOUNT));
        // matplotlib's font list, built with the image, so a first plot does
        // not spend a second rebuilding it.
        runtime.tmp_seed = fs::read_dir(base.dir.join("mplconfig"))
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .filter_map(|e| {
                        let content = fs::read(e.path()).ok()?;
                        Some((format!(".config/matplotlib/{}", e.file_name().to_string_lossy()), content))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let packages = self.packages();
        let top: Vec<String> = packages.iter().map(|p| format!("{} {}", p.name, p.version)).collect();
        runtime.image = Some(ImageRef { name: self.name.clone(), hash: self.manifest.hash.clone() });
        runtime.describe = format!("Python {} with {}", python.version, top.join(", "));
        if self.base.is_some() {
            self.add_layer(&mut runtime);
        }
        runtime
    }

    /// Every package the image holds, its base's included.
    pub fn packages(&self) -> Vec<Package> {
        let mut all: Vec<Package> = self.base.as_deref().map(Image::packages).unwrap_or_default();
        all.extend(self.manifest.packages.iter().cloned());
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// This image's own files, compared with the list made when it was built.
    fn verify(&self) -> Result<Differences, String> {
        let listing =
            fs::read(self.dir.join(FILES)).map_err(|e| format!("{}/{FILES} is unreadable: {e}", self.dir.display()))?;
        if airlock_core::sha256_hex(&listing) != self.manifest.files_sha256 {
            return Err(format!("{}/{FILES} is not the list its manifest pins: it was changed", self.dir.display()));
        }
        let listing = String::from_utf8(listing).map_err(|_| format!("{FILES} is not text"))?;
        manifest::compare(&self.dir, &listing, &SEALED_APART)
    }
}

/// The file list, beside the manifest in an image's folder.
const FILES: &str = "files.txt";
const MANIFEST: &str = "manifest.json";
/// What the file list does not cover: itself and the manifest that pins it.
const SEALED_APART: [&str; 2] = [MANIFEST, FILES];

/// A build error that did not know which image it was for, told.
fn named(error: Error, name: &str) -> Error {
    match error {
        Error::ImageBuild { name: empty, reason } if empty.is_empty() => {
            Error::ImageBuild { name: name.to_owned(), reason }
        }
        other => other,
    }
}

fn corrupt(name: &str, reason: String) -> Error {
    Error::ImageCorrupt { name: name.to_owned(), reason }
}

fn is_hash(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Image names: what a person would type, safe as a file name.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok { Ok(()) } else { Err(Error::BadImageName { name: name.to_owned() }) }
}

/// Reads `dir`'s manifest, refusing it unless its SHA-256 is the one its
/// name pins and it describes the image `hash` of this format, whole.
fn read_manifest(dir: &Path, hash: &str, manifest_sha256: &str) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    let bytes =
        fs::read(&path).map_err(|e| format!("{} is unreadable ({e}): the image is incomplete", path.display()))?;
    let actual = airlock_core::sha256_hex(&bytes);
    if actual != manifest_sha256 {
        return Err(format!(
            "{} has SHA-256 {actual}, and its name pins {manifest_sha256}: the manifest was changed",
            path.display()
        ));
    }
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| format!("{} is not a valid manifest: {e}", path.display()))?;
    if manifest.format != manifest::FORMAT || manifest.hash != hash {
        return Err(format!("{} belongs to another image or format", path.display()));
    }
    let tree = if manifest.base.is_some() { "layer" } else { "venv/bin/python" };
    if fs::symlink_metadata(dir.join(tree)).is_err() {
        return Err(format!("{tree} is missing from {}", dir.display()));
    }
    if !manifest.python.executable.is_file() {
        return Err(format!("its interpreter {} is gone", manifest.python.executable.display()));
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for bad in ["", "../x", "a/b", ".hidden", "-x", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("python-data").unwrap();
    }

    #[test]
    fn a_half_built_corrupt_or_old_image_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::at(root.path());
        assert!(matches!(store.get("x"), Err(Error::ImageMissing { .. })));
        fs::create_dir_all(root.path().join("names")).unwrap();
        let hash = "0123456789abcdef0123456789abcdef";
        fs::write(root.path().join("names/old"), hash).unwrap();
        let err = store.get("old").unwrap_err().to_string();
        assert!(err.contains("earlier airlock") && err.contains("airlock image build old"), "{err}");
        let manifest = b"{ not json";
        fs::write(root.path().join("names/x"), format!("{hash} {}", airlock_core::sha256_hex(manifest))).unwrap();
        fs::create_dir_all(root.path().join(hash).join("venv/bin")).unwrap();
        let err = store.get("x").unwrap_err().to_string();
        assert!(err.contains("incomplete") && err.contains("airlock image build"), "{err}");
        fs::write(root.path().join(hash).join(MANIFEST), manifest).unwrap();
        let err = store.get("x").unwrap_err().to_string();
        assert!(err.contains("not a valid manifest"), "{err}");
        fs::write(root.path().join(hash).join(MANIFEST), b"{}").unwrap();
        let err = store.get("x").unwrap_err().to_string();
        assert!(err.contains("was changed"), "{err}");
    }
}
