//! User namespaces: the sandbox's own, where its code runs as an
//! unprivileged user mapped to the caller's.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};

use rustix::thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space};

use crate::mounts::{SANDBOX_GID, SANDBOX_UID};
use crate::protocol::Failure;

/// Child side, at setup: a new user and mount namespace in which this
/// process's user is [`SANDBOX_UID`]. Mapping only our own ids needs no
/// privilege, so the same path serves root and ordinary users.
pub fn enter_new() -> Result<(), Failure> {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let step = "create the user namespace";
    // SAFETY: the helper is single-threaded, and CLONE_NEWUSER | CLONE_NEWNS
    // do not unshare file descriptor tables or anything Rust holds.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }.map_err(|e| {
        Failure::new(
            step,
            "unshare(CLONE_NEWUSER); enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
             user.max_user_namespaces > 0, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)",
            &e.into(),
        )
    })?;
    // setgroups must be denied before an unprivileged process may map its group.
    let write = |file: &str, content: String| {
        fs::write(format!("/proc/self/{file}"), &content).map_err(|e| Failure::new(step, format!("write {file}"), &e))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{SANDBOX_UID} {uid} 1"))?;
    write("gid_map", format!("{SANDBOX_GID} {gid} 1"))
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
