//! Runtime images: Python environments with pinned packages, built on the
//! host from the package index before any run, mounted read-only inside.
//!
//! An image lives in `<data dir>/images/<hash>/`, where the hash covers what
//! went into it (the interpreter, its version, the requirements), so the same
//! inputs give the same image and a rebuild reuses it. Names
//! (`images/names/<NAME>`) point at hashes. A build happens in a temporary
//! folder renamed into place only when complete, so a failed or interrupted
//! build leaves nothing half-made behind.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use airlock_core::Runtime;
use airlock_core::paths::open_to_others;
use airlock_policy::ImageRef;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::interpreter::Interpreter;

/// The image `airlock run` uses unless told otherwise.
pub const DEFAULT_IMAGE: &str = "python-data";
/// The default image's requirements.
pub const DEFAULT_REQUIREMENTS: &str = include_str!("python-data.txt");
/// Where an image's environment appears inside the sandbox.
pub const IMAGE_MOUNT: &str = "/opt/airlock/image";

/// Bumped when the layout of an image folder changes.
const FORMAT: u32 = 1;

/// What an image holds, written last when it is built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub hash: String,
    pub python: Interpreter,
    /// The requirements as given.
    pub requirements: String,
    /// Every package installed, with its version.
    pub packages: Vec<Package>,
    pub size_bytes: u64,
    pub created_at: String,
}

/// One installed package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// A built image, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub name: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
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
    /// Package `index` of about `total` is being fetched.
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

/// The images in airlock's data directory.
#[derive(Clone, Debug)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// The store in airlock's data directory.
    pub fn open_default() -> Result<ImageStore, Error> {
        Ok(ImageStore::at(airlock_core::paths::data_dir()?.join("images")))
    }

    pub fn at(root: impl Into<PathBuf>) -> ImageStore {
        ImageStore { root: root.into() }
    }

    fn name_file(&self, name: &str) -> PathBuf {
        self.root.join("names").join(name)
    }

    /// Builds image `name` from `requirements` with `python`, or reuses the
    /// identical image if it was built before.
    pub fn build(
        &self,
        name: &str,
        python: &str,
        requirements: &str,
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<Image, Error> {
        check_name(name)?;
        let fail = |reason: String| Error::ImageBuild { name: name.to_owned(), reason };
        const STEPS: usize = 5;
        progress(BuildEvent::Step { index: 1, total: STEPS, what: format!("finding the interpreter {python}") });
        let interpreter = Interpreter::resolve(python)?;
        let hash = image_hash(&interpreter, requirements);
        fs::create_dir_all(self.root.join("names"))
            .map_err(|e| fail(format!("creating {}: {e}", self.root.display())))?;

        // One build per hash at a time, across processes.
        let lock_path = self.root.join(format!(".{hash}.lock"));
        let lock = fs::File::create(&lock_path).map_err(|e| fail(format!("{}: {e}", lock_path.display())))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| fail(format!("locking: {e}")))?;

        let dir = self.root.join(&hash);
        if let Ok(manifest) = read_manifest(&dir, &hash) {
            self.point(name, &hash)?;
            progress(BuildEvent::Reused { hash: hash.clone() });
            return Ok(Image { name: name.to_owned(), dir, manifest });
        }
        if dir.exists() {
            // Not a valid image under the final name: never trust it.
            fs::remove_dir_all(&dir).map_err(|e| fail(format!("removing the broken {}: {e}", dir.display())))?;
        }

        let staging = self.root.join(format!(".build-{hash}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&staging);
        let result = build_into(&staging, &interpreter, requirements, &hash, progress, STEPS);
        let manifest = match result {
            Ok(m) => m,
            Err(reason) => {
                let _ = fs::remove_dir_all(&staging);
                return Err(fail(reason));
            }
        };
        fs::rename(&staging, &dir).map_err(|e| {
            let _ = fs::remove_dir_all(&staging);
            fail(format!("moving the image into place: {e}"))
        })?;
        self.point(name, &hash)?;
        progress(BuildEvent::Done { hash: hash.clone(), size_bytes: manifest.size_bytes });
        Ok(Image { name: name.to_owned(), dir, manifest })
    }

    /// Makes `name` point at `hash`, atomically.
    fn point(&self, name: &str, hash: &str) -> Result<(), Error> {
        let file = self.name_file(name);
        let tmp = self.root.join("names").join(format!(".{name}.{}", std::process::id()));
        fs::write(&tmp, format!("{hash}\n"))
            .and_then(|()| fs::rename(&tmp, &file))
            .map_err(|e| Error::ImageBuild { name: name.to_owned(), reason: format!("naming the image: {e}") })
    }

    /// The image called `name`, checked to be whole.
    pub fn get(&self, name: &str) -> Result<Image, Error> {
        check_name(name)?;
        let hash = match fs::read_to_string(self.name_file(name)) {
            Ok(h) => h.trim().to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::ImageMissing { name: name.to_owned() });
            }
            Err(e) => return Err(corrupt(name, format!("reading its name: {e}"))),
        };
        if hash.len() != 32 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(corrupt(name, format!("its name points at {hash:?}, which is not an image hash")));
        }
        let dir = self.root.join(&hash);
        let manifest = read_manifest(&dir, &hash).map_err(|reason| corrupt(name, reason))?;
        // Images built before builds opened them up may be closed to the
        // sandbox's user; the first use after opens them, once.
        let venv = dir.join("venv");
        if !open_to_others(&venv) || !open_to_others(&venv.join("pyvenv.cfg")) {
            readable_by_all(&dir).map_err(|e| corrupt(name, format!("making it readable: {e}")))?;
        }
        Ok(Image { name: name.to_owned(), dir, manifest })
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
        let hash = fs::read_to_string(&file).map_err(|_| Error::ImageMissing { name: name.to_owned() })?;
        let hash = hash.trim();
        fs::remove_file(&file).map_err(|e| Error::Io { context: format!("removing {}", file.display()), source: e })?;
        let still_used = fs::read_dir(self.root.join("names"))
            .map(|entries| entries.flatten().any(|e| fs::read_to_string(e.path()).is_ok_and(|h| h.trim() == hash)))
            .unwrap_or(true);
        if !still_used && hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            let dir = self.root.join(hash);
            // Renamed first, so a half-removed image is never found under its hash.
            let trash = self.root.join(format!(".trash-{hash}-{}", std::process::id()));
            if fs::rename(&dir, &trash).is_ok() {
                fs::remove_dir_all(&trash)
                    .map_err(|e| Error::Io { context: format!("removing {}", trash.display()), source: e })?;
            }
        }
        Ok(())
    }

    /// The image `name`, building it first (with `progress`) if it is the
    /// default image and does not exist yet.
    pub fn get_or_build_default(&self, name: &str, progress: &mut dyn FnMut(BuildEvent)) -> Result<Image, Error> {
        match self.get(name) {
            Err(Error::ImageMissing { .. }) if name == DEFAULT_IMAGE => {
                self.build(name, "python3", DEFAULT_REQUIREMENTS, progress)
            }
            other => other,
        }
    }
}

impl Image {
    /// The runtime that runs code in this image: its venv at [`IMAGE_MOUNT`],
    /// its interpreter at a fixed path too, nothing at a host path.
    pub fn runtime(&self) -> Runtime {
        let python = &self.manifest.python;
        let mut runtime = python.venv_runtime(&self.dir.join("venv"), Path::new(IMAGE_MOUNT));
        // matplotlib's font list, built with the image, so a first plot does
        // not spend a second rebuilding it.
        runtime.tmp_seed = fs::read_dir(self.dir.join("mplconfig"))
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
        let top: Vec<String> = self.manifest.packages.iter().map(|p| format!("{} {}", p.name, p.version)).collect();
        runtime.image = Some(ImageRef { name: self.name.clone(), hash: self.manifest.hash.clone() });
        runtime.describe = format!("Python {} with {}", python.version, top.join(", "));
        runtime
    }
}

fn corrupt(name: &str, reason: String) -> Error {
    Error::ImageCorrupt { name: name.to_owned(), reason }
}

/// Image names: what a person would type, safe as a file name.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok { Ok(()) } else { Err(Error::BadImageName { name: name.to_owned() }) }
}

/// The hash of what goes into an image: interpreter, version, requirements
/// (comments, blank lines and order ignored), and the image format.
pub fn image_hash(interpreter: &Interpreter, requirements: &str) -> String {
    use sha2::Digest;
    let mut lines: Vec<&str> =
        requirements.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).collect();
    lines.sort_unstable();
    let mut hasher = sha2::Sha256::new();
    hasher.update(format!("airlock-image-format {FORMAT}\n"));
    hasher.update(format!("python {} {}\n", interpreter.executable.display(), interpreter.version));
    for line in lines {
        hasher.update(line);
        hasher.update("\n");
    }
    hex::encode(&hasher.finalize()[..16])
}

fn read_manifest(dir: &Path, hash: &str) -> Result<Manifest, String> {
    let path = dir.join("manifest.json");
    let bytes =
        fs::read(&path).map_err(|e| format!("{} is unreadable ({e}): the image is incomplete", path.display()))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| format!("{} is not a valid manifest: {e}", path.display()))?;
    if manifest.format != FORMAT || manifest.hash != hash {
        return Err(format!("{} belongs to another image or format", path.display()));
    }
    for needed in ["venv/pyvenv.cfg", "venv/bin/python"] {
        if fs::symlink_metadata(dir.join(needed)).is_err() {
            return Err(format!("{needed} is missing from {}", dir.display()));
        }
    }
    if !manifest.python.executable.is_file() {
        return Err(format!("its interpreter {} is gone", manifest.python.executable.display()));
    }
    Ok(manifest)
}

fn build_into(
    staging: &Path,
    interpreter: &Interpreter,
    requirements: &str,
    hash: &str,
    progress: &mut dyn FnMut(BuildEvent),
    steps: usize,
) -> Result<Manifest, String> {
    fs::create_dir_all(staging).map_err(|e| format!("creating {}: {e}", staging.display()))?;
    let venv = staging.join("venv");
    progress(BuildEvent::Step {
        index: 2,
        total: steps,
        what: format!("creating a Python {} environment", interpreter.version),
    });
    run_quiet(Command::new(&interpreter.executable).arg("-m").arg("venv").arg(&venv), "python -m venv")?;
    let python = venv.join("bin/python");

    let requirements_file = staging.join("requirements.txt");
    fs::write(&requirements_file, requirements).map_err(|e| format!("writing the requirements: {e}"))?;
    let wanted = requirements.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).count();
    progress(BuildEvent::Step {
        index: 3,
        total: steps,
        what: format!("installing {wanted} packages from the package index"),
    });
    let mut pip = Command::new(&python)
        // Wheels only: a source package would run its build code here, on the
        // host, outside any sandbox.
        .args([
            "-m",
            "pip",
            "install",
            "--only-binary=:all:",
            "--no-input",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-r",
        ])
        .arg(&requirements_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting pip: {e}"))?;
    let stderr = pip.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut s) = stderr {
            let _ = std::io::Read::read_to_string(&mut s, &mut text);
        }
        text
    });
    let mut collected = 0;
    if let Some(out) = pip.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(rest) = line.trim().strip_prefix("Collecting ") {
                collected += 1;
                let name = rest.split_whitespace().next().unwrap_or(rest).to_owned();
                progress(BuildEvent::Package { index: collected, total: wanted.max(collected), name });
            }
        }
    }
    let status = pip.wait().map_err(|e| format!("waiting for pip: {e}"))?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = errors.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(format!("pip failed:\n{}", tail.join("\n")));
    }

    progress(BuildEvent::Step { index: 4, total: steps, what: "preparing matplotlib's font cache".to_owned() });
    let mplconfig = staging.join("mplconfig");
    fs::create_dir_all(&mplconfig).map_err(|e| format!("creating {}: {e}", mplconfig.display()))?;
    // Without matplotlib this fails, which is fine: there is nothing to cache.
    let _ = Command::new(&python)
        .args(["-c", "import matplotlib.font_manager"])
        .env("MPLCONFIGDIR", &mplconfig)
        .env("MPLBACKEND", "Agg")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();

    // The sandbox's user is not the builder (as root, it is nobody): under a
    // strict umask the packages would be unreadable inside.
    readable_by_all(staging).map_err(|e| format!("making the image readable: {e}"))?;

    progress(BuildEvent::Step { index: 5, total: steps, what: "recording what the image holds".to_owned() });
    let listing = Command::new(&python)
        .args(["-m", "pip", "list", "--format", "json", "--disable-pip-version-check"])
        .output()
        .map_err(|e| format!("listing packages: {e}"))?;
    let mut packages: Vec<Package> =
        serde_json::from_slice(&listing.stdout).map_err(|e| format!("reading pip list: {e}"))?;
    packages.retain(|p| p.name != "pip" && p.name != "setuptools");
    packages.sort_by_key(|p| p.name.to_lowercase());
    let manifest = Manifest {
        format: FORMAT,
        hash: hash.to_owned(),
        python: interpreter.clone(),
        requirements: requirements.to_owned(),
        packages,
        size_bytes: dir_size(staging),
        created_at: airlock_core::record::now_rfc3339(),
    };
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
    let path = staging.join("manifest.json");
    let file = fs::File::create(&path).map_err(|e| format!("writing the manifest: {e}"))?;
    std::io::Write::write_all(&mut &file, &bytes).map_err(|e| format!("writing the manifest: {e}"))?;
    file.sync_all().map_err(|e| format!("writing the manifest: {e}"))?;
    Ok(manifest)
}

fn run_quiet(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{what}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// Adds read (and, where anyone may execute, execute) permission for all to
/// every file and folder below `dir`, following no link.
fn readable_by_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            continue;
        }
        let mode = entry.metadata()?.permissions().mode();
        let wanted = if kind.is_dir() || mode & 0o111 != 0 { mode | 0o555 } else { mode | 0o444 };
        if wanted != mode {
            fs::set_permissions(entry.path(), fs::Permissions::from_mode(wanted))?;
        }
        if kind.is_dir() {
            readable_by_all(&entry.path())?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strict_umask_still_gives_an_image_the_sandbox_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("venv/lib");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(dir.join("module.py"), "x = 1").unwrap();
        fs::set_permissions(dir.join("module.py"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(dir.join("tool"), "#!/bin/sh").unwrap();
        fs::set_permissions(dir.join("tool"), fs::Permissions::from_mode(0o700)).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let private = elsewhere.path().join("private");
        fs::write(&private, "not the image's").unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&private, dir.join("link")).unwrap();
        readable_by_all(root.path()).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join("module.py")), 0o644);
        assert_eq!(mode(&dir.join("tool")), 0o755);
        // The link was not followed.
        assert_eq!(mode(&private), 0o600);
    }

    fn interp() -> Interpreter {
        Interpreter {
            executable: "/usr/bin/python3.11".into(),
            base_prefix: "/usr".into(),
            prefix: "/usr".into(),
            version: "3.11.2".into(),
        }
    }

    #[test]
    fn the_hash_covers_inputs_not_their_layout() {
        let a = image_hash(&interp(), "numpy==2.0\n# comment\npandas==2.2\n");
        let b = image_hash(&interp(), "pandas==2.2\n\nnumpy==2.0  # pinned\n");
        assert_eq!(a, b);
        assert_ne!(a, image_hash(&interp(), "numpy==2.1\npandas==2.2\n"));
        let mut other = interp();
        other.version = "3.11.3".into();
        assert_ne!(a, image_hash(&other, "numpy==2.0\npandas==2.2\n"));
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "../x", "a/b", ".hidden", "-x", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("python-data").unwrap();
    }

    #[test]
    fn an_image_closed_to_others_is_opened_on_first_use() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::at(root.path());
        let hash = "0123456789abcdef0123456789abcdef";
        fs::create_dir_all(root.path().join("names")).unwrap();
        fs::write(root.path().join("names/old"), hash).unwrap();
        let dir = root.path().join(hash);
        fs::create_dir_all(dir.join("venv/bin")).unwrap();
        fs::write(dir.join("venv/pyvenv.cfg"), "home = /usr/bin").unwrap();
        std::os::unix::fs::symlink("/bin/sh", dir.join("venv/bin/python")).unwrap();
        let python = Interpreter { executable: "/bin/sh".into(), ..interp() };
        let manifest = Manifest {
            format: FORMAT,
            hash: hash.to_owned(),
            python,
            requirements: String::new(),
            packages: vec![],
            size_bytes: 0,
            created_at: String::new(),
        };
        fs::write(dir.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
        // As an image built under umask 077 before builds opened them.
        fs::set_permissions(dir.join("venv/pyvenv.cfg"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(dir.join("venv/bin"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(dir.join("venv"), fs::Permissions::from_mode(0o700)).unwrap();
        store.get("old").unwrap();
        let mode = |p: &str| fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode("venv"), mode("venv/bin"), mode("venv/pyvenv.cfg")), (0o755, 0o755, 0o644));
    }

    #[test]
    fn a_half_built_or_corrupt_image_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::at(root.path());
        assert!(matches!(store.get("x"), Err(Error::ImageMissing { .. })));
        fs::create_dir_all(root.path().join("names")).unwrap();
        let hash = "0123456789abcdef0123456789abcdef";
        fs::write(root.path().join("names/x"), hash).unwrap();
        fs::create_dir_all(root.path().join(hash).join("venv/bin")).unwrap();
        let err = store.get("x").unwrap_err().to_string();
        assert!(err.contains("incomplete") && err.contains("airlock image build"), "{err}");
        fs::write(root.path().join(hash).join("manifest.json"), "{ not json").unwrap();
        let err = store.get("x").unwrap_err().to_string();
        assert!(err.contains("not a valid manifest"), "{err}");
    }
}
