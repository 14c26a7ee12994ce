//! A run's cgroup directory, made by airlock.
//!
//! Its files are opened relative to the directory, one name each, rather
//! than by their whole path: kernfs revalidates every component of a path
//! under /sys/fs/cgroup as it is walked, and a run opens about twenty of its
//! cgroup's files (its limits, the helper's `tasks`, the counters read at
//! its end). Walked whole, those paths cost a cold `airlock run` about
//! 0.3 ms of the supervisor's CPU, much of it between the code's exit and
//! the record (bench/results/startup.md, stop 37).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

/// A cgroup directory this process made. No descriptor is held while it
/// waits (a server's pool holds up to 64 sandboxes, each with its first
/// run's cgroup): each use opens it ([`Dir::open`]) and its files by name.
#[derive(Debug)]
pub(super) struct Dir {
    path: PathBuf,
}

impl Dir {
    /// Makes the directory `path`.
    pub(super) fn make(path: PathBuf) -> io::Result<Dir> {
        fs::create_dir(&path).map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        Ok(Dir { path })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of its file `name`, for messages and for callers that
    /// keep a path.
    pub(super) fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The directory, opened for a few uses of its files.
    pub(super) fn open(&self) -> io::Result<Open<'_>> {
        let fd = rustix::fs::open(&self.path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("opening {}: {e}", self.path.display())))?;
        Ok(Open { dir: self, fd })
    }

    /// Its file `name` as one number.
    pub(super) fn read_u64(&self, name: &str) -> Option<u64> {
        self.open().ok()?.read_u64(name)
    }

    /// The value of `key` in its flat keyed file `name`.
    pub(super) fn read_key(&self, name: &str, key: &str) -> Option<u64> {
        self.open().ok()?.read_key(name, key)
    }

    /// The processes listed in its `cgroup.procs`.
    pub(super) fn procs(&self) -> Vec<i32> {
        self.open().map(|dir| dir.procs()).unwrap_or_default()
    }
}

/// A [`Dir`], open (`O_PATH`): its files are opened relative to it.
pub(super) struct Open<'a> {
    dir: &'a Dir,
    fd: OwnedFd,
}

impl Open<'_> {
    /// Whether it has the file `name` (the kernel's controllers and
    /// versions differ in which they offer).
    pub(super) fn has(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, AtFlags::empty()).is_ok()
    }

    /// Opens its file `name` (for the helper, or to read or write it here).
    pub(super) fn open_file(&self, name: &str, flags: OFlags) -> io::Result<OwnedFd> {
        rustix::fs::openat(&self.fd, name, flags | OFlags::CLOEXEC, Mode::from_raw_mode(0o666)).map_err(|e| {
            io::Error::new(io::Error::from(e).kind(), format!("opening {}: {e}", self.dir.file(name).display()))
        })
    }

    /// The descriptor on the directory itself, for the helper.
    pub(super) fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Writes `value` to its file `name`, as `fs::write` would.
    pub(super) fn write(&self, name: &str, value: impl AsRef<[u8]>) -> io::Result<()> {
        let file = File::from(self.open_file(name, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC)?);
        io::Write::write_all(&mut &file, value.as_ref())
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", self.dir.file(name).display())))
    }

    fn read(&self, name: &str) -> Option<String> {
        let mut text = String::new();
        File::from(self.open_file(name, OFlags::RDONLY).ok()?).read_to_string(&mut text).ok()?;
        Some(text)
    }

    /// Its file `name` as one number.
    pub(super) fn read_u64(&self, name: &str) -> Option<u64> {
        self.read(name)?.trim().parse().ok()
    }

    /// The value of `key` in its flat keyed file `name` (`key value` per line).
    pub(super) fn read_key(&self, name: &str, key: &str) -> Option<u64> {
        super::value_of(&self.read(name)?, key)
    }

    /// The processes listed in its `cgroup.procs`.
    pub(super) fn procs(&self) -> Vec<i32> {
        super::parse_procs(&self.read("cgroup.procs").unwrap_or_default())
    }
}
