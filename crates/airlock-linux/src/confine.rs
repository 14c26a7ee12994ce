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
pub use crate::copy::{read as copy_out, write as copy_in};
pub use crate::landlock::{
    Enforced as LandlockEnforced, restrict as landlock, restrict_reads_too as landlock_reads_too,
};
pub use crate::limits::apply as apply_rlimits;
pub use crate::mounts::{DEVICES, LAYOUT_BYTES, LAYOUT_INODES, STAGE, check_readable_by_others, pivot_into_stage};
pub use crate::probe::{NAMESPACE_LAYERS, probe};
pub use crate::process::{die_with_parent, exit_if_parent_gone};
pub use crate::supervise::{drain, recv_nonblocking, spawn_helper};
pub use crate::sys::{Forked, clone_with_namespaces, close_from_except, install_seccomp, landlock_abi, wait4_cpu_time};
pub use crate::userns::{
    HOST_ID_FOR_ROOT, become_sandbox_user, check_mapping, drop_supplementary_groups, join as join_sandbox,
};

/// A sandbox's persistent part, made by the helper's setup and held only by
/// these descriptors (see [`make_stage`]).
#[derive(Debug)]
pub struct Stage {
    pub user_ns: OwnedFd,
    pub mount_ns: OwnedFd,
    /// The stage tmpfs's root (read-only), for its free space.
    pub root: OwnedFd,
    pub work: OwnedFd,
    pub tmp: OwnedFd,
}

/// Has `helper` (a binary that runs [`crate::child::main`]) make a sandbox's
/// user and mount namespaces and its stage tmpfs with `plan`'s layout, as
/// [`crate::LinuxBackend`] does for each of its sandboxes.
pub fn make_stage(helper: &Path, plan: SetupPlan) -> Result<Stage, SandboxError> {
    let [user_ns, mount_ns, root, work, tmp] = crate::setup(helper, plan)?;
    Ok(Stage { user_ns, mount_ns, root, work, tmp })
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
/// sandbox.
pub fn find_helper(name: &str, env: &str) -> Result<PathBuf, SandboxError> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(name))).filter(|p| p.is_file()).ok_or_else(
        || SandboxError::Missing {
            what: format!("the sandbox helper `{name}`"),
            hint: format!("install it beside the airlock program, or set {env} to its path"),
        },
    )
}
