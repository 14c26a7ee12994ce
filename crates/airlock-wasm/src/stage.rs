//! Where a wasm sandbox's files live, and how its workers see them.
//!
//! With namespaces, a sandbox is the Linux backend's own stage, made by the
//! same helper code (the worker binary without `--guest` is that helper):
//! a user and a mount namespace held by descriptors, and one tmpfs holding
//! /work and /tmp, sized by the policy's disk and inode caps, so the kernel
//! refuses the byte past the cap at the moment it is written. Its root,
//! read-only, holds the interpreter's library and matplotlib's data (bound
//! read-only from the install), five devices, and /.airlock, where each
//! worker mounts the program. Nothing of it is on the host's filesystem.
//!
//! Without namespaces, a private folder of the host holds the same layout,
//! and the disk caps are measured (see `supervise`), as nothing else can hold
//! them; RLIMIT_FSIZE keeps any one file to the cap.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use airlock_core::SandboxError;
use airlock_core::driver::{PROGRAM_DIR, REPORT_FILE};
use airlock_linux::confine;
use airlock_linux::protocol::{Bind, LandlockPlan, LayoutEntry, SetupPlan};
use airlock_policy::Limits;
use rustix::fs::{Mode, OFlags};

use crate::install::InstalledInterpreter;
use crate::protocol::Preopen;
use crate::supervise::MeasuredDisk;

/// Where the interpreter's folders are in a namespaced stage.
const STAGE_STDLIB: &str = "/interpreter/lib";
const STAGE_MPL_DATA: &str = "/interpreter/mpl-data";
/// Where the guest finds the stdlib zip's folder.
const GUEST_STDLIB_DIR: &str = "/usr/local/lib";

/// One sandbox's files.
#[derive(Debug)]
pub(crate) enum Stage {
    /// The sandbox's own namespaces and tmpfs.
    Namespaced(confine::Stage),
    /// A private folder of the host's (0700), removed with the sandbox;
    /// as root, owned by the sandbox's own host id, held as long.
    Host { dir: tempfile::TempDir, work: OwnedFd, files: confine::FileAccess, host_id: Option<confine::HostId> },
}

impl Stage {
    /// A stage in namespaces of its own, made by `worker` in helper mode.
    /// Its user is `host_id` on the host.
    pub fn namespaced(
        worker: &Path,
        installed: &InstalledInterpreter,
        limits: &Limits,
        host_id: confine::HostId,
    ) -> Result<Stage, SandboxError> {
        let bind = |source: &Path, target: &str| Bind {
            source: source.display().to_string(),
            target: target.to_owned(),
            writable: false,
            noexec: false,
        };
        let binds = vec![bind(&installed.stdlib_dir, STAGE_STDLIB), bind(&installed.mpl_data, STAGE_MPL_DATA)];
        if host_id.mapping != confine::IdMapping::Caller {
            // The sandbox's user is not the caller: the trees must be open to others.
            confine::check_readable_by_others(&binds)
                .map_err(|detail| SandboxError::Setup { step: "lay out the sandbox".to_owned(), detail })?;
        }
        let dir = |path: &str, mode: u32| LayoutEntry::Dir { path: path.to_owned(), mode };
        let mut layout = vec![
            dir("work", 0o755),
            dir("tmp", 0o1777),
            dir(PROGRAM_DIR.trim_start_matches('/'), 0o755),
            dir(STAGE_STDLIB.trim_start_matches('/'), 0o755),
            dir(STAGE_MPL_DATA.trim_start_matches('/'), 0o755),
            dir("dev", 0o755),
        ];
        layout.extend(confine::DEVICES.iter().map(|name| LayoutEntry::MountFile { path: format!("dev/{name}") }));
        let plan = SetupPlan {
            supervisor_pid: std::process::id() as i32,
            // Set from the host id by `make_stage`.
            ids: confine::IdMapping::Caller,
            tmpfs_bytes: limits.disk_bytes + confine::LAYOUT_BYTES,
            tmpfs_inodes: limits.disk_inodes + confine::LAYOUT_INODES,
            layout,
            binds,
        };
        Ok(Stage::Namespaced(confine::make_stage(worker, host_id, plan)?))
    }

    /// A stage in a private folder of the host, owned by `host_id` when
    /// given (root runs the guest as an id of the reserved range).
    pub fn on_host(installed: &InstalledInterpreter, host_id: Option<confine::HostId>) -> Result<Stage, SandboxError> {
        let run_as = host_id.as_ref().and_then(|id| reserved_ids(&id.mapping));
        use std::os::unix::fs::PermissionsExt;
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| SandboxError::io(what, e)
        };
        if run_as.is_some() {
            let binds = [&installed.stdlib_dir, &installed.mpl_data].map(|p| Bind {
                source: p.display().to_string(),
                target: String::new(),
                writable: false,
                noexec: false,
            });
            confine::check_readable_by_others(&binds)
                .map_err(|detail| SandboxError::Setup { step: "lay out the sandbox".to_owned(), detail })?;
        }
        let dir = tempfile::Builder::new()
            .prefix("airlock-wasm-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(io("making the sandbox's folder"))?;
        for name in ["work", "tmp"] {
            std::fs::create_dir(dir.path().join(name)).map_err(io("making the sandbox's folders"))?;
        }
        if let Some((uid, gid)) = run_as {
            let owner = Some(rustix::process::Uid::from_raw(uid));
            let group = Some(rustix::process::Gid::from_raw(gid));
            for path in [dir.path().to_owned(), dir.path().join("work"), dir.path().join("tmp")] {
                rustix::fs::chown(&path, owner, group)
                    .map_err(|e| SandboxError::io("handing over the sandbox's folder", e.into()))?;
            }
        }
        let work = rustix::fs::open(
            dir.path().join("work"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| SandboxError::io("opening the work folder", e.into()))?;
        let files = match run_as {
            Some((uid, gid)) => confine::FileAccess::ThreadFsIds { uid, gid },
            None => confine::FileAccess::Direct,
        };
        Ok(Stage::Host { dir, work, files, host_id })
    }

    /// How the supervisor opens the sandbox's files as its user.
    pub fn files(&self) -> &confine::FileAccess {
        match self {
            Stage::Namespaced(stage) => &stage.files,
            Stage::Host { files, .. } => files,
        }
    }

    /// Without namespaces, as root: the host uid and gid the guest runs as.
    pub fn run_as(&self) -> Option<(u32, u32)> {
        match self {
            Stage::Namespaced(_) => None,
            Stage::Host { host_id, .. } => host_id.as_ref().and_then(|id| reserved_ids(&id.mapping)),
        }
    }

    pub fn is_namespaced(&self) -> bool {
        matches!(self, Stage::Namespaced(_))
    }

    /// The work directory, for copy-in and copy-out.
    pub fn work(&self) -> BorrowedFd<'_> {
        match self {
            Stage::Namespaced(stage) => stage.work.as_fd(),
            Stage::Host { work, .. } => work.as_fd(),
        }
    }

    /// The sandbox's user and mount namespaces, to hand to a worker.
    pub fn namespaces(&self) -> Option<(BorrowedFd<'_>, BorrowedFd<'_>)> {
        match self {
            Stage::Namespaced(stage) => Some((stage.user_ns.as_fd(), stage.mount_ns.as_fd())),
            Stage::Host { .. } => None,
        }
    }

    /// A path of the sandbox's root as the worker sees it.
    fn path(&self, sandbox_path: &str) -> String {
        match self {
            Stage::Namespaced(_) => sandbox_path.to_owned(),
            Stage::Host { dir, .. } => dir.path().join(sandbox_path.trim_start_matches('/')).display().to_string(),
        }
    }

    /// Where the worker writes the program.
    pub fn program_dir(&self) -> String {
        self.path(PROGRAM_DIR)
    }

    /// The folders the guest sees: its root read-only, /work and /tmp
    /// writable, the program folder (only its report file can be written),
    /// the interpreter read-only.
    pub fn preopens(&self, installed: &InstalledInterpreter) -> Vec<Preopen> {
        let (stdlib, mpl_data) = match self {
            Stage::Namespaced(_) => (STAGE_STDLIB.to_owned(), STAGE_MPL_DATA.to_owned()),
            Stage::Host { .. } => {
                (installed.stdlib_dir.display().to_string(), installed.mpl_data.display().to_string())
            }
        };
        let preopen = |host: String, guest: &str, writable: bool| Preopen { host, guest: guest.to_owned(), writable };
        vec![
            preopen(self.path("/"), "/", false),
            preopen(stdlib, GUEST_STDLIB_DIR, false),
            preopen(mpl_data, &format!("{GUEST_STDLIB_DIR}/{}/matplotlib/mpl-data", installed.stdlib_name), false),
            preopen(self.path("/work"), "/work", true),
            preopen(self.path("/tmp"), "/tmp", true),
            preopen(self.path(PROGRAM_DIR), PROGRAM_DIR, true),
        ]
    }

    /// What Landlock lets the worker write: /work, /tmp and the report file.
    pub fn landlock(&self, required: bool) -> LandlockPlan {
        LandlockPlan {
            writable_dirs: vec![self.path("/work"), self.path("/tmp")],
            writable_files: vec![self.path(&format!("{PROGRAM_DIR}/{REPORT_FILE}"))],
            required,
        }
    }

    /// Without a mount namespace, the only folders the worker may read.
    pub fn readable(&self, installed: &InstalledInterpreter) -> Vec<String> {
        match self {
            Stage::Namespaced(_) => Vec::new(),
            Stage::Host { dir, .. } => vec![
                dir.path().display().to_string(),
                installed.stdlib_dir.display().to_string(),
                installed.mpl_data.display().to_string(),
            ],
        }
    }

    /// Without a tmpfs: the folders to measure against the caps.
    pub fn measured(&self, limits: &Limits) -> Option<MeasuredDisk> {
        match self {
            Stage::Namespaced(_) => None,
            Stage::Host { dir, .. } => Some(MeasuredDisk {
                roots: vec![dir.path().join("work"), dir.path().join("tmp")],
                bytes: limits.disk_bytes,
                inodes: limits.disk_inodes,
            }),
        }
    }

    /// Whether the disk cap and the inode cap were reached.
    pub fn full(&self, limits: &Limits) -> (bool, bool) {
        match self {
            Stage::Namespaced(stage) => stage.full(),
            Stage::Host { .. } => match self.measured(limits).as_ref().and_then(crate::supervise::disk_over) {
                Some(crate::supervise::Stop::Disk) => (true, false),
                Some(crate::supervise::Stop::Inodes) => (false, true),
                _ => (false, false),
            },
        }
    }
}

/// The host ids of an id of root's reserved range.
fn reserved_ids(mapping: &confine::IdMapping) -> Option<(u32, u32)> {
    match mapping {
        confine::IdMapping::Reserved { uid, gid } => Some((*uid, *gid)),
        _ => None,
    }
}
