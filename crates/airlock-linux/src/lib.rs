//! airlock's Linux backend.
//!
//! # Design
//!
//! A sandbox ([`LinuxInstance`]) is a user namespace, a mount namespace and
//! a tmpfs (the "stage": /work, /tmp and the root's layout), made once by the
//! helper and then held only by descriptors in the supervisor: no process,
//! no mount on the host. Dropping the instance closes them and the kernel
//! frees everything. Each run is a fresh process tree in fresh PID, network,
//! IPC, UTS and cgroup namespaces and a fresh copy of the mount namespace,
//! in a cgroup of its own.
//!
//! The supervisor (this library, possibly in a multi-threaded program) never
//! sets anything up in a fork of itself: it starts `airlock-init` with
//! fork+exec and sends it a plan. The helper, single-threaded, does the work
//! in the order `child.rs` shows on one screen: join the sandbox, new
//! namespaces, hostname, loopback, mounts and pivot_root, rlimits,
//! capabilities and no_new_privs, Landlock, and, in the code's own process,
//! close every descriptor but 0-2, seccomp last, exec.
//!
//! One file per concern, each with its supervisor half and its child half:
//! `userns`, `mounts`, `network`, `cgroup` (v1 and v2 behind one trait),
//! `limits`, `caps`, `landlock`, `seccomp` (policy as data, compiled here),
//! `copy` (copy-in and copy-out), `process`, `supervise` (the run loop),
//! `protocol` (the messages between the two halves), `native` (the library
//! warm drivers load, one sealed memfd shared by every sandbox).

mod caps;
mod cgroup;
pub mod child;
pub mod confine;
mod copy;
mod drain;
pub mod fork;
mod forked;
pub mod hostid;
mod instance;
mod landlock;
mod limits;
mod mounts;
mod native;
mod network;
mod observe;
mod probe;
mod process;
pub mod protocol;
mod sampler;
pub mod seccomp;
mod spare;
mod supervise;
mod sys;
mod userns;
mod warm;

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use airlock_core::{Backend, Instance, Probe, Runtime, SandboxError};
use airlock_policy::{BackendKind, Layer, Policy, SandboxPath};

pub use cgroup::{DELEGATED_CGROUP_ENV, HOLD_ARG, Hierarchy, hold};
pub use instance::LinuxInstance;
pub use native::{NATIVE_ENV as FORK_LIB_ENV, NATIVE_NAME as FORK_LIB_NAME};
pub use network::PROXY_ADDR;
pub use probe::{PROBE_USERNS_ARG, TRIAL_CACHE as PROBE_TRIAL_CACHE, try_user_namespace};

use crate::protocol::{Reply, Request, SetupPlan};

/// The default seccomp policy as compiled by build.rs (see
/// [`seccomp::default_program`]).
const DEFAULT_SECCOMP_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/default-seccomp.bpf"));

/// The forked mode's template policy as compiled by build.rs (see
/// [`seccomp::template_program`]).
const TEMPLATE_SECCOMP_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/template-seccomp.bpf"));

/// The environment variable naming the helper binary, for installs where it
/// is not beside the running program.
pub const HELPER_ENV: &str = "AIRLOCK_INIT";
/// The helper's file name.
pub const HELPER_NAME: &str = "airlock-init";

/// The Linux backend. Cheap to share; the host is probed once.
#[derive(Debug, Default)]
pub struct LinuxBackend {
    helper: Option<PathBuf>,
    /// The native library (the forked mode's, and every warm driver's arena
    /// allocator): read once, shared by every sandbox (see `native`).
    native: Arc<native::NativeLibrary>,
    state: OnceLock<HostState>,
    /// A helper started while the host is probed, for the first sandbox's
    /// setup (see `spare`).
    spare: std::sync::Mutex<Option<spare::SpareHelper>>,
    /// A helper started with that one, for the first sandbox's first run
    /// (see `spare`).
    run_spare: std::sync::Mutex<Option<spare::SpareHelper>>,
}

#[derive(Debug)]
struct HostState {
    cgroups: Result<Hierarchy, String>,
    /// Where sandboxes' host ids come from (see `hostid`).
    ids: Result<hostid::Allocator, String>,
    probe: Probe,
    seccomp: Arc<Vec<seccomp::Instruction>>,
}

impl LinuxBackend {
    /// A backend that finds its helper through [`HELPER_ENV`], or beside the
    /// running program.
    pub fn new() -> LinuxBackend {
        LinuxBackend::default()
    }

    /// A backend using this helper binary.
    pub fn with_helper(helper: impl Into<PathBuf>) -> LinuxBackend {
        LinuxBackend { helper: Some(helper.into()), ..LinuxBackend::default() }
    }

    /// This backend, its forked templates and pooled sandboxes loading the
    /// native library at `path` (see [`FORK_LIB_NAME`]) rather than the one
    /// beside the helper.
    pub fn with_fork_library(mut self, path: impl Into<PathBuf>) -> LinuxBackend {
        self.native = Arc::new(native::NativeLibrary::new(Some(path.into())));
        self
    }

    fn state(&self) -> &HostState {
        self.state.get_or_init(|| {
            let helper = self.helper_path().ok();
            let cgroups = Hierarchy::detect(helper.as_deref());
            // The first sandbox's setup helper and its first run's helper,
            // started now so that their starts (and the run's network
            // namespace) overlap the rest of the probe and the caller's own
            // work; once the cgroup is known, since finding it may move this
            // process into a systemd scope, and every helper starts where it
            // would without a spare. Held until the first sandbox, or until
            // the backend goes (see `spare`).
            if let Some(helper) = &helper {
                *self.spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    spare::SpareHelper::start(helper);
                *self.run_spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    spare::SpareHelper::start_for_run(helper);
            }
            if let Ok(h) = &cgroups {
                // The next start after a crash cleans up what it left:
                // before any host id is taken, so that a process the dead
                // airlock left in one of them (a degraded run's, without a
                // PID namespace to end it) is gone before its host id is
                // handed out again.
                h.remove_stale();
            }
            let ids = hostid::Allocator::for_this_process();
            let probe = probe::probe_with_helper(&cgroups, &ids, helper.as_deref());
            let seccomp = Arc::new(seccomp::default_program());
            HostState { cgroups, ids, probe, seccomp }
        })
    }

    /// Where the helper binary is.
    pub fn helper_path(&self) -> Result<PathBuf, SandboxError> {
        match &self.helper {
            Some(path) => Ok(path.clone()),
            None => confine::find_helper(
                HELPER_NAME,
                HELPER_ENV,
                "`scripts/build` (or, for the glibc command, `cargo build --release`)",
            ),
        }
    }
}

impl Backend for LinuxBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Linux
    }

    fn probe(&self) -> Result<Probe, SandboxError> {
        Ok(self.state().probe.clone())
    }

    fn create(&self, policy: &Policy, runtime: &Runtime) -> Result<Box<dyn Instance>, SandboxError> {
        Ok(Box::new(self.make(policy, runtime, FirstRun::Here)?))
    }

    /// A warm sandbox's run and a template's are each made on a thread of
    /// their own (`warm`, `forked`), which may not use a helper started on
    /// this one (see `spare`): none is started for them here, nor its
    /// network namespace made, only to be refused.
    fn create_to_start_ahead(&self, policy: &Policy, runtime: &Runtime) -> Result<Box<dyn Instance>, SandboxError> {
        Ok(Box::new(self.make(policy, runtime, FirstRun::Elsewhere)?))
    }
}

/// Where a sandbox's first run is made: on the thread that made the
/// sandbox, whose run's helper is then started while the sandbox is built
/// (`spare`), or on another.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FirstRun {
    Here,
    Elsewhere,
}

impl LinuxBackend {
    fn make(&self, policy: &Policy, runtime: &Runtime, first_run: FirstRun) -> Result<LinuxInstance, SandboxError> {
        let state = self.state();
        // Taken first, so that a sandbox refused below ends it too.
        let spare = self.spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let run_spare = self.run_spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        policy.check(&state.probe.host)?;
        let degraded = state.probe.check(policy)?;
        let seccomp = state.seccomp.clone();
        let helper = self.helper_path()?;
        let mut runtime = runtime.clone();
        // The driver's folder, checked again as it is bound: one removed or
        // changed since the runtime was made (a long-lived server's) is not
        // bound, and each run brings the driver instead.
        let owner = rustix::process::geteuid().as_raw();
        // Noted first, as in use (see `driver::note_folder_used`).
        if let Some(dir) = runtime.driver_dir.as_deref() {
            airlock_core::driver::note_folder_used(dir);
        }
        if runtime.driver_dir.as_deref().is_some_and(|dir| !airlock_core::driver::folder_holds_this_driver(dir, owner))
        {
            runtime.driver_dir = None;
        }
        let (layout, binds) = mounts::layout_for(&runtime)
            .map_err(|e| SandboxError::Setup { step: "lay out the sandbox".to_owned(), detail: e.to_string() })?;
        let allocator = state.ids.as_ref().map_err(|detail| SandboxError::Setup {
            step: "choose the sandbox's host ids".to_owned(),
            detail: detail.clone(),
        })?;
        // Taken for this sandbox's life: given back when the instance drops.
        let host_id = allocator
            .allocate()
            .map_err(|e| SandboxError::Setup { step: "take a host id".to_owned(), detail: e.to_string() })?;
        if host_id.mapping != hostid::IdMapping::Caller {
            // The sandbox's user is not the caller: the trees must be open to others.
            mounts::check_readable_by_others(&binds)
                .map_err(|detail| SandboxError::Setup { step: "lay out the sandbox".to_owned(), detail })?;
            hand_writable_to_sandbox(&binds, &host_id.mapping)?;
        }
        let plan = SetupPlan {
            supervisor_pid: std::process::id() as i32,
            ids: host_id.mapping.clone(),
            tmpfs_bytes: policy.limits.disk_bytes + mounts::LAYOUT_BYTES,
            tmpfs_inodes: policy.limits.disk_inodes + mounts::LAYOUT_INODES,
            layout,
            binds,
        };
        let cgroups = if degraded.contains(&Layer::Cgroups) { None } else { state.cgroups.clone().ok() };
        // The run's spare started with the probe, if this thread started it
        // (only that thread may use it); else one started once the setup is
        // sent, while the sandbox is built. One of another thread's, or any
        // where the first run is made elsewhere (which then starts none),
        // is refused, and reaped with the sandbox's ending helpers.
        let (run_spare, refused_run_spare) = match run_spare {
            Some(s) if s.started_on_this_thread() && first_run == FirstRun::Here => (Some(s), None),
            Some(s) => (None, s.refuse()),
            None => (None, None),
        };
        let next_for_run = || match first_run {
            FirstRun::Here => run_spare.or_else(|| spare::SpareHelper::start_for_run(&helper)),
            FirstRun::Elsewhere => None,
        };
        let building = start_setup(&helper, plan, spare, next_for_run);
        // While the helper builds: the cgroup of the sandbox's first run,
        // made now rather than after the sandbox is handed over (see
        // `LinuxInstance::first_cgroup`). A failure here is the run's to
        // meet again, and to report.
        let limits = instance::run_cgroup_limits(&policy.limits);
        let first_cgroup = cgroups
            .as_ref()
            .filter(|_| building.is_ok())
            .and_then(|h| h.create(&limits).ok())
            .map(|made| (limits, made));
        // A sandbox that cannot be made may mean the host changed since a
        // remembered trial: the next start probes again, and names the fix.
        let (made, run_helper) = building.and_then(Building::finish).inspect_err(|_| probe::forget_trial())?;
        let Made { fds: [user_ns, mount_ns, stage, work, tmp], host_paths_shown, mut helpers } = made;
        helpers.extend(refused_run_spare);
        let files = confine::file_access(&host_id.mapping, &helper, &user_ns)?;
        for (name, content) in &runtime.tmp_seed {
            // Checked as a path below a directory, as those below /work are.
            let path = SandboxPath::parse(name)?;
            copy::write(&files, tmp.as_fd(), &path, content)?;
        }
        let mut details = std::collections::BTreeMap::new();
        details.insert("host_ids".to_owned(), host_id.mapping.describe());
        if !host_paths_shown.is_empty() {
            details.insert(
                "mount_table".to_owned(),
                format!(
                    "shows the host paths of {} (bound as they are: mounts below them, or no overlay here)",
                    host_paths_shown.join(", ")
                ),
            );
        }
        Ok(LinuxInstance {
            native: self.native.clone(),
            helper,
            policy: policy.clone(),
            runtime,
            user_ns,
            mount_ns,
            stage,
            work,
            cgroups,
            degraded,
            seccomp,
            landlock_abi: sys::landlock_abi(),
            written: 0,
            files,
            details,
            ending: std::sync::Mutex::new(helpers),
            run_helper: std::sync::Mutex::new(run_helper),
            first_cgroup: std::sync::Mutex::new(first_cgroup),
            host_id,
        })
    }
}

/// When the sandbox's user is not the caller, each writable directory (an
/// image build's new environment) is handed to its host id, alone, for the
/// sandbox's life. Only the directory itself changes owner; the caller takes
/// it back, and checks what the sandbox left in it, once the sandbox is gone.
fn hand_writable_to_sandbox(binds: &[protocol::Bind], ids: &hostid::IdMapping) -> Result<(), SandboxError> {
    let (uid, gid) = match ids {
        hostid::IdMapping::Caller => return Ok(()),
        hostid::IdMapping::Reserved { uid, gid } => (*uid, *gid),
        // Handing a directory to a subordinate id needs the user namespace
        // that maps it; until the helper does that, refuse rather than open
        // the directory to every host user for the build.
        hostid::IdMapping::Subordinate { .. } => match binds.iter().find(|b| b.writable) {
            Some(bind) => {
                return Err(SandboxError::Setup {
                    step: "lay out the sandbox".to_owned(),
                    detail: format!(
                        "{} must be writable by the sandbox's user, a subordinate id of yours, which airlock cannot \
                         hand it to yet: build images as root, or as a user without entries in /etc/subuid",
                        bind.source
                    ),
                });
            }
            None => return Ok(()),
        },
    };
    let id = Some(rustix::process::Uid::from_raw(uid));
    let gid = Some(rustix::process::Gid::from_raw(gid));
    for bind in binds.iter().filter(|b| b.writable) {
        let fail = |e: rustix::io::Errno| SandboxError::Setup {
            step: "lay out the sandbox".to_owned(),
            detail: format!("handing {} to the sandbox's user: {e}", bind.source),
        };
        // Opened without following a link, so the one directory named is the one changed.
        let dir = rustix::fs::open(
            &bind.source,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(fail)?;
        rustix::fs::fchown(&dir, id, gid).map_err(fail)?;
        rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(0o700)).map_err(fail)?;
    }
    Ok(())
}

/// A sandbox as its setup helper handed it over.
struct Made {
    /// The user namespace, the mount namespace, the stage root, /work, /tmp.
    fds: [OwnedFd; 5],
    /// The host paths its mount table shows.
    host_paths_shown: Vec<String>,
    /// The helper, still ending: once it has handed the sandbox over it only
    /// closes what it built in, and is reaped when the sandbox goes; and a
    /// spare refused on the way (see `spare`).
    helpers: Vec<supervise::Ending>,
}

/// A setup sent to its helper, not yet handed back ([`Building::finish`]).
pub(crate) struct Building {
    ending: supervise::Ending,
    socket: OwnedFd,
    refused: Option<supervise::Ending>,
    /// The helper for the sandbox's first run, started while this one builds.
    next: Option<spare::SpareHelper>,
}

/// Sends `plan` to a helper (`spare`, where this thread started one), and
/// then takes the helper for the sandbox's first run from `next_for_run`
/// (a spare, or one it starts while the sandbox builds; see `spare`). The
/// sandbox comes from [`Building::finish`].
pub(crate) fn start_setup(
    helper: &Path,
    plan: SetupPlan,
    spare: Option<spare::SpareHelper>,
    next_for_run: impl FnOnce() -> Option<spare::SpareHelper>,
) -> Result<Building, SandboxError> {
    let spare::Started { child, socket, refused } = spare::HelperSource { path: helper, spare }
        .start()
        .map_err(|e| SandboxError::io("starting the sandbox helper", e))?;
    // Killed and reaped unless it hands the sandbox over: a helper stuck (on
    // a hung mount, say) must not hold the caller forever.
    let ending = supervise::Ending::new(child);
    protocol::send_request(socket.as_fd(), &Request::Setup(plan), &[])
        .map_err(|e| SandboxError::io("talking to the helper", e))?;
    let next = next_for_run();
    Ok(Building { ending, socket, refused, next })
}

impl Building {
    /// The sandbox, as the helper hands it over, and the first run's helper.
    pub(crate) fn finish(self) -> Result<(Made, Option<spare::SpareHelper>), SandboxError> {
        let step = |detail: String| SandboxError::Setup { step: "create the sandbox".to_owned(), detail };
        let Building { ending, socket, refused, next } = self;
        match supervise::recv_within(socket.as_fd(), supervise::SETUP_TIMEOUT) {
            Ok(Some((Reply::SetupDone { host_paths_shown }, fds))) => fds
                .try_into()
                .map(|fds| {
                    (Made { fds, host_paths_shown, helpers: std::iter::once(ending).chain(refused).collect() }, next)
                })
                .map_err(|fds: Vec<OwnedFd>| step(format!("the helper handed over {} descriptors, not 5", fds.len()))),
            Ok(Some((Reply::Failed(failure), _))) => {
                Err(SandboxError::Setup { step: failure.step.clone(), detail: failure.to_string() })
            }
            Ok(Some((other, _))) => Err(step(format!("unexpected reply {other:?}"))),
            Ok(None) => Err(step("the helper exited without a word".to_owned())),
            Err(e) => Err(SandboxError::io("talking to the helper", e)),
        }
    }
}
