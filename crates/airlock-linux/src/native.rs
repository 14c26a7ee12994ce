//! The native library, `libairlock_fork.so` (crates/airlock-fork): the
//! forked mode's steps and every warm driver's arena allocator. Where it is
//! found, and how a sandbox's driver gets it.
//!
//! The supervisor reads the library once, into a sealed memfd, and each run
//! that needs it (a template, a pooled sandbox's warm driver) is handed a
//! descriptor of that memfd at [`NATIVE_FD`] of its code's process. The
//! driver loads it through `/proc/self/fd/3` and closes the descriptor
//! before any user code (driver.py, `_take_native`).
//!
//! Why not a file in the program's folder, as the driver's own are: each
//! pooled sandbox then held a copy of its own (1.3 MB of tmpfs, charged to
//! its cgroup), every refill read the file and sent it base64 in JSON, and
//! the folder had to be mounted executable, remounted `noexec` again by
//! each fork. The memfd's pages are one copy, shared by every sandbox; the
//! program's folder is `noexec` everywhere.
//!
//! What every sandbox shares is then one file that none can change: the
//! memfd is sealed against writes, growth and shrinking before any sandbox
//! gets it, its inode belongs to the supervisor, and its descriptor is
//! closed before the code's first instruction, which then reaches it only
//! as the read-only, private mapping the loader made (`/proc/self/map_files`
//! needs a capability of the host's). A library that cannot be read or
//! sealed is an error for the forked mode, which needs it, and leaves a
//! pooled sandbox without its allocator: an optimisation, not a layer.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use airlock_core::SandboxError;
use rustix::fs::{MemfdFlags, SealFlags};

/// The environment variable naming the native library, for installs where
/// it is not beside the helper.
pub const NATIVE_ENV: &str = "AIRLOCK_FORK_LIB";
/// The native library's file name (built from crates/airlock-fork).
pub const NATIVE_NAME: &str = "libairlock_fork.so";
/// Where the code's process finds the library, when its run was handed it:
/// the one descriptor past its standard streams (driver.py, `_NATIVE_FD`).
pub const NATIVE_FD: RawFd = 3;
/// The memfd's name, which `/proc/PID/maps` shows (`/memfd:airlock-native`).
pub const MEMFD_NAME: &str = "airlock-native";

/// The backend's native library: found and sealed into a memfd at its
/// first use, then shared by every sandbox of the backend.
#[derive(Debug, Default)]
pub struct NativeLibrary {
    /// Where the backend was told it is ([`crate::LinuxBackend::with_fork_library`]).
    given: Option<PathBuf>,
    /// The sealed memfd, once made. A failure is not kept: the next sandbox
    /// tries again (a library being installed, descriptors short for a
    /// moment), so a long-lived server recovers without a restart.
    loaded: OnceLock<OwnedFd>,
}

impl NativeLibrary {
    /// The library at `given`, else as [`find`] says.
    pub fn new(given: Option<PathBuf>) -> NativeLibrary {
        NativeLibrary { given, loaded: OnceLock::new() }
    }

    /// The sealed memfd of the library found for `helper`; read once.
    pub fn memfd(&self, helper: &Path) -> Result<BorrowedFd<'_>, SandboxError> {
        if let Some(fd) = self.loaded.get() {
            return Ok(fd.as_fd());
        }
        let path = find(helper, self.given.as_deref())?;
        let made = sealed_copy(&path).map_err(|e| SandboxError::Setup {
            step: "load the native library".to_owned(),
            detail: format!("reading {} into a memfd: {e}", path.display()),
        })?;
        // Two threads may both have made one: the first kept is every sandbox's.
        Ok(self.loaded.get_or_init(|| made).as_fd())
    }
}

/// Where the native library is: `given`, else [`NATIVE_ENV`], else beside
/// `helper`.
pub fn find(helper: &Path, given: Option<&Path>) -> Result<PathBuf, SandboxError> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os(NATIVE_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    helper.parent().map(|dir| dir.join(NATIVE_NAME)).filter(|p| p.is_file()).ok_or_else(|| SandboxError::Missing {
        what: format!("the forked mode's native library `{NATIVE_NAME}`"),
        hint: format!(
            "build it (cargo build -p airlock-fork) and install it beside {}, or set {NATIVE_ENV} to its path; \
             or use the pool's pooled mode",
            helper.display()
        ),
    })
}

/// `path`'s bytes in a memfd sealed against any change.
fn sealed_copy(path: &Path) -> std::io::Result<OwnedFd> {
    let content = std::fs::read(path)?;
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // Never executable (and sealed so, where the kernel knows the flag: 6.3
    // and later; older ones refuse it): the loader maps the library, which
    // `noexec` does not stop, and nothing executes it. So any setting of
    // vm.memfd_noexec allows it.
    let memfd = match rustix::fs::memfd_create(MEMFD_NAME, flags | MemfdFlags::NOEXEC_SEAL) {
        Err(rustix::io::Errno::INVAL) => rustix::fs::memfd_create(MEMFD_NAME, flags),
        made => made,
    }?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(&content)?;
    let memfd = OwnedFd::from(file);
    rustix::fs::fcntl_add_seals(&memfd, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)?;
    Ok(memfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memfd_holds_the_file_and_refuses_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NATIVE_NAME);
        std::fs::write(&path, b"\x7fELF and the rest").unwrap();
        let library = NativeLibrary::new(Some(path.clone()));
        let memfd = library.memfd(Path::new("/nowhere/airlock-init")).unwrap();
        let mut read = vec![0u8; 64];
        let n = rustix::io::pread(memfd, &mut read, 0).unwrap();
        assert_eq!(&read[..n], b"\x7fELF and the rest");
        assert_eq!(rustix::io::pwrite(memfd, b"X", 0), Err(rustix::io::Errno::PERM), "written through a seal");
        assert_eq!(rustix::fs::ftruncate(memfd, 1), Err(rustix::io::Errno::PERM), "shrunk through a seal");
        assert_eq!(rustix::fs::ftruncate(memfd, 1 << 20), Err(rustix::io::Errno::PERM), "grown through a seal");
        assert_eq!(
            rustix::fs::fcntl_add_seals(memfd, SealFlags::empty()),
            Err(rustix::io::Errno::PERM),
            "the seals can be changed"
        );
        // Shared writable mappings are refused too (F_SEAL_WRITE).
        // SAFETY: a fresh mapping of a descriptor this test holds, which
        // nothing reads or writes; unmapped at once if the kernel made it.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&memfd),
                0,
            )
        };
        if address != libc::MAP_FAILED {
            // SAFETY: the mapping just made, of one page.
            unsafe { libc::munmap(address, 4096) };
            panic!("a shared writable mapping of the sealed memfd was made");
        }
        // Read once: the file's later changes do not reach it.
        std::fs::write(&path, b"changed").unwrap();
        let again = library.memfd(Path::new("/nowhere/airlock-init")).unwrap();
        let n = rustix::io::pread(again, &mut read, 0).unwrap();
        assert_eq!(&read[..n], b"\x7fELF and the rest");
    }

    #[test]
    fn a_missing_library_is_named_and_found_once_it_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("late.so");
        let library = NativeLibrary::new(Some(path.clone()));
        let error = library.memfd(Path::new("/nowhere/airlock-init")).unwrap_err().to_string();
        assert!(error.contains("late.so") && error.contains("memfd"), "{error}");
        // Installed later: the next sandbox has it, no restart needed.
        std::fs::write(&path, b"\x7fELF").unwrap();
        assert!(library.memfd(Path::new("/nowhere/airlock-init")).is_ok());
        // Not given and not beside the helper: the hint names both ways.
        let error = find(&dir.path().join("airlock-init"), None);
        if std::env::var_os(NATIVE_ENV).is_none() {
            let error = error.unwrap_err().to_string();
            assert!(error.contains(NATIVE_ENV) && error.contains("cargo build -p airlock-fork"), "{error}");
        }
    }
}
