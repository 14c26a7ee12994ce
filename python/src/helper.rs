//! The binaries this module carries, installed where they can run.
//!
//! The Linux backend starts `airlock-init` (built from crates/airlock-linux)
//! by path for every sandbox and every run, and a forked pool's template
//! loads `libairlock_fork.so` (built from crates/airlock-fork), which the
//! backend reads from its path. The build script provided both for this
//! exact library version (see build.rs) and they are embedded here, so a
//! wheel needs nothing beside itself and they always speak this library's
//! protocol. Every shipped binary is installed the same way
//! ([`installed`]): on first use in a process it is written, whole or not at
//! all, to `<data dir>/helpers/<name>-<hash>` (the hash of its content, so
//! versions side by side never overwrite each other).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use airlock::SandboxError;
use airlock_linux::LinuxBackend;

/// The binaries build.rs provided: (name, content).
const SHIPPED: &[(&str, &[u8])] = &[
    ("airlock-init", include_bytes!(concat!(env!("OUT_DIR"), "/airlock-init"))),
    (airlock_linux::FORK_LIB_NAME, include_bytes!(concat!(env!("OUT_DIR"), "/libairlock_fork.so"))),
];

/// The Linux backend running the embedded helper, its forked templates
/// loading the embedded native library, made once per process.
pub fn backend() -> Result<&'static LinuxBackend, SandboxError> {
    static BACKEND: OnceLock<LinuxBackend> = OnceLock::new();
    // One installer at a time in this process; other processes write files
    // of their own (named for their pid) and rename them into place.
    static INSTALLING: Mutex<()> = Mutex::new(());
    if let Some(backend) = BACKEND.get() {
        return Ok(backend);
    }
    let _alone = INSTALLING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(backend) = BACKEND.get() {
        return Ok(backend);
    }
    let helper = installed("airlock-init")?;
    let fork_library = installed(airlock_linux::FORK_LIB_NAME)?;
    Ok(BACKEND.get_or_init(|| LinuxBackend::with_helper(helper).with_fork_library(fork_library)))
}

/// The shipped binary `name`, installed in the data folder.
pub fn installed(name: &str) -> Result<PathBuf, SandboxError> {
    let Some((_, content)) = SHIPPED.iter().find(|(shipped, _)| *shipped == name) else {
        return Err(SandboxError::io(
            format!("finding the binary {name}"),
            std::io::Error::new(std::io::ErrorKind::NotFound, "this package does not ship it"),
        ));
    };
    install(&airlock_core::paths::data_dir()?.join("helpers"), name, content)
}

/// Writes `content` as `name` into `dir` unless an identical, executable copy is there.
fn install(dir: &Path, name: &str, content: &[u8]) -> Result<PathBuf, SandboxError> {
    let digest = airlock_core::sha256_hex(content);
    let path = dir.join(format!("{name}-{}", &digest[..16]));
    if is_installed(&path, content) {
        return Ok(path);
    }
    let fail = |source| SandboxError::io(format!("installing {name} at {}", path.display()), source);
    fs::create_dir_all(dir).map_err(fail)?;
    // Made executable before it takes the final name, which another process
    // may be about to run.
    let staged = dir.join(format!(".{name}-{}.{}", &digest[..16], std::process::id()));
    let installed = airlock::save_to_host(&staged, content)
        .and_then(|_| fs::set_permissions(&staged, fs::Permissions::from_mode(0o755)))
        .and_then(|()| fs::rename(&staged, &path));
    if let Err(error) = installed {
        let _ = fs::remove_file(&staged);
        return Err(fail(error));
    }
    Ok(path)
}

fn is_installed(path: &Path, content: &[u8]) -> bool {
    let executable = fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    executable && fs::read(path).is_ok_and(|installed| installed == content)
}
