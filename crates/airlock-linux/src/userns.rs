//! User namespaces: the sandbox's own, where its code runs as an
//! unprivileged user, [`SANDBOX_UID`] inside and an unprivileged user on the
//! host too.
//!
//! An ordinary caller maps the sandbox's user to itself, which needs no
//! privilege. Root must not: code running as host uid 0, even without a
//! capability, would own every root-owned file a later kernel bug exposed
//! and count against no per-user limit. So as root the sandbox's user is
//! [`HOST_ID_FOR_ROOT`] (nobody) on the host, and root's own uid is not
//! mapped into the namespace at all. Such a map needs CAP_SETUID in the
//! parent namespace, which the helper loses the moment it unshares, so a
//! child forked before the unshare writes it.

use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space};

use crate::mounts::{SANDBOX_GID, SANDBOX_UID};
use crate::protocol::Failure;
use crate::sys::{self, Forked};

/// The host uid and gid the sandbox's user is when the supervisor is root.
pub const HOST_ID_FOR_ROOT: u32 = 65534;

/// Supervisor side, for the probe: whether this process can make the
/// sandboxes it would make. As root that means mapping [`HOST_ID_FOR_ROOT`],
/// which needs CAP_SETUID and CAP_SETGID and that id to exist in this
/// process's own user namespace (root inside `unshare -r`, say, has only
/// itself). Ordinary users map themselves, which always works.
pub fn check_mapping() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SETGID: u64 = 1 << 6;
    const CAP_SETUID: u64 = 1 << 7;
    if effective & (CAP_SETUID | CAP_SETGID) != CAP_SETUID | CAP_SETGID {
        return Err(format!(
            "running as root without CAP_SETUID and CAP_SETGID, airlock cannot run the sandbox as host uid \
             {HOST_ID_FOR_ROOT} (nobody), and it never runs it as root; run airlock as an ordinary user, or with \
             those capabilities"
        ));
    }
    for file in ["uid_map", "gid_map"] {
        let map = fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
        let mapped = map.lines().any(|line| {
            let numbers: Vec<u64> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
            matches!(numbers[..], [inside, _, count] if (inside..inside + count).contains(&u64::from(HOST_ID_FOR_ROOT)))
        });
        if !mapped {
            return Err(format!(
                "this root is in a user namespace where id {HOST_ID_FOR_ROOT} (nobody) does not exist \
                 (/proc/self/{file}), so airlock cannot run the sandbox as nobody, and it never runs it as root; \
                 run airlock as an ordinary user, or map {HOST_ID_FOR_ROOT} into this namespace"
            ));
        }
    }
    Ok(())
}

/// Child side, at setup: a new user and mount namespace in which
/// [`SANDBOX_UID`] is the caller, or [`HOST_ID_FOR_ROOT`] for root. The helper keeps its
/// host uid (and with it its access to the host's files, to clone the trees
/// it binds) until [`become_sandbox_user`].
pub fn enter_new() -> Result<(), Failure> {
    let root = rustix::process::geteuid().is_root();
    let (uid, gid) = if root {
        (HOST_ID_FOR_ROOT, HOST_ID_FOR_ROOT)
    } else {
        (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
    };
    let maps = [
        // setgroups must be denied before an unprivileged process may map
        // its group; as root it is denied too, so nothing inside can drop a
        // group to get around a group's denial.
        ("setgroups", "deny".to_owned()),
        ("uid_map", format!("{SANDBOX_UID} {uid} 1")),
        ("gid_map", format!("{SANDBOX_GID} {gid} 1")),
    ];
    if root {
        return enter_new_mapped_from_outside(&maps);
    }
    unshare()?;
    for (file, content) in &maps {
        fs::write(format!("/proc/self/{file}"), content)
            .map_err(|e| Failure::new(STEP, format!("write {file}"), &e))?;
    }
    Ok(())
}

const STEP: &str = "create the user namespace";

fn unshare() -> Result<(), Failure> {
    // SAFETY: the helper is single-threaded, and CLONE_NEWUSER | CLONE_NEWNS
    // do not unshare file descriptor tables or anything Rust holds.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }.map_err(|e| {
        Failure::new(
            STEP,
            "unshare(CLONE_NEWUSER); enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
             user.max_user_namespaces > 0, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)",
            &e.into(),
        )
    })
}

/// As root: forks a child that stays in the host's user namespace, unshares,
/// and has the child write the maps into this process's namespace.
fn enter_new_mapped_from_outside(maps: &[(&str, String)]) -> Result<(), Failure> {
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| Failure::new(STEP, "pipe", &e.into()));
    let (go_read, go_write) = pipe()?;
    let (said_read, said_write) = pipe()?;
    let helper = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the helper is single-threaded (a fresh exec that starts no threads).
    match unsafe { sys::fork() }.map_err(|e| Failure::new(STEP, "fork the map writer", &e))? {
        Forked::Child => {
            drop((go_write, said_read));
            // The helper's /proc entry, opened while it is surely our parent:
            // if it died and its pid were reused, writes through this
            // descriptor fail instead of reaching another process.
            let helper_dir = rustix::fs::open(
                format!("/proc/{helper}"),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            );
            let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
            // One byte: the helper has unshared. End of file: it gave up.
            let mut go = [0u8; 1];
            let code = match (helper_dir, rustix::io::read(&go_read, &mut go)) {
                (Ok(dir), Ok(1)) if parent == Some(helper) => write_maps(dir.as_fd(), maps, said_write.as_fd()),
                _ => 1,
            };
            // SAFETY: _exit ends this forked copy without running anything
            // of the helper's (no destructors, no atexit handlers).
            unsafe { libc::_exit(code) }
        }
        Forked::Parent { pid, .. } => {
            drop((go_read, said_write));
            let unshared = unshare();
            if unshared.is_ok() {
                let _ = rustix::io::write(&go_write, &[1]);
            }
            drop(go_write);
            let mut said = String::new();
            let _ = fs::File::from(said_read).read_to_string(&mut said);
            let status = rustix::process::Pid::from_raw(pid)
                .and_then(|pid| rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()).ok())
                .flatten();
            unshared?;
            let exited_cleanly = status.and_then(|(_, s)| s.exit_status()) == Some(0);
            if !said.is_empty() || !exited_cleanly {
                if said.is_empty() {
                    said = "the map writer ended without writing them".to_owned();
                }
                return Err(Failure::plain(
                    STEP,
                    format!("map the sandbox's user to host uid {HOST_ID_FOR_ROOT}: {said}"),
                ));
            }
            Ok(())
        }
    }
}

/// The map writer's work, in the forked child: returns its exit code and
/// explains a failure on `said`.
fn write_maps(helper_dir: BorrowedFd<'_>, maps: &[(&str, String)], said: BorrowedFd<'_>) -> i32 {
    for (file, content) in maps {
        let written = rustix::fs::openat(
            helper_dir,
            *file,
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .and_then(|fd| rustix::io::write(&fd, content.as_bytes()));
        if let Err(e) = written {
            let _ = rustix::io::write(said, format!("write {file}: {e}").as_bytes());
            return 1;
        }
    }
    0
}

/// Child side, in the namespace: becomes [`SANDBOX_UID`] and
/// [`SANDBOX_GID`], keeping this process's capabilities in the namespace.
/// For an ordinary caller this changes nothing (its ids are the ones mapped);
/// for root it leaves host uid 0, which is not mapped here, so that every
/// file the sandbox makes from now on belongs to the sandbox's user.
///
/// The capabilities stay because the kernel clears them only when a uid
/// changes away from the namespace's uid 0, and uid 0 is never mapped.
/// A change of credentials does clear the parent-death signal: callers set
/// it afterwards.
pub fn become_sandbox_user() -> Result<(), Failure> {
    let step = "become the sandbox's user";
    let gid = rustix::process::Gid::from_raw(SANDBOX_GID);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| Failure::new(step, "setresgid", &e.into()))?;
    let uid = rustix::process::Uid::from_raw(SANDBOX_UID);
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| Failure::new(step, "setresuid", &e.into()))
}

/// Supervisor side: while the returned guard lives, this thread creates
/// files as the sandbox's host user, so what it copies in belongs to the
/// code. Only root needs it: root's uid is not mapped in the sandbox, and
/// the kernel refuses to create a file whose owner the namespace cannot name.
/// Only this thread's filesystem ids change (not the process's, which a
/// server shares between threads), and the guard puts them back.
pub fn files_as_sandbox_user() -> std::io::Result<FsIdentity> {
    if !rustix::process::geteuid().is_root() {
        return Ok(FsIdentity { restore: None });
    }
    let previous = sys::set_thread_fs_ids(HOST_ID_FOR_ROOT, HOST_ID_FOR_ROOT)?;
    Ok(FsIdentity { restore: Some(previous) })
}

/// See [`files_as_sandbox_user`].
#[must_use]
pub struct FsIdentity {
    restore: Option<(u32, u32)>,
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.restore {
            // Back to root's ids, which root may always take.
            let _ = sys::set_thread_fs_ids(uid, gid);
        }
    }
}

/// Child side, per run: joins the sandbox's user namespace, then its mount
/// namespace (in that order: the second needs the first's capabilities).
pub fn join(user: &OwnedFd, mnt: &OwnedFd) -> Result<(), Failure> {
    let step = "join the sandbox's namespaces";
    move_into_link_name_space(user.as_fd(), Some(LinkNameSpaceType::User))
        .map_err(|e| Failure::new(step, "user", &e.into()))?;
    move_into_link_name_space(mnt.as_fd(), Some(LinkNameSpaceType::Mount))
        .map_err(|e| Failure::new(step, "mount", &e.into()))
}

/// Child side: as root, drops the supplementary groups this process would
/// otherwise keep for permission checks even inside the namespace. An
/// ordinary user cannot, and keeps only groups it already had.
pub fn drop_supplementary_groups() -> Result<(), Failure> {
    if rustix::process::geteuid().is_root() {
        rustix::thread::set_thread_groups(&[]).map_err(|e| Failure::new("drop supplementary groups", "", &e.into()))?;
    }
    Ok(())
}

/// Opens a namespace of this process for the supervisor to keep.
pub fn open_own(kind: &str) -> Result<OwnedFd, Failure> {
    let path = format!("/proc/self/ns/{kind}");
    rustix::fs::open(&path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| Failure::new("open the sandbox's namespaces", path, &e.into()))
}
