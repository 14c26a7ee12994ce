//! Copy-in and copy-out, supervisor side: named files only, opened beneath
//! the work directory without following any link the sandbox may have
//! planted, regular files only, capped in size.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use airlock_core::{ArtifactError, SandboxError};
use airlock_policy::SandboxPath;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, fstat, mkdirat, openat2};

/// No symbolic links at all, no /proc magic links, no leaving the directory,
/// no crossing into another mount.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

fn open_beneath(dir: BorrowedFd<'_>, name: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    openat2(dir, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode, RESOLVE).map_err(io::Error::from)
}

/// Writes `data` at `path` below `work`, creating parent directories.
pub fn write(work: BorrowedFd<'_>, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
    let fail = |reason: String| SandboxError::Input { path: path.to_string(), reason };
    let explain = |e: io::Error| -> String {
        match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link is in the way; links in /work are never followed".to_owned(),
            Some(libc::ENOSPC) => "the work directory is full (raise disk_mb or disk_inodes)".to_owned(),
            Some(libc::EDQUOT) => "the work directory is full (raise disk_mb or disk_inodes)".to_owned(),
            Some(libc::ENOTDIR) => "a parent is a file, not a directory".to_owned(),
            _ => e.to_string(),
        }
    };
    // What is copied in belongs to the code, as if it had made it itself.
    let _owner = crate::userns::files_as_sandbox_user()
        .map_err(|e| fail(format!("could not create files as the sandbox's user: {e}")))?;
    let mut dir: Option<OwnedFd> = None;
    for parent in path.parents() {
        let at = dir.as_ref().map_or(work, AsFd::as_fd);
        match mkdirat(at, parent, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(fail(explain(e.into()))),
        }
        let next = open_beneath(at, parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| fail(explain(e)))?;
        dir = Some(next);
    }
    let at = dir.as_ref().map_or(work, AsFd::as_fd);
    // O_NONBLOCK: if the sandbox left a FIFO here, opening it must not wait
    // for a reader (it fails with ENXIO instead).
    let fd = open_beneath(
        at,
        path.file_name(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| fail(explain(e)))?;
    let stat = fstat(&fd).map_err(|e| fail(e.to_string()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(fail("something that is not a regular file is already there".to_owned()));
    }
    rustix::fs::ftruncate(&fd, 0).map_err(|e| fail(explain(e.into())))?;
    let mut file = File::from(fd);
    file.write_all(data).map_err(|e| fail(explain(e)))?;
    Ok(())
}

/// Reads the regular file at `path` below `work`, refusing anything above
/// `max_bytes`, any link, and anything that is not a regular file.
pub fn read(work: BorrowedFd<'_>, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
    let name = path.to_string();
    let fd =
        open_beneath(work, path.relative(), OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENOENT) => ArtifactError::NotFound { path: name.clone() },
                Some(libc::ELOOP) | Some(libc::EXDEV) => ArtifactError::Link { path: name.clone() },
                Some(libc::ENXIO) => ArtifactError::NotRegular { path: name.clone(), kind: "socket" },
                _ => ArtifactError::Io { path: name.clone(), source: e },
            }
        })?;
    let stat = fstat(&fd).map_err(|e| ArtifactError::Io { path: name.clone(), source: e.into() })?;
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => None,
        FileType::Directory => Some("directory"),
        FileType::Fifo => Some("FIFO"),
        FileType::Socket => Some("socket"),
        FileType::CharacterDevice | FileType::BlockDevice => Some("device"),
        FileType::Symlink => Some("symbolic link"),
        FileType::Unknown => Some("special file"),
    };
    if let Some(kind) = kind {
        return Err(ArtifactError::NotRegular { path: name, kind });
    }
    let size = stat.st_size as u64;
    if size > max_bytes {
        return Err(ArtifactError::TooLarge { path: name, size, cap: max_bytes });
    }
    let mut data = Vec::with_capacity(size as usize);
    File::from(fd)
        .take(max_bytes + 1)
        .read_to_end(&mut data)
        .map_err(|e| ArtifactError::Io { path: name.clone(), source: e })?;
    if data.len() as u64 > max_bytes {
        return Err(ArtifactError::TooLarge { path: name, size: data.len() as u64, cap: max_bytes });
    }
    Ok(data)
}
