//! User namespaces: the sandbox's own, where its code runs as an
//! unprivileged user, [`SANDBOX_UID`] inside and a host id of its own
//! outside (see `hostid` for which).
//!
//! Who creates the namespace matters as much as the map: the kernel charges
//! a namespace's per-user budgets (inotify, pending signals, message queues,
//! locked shared memory) up its hierarchy to the uid that *created* it. So as
//! root the helper first becomes the sandbox's host id and creates the
//! namespace as that id, which then may map itself without privilege; root's
//! own uid is never mapped into the sandbox. An ordinary user creates it as
//! itself and maps itself, or a subordinate id through the setuid
//! `newuidmap`/`newgidmap`, which a child forked before the unshare runs
//! from outside the namespace.

use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, Stdio};

use rustix::thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space};

use crate::hostid::{Allocator, IdMapping};
use crate::mounts::{SANDBOX_GID, SANDBOX_UID};
use crate::protocol::Failure;
use crate::sys::{self, Forked};

/// Supervisor side, for the probe: whether this process can make the
/// sandboxes it would make. As root that means taking the reserved ids,
/// which needs CAP_SETUID and CAP_SETGID and those ids to exist in this
/// process's own user namespace (root inside `unshare -r`, say, has only
/// itself). Ordinary users map themselves or their subordinate ids.
pub fn check_mapping(ids: &Result<Allocator, String>) -> Result<(), String> {
    let allocator = ids.as_ref().map_err(Clone::clone)?;
    let Some(range) = allocator.reserved_range() else { return Ok(()) };
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
            "running as root without CAP_SETUID and CAP_SETGID, airlock cannot run sandboxes as host ids \
             {range} of its own, and it never runs them as root; run airlock as an ordinary user, or with \
             those capabilities"
        ));
    }
    for file in ["uid_map", "gid_map"] {
        let map = fs::read_to_string(format!("/proc/self/{file}")).unwrap_or_default();
        let mapped = map.lines().any(|line| {
            let numbers: Vec<u64> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
            matches!(numbers[..], [inside, _, count]
                if inside <= u64::from(range.first) && u64::from(range.last()) < inside + count)
        });
        if !mapped {
            return Err(format!(
                "this root is in a user namespace where airlock's host ids {range} do not exist \
                 (/proc/self/{file}), so airlock cannot run sandboxes as them, and it never runs them as root; \
                 run airlock as an ordinary user, map those ids into this namespace, or choose ids it has \
                 with {}",
                crate::hostid::RANGE_ENV
            ));
        }
    }
    Ok(())
}

/// Child side, at setup: a new user and mount namespace in which
/// [`SANDBOX_UID`] and [`SANDBOX_GID`] are the host ids `mapping` names.
/// For [`IdMapping::Reserved`] the helper has already become those ids; for
/// the others it keeps its own (and with them its access to the host's
/// files, to clone the trees it binds) until [`become_sandbox_user`].
pub fn enter_new(mapping: &IdMapping) -> Result<(), Failure> {
    match mapping {
        IdMapping::Caller | IdMapping::Reserved { .. } => {
            // The helper's own ids, which the namespace's creator may map
            // without privilege.
            let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
            unshare()?;
            let maps = [
                // setgroups must be denied before an unprivileged process may
                // map its group; and so nothing inside can drop a group to get
                // around a group's denial.
                ("setgroups", "deny".to_owned()),
                ("uid_map", format!("{SANDBOX_UID} {uid} 1")),
                ("gid_map", format!("{SANDBOX_GID} {gid} 1")),
            ];
            for (file, content) in &maps {
                fs::write(format!("/proc/self/{file}"), content)
                    .map_err(|e| Failure::new(STEP, format!("write {file}"), &e))?;
            }
            Ok(())
        }
        IdMapping::Subordinate { uid, gid, newuidmap, newgidmap } => {
            let helper = rustix::process::getpid().as_raw_nonzero().get().to_string();
            let uid_map =
                [newuidmap.as_str(), &helper, &SANDBOX_UID.to_string(), &uid.to_string(), "1"].map(str::to_owned);
            let gid_map =
                [newgidmap.as_str(), &helper, &SANDBOX_GID.to_string(), &gid.to_string(), "1"].map(str::to_owned);
            enter_new_mapped_from_outside(&[uid_map.to_vec(), gid_map.to_vec()])
        }
    }
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

/// Forks a child that stays in this user namespace, unshares, and has the
/// child run the setuid map tools (`commands`) on this process: they act
/// only from outside the namespace.
fn enter_new_mapped_from_outside(commands: &[Vec<String>]) -> Result<(), Failure> {
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| Failure::new(STEP, "pipe", &e.into()));
    let (go_read, go_write) = pipe()?;
    let (said_read, said_write) = pipe()?;
    let helper = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the helper is single-threaded (a fresh exec that starts no threads).
    match unsafe { sys::fork() }.map_err(|e| Failure::new(STEP, "fork the map writer", &e))? {
        Forked::Child => {
            drop((go_write, said_read));
            // One byte: the helper has unshared. End of file: it gave up. The
            // helper waits for this child, so its pid cannot be reused
            // while the tools run.
            let mut go = [0u8; 1];
            let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
            let code = match rustix::io::read(&go_read, &mut go) {
                Ok(1) if parent == Some(helper) => run_map_tools(commands, said_write.as_fd()),
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
                return Err(Failure::plain(STEP, format!("map the sandbox's user to its subordinate ids: {said}")));
            }
            Ok(())
        }
    }
}

/// The map writer's work, in the forked child: runs each tool, and explains
/// a failure on `said`. Returns its exit code.
fn run_map_tools(commands: &[Vec<String>], said: std::os::fd::BorrowedFd<'_>) -> i32 {
    for command in commands {
        let Some((program, args)) = command.split_first() else { continue };
        let output = Command::new(program).args(args).env_clear().stdin(Stdio::null()).output();
        let problem = match output {
            Ok(out) if out.status.success() => continue,
            Ok(out) => format!("{} failed: {}", command.join(" "), String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => format!("{program}: {e}"),
        };
        let _ = rustix::io::write(said, problem.as_bytes());
        return 1;
    }
    0
}

/// Child side, as root at setup, once the root is built: becomes the
/// sandbox's host ids for good. Nothing of root remains: no capability, no
/// supplementary group (dropped before).
pub fn become_host_ids(uid: u32, gid: u32) -> Result<(), Failure> {
    let step = "become the sandbox's host user";
    let g = rustix::process::Gid::from_raw(gid);
    rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| Failure::new(step, "setresgid", &e.into()))?;
    let u = rustix::process::Uid::from_raw(uid);
    rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| Failure::new(step, "setresuid", &e.into()))?;
    // Leaving root made this process undumpable, which gives its /proc files
    // to root: it could not write its own uid_map. No other process of this
    // id exists to take advantage (the id is this sandbox's alone), and the
    // sandbox's init makes itself undumpable again at each run.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(|e| Failure::new(step, "PR_SET_DUMPABLE", &e.into()))
}

/// Child side, in the namespace: becomes [`SANDBOX_UID`] and
/// [`SANDBOX_GID`], keeping this process's capabilities in the namespace.
/// For a helper whose ids are the ones mapped this changes nothing; for root
/// (at each run) and for an ordinary user with subordinate ids it leaves an
/// id the namespace does not map, so that every file the sandbox makes from
/// now on belongs to the sandbox's user. Where the namespace allows it
/// (subordinate ids), the supplementary groups go too.
///
/// The capabilities stay because the kernel clears them only when a uid
/// changes away from the namespace's uid 0, and uid 0 is never mapped.
/// A change of credentials does clear the parent-death signal: callers set
/// it afterwards.
pub fn become_sandbox_user() -> Result<(), Failure> {
    let step = "become the sandbox's user";
    let gid = rustix::process::Gid::from_raw(SANDBOX_GID);
    if fs::read_to_string("/proc/self/setgroups").is_ok_and(|s| s.trim() == "allow") {
        rustix::thread::set_thread_groups(&[gid]).map_err(|e| Failure::new(step, "setgroups", &e.into()))?;
    }
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| Failure::new(step, "setresgid", &e.into()))?;
    let uid = rustix::process::Uid::from_raw(SANDBOX_UID);
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| Failure::new(step, "setresuid", &e.into()))
}

/// Child side, per run: joins the sandbox's user namespace, then its mount
/// namespace (in that order: the second needs the first's capabilities).
pub fn join(user: &OwnedFd, mnt: &OwnedFd) -> Result<(), Failure> {
    join_user(user)?;
    move_into_link_name_space(mnt.as_fd(), Some(LinkNameSpaceType::Mount))
        .map_err(|e| Failure::new("join the sandbox's namespaces", "mount", &e.into()))
}

/// Child side: joins the sandbox's user namespace only.
pub fn join_user(user: &OwnedFd) -> Result<(), Failure> {
    move_into_link_name_space(user.as_fd(), Some(LinkNameSpaceType::User))
        .map_err(|e| Failure::new("join the sandbox's namespaces", "user", &e.into()))
}

/// Child side: as root, drops the supplementary groups this process would
/// otherwise keep for permission checks even inside the namespace. An
/// ordinary user cannot here, and keeps only groups it already had (until
/// [`become_sandbox_user`], where the namespace allows it).
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

/// A fork of a forked pool's template (see `fork`), its mounts made: a user
/// namespace nested in the sandbox's, mapping only the sandbox's user onto
/// itself. It has every capability in the new namespace and none over the
/// template's: the mounts made so far can no longer be undone, and what it
/// makes next (network, UTS, IPC, cgroup namespaces) is owned here.
pub fn enter_nested() -> Result<(), Failure> {
    let step = "create the run's user namespace";
    let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    // Its own /proc files are its own to write only while it is dumpable;
    // it becomes undumpable again before any code runs. Nothing else can
    // name it meanwhile: it is alone in its PID namespace but for its init.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(|e| Failure::new(step, "PR_SET_DUMPABLE", &e.into()))?;
    // SAFETY: CLONE_NEWUSER unshares no descriptor table or memory; this
    // process has one thread (the template checks before each fork).
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER) }
        .map_err(|e| Failure::new(step, "unshare(CLONE_NEWUSER)", &e.into()))?;
    for (file, content) in
        [("setgroups", "deny".to_owned()), ("uid_map", format!("{uid} {uid} 1")), ("gid_map", format!("{gid} {gid} 1"))]
    {
        fs::write(format!("/proc/self/{file}"), content)
            .map_err(|e| Failure::new(step, format!("write {file}"), &e))?;
    }
    Ok(())
}
