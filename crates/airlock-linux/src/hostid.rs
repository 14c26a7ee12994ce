//! Host ids: who each sandbox's user is on the host.
//!
//! Inside, the code is always uid and gid 1000. On the host, the kernel keeps
//! budgets per user: inotify instances, pending signals, message queue
//! bytes, locked shared memory, epoll watches, pipe buffers, descriptors in
//! flight. Sandboxes that shared a host uid shared those budgets, so one run
//! could exhaust them for its neighbours. So each live sandbox gets a host
//! uid and gid of its own:
//!
//! - as root, from a block reserved for airlock ([`DEFAULT_RANGE`], or
//!   [`RANGE_ENV`]), which no account in /etc/passwd or /etc/group and no
//!   range in /etc/subuid or /etc/subgid may overlap;
//! - as an ordinary user with subordinate ids (/etc/subuid, /etc/subgid)
//!   and the setuid `newuidmap`/`newgidmap`, from that range;
//! - otherwise, the caller's own uid: the only id an unprivileged process
//!   may map without help, shared with the caller and its other sandboxes.
//!
//! An id is taken at sandbox creation and given back when the sandbox is
//! dropped. It is held as an open-file-description lock on one byte of a
//! lock file (the byte at offset = the uid), so two live sandboxes never
//! hold one id, across threads and processes alike, and a crashed process
//! holds nothing: the kernel drops its locks with its descriptors. Nothing
//! is left to clean up after a crash.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

/// The variable that sets the range root's sandboxes take their ids from:
/// `FIRST:COUNT`, as in /etc/subuid.
pub const RANGE_ENV: &str = "AIRLOCK_HOST_IDS";

/// The default range: 65,536 ids from 0x7F000000 (2130706432 to 2130771967).
/// Above the container ranges systemd hands out (up to 0x6FFFFFFF) and the
/// usual /etc/subuid blocks (100000 and up, 65,536 each), below systemd's
/// foreign-id range (0x7FFE0000) and below 2^31, which tools that read ids
/// as signed numbers get wrong.
pub const DEFAULT_RANGE: IdRange = IdRange { first: 0x7F00_0000, count: 65_536 };

/// Where root's allocations are locked: one file for the whole host,
/// whatever data directory each airlock process uses.
const ROOT_LOCK_FILE: &str = "/run/airlock/host-ids.lock";

/// A block of host ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub first: u32,
    pub count: u32,
}

impl IdRange {
    /// `FIRST:COUNT`.
    pub fn parse(text: &str) -> Result<IdRange, String> {
        let bad = || {
            format!(
                "{RANGE_ENV}={text:?} is not FIRST:COUNT (two numbers, the range ending below 4294967295), e.g. 2130706432:65536"
            )
        };
        let (first, count) = text.trim().split_once(':').ok_or_else(bad)?;
        let first: u32 = first.trim().parse().map_err(|_| bad())?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || first == 0 || u64::from(first) + u64::from(count) > u64::from(u32::MAX) {
            return Err(bad());
        }
        Ok(IdRange { first, count })
    }

    pub fn last(&self) -> u32 {
        self.first + (self.count - 1)
    }

    fn contains(&self, id: u64) -> bool {
        (u64::from(self.first)..=u64::from(self.last())).contains(&id)
    }

    fn overlaps(&self, first: u64, count: u64) -> bool {
        count > 0 && first <= u64::from(self.last()) && first + count > u64::from(self.first)
    }
}

impl std::fmt::Display for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} to {}", self.first, self.last())
    }
}

/// How the sandbox's user (uid and gid 1000 inside) maps to the host; what
/// the helper is told at setup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdMapping {
    /// The caller's own uid and gid: what an unprivileged process may map.
    Caller,
    /// Root: an id of airlock's reserved range. The helper builds the root
    /// as root, then becomes this id and makes the user namespace as it, so
    /// that the namespace is this id's: every per-user budget the kernel
    /// keeps for the sandbox is this id's alone.
    Reserved { uid: u32, gid: u32 },
    /// An ordinary user's subordinate id, mapped by these setuid helpers.
    Subordinate { uid: u32, gid: u32, newuidmap: String, newgidmap: String },
}

impl IdMapping {
    /// The host uid and gid of the sandbox's user, for a caller whose own are `caller`.
    pub fn host_ids(&self, caller: (u32, u32)) -> (u32, u32) {
        match self {
            IdMapping::Caller => caller,
            IdMapping::Reserved { uid, gid } | IdMapping::Subordinate { uid, gid, .. } => (*uid, *gid),
        }
    }

    /// For the record: who the sandbox's user is on the host, and what it shares.
    pub fn describe(&self) -> String {
        match self {
            IdMapping::Caller => "the caller's own uid and gid: without subordinate ids (/etc/subuid, /etc/subgid \
                 and newuidmap), an ordinary user's sandboxes share its per-user kernel budgets (inotify, pending \
                 signals, message queues, locked memory, epoll watches, pipe buffers) with each other and with \
                 its own processes, and may signal its processes outside their PID namespace if they could see them"
                .to_owned(),
            IdMapping::Reserved { uid, gid } => {
                format!("uid {uid} and gid {gid}, of airlock's reserved range, this sandbox's alone while it lives")
            }
            IdMapping::Subordinate { uid, gid, .. } => format!(
                "uid {uid} and gid {gid}, of the caller's subordinate ids, this sandbox's alone while it lives; \
                 the kernel still charges per-user budgets to the caller's own uid at the top of the user \
                 namespace hierarchy, so they are shared with the caller"
            ),
        }
    }

    /// For the record of a run forked from a template with these ids: they
    /// are the template's, so every run forked from it shares them, and
    /// with them the kernel's per-user budgets (pending signals among them,
    /// which no cgroup bounds).
    pub fn describe_for_forks(&self) -> String {
        match self {
            IdMapping::Caller => self.describe(),
            IdMapping::Reserved { uid, gid } | IdMapping::Subordinate { uid, gid, .. } => format!(
                "uid {uid} and gid {gid}, its template's, shared with every run forked from it while they live, \
                 and with them the kernel's per-user budgets (pending signals, inotify, locked memory, pipe \
                 buffers; docs/design.md, \"Forked starts\")"
            ),
        }
    }
}

/// A host id taken for one live sandbox; dropping it gives it back.
#[derive(Debug)]
pub struct HostId {
    pub mapping: IdMapping,
    /// The lock that makes the id this sandbox's; `None` for [`IdMapping::Caller`].
    _held: Option<OwnedFd>,
}

/// Why no host id could be taken.
#[derive(Debug, thiserror::Error)]
pub enum HostIdError {
    #[error("{0}")]
    Range(String),
    #[error("every host id of {range} ({count}) belongs to a live sandbox; give airlock a larger range with {RANGE_ENV}=FIRST:COUNT", count = range.count)]
    Exhausted { range: IdRange },
    #[error("the host-id lock file {path}: {source}")]
    Lock { path: String, source: io::Error },
}

/// Where a sandbox's host ids come from, decided once per process.
#[derive(Clone, Debug)]
pub struct Allocator {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Caller,
    Reserved { range: IdRange, lock: PathBuf },
    Subordinate { uids: IdRange, gids: IdRange, lock: PathBuf, newuidmap: PathBuf, newgidmap: PathBuf },
}

impl Allocator {
    /// The allocator for this process: as root, the reserved range, checked
    /// against the host's accounts; as anyone else, their subordinate ids
    /// if they have them and newuidmap, else their own uid.
    pub fn for_this_process() -> Result<Allocator, String> {
        if rustix::process::geteuid().is_root() {
            let range = match std::env::var(RANGE_ENV) {
                Ok(text) if !text.trim().is_empty() => IdRange::parse(&text)?,
                _ => DEFAULT_RANGE,
            };
            check_range_is_free(range, &HostFiles::read())?;
            return Ok(Allocator { source: Source::Reserved { range, lock: PathBuf::from(ROOT_LOCK_FILE) } });
        }
        Ok(Allocator { source: subordinate_source().unwrap_or(Source::Caller) })
    }

    /// Root's reserved range, if this process takes its ids from it.
    pub fn reserved_range(&self) -> Option<IdRange> {
        match &self.source {
            Source::Reserved { range, .. } => Some(*range),
            _ => None,
        }
    }

    /// Takes an id no live sandbox holds.
    pub fn allocate(&self) -> Result<HostId, HostIdError> {
        match &self.source {
            Source::Caller => Ok(HostId { mapping: IdMapping::Caller, _held: None }),
            Source::Reserved { range, lock } => {
                let (uid, held) = take(lock, *range, true)?;
                Ok(HostId { mapping: IdMapping::Reserved { uid, gid: uid }, _held: Some(held) })
            }
            Source::Subordinate { uids, gids, lock, newuidmap, newgidmap } => {
                // The same offset in both ranges; the shorter one bounds.
                let range = IdRange { first: uids.first, count: uids.count.min(gids.count) };
                let (uid, held) = take(lock, range, false)?;
                let gid = gids.first + (uid - uids.first);
                Ok(HostId {
                    mapping: IdMapping::Subordinate {
                        uid,
                        gid,
                        newuidmap: newuidmap.display().to_string(),
                        newgidmap: newgidmap.display().to_string(),
                    },
                    _held: Some(held),
                })
            }
        }
    }
}

/// Where the next search starts, so that a process does not retry the ids
/// it holds itself on every allocation.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// Locks the first free id of `range` in the lock file at `path`.
fn take(path: &Path, range: IdRange, system: bool) -> Result<(u32, OwnedFd), HostIdError> {
    let fail = |source: io::Error| HostIdError::Lock { path: path.display().to_string(), source };
    let file = open_lock_file(path, system).map_err(fail)?;
    let fd = OwnedFd::from(file);
    let start = NEXT.fetch_add(1, Ordering::Relaxed);
    for step in 0..range.count {
        let id = range.first + (start.wrapping_add(step) % range.count);
        match lock_byte(&fd, id) {
            Ok(true) => {
                NEXT.store(id - range.first + 1, Ordering::Relaxed);
                return Ok((id, fd));
            }
            Ok(false) => continue,
            Err(e) => return Err(fail(e)),
        }
    }
    Err(HostIdError::Exhausted { range })
}

/// A fresh open file description of the lock file (locks belong to it, so
/// every allocation needs its own). Root's lives in a folder only root may
/// write; anyone's is refused if others could write it.
fn open_lock_file(path: &Path, system: bool) -> io::Result<fs::File> {
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let meta = fs::metadata(dir)?;
        let me = rustix::process::geteuid().as_raw();
        if meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
            return Err(io::Error::other(format!(
                "{} must belong to uid {me} and be writable by it alone (it is uid {}, mode {:o}){}",
                dir.display(),
                meta.uid(),
                meta.permissions().mode() & 0o7777,
                if system { "; remove it and airlock makes it again" } else { "" }
            )));
        }
    }
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Tries an open-file-description write lock on byte `offset`: `Ok(false)`
/// if another description holds it.
fn lock_byte(fd: &OwnedFd, offset: u32) -> io::Result<bool> {
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(offset),
        l_len: 1,
        l_pid: 0,
    };
    match crate::sys::set_ofd_lock(fd.as_fd(), &lock) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The host's account files, as text.
#[derive(Debug, Default)]
pub struct HostFiles {
    pub passwd: String,
    pub group: String,
    pub subuid: String,
    pub subgid: String,
}

impl HostFiles {
    pub fn read() -> HostFiles {
        let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
        HostFiles {
            passwd: read("/etc/passwd"),
            group: read("/etc/group"),
            subuid: read("/etc/subuid"),
            subgid: read("/etc/subgid"),
        }
    }
}

/// Refuses a range that a host account or a subordinate range uses, naming it.
pub fn check_range_is_free(range: IdRange, files: &HostFiles) -> Result<(), String> {
    let fix = format!("choose another range with {RANGE_ENV}=FIRST:COUNT");
    for (file, text, what) in [("/etc/passwd", &files.passwd, "uid"), ("/etc/group", &files.group, "gid")] {
        for line in text.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if let (Some(name), Some(Ok(id))) = (fields.first(), fields.get(2).map(|f| f.trim().parse::<u64>())) {
                if range.contains(id) {
                    return Err(format!(
                        "airlock's host ids ({range}) include {what} {id} of {name:?} in {file}: sandboxes would \
                         act as that account; {fix}"
                    ));
                }
            }
        }
    }
    for (file, text) in [("/etc/subuid", &files.subuid), ("/etc/subgid", &files.subgid)] {
        for (owner, first, count) in subordinate_ranges(text) {
            if range.overlaps(first, count) {
                return Err(format!(
                    "airlock's host ids ({range}) overlap {owner:?}'s subordinate ids {first}:{count} in {file}: \
                     that user's containers would share ids with sandboxes; {fix}"
                ));
            }
        }
    }
    Ok(())
}

/// `(owner, first, count)` for each line of /etc/subuid or /etc/subgid.
fn subordinate_ranges(text: &str) -> impl Iterator<Item = (&str, u64, u64)> {
    text.lines().filter(|l| !l.trim_start().starts_with('#')).filter_map(|line| {
        let mut fields = line.trim().split(':');
        let owner = fields.next()?;
        let first = fields.next()?.parse().ok()?;
        let count = fields.next()?.parse().ok()?;
        Some((owner, first, count))
    })
}

/// The caller's subordinate ids, if it has both kinds and the helpers that map them.
fn subordinate_source() -> Option<Source> {
    let files = HostFiles::read();
    let uid = rustix::process::geteuid().as_raw();
    let account = files.passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.get(2).and_then(|f| f.parse::<u32>().ok()) == Some(uid)).then_some(fields)
    });
    let name = account.as_ref().map(|fields| fields[0].to_owned());
    let home = account.as_ref().and_then(|fields| fields.get(5)).map(PathBuf::from);
    let mine = |text: &str| {
        subordinate_ranges(text)
            .find(|(owner, _, count)| (Some(*owner) == name.as_deref() || *owner == uid.to_string()) && *count > 0)
            .and_then(|(_, first, count)| {
                let range = IdRange { first: u32::try_from(first).ok()?, count: u32::try_from(count).ok()? };
                (u64::from(range.first) + u64::from(range.count) <= u64::from(u32::MAX)).then_some(range)
            })
    };
    let (uids, gids) = (mine(&files.subuid)?, mine(&files.subgid)?);
    let find = |tool: &str| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
    };
    let (newuidmap, newgidmap) = (find("newuidmap")?, find("newgidmap")?);
    Some(Source::Subordinate { uids, gids, lock: user_lock_file(uid, home.as_deref()), newuidmap, newgidmap })
}

/// An ordinary user's lock file: one place per user, whatever each
/// process's environment says, since the subordinate ids are the user's
/// and not a data directory's or a login session's. The first of these
/// that can be opened as the user's alone: in the home folder /etc/passwd
/// names, where it is the user's own; in the user's runtime folder,
/// /run/user/UID (one fixed path, not the environment's); in
/// /tmp/airlock-UID. (Before, it followed XDG_RUNTIME_DIR, else the data
/// directory: two processes under `su` or cron with different data
/// directories took the same id.) Two processes that see different
/// folders (one whose home is read-only to it, say) may still choose
/// differently; docs/design.md says so.
fn user_lock_file(uid: u32, home: Option<&Path>) -> PathBuf {
    let owned = |dir: &Path| fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
    let mut candidates = Vec::new();
    if let Some(home) = home.filter(|home| owned(home)) {
        candidates.push(home.join(".local/state/airlock/host-ids.lock"));
    }
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    if owned(&runtime) {
        candidates.push(runtime.join("airlock/host-ids.lock"));
    }
    let last = PathBuf::from(format!("/tmp/airlock-{uid}/host-ids.lock"));
    // The last is taken whatever it holds: refused there, the run says why.
    candidates.into_iter().find(|path| open_lock_file(path, false).is_ok()).unwrap_or(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_nonsense() {
        assert_eq!(IdRange::parse("2130706432:65536"), Ok(DEFAULT_RANGE));
        for bad in ["", "5", "a:b", "0:10", "10:0", "4294967290:100", "-1:5"] {
            let err = IdRange::parse(bad).unwrap_err();
            assert!(err.contains("FIRST:COUNT"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_range_an_account_or_a_subordinate_range_uses_is_refused_with_the_fix() {
        let range = IdRange { first: 200_000, count: 1000 };
        let files = |passwd: &str, group: &str, subuid: &str| HostFiles {
            passwd: passwd.into(),
            group: group.into(),
            subuid: subuid.into(),
            subgid: String::new(),
        };
        let fine =
            files("root:x:0:0::/root:/bin/sh\nbig:x:300000:1::/:/bin/sh\n", "g:x:199999:\n", "alice:100000:65536\n");
        assert_eq!(check_range_is_free(range, &fine), Ok(()));
        let err = check_range_is_free(range, &files("svc:x:200500:1::/:/bin/sh\n", "", "")).unwrap_err();
        assert!(err.contains("uid 200500 of \"svc\" in /etc/passwd") && err.contains(RANGE_ENV), "{err}");
        let err = check_range_is_free(range, &files("", "grp:x:200999:\n", "")).unwrap_err();
        assert!(err.contains("gid 200999"), "{err}");
        let err = check_range_is_free(range, &files("", "", "bob:165536:65536\n")).unwrap_err();
        assert!(err.contains("\"bob\"'s subordinate ids 165536:65536"), "{err}");
        // The default range clears a host with the usual subordinate blocks.
        let usual = files("", "", "alice:100000:65536\nbob:165536:65536\nlxd:1000000:1000000000\n");
        assert_eq!(check_range_is_free(DEFAULT_RANGE, &usual), Ok(()));
    }

    #[test]
    fn two_live_allocations_never_share_an_id_and_a_dropped_one_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("ids/host-ids.lock");
        let range = IdRange { first: 5000, count: 3 };
        let allocator = Allocator { source: Source::Reserved { range, lock: lock.clone() } };
        let ids: Vec<HostId> = (0..3).map(|_| allocator.allocate().unwrap()).collect();
        let uids: std::collections::BTreeSet<u32> = ids.iter().map(|id| id.mapping.host_ids((0, 0)).0).collect();
        assert_eq!(uids, [5000, 5001, 5002].into());
        // Full: every id is held, by this process's own descriptions too.
        let err = allocator.allocate().unwrap_err();
        assert!(err.to_string().contains(RANGE_ENV), "{err}");
        drop(ids);
        let again = allocator.allocate().unwrap();
        assert!(range.contains(u64::from(again.mapping.host_ids((0, 0)).0)));
        assert_eq!(fs::metadata(&lock).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_lock_folder_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = open_lock_file(&open.join("host-ids.lock"), false).unwrap_err();
        assert!(err.to_string().contains("writable by it alone"), "{err}");
    }
}
