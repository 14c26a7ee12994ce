//! Finding the real Python interpreter behind a name on PATH.
//!
//! `python3` is often not the interpreter: a pyenv shim (a shell script), a
//! symbolic link, a venv. Bind-mounting the shim would run nothing. So the
//! interpreter is asked where it really is, once, and the answer is kept
//! (in airlock's data directory) until the program it was asked through changes.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use airlock_core::{PYTHON_MOUNT, Runtime, RuntimeFile, RuntimeMount};
use serde::{Deserialize, Serialize};

use crate::Error;

/// A Python interpreter on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interpreter {
    /// The real executable, links resolved.
    pub executable: PathBuf,
    /// The installation it belongs to (`sys.base_prefix`), links resolved.
    pub base_prefix: PathBuf,
    /// `sys.prefix`: differs from `base_prefix` inside a venv.
    pub prefix: PathBuf,
    /// `3.11.7`.
    pub version: String,
    /// What the interpreter said about its platform: which wheels it takes.
    #[serde(default)]
    pub platform: Platform,
}

/// The facts wheel tags and environment markers are decided from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `sys.implementation.name`: `cpython`, `pypy`.
    pub implementation: String,
    /// `platform.machine()`: `x86_64`, `aarch64`.
    pub machine: String,
    /// `glibc` or `musl`, or empty when unknown (only pure-Python and
    /// `linux_*` wheels then fit).
    pub libc: String,
    /// `2.36`.
    pub libc_version: String,
    /// `sys.abiflags`: `t` for a free-threaded build.
    pub abiflags: String,
}

impl Interpreter {
    /// Resolves `program` (a name looked up on PATH, or a path).
    pub fn resolve(program: &str) -> Result<Interpreter, Error> {
        let found = find_program(program)?;
        let key = cache_key(&found);
        if let Some(cached) = key.as_ref().and_then(|k| load_cache().remove(k)) {
            // An entry from before interpreters reported their platform is asked again.
            if cached.executable.is_file() && cached.base_prefix.is_dir() && !cached.platform.machine.is_empty() {
                cached.check_bound_folders(&found)?;
                return Ok(cached);
            }
        }
        let interpreter = ask(&found)?;
        interpreter.check_bound_folders(&found)?;
        if let Some(key) = key {
            let mut cache = load_cache();
            cache.insert(key, interpreter.clone());
            save_cache(&cache);
        }
        Ok(interpreter)
    }

    /// A runtime that runs this interpreter as it is, with its own packages
    /// (and its venv's, when it is a venv's interpreter).
    pub fn runtime(&self) -> Runtime {
        if self.prefix != self.base_prefix {
            return self.venv_runtime(&self.prefix, Path::new(VENV_MOUNT));
        }
        let (mounts, env) = self.installation();
        let python = self.executable_inside();
        Runtime {
            env: with_path(env, python.parent().unwrap_or(Path::new("/"))),
            python,
            mounts,
            files: Vec::new(),
            image: None,
            tmp_seed: Vec::new(),
            describe: format!("Python {}, the host's, without an image", self.version),
            driver_dir: crate::driver_folder::driver_folder(&self.executable),
            // The host's interpreter runs as it is, its own `site` included.
            known_site: None,
        }
    }

    /// A runtime that runs `venv` (a venv of this interpreter, on the host)
    /// at `at` inside: its folders mounted read-only, its `pyvenv.cfg` and
    /// `bin/python` written anew to name the interpreter where it is inside.
    /// The venv's own files name host paths, which the sandbox never shows.
    pub(crate) fn venv_runtime(&self, venv: &Path, at: &Path) -> Runtime {
        let (mut mounts, env) = self.installation();
        let python = self.executable_inside();
        let mut files = Vec::new();
        // A venv without pyvenv.cfg is not one to Python: its `site` is not known.
        let mut own_site_only = false;
        let entries = fs::read_dir(venv).map(|e| e.flatten().collect::<Vec<_>>()).unwrap_or_default();
        for entry in entries {
            let name = entry.file_name();
            let sandbox = at.join(&name);
            let Ok(kind) = entry.file_type() else { continue };
            if name == "bin" {
                // The interpreter under the names a venv gives it; console
                // scripts name the host's venv in their #! line and are left out.
                let short = self.version.split('.').take(2).collect::<Vec<_>>().join(".");
                for link in ["python".to_owned(), "python3".to_owned(), format!("python{short}")] {
                    files.push(RuntimeFile::Link { sandbox: sandbox.join(link), target: python.clone() });
                }
            } else if name == "pyvenv.cfg" {
                let host = fs::read_to_string(entry.path()).unwrap_or_default();
                let system_site = host
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .find(|(k, _)| k.trim() == "include-system-site-packages")
                    .map_or("false", |(_, v)| v.trim());
                own_site_only = system_site.eq_ignore_ascii_case("false");
                let home = python.parent().unwrap_or(Path::new("/")).display().to_string();
                let content = format!(
                    "home = {home}\ninclude-system-site-packages = {system_site}\nversion = {}\n",
                    self.version
                );
                files.push(RuntimeFile::Text { sandbox, content });
            } else if kind.is_dir() {
                mounts.push(RuntimeMount::read_only(entry.path(), sandbox));
            } else if kind.is_symlink() {
                // lib64 -> lib: relative links stay inside the venv.
                if let Some(target) = fs::read_link(entry.path()).ok().filter(|t| t.is_relative()) {
                    files.push(RuntimeFile::Link { sandbox, target });
                }
            }
        }
        let venv_python = at.join("bin/python");
        Runtime {
            env: with_path(env, &at.join("bin")),
            python: venv_python,
            mounts,
            files,
            image: None,
            tmp_seed: Vec::new(),
            describe: format!("Python {} in a venv", self.version),
            driver_dir: crate::driver_folder::driver_folder(&self.executable),
            known_site: (own_site_only && self.site_runs_nothing_in(venv)).then(|| at.to_path_buf()),
        }
    }

    /// Whether Python's `site` would only put `venv`'s site-packages on the
    /// path (see [`Runtime::known_site`]): no `.pth` file there, and no
    /// `sitecustomize` module there or in the interpreter's own library.
    /// (A venv that leaves out the system's site-packages has no user site
    /// either, so no `usercustomize`.) Anything unreadable counts as unknown.
    ///
    /// Listing those folders (about 300 entries) cost 0.17 ms of every cold
    /// start, so a yes is remembered (`<data>/cache/site-checks/`) under the
    /// folders as they are now: each one's device, inode, mtime and ctime,
    /// which an entry added, removed or renamed in it moves (ctime, which
    /// no call can set back, even when the mtime is). A no is not
    /// remembered; a wrong yes could only leave a `.pth` file unrun.
    fn site_runs_nothing_in(&self, venv: &Path) -> bool {
        let remembered_in = airlock_core::paths::data_dir().ok().map(|data| data.join("cache/site-checks"));
        self.site_runs_nothing_in_remembered(venv, remembered_in.as_deref())
    }

    /// [`Self::site_runs_nothing_in`], its yes remembered in `remembered_in`.
    fn site_runs_nothing_in_remembered(&self, venv: &Path, remembered_in: Option<&Path>) -> bool {
        let short = self.version.split('.').take(2).collect::<Vec<_>>().join(".");
        let stdlib = self.base_prefix.join("lib").join(format!("python{short}"));
        let site_packages = venv.join("lib").join(format!("python{short}")).join("site-packages");
        let zipped_stdlib = self.base_prefix.join("lib").join(format!("python{}.zip", short.replace('.', "")));
        // Each folder, and whether the `.pth` files in it run.
        let folders = [(site_packages, true), (stdlib.join("lib-dynload"), false), (stdlib, false)];
        if zipped_stdlib.exists() {
            return false;
        }
        let remembered = remembered_in.and_then(|cache| {
            let stamps = folders.iter().map(|(dir, _)| folder_stamp(dir)).collect::<Option<Vec<_>>>()?;
            let key = airlock_core::sha256_hex(format!("site checked\n{}", stamps.join("\n")).as_bytes());
            Some(cache.join(&key[..32]))
        });
        if remembered.as_deref().is_some_and(Path::is_file) {
            return true;
        }
        let holds_nothing_site_runs = |dir: &Path, pth_files_run: bool| match fs::read_dir(dir) {
            Err(_) => false,
            Ok(entries) => entries.flatten().all(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                // sitecustomize.py, .pyc, an extension module, a package.
                name.split('.').next() != Some("sitecustomize") && !(pth_files_run && name.ends_with(".pth"))
            }),
        };
        let nothing = folders.iter().all(|(dir, pth_files_run)| holds_nothing_site_runs(dir, *pth_files_run));
        if let Some(marker) = remembered.filter(|_| nothing) {
            // Best effort: a yes not remembered is asked again next time.
            let _ = marker.parent().map(fs::create_dir_all).transpose().and_then(|_| fs::write(&marker, ""));
        }
        nothing
    }

    /// Where the installation (`base_prefix`) is inside: the host's /usr is
    /// bound as it is; any other installation at [`PYTHON_MOUNT`].
    fn prefix_inside(&self) -> PathBuf {
        if self.base_prefix.starts_with("/usr") { self.base_prefix.clone() } else { PathBuf::from(PYTHON_MOUNT) }
    }

    /// The interpreter's executable, as a path inside.
    pub(crate) fn executable_inside(&self) -> PathBuf {
        match self.executable.strip_prefix(&self.base_prefix) {
            Ok(relative) => self.prefix_inside().join(relative),
            // Outside its installation (unusual): it is bound beside it.
            Err(_) if !self.executable.starts_with("/usr") => {
                Path::new(PYTHON_BIN_MOUNT).join(self.executable.file_name().unwrap_or_default())
            }
            Err(_) => self.executable.clone(),
        }
    }

    /// The host folders of the installation the sandbox gets whole: the
    /// installation (unless it is under /usr) and the folder of an
    /// executable outside it.
    fn installation_folders(&self) -> Vec<&Path> {
        let mut folders = Vec::new();
        if !self.base_prefix.starts_with("/usr") {
            folders.push(self.base_prefix.as_path());
        }
        if !self.executable.starts_with(&self.base_prefix) && !self.executable.starts_with("/usr") {
            folders.extend(self.executable.parent());
        }
        folders
    }

    /// Refuses an interpreter whose installation, venv or folder holds the
    /// caller's home folder or airlock's data folder: binding it would show
    /// the sandbox the caller's keys and files (a Python built with
    /// `--prefix=$HOME`, a venv made in the home folder itself) and every
    /// earlier run airlock keeps.
    fn check_bound_folders(&self, found: &Path) -> Result<(), Error> {
        let mut folders = self.installation_folders();
        if self.prefix != self.base_prefix {
            folders.push(self.prefix.as_path());
        }
        check_folders(&folders, found)
    }

    /// As [`Self::check_bound_folders`], for an image built with this
    /// interpreter: its runtime binds the installation (the venv is the
    /// image's own, in airlock's data folder).
    pub(crate) fn check_image_installation(&self) -> Result<(), Error> {
        check_folders(&self.installation_folders(), &self.executable)
    }

    /// The mounts of the installation, and the variables it needs there.
    fn installation(&self) -> (Vec<RuntimeMount>, BTreeMap<String, String>) {
        let mut mounts = Vec::new();
        let mut env = BTreeMap::new();
        if !self.base_prefix.starts_with("/usr") {
            mounts.push(RuntimeMount::read_only(self.base_prefix.clone(), PYTHON_MOUNT));
            // A shared build finds libpython through a RUNPATH that names the
            // host's prefix (pyenv's do): tell the loader where it is inside.
            let short = self.version.split('.').take(2).collect::<Vec<_>>().join(".");
            let lib = self.base_prefix.join("lib");
            if lib.join(format!("libpython{short}.so.1.0")).exists()
                || lib.join(format!("libpython{short}.so")).exists()
            {
                env.insert("LD_LIBRARY_PATH".to_owned(), format!("{PYTHON_MOUNT}/lib"));
            }
        }
        if !self.executable.starts_with(&self.base_prefix) && !self.executable.starts_with("/usr") {
            if let Some(dir) = self.executable.parent() {
                mounts.push(RuntimeMount::read_only(dir.to_path_buf(), PYTHON_BIN_MOUNT));
            }
        }
        (mounts, env)
    }
}

/// Refuses `folders` (bound whole into the sandbox, for the interpreter
/// `found`) when one holds a private folder: the caller's home folder, as
/// `HOME` says and as /etc/passwd says (HOME may be unset or another's,
/// under sudo, su or a service), or airlock's data folder.
fn check_folders(folders: &[&Path], found: &Path) -> Result<(), Error> {
    // Under /usr, nothing is bound whole: no reason to look (an image opens at every cold run).
    if folders.is_empty() {
        return Ok(());
    }
    let real = |path: PathBuf| fs::canonicalize(&path).unwrap_or(path);
    let mut private: Vec<(PathBuf, &str)> = Vec::new();
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute()) {
        private.push((real(home), "your home folder"));
    }
    if let Some(home) = passwd_home(rustix::process::geteuid().as_raw()) {
        private.push((real(home), "your home folder"));
    }
    if let Ok(data) = airlock_core::paths::data_dir() {
        private.push((real(data), "airlock's data folder"));
    }
    for folder in folders {
        if let Some((inside, what)) = private.iter().find(|(path, _)| path.starts_with(folder)) {
            return Err(Error::Interpreter {
                program: found.display().to_string(),
                reason: format!(
                    "airlock would show the sandbox {} whole (read-only), and it holds {what} ({}): use a Python \
                     installed in a folder of its own (a pyenv or uv Python, /usr/bin/python3) or a venv in a \
                     folder of its own{}",
                    folder.display(),
                    inside.display(),
                    if *what == "airlock's data folder" { ", or set AIRLOCK_HOME to a folder outside it" } else { "" }
                ),
            });
        }
    }
    Ok(())
}

/// The home folder /etc/passwd gives `uid`, if it lists it with an absolute one.
fn passwd_home(uid: u32) -> Option<PathBuf> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        let home = fields.get(5).filter(|home| home.starts_with('/') && **home != "/")?;
        (fields.get(2)?.parse::<u32>().ok()? == uid).then(|| PathBuf::from(home))
    })
}

/// Where an interpreter's own venv appears inside (`--python venv/bin/python`).
pub const VENV_MOUNT: &str = "/opt/airlock/venv";
/// Where an interpreter that lives outside its installation is bound.
const PYTHON_BIN_MOUNT: &str = "/opt/airlock/python-bin";

/// `env` and what every Python runtime adds to the base environment: `bin`
/// first on PATH (so `python` works from shell code), and the variables that
/// make matplotlib draw off-screen into airlock's driver.
fn with_path(mut env: BTreeMap<String, String>, bin: &Path) -> BTreeMap<String, String> {
    let base_path = airlock_core::runtime::BASE_ENV.iter().find(|(k, _)| *k == "PATH").map_or("", |(_, v)| *v);
    env.insert("PATH".to_owned(), format!("{}:{base_path}", bin.display()));
    env.insert("MPLBACKEND".to_owned(), "module://airlock_inline_backend".to_owned());
    env.insert("MPLCONFIGDIR".to_owned(), "/tmp/.config/matplotlib".to_owned());
    env
}

fn find_program(program: &str) -> Result<PathBuf, Error> {
    let not_found = || Error::Interpreter {
        program: program.to_owned(),
        reason: "not found; install Python 3 or pass its path (--python /usr/bin/python3)".to_owned(),
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if path.is_file() { Ok(path) } else { Err(not_found()) };
    }
    let path = std::env::var_os("PATH").ok_or_else(not_found)?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()).ok_or_else(not_found)
}

/// What the answer depends on: the program, when it last changed, and for
/// pyenv shims the version selection.
fn cache_key(found: &Path) -> Option<String> {
    let meta = fs::metadata(found).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    let pyenv = std::env::var("PYENV_VERSION").unwrap_or_default();
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
    Some(format!("{}|{mtime}|{}|{pyenv}|{cwd}", found.display(), meta.len()))
}

const PROBE: &str = "import json, os, platform, sys\n\
try:\n  libc = os.confstr('CS_GNU_LIBC_VERSION').split()\n\
except (ValueError, OSError, AttributeError):\n  libc = []\n\
print(json.dumps({'executable': sys.executable, 'base_prefix': sys.base_prefix, 'prefix': sys.prefix,\n\
  'version': '%d.%d.%d' % sys.version_info[:3], 'implementation': sys.implementation.name,\n\
  'machine': platform.machine(), 'libc': libc[0] if len(libc) == 2 else '',\n\
  'libc_version': libc[1] if len(libc) == 2 else '', 'abiflags': getattr(sys, 'abiflags', '')}))";

fn ask(found: &Path) -> Result<Interpreter, Error> {
    let fail = |reason: String| Error::Interpreter { program: found.display().to_string(), reason };
    let output =
        Command::new(found).args(["-I", "-c", PROBE]).output().map_err(|e| fail(format!("cannot run it: {e}")))?;
    if !output.status.success() {
        return Err(fail(format!("it failed: {}", String::from_utf8_lossy(&output.stderr).trim())));
    }
    #[derive(Deserialize)]
    struct Answer {
        executable: PathBuf,
        base_prefix: PathBuf,
        prefix: PathBuf,
        version: String,
        implementation: String,
        machine: String,
        libc: String,
        libc_version: String,
        abiflags: String,
    }
    let answer: Answer = serde_json::from_slice(&output.stdout).map_err(|e| fail(format!("unexpected answer: {e}")))?;
    let real = |p: &Path| fs::canonicalize(p).map_err(|e| fail(format!("{}: {e}", p.display())));
    if !answer.version.starts_with('3') {
        return Err(fail(format!("it is Python {}, and airlock needs Python 3", answer.version)));
    }
    Ok(Interpreter {
        executable: real(&answer.executable)?,
        base_prefix: real(&answer.base_prefix)?,
        prefix: real(&answer.prefix)?,
        version: answer.version,
        platform: Platform {
            implementation: answer.implementation,
            machine: answer.machine,
            libc: answer.libc,
            libc_version: answer.libc_version,
            abiflags: answer.abiflags,
        },
    })
}

fn cache_path() -> Option<PathBuf> {
    airlock_core::paths::data_dir().ok().map(|d| d.join("cache/interpreters.json"))
}

fn load_cache() -> BTreeMap<String, Interpreter> {
    cache_path().and_then(|p| fs::read(p).ok()).and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

fn save_cache(cache: &BTreeMap<String, Interpreter>) {
    // A cache: failing to save it costs a lookup next time, nothing more.
    let Some(path) = cache_path() else { return };
    let Some(dir) = path.parent() else { return };
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(bytes) = serde_json::to_vec_pretty(cache) else { return };
    let tmp = dir.join(format!(".interpreters.{}.tmp", std::process::id()));
    if fs::write(&tmp, bytes).is_ok() {
        let _ = fs::rename(&tmp, &path);
    }
}

/// A folder as it is now, for [`Interpreter::site_runs_nothing_in`]'s
/// memory: its path, device, inode, mtime and ctime, to the nanosecond.
fn folder_stamp(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::symlink_metadata(dir).ok().filter(fs::Metadata::is_dir)?;
    Some(format!(
        "{}|{}|{}|{}.{}|{}.{}",
        dir.display(),
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    ))
}

#[cfg(test)]
mod tests {
    // A test: a failure to set up is a failed test, said plainly.
    #![allow(clippy::expect_used, clippy::unwrap_used)]

    use super::*;

    /// An installation and a venv of it, as files only: enough for
    /// `venv_runtime` to decide whether the venv's `site` is known.
    struct Layout {
        _dir: tempfile::TempDir,
        interpreter: Interpreter,
        venv: PathBuf,
    }

    impl Layout {
        fn new(system_site: &str) -> Layout {
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path().join("python");
            fs::create_dir_all(base.join("lib/python3.11/lib-dynload")).unwrap();
            fs::write(base.join("lib/python3.11/os.py"), "").unwrap();
            let venv = dir.path().join("venv");
            fs::create_dir_all(venv.join("lib/python3.11/site-packages/numpy")).unwrap();
            fs::write(
                venv.join("pyvenv.cfg"),
                format!("home = {}/bin\ninclude-system-site-packages = {system_site}\n", base.display()),
            )
            .unwrap();
            let interpreter = Interpreter {
                executable: base.join("bin/python3.11"),
                base_prefix: base.clone(),
                prefix: venv.clone(),
                version: "3.11.7".to_owned(),
                platform: Platform::default(),
            };
            Layout { _dir: dir, interpreter, venv }
        }

        fn known_site(&self) -> Option<PathBuf> {
            self.interpreter.venv_runtime(&self.venv, Path::new("/opt/airlock/image")).known_site
        }

        fn add(&self, path: &str) {
            let path = match path.strip_prefix("venv/") {
                Some(inside) => self.venv.join(inside),
                None => self.interpreter.base_prefix.join(path),
            };
            fs::write(path, "import sys\n").unwrap();
        }
    }

    #[test]
    fn a_venv_whose_site_runs_nothing_is_known_by_its_path_inside() {
        assert_eq!(Layout::new("false").known_site(), Some(PathBuf::from("/opt/airlock/image")));
    }

    /// A yes is remembered under the folders as they are, and asked again
    /// once one of them changes: a `sitecustomize` added, even with the
    /// folder's mtime set back. (Before, each start listed the folders.)
    #[test]
    fn a_remembered_yes_is_asked_again_when_a_folder_changes() {
        let cache = tempfile::tempdir().unwrap();
        let layout = Layout::new("false");
        let runs_nothing = || layout.interpreter.site_runs_nothing_in_remembered(&layout.venv, Some(cache.path()));
        assert!(runs_nothing());
        let remembered = || fs::read_dir(cache.path()).unwrap().count();
        assert_eq!(remembered(), 1, "the yes is remembered");
        assert!(runs_nothing());
        assert_eq!(remembered(), 1, "and found again");

        let stdlib = layout.interpreter.base_prefix.join("lib/python3.11");
        let mtime = fs::metadata(&stdlib).unwrap().modified().unwrap();
        layout.add("lib/python3.11/sitecustomize.py");
        fs::File::open(&stdlib).unwrap().set_modified(mtime).unwrap();
        assert!(!runs_nothing(), "a sitecustomize added behind a remembered yes");
        fs::remove_file(stdlib.join("sitecustomize.py")).unwrap();
        assert!(runs_nothing());
        let pth = layout.venv.join("lib/python3.11/site-packages/extra.pth");
        fs::write(&pth, "import os\n").unwrap();
        assert!(!runs_nothing(), "a .pth file added behind a remembered yes");
    }

    #[test]
    fn anything_site_would_run_or_add_leaves_site_to_python() {
        // The system's site-packages, which the driver does not set up.
        assert_eq!(Layout::new("true").known_site(), None);
        for file in [
            "venv/lib/python3.11/site-packages/distutils-precedence.pth",
            "venv/lib/python3.11/site-packages/sitecustomize.py",
            "lib/python3.11/sitecustomize.py",
            "lib/python3.11/lib-dynload/sitecustomize.cpython-311-x86_64-linux-gnu.so",
            // A zipped library comes first on the path; what it holds is not looked at.
            "lib/python311.zip",
        ] {
            let layout = Layout::new("false");
            layout.add(file);
            assert_eq!(layout.known_site(), None, "{file}");
        }
        // A venv without site-packages is not known either (site would add nothing).
        let layout = Layout::new("false");
        fs::remove_dir_all(layout.venv.join("lib")).unwrap();
        assert_eq!(layout.known_site(), None);
    }
}
