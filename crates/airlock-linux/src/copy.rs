//! Copy-in and copy-out: named files only, opened beneath the work directory
//! without following any link the sandbox may have planted, regular files
//! only, capped in size.
//!
//! What is copied in belongs to the sandbox's user, as if the code had made
//! it. The supervisor opens files as that user in one of three ways
//! ([`FileAccess`]); whichever opened it, the supervisor then checks and
//! moves the bytes itself.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use airlock_core::{ArtifactError, SandboxError};
use airlock_policy::SandboxPath;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, fstat, mkdirat, openat2};

use crate::protocol::{self, Failure, OpenPlan, Reply, Request};

/// No symbolic links at all, no /proc magic links, no leaving the directory,
/// no crossing into another mount.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// How the supervisor opens files as the sandbox's user.
#[derive(Debug)]
pub enum FileAccess {
    /// It is that user on the host (an ordinary user mapping itself).
    Direct,
    /// Root: with the sandbox's host ids as the copying thread's filesystem
    /// ids (not the process's, which a server shares between threads). The
    /// kernel refuses to create a file whose owner the namespace cannot name,
    /// and root's uid is not mapped in the sandbox.
    ThreadFsIds { uid: u32, gid: u32 },
    /// Through the helper, in the sandbox's user namespace: an ordinary user
    /// cannot take its subordinate id, so a helper joins the namespace,
    /// becomes the sandbox's user, opens the file and hands it over.
    Helper { helper: PathBuf, user_ns: OwnedFd },
}

impl FileAccess {
    fn open(&self, dir: BorrowedFd<'_>, path: &SandboxPath, write: bool) -> io::Result<OwnedFd> {
        match self {
            FileAccess::Direct => open_as_this_thread(dir, path.relative(), write),
            FileAccess::ThreadFsIds { uid, gid } => {
                let previous = crate::sys::set_thread_fs_ids(*uid, *gid)?;
                let opened = open_as_this_thread(dir, path.relative(), write);
                // Back to root's ids, which root may always take.
                let _ = crate::sys::set_thread_fs_ids(previous.0, previous.1);
                opened
            }
            FileAccess::Helper { helper, user_ns } => open_through_helper(helper, user_ns, dir, path, write),
        }
    }
}

fn open_beneath(dir: BorrowedFd<'_>, name: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    openat2(dir, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode, RESOLVE).map_err(io::Error::from)
}

/// Opens `relative` (a checked sandbox path's text) below `dir` as this
/// thread's user: for writing, creating it and its parents; else for reading.
/// O_NONBLOCK either way: if the sandbox left a FIFO there, opening it must
/// not wait for a peer (it fails with ENXIO instead).
fn open_as_this_thread(dir: BorrowedFd<'_>, relative: &str, write: bool) -> io::Result<OwnedFd> {
    if !write {
        return open_beneath(dir, relative, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty());
    }
    let path = SandboxPath::parse(relative).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let mut parent: Option<OwnedFd> = None;
    for name in path.parents() {
        let at = parent.as_ref().map_or(dir, AsFd::as_fd);
        match mkdirat(at, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        parent = Some(open_beneath(at, name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?);
    }
    let at = parent.as_ref().map_or(dir, AsFd::as_fd);
    open_beneath(at, path.file_name(), OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK, Mode::from_raw_mode(0o644))
}

/// Supervisor side of [`FileAccess::Helper`].
fn open_through_helper(
    helper: &std::path::Path,
    user_ns: &OwnedFd,
    dir: BorrowedFd<'_>,
    path: &SandboxPath,
    write: bool,
) -> io::Result<OwnedFd> {
    let (mut child, ours) = crate::supervise::spawn_helper(helper)?;
    let plan = OpenPlan { supervisor_pid: std::process::id() as i32, path: path.relative().to_owned(), write };
    let sent = protocol::send_request(ours.as_fd(), &Request::Open(plan), &[user_ns.as_fd(), dir]);
    let reply = sent.and_then(|()| crate::supervise::recv_within(ours.as_fd(), crate::supervise::SETUP_TIMEOUT));
    if reply.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
    match reply? {
        Some((Reply::Opened, mut fds)) if fds.len() == 1 => fds.pop().ok_or_else(|| io::Error::other("no file")),
        Some((Reply::Failed(failure), _)) => Err(match failure.errno {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::other(failure.to_string()),
        }),
        Some((other, _)) => Err(io::Error::other(format!("the helper answered {other:?} to an open"))),
        None => Err(io::Error::other("the helper exited without opening the file")),
    }
}

/// Child side of [`FileAccess::Helper`], in a fresh helper: joins the
/// sandbox's user namespace, becomes its user without a capability, opens
/// the file exactly as the supervisor would, and hands it over.
pub fn open_for_supervisor(plan: &OpenPlan, fds: Vec<OwnedFd>, socket: BorrowedFd<'_>) -> Result<(), Failure> {
    let step = "open a file as the sandbox's user";
    let [user_ns, dir]: [OwnedFd; 2] =
        fds.try_into().map_err(|_| Failure::plain(step, "expected the user namespace and a folder"))?;
    crate::process::die_with_parent(Some(plan.supervisor_pid))?;
    crate::userns::join_user(&user_ns)?;
    crate::userns::become_sandbox_user()?;
    crate::caps::drop_all()?;
    let file = open_as_this_thread(dir.as_fd(), &plan.path, plan.write).map_err(|e| Failure::new(step, "", &e))?;
    protocol::send(socket, &Reply::Opened, &[file.as_fd()]).map_err(|e| Failure::new(step, "hand it over", &e))
}

/// Writes `data` at `path` below `dir` (the work directory, or /tmp for a
/// runtime's seed files), creating parent directories, as the sandbox's user.
pub fn write(access: &FileAccess, dir: BorrowedFd<'_>, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
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
    let fd = access.open(dir, path, true).map_err(|e| fail(explain(e)))?;
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
pub fn read(
    access: &FileAccess,
    work: BorrowedFd<'_>,
    path: &SandboxPath,
    max_bytes: u64,
) -> Result<Vec<u8>, ArtifactError> {
    let name = path.to_string();
    let fd = access.open(work, path, false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => ArtifactError::NotFound { path: name.clone() },
        Some(libc::ELOOP) | Some(libc::EXDEV) => ArtifactError::Link { path: name.clone() },
        Some(libc::ENXIO) => ArtifactError::NotRegular { path: name.clone(), kind: "socket" },
        _ => ArtifactError::Io { path: name.clone(), source: e },
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
