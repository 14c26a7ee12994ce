//! The pieces of this backend that another backend reuses to confine a
//! process of its own: the wasm backend's worker is a sandbox of the same
//! shape (the sandbox's user and mount namespaces and its stage tmpfs, fresh
//! PID, network, IPC namespaces per run, pivot_root, rlimits, capabilities,
//! Landlock, seccomp, a cgroup), built from these same functions. Nothing here
//! is new machinery: it names what is shared, so that the two backends cannot
//! drift apart, and keeps the rest of this crate private.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use airlock_core::SandboxError;

use crate::protocol::SetupPlan;

pub use crate::caps::drop_all as drop_capabilities;
pub use crate::cgroup::{CgroupLimits, CgroupStats, Placement, RunCgroup, enter_self as enter_cgroup_v1};
pub use crate::child::take_socket;
pub use crate::copy::{FileAccess, read as copy_out, write as copy_in};
pub use crate::drain::Stream;
pub use crate::hostid::{Allocator, HostId, IdMapping};
pub use crate::landlock::{
    Enforced as LandlockEnforced, restrict as landlock, restrict_reads_too as landlock_reads_too,
};
pub use crate::limits::apply as apply_rlimits;
pub use crate::mounts::{
    DEVICES, LAYOUT_BYTES, LAYOUT_INODES, STAGE, bind_stage_onto_itself, check_readable_by_others, pivot_into_stage,
};
pub use crate::probe::{NAMESPACE_LAYERS, probe};
pub use crate::process::{die_with_parent, exit_if_parent_gone, report_setup};
pub use crate::supervise::{recv_nonblocking, spawn_helper};
pub use crate::sys::{Forked, clone_with_namespaces, close_from_except, install_seccomp, landlock_abi, wait4_cpu_time};
pub use crate::userns::{become_sandbox_user, check_mapping, drop_supplementary_groups, join as join_sandbox};

/// A sandbox's persistent part, made by the helper's setup and held only by
/// these descriptors (see [`make_stage`]), with the host id it runs as.
#[derive(Debug)]
pub struct Stage {
    pub user_ns: OwnedFd,
    pub mount_ns: OwnedFd,
    /// The stage tmpfs's root (read-only), for its free space.
    pub root: OwnedFd,
    pub work: OwnedFd,
    pub tmp: OwnedFd,
    /// The host paths the sandbox's mount table shows.
    pub host_paths_shown: Vec<String>,
    /// How the supervisor opens the stage's files as the sandbox's user.
    pub files: FileAccess,
    /// The sandbox's own host id, held for the stage's life.
    pub host_id: HostId,
}

/// Has `helper` (a binary that runs [`crate::child::main`]) make a sandbox's
/// user and mount namespaces and its stage tmpfs with `plan`'s layout, as
/// [`crate::LinuxBackend`] does for each of its sandboxes, its user being
/// `host_id` (the plan's ids are set from it).
pub fn make_stage(helper: &Path, host_id: HostId, mut plan: SetupPlan) -> Result<Stage, SandboxError> {
    plan.ids = host_id.mapping.clone();
    // No run of this stage has a helper to wait for: its setup helper is reaped now.
    let (made, _) = crate::start_setup(helper, plan, None, || None)?.finish()?;
    let crate::Made { fds: [user_ns, mount_ns, root, work, tmp], host_paths_shown, helpers } = made;
    drop(helpers);
    let files = file_access(&host_id.mapping, helper, &user_ns)?;
    Ok(Stage { user_ns, mount_ns, root, work, tmp, host_paths_shown, files, host_id })
}

/// How the supervisor opens a sandbox's files as its user, whose host ids
/// are `mapping`, in the user namespace `user_ns` that `helper` made.
pub fn file_access(mapping: &IdMapping, helper: &Path, user_ns: &OwnedFd) -> Result<FileAccess, SandboxError> {
    Ok(match mapping {
        IdMapping::Caller => FileAccess::Direct,
        IdMapping::Reserved { uid, gid } => FileAccess::ThreadFsIds { uid: *uid, gid: *gid },
        IdMapping::Subordinate { .. } => FileAccess::Helper {
            helper: helper.to_owned(),
            user_ns: user_ns.try_clone().map_err(|e| SandboxError::io("keeping the user namespace", e))?,
        },
    })
}

impl Stage {
    /// Whether the stage tmpfs has no block left, and no inode left.
    pub fn full(&self) -> (bool, bool) {
        match rustix::fs::fstatvfs(self.root.as_fd()) {
            Ok(vfs) => (vfs.f_bavail == 0, vfs.f_favail == 0),
            Err(_) => (false, false),
        }
    }
}

/// Where a helper binary called `name` is: the path in the environment
/// variable `env`, else beside the running program. Never from PATH:
/// whatever the helper is, the supervisor (often root) runs it to build the
/// sandbox. `build` says which command puts it beside the program.
pub fn find_helper(name: &str, env: &str, build: &str) -> Result<PathBuf, SandboxError> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(name))).filter(|p| p.is_file()).ok_or_else(
        || SandboxError::Missing {
            what: format!("the sandbox helper `{name}`"),
            hint: format!(
                "{build} puts it beside the airlock command; beside another program, copy it there, or set {env} \
                 to its path"
            ),
        },
    )
}
