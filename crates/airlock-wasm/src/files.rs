//! Files in and out of a sandbox's folders, never following a link the guest
//! may have planted, and the folders' usage.
//!
//! Every open goes through `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`
//! from a descriptor of the folder itself, so no component of the path (an
//! intermediate directory included) can be a symbolic link, and `..` cannot
//! climb out, whatever the guest left in the folder. WASI lets a guest make a
//! symbolic link with any target text, including host paths, so the host must
//! never resolve one.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use airlock_core::ArtifactError;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// A fresh host folder only this user may enter (0700), removed when the
/// handle is dropped, and a descriptor of it for beneath-opens.
pub(crate) fn private_dir(prefix: &str) -> io::Result<(tempfile::TempDir, OwnedFd)> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix(prefix).permissions(fs::Permissions::from_mode(0o700)).tempdir()?;
    let fd = open_dir(dir.path())?;
    Ok((dir, fd))
}

/// Opens the folder at `path` (which the host made) for later beneath-opens.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())?)
}

fn open_beneath(dir: impl AsFd, relative: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    Ok(rustix::fs::openat2(dir, relative, flags, mode, RESOLVE)?)
}

/// Writes `data` to `relative` below `dir`, making parent folders. Fails if
/// any component is a link or the target is not a regular file.
pub(crate) fn write_beneath(dir: &OwnedFd, relative: &str, data: &[u8]) -> io::Result<()> {
    let mut parts: Vec<&str> = relative.split('/').collect();
    let name = parts.pop().unwrap_or(relative);
    let mut current = open_beneath(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    for part in parts {
        match rustix::fs::mkdirat(&current, part, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::EXIST => {}
            Err(e) => return Err(e.into()),
        }
        current = open_beneath(&current, part, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    }
    // Non-blocking, so a FIFO planted at the name cannot hang the host.
    let fd =
        open_beneath(&current, name, OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK, Mode::from_raw_mode(0o600))?;
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("the path exists and is not a regular file"));
    }
    rustix::fs::ftruncate(&fd, 0)?;
    let mut file = fs::File::from(fd);
    file.write_all(data)?;
    Ok(())
}

/// Reads one regular file below `dir`, at most `max_bytes`. `shown` is the
/// path as the caller named it, for errors.
pub(crate) fn read_beneath(
    dir: &OwnedFd,
    relative: &str,
    max_bytes: u64,
    shown: &str,
) -> Result<Vec<u8>, ArtifactError> {
    let path = shown.to_owned();
    let fd = match open_beneath(dir, relative, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => return Err(classify_open_error(dir, relative, e, path)),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| ArtifactError::Io { path: path.clone(), source: e.into() })?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        return Err(ArtifactError::NotRegular { path, kind: kind_name(kind) });
    }
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > max_bytes {
        return Err(ArtifactError::TooLarge { path, size, cap: max_bytes });
    }
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    fs::File::from(fd)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| ArtifactError::Io { path: path.clone(), source: e })?;
    if data.len() as u64 > max_bytes {
        return Err(ArtifactError::TooLarge { path, size: data.len() as u64, cap: max_bytes });
    }
    Ok(data)
}

fn classify_open_error(dir: &OwnedFd, relative: &str, error: io::Error, path: String) -> ArtifactError {
    match rustix::io::Errno::from_io_error(&error) {
        Some(rustix::io::Errno::LOOP) | Some(rustix::io::Errno::XDEV) => ArtifactError::Link { path },
        Some(rustix::io::Errno::NOENT) | Some(rustix::io::Errno::NOTDIR) => ArtifactError::NotFound { path },
        // A socket cannot be opened at all; say what it is.
        Some(rustix::io::Errno::NXIO) => {
            let kind = rustix::fs::statat(dir, relative, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| kind_name(FileType::from_raw_mode(s.st_mode)))
                .unwrap_or("special file");
            ArtifactError::NotRegular { path, kind }
        }
        _ => ArtifactError::Io { path, source: error },
    }
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "special file",
    }
}

/// What a set of folders holds: bytes allocated and entries (inodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DiskUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Adds up what `roots` hold, without following links, stopping early once
/// either count passes its cap (the answer is then "over", not exact).
pub(crate) fn usage(roots: &[&Path], byte_cap: u64, inode_cap: u64) -> DiskUsage {
    use std::os::unix::fs::MetadataExt;
    let mut total = DiskUsage::default();
    let mut stack: Vec<std::path::PathBuf> = roots.iter().map(|r| r.to_path_buf()).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // DirEntry::metadata does not follow links.
            let Ok(meta) = entry.metadata() else { continue };
            total.inodes += 1;
            // Allocated blocks, as a filesystem quota counts them: a sparse
            // file costs what it holds, not its length.
            total.bytes = total.bytes.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
            if total.bytes > byte_cap || total.inodes > inode_cap {
                return total;
            }
        }
    }
    total
}
