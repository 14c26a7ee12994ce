//! The sandbox's filesystem.
//!
//! Each sandbox owns one tmpfs (the "stage"), made at setup in the sandbox's
//! own mount namespace and kept alive by the supervisor's descriptors. Its
//! size and inode caps are the work directory's: /work and /tmp are two of
//! its directories. Its root is the sandbox's root: a layout of empty
//! mountpoints and a generated /etc, made once.
//!
//! At setup the root is finished once: the host's /usr, the Python
//! installation and the driver's folder (at /.airlock-driver, see
//! `Runtime::driver_dir`) bound read-only onto their mountpoints, five devices bound,
//! /work and /tmp made mounts of their own, the rest made read-only (an image
//! build's one writable directory excepted: see `RuntimeMount::writable`). Each run
//! then, in a fresh copy of that mount namespace, mounts a fresh /proc with
//! sensitive entries masked and a small tmpfs at /.airlock with the run's
//! program (its code, report and FIFOs),
//! and pivots into the root. nosuid and nodev are set on every mount but the
//! five devices.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use airlock_core::driver::{DRIVER_DIR, PROGRAM_DIR};
use airlock_core::runtime::{Runtime, RuntimeFile};
use rustix::fs::{CWD, FileType, Mode, OFlags};
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags, mount, mount_change, mount_remount,
    move_mount, open_tree, unmount,
};

use crate::protocol::{Bind, Failure, LayoutEntry};
use crate::sys;

/// Where the stage tmpfs is mounted in the sandbox's mount namespace. Any
/// directory every host has will do: the namespace is the sandbox's own, so
/// the host's /tmp is untouched.
pub const STAGE: &str = "/tmp";

/// The user and group the code runs as inside.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;

/// Devices the sandbox gets: nodes of its own where the helper may make
/// them (root), else bound from the host's.
pub const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// Their numbers (major 1, the kernel's memory devices: a fixed ABI), in
/// the order of [`DEVICES`].
const DEVICE_MINORS: [u32; 5] = [3, 5, 7, 8, 9];

/// Where the sandbox's own device nodes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    /// Nodes made for this sandbox alone (root, with CAP_MKNOD): a lock the
    /// code takes on one (`flock` on /dev/null) is on an inode no other
    /// sandbox and nothing on the host holds. If the host refuses to make
    /// them (no CAP_MKNOD in a container, a device cgroup), the host's.
    OwnNodes,
    /// The host's own nodes, bound in: an ordinary user cannot make device
    /// nodes. A lock taken on one is seen by the host and by the runs of
    /// the same time.
    Hosts,
}

/// Files under /proc hidden behind /dev/null. They are the host's, not the
/// run's: its kernel memory, keys, timers and scheduler; how it booted
/// (`cmdline`, the boot id); its disks, modules and devices; and activity a
/// run could watch to learn what the host and other runs do (locks taken
/// anywhere, interrupts, disk and memory statistics). What programs read to
/// size themselves stays: cpuinfo, meminfo, stat, loadavg, uptime.
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "sysrq-trigger",
    "kallsyms",
    "cmdline",
    "sys/kernel/random/boot_id",
    "config.gz",
    "modules",
    "partitions",
    "diskstats",
    "swaps",
    "locks",
    "interrupts",
    "softirqs",
    "vmstat",
    "zoneinfo",
    "buddyinfo",
    "pagetypeinfo",
    "slabinfo",
    "vmallocinfo",
    "schedstat",
    "iomem",
    "ioports",
    "mtrr",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
];
/// Directories under /proc hidden behind an empty read-only tmpfs: hardware,
/// and the host's pressure stall figures (a live view of its load).
const PROC_MASKED_DIRS: [&str; 7] = ["acpi", "scsi", "bus", "irq", "asound", "pressure", "driver"];
/// Directories under /proc made read-only.
const PROC_READ_ONLY: [&str; 2] = ["sys", "fs"];

/// Sandbox paths a runtime may not mount over.
const RESERVED: [&str; 8] = ["/work", "/tmp", "/proc", "/dev", "/etc", PROGRAM_DIR, DRIVER_DIR, "/usr"];

/// Space the layout itself takes on the stage, added to the user's caps so
/// that /work and /tmp get all they were promised.
pub const LAYOUT_BYTES: u64 = 256 * 1024;
pub const LAYOUT_INODES: u64 = 128;

/// Why a runtime cannot be laid out.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "the runtime needs {0} mounted at {1}, which the sandbox reserves; install the interpreter or image elsewhere"
    )]
    Reserved(String, String),
    #[error("{0} must be an absolute path")]
    NotAbsolute(String),
    #[error("{0} is not a directory: only a directory can be mounted writable")]
    WritableFile(String),
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

/// The root's layout and its binds, for a runtime. Supervisor side.
pub fn layout_for(runtime: &Runtime) -> Result<(Vec<LayoutEntry>, Vec<Bind>), LayoutError> {
    let mut entries = vec![
        LayoutEntry::Dir { path: "work".into(), mode: 0o755 },
        LayoutEntry::Dir { path: "tmp".into(), mode: 0o1777 },
        LayoutEntry::Dir { path: PROGRAM_DIR.trim_start_matches('/').into(), mode: 0o755 },
        LayoutEntry::Dir { path: "proc".into(), mode: 0o555 },
        LayoutEntry::Dir { path: "dev".into(), mode: 0o755 },
        LayoutEntry::Dir { path: "etc".into(), mode: 0o755 },
        LayoutEntry::Dir { path: "usr".into(), mode: 0o755 },
    ];
    let mut binds = vec![Bind { source: "/usr".into(), target: "/usr".into(), writable: false, noexec: false }];
    // The top-level library and binary folders: symbolic links into /usr on
    // merged-/usr systems (copied as links), real folders elsewhere (bound).
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = Path::new("/").join(name);
        match fs::symlink_metadata(&host) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(&host)
                    .map_err(|source| LayoutError::Io { path: host.display().to_string(), source })?;
                entries.push(LayoutEntry::Symlink { path: name.into(), target: target.to_string_lossy().into_owned() });
            }
            Ok(meta) if meta.is_dir() => {
                entries.push(LayoutEntry::Dir { path: name.into(), mode: 0o755 });
                binds.push(Bind {
                    source: host.display().to_string(),
                    target: format!("/{name}"),
                    writable: false,
                    noexec: false,
                });
            }
            _ => {}
        }
    }
    // The driver, bound once for the sandbox's life (see `Runtime::driver_dir`).
    if let Some(driver) = &runtime.driver_dir {
        entries.push(LayoutEntry::Dir { path: DRIVER_DIR.trim_start_matches('/').into(), mode: 0o755 });
        binds.push(Bind {
            source: driver.display().to_string(),
            target: DRIVER_DIR.into(),
            writable: false,
            noexec: true,
        });
    }
    for name in DEVICES {
        entries.push(LayoutEntry::MountFile { path: format!("dev/{name}") });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        // POSIX shared memory and named semaphores (multiprocessing's locks,
        // sem_open) are files in /dev/shm: the run's own /tmp, inside its
        // disk caps, gone with the sandbox.
        ("shm", "/tmp"),
    ] {
        entries.push(LayoutEntry::Symlink { path: format!("dev/{name}"), target: target.into() });
    }
    entries.extend(etc_files());

    for mount in &runtime.mounts {
        let (source, target) = (&mount.host, &mount.sandbox);
        for path in [source, target] {
            if !path.is_absolute() {
                return Err(LayoutError::NotAbsolute(path.display().to_string()));
            }
        }
        let target_text = target.display().to_string();
        if source == target && target.starts_with("/usr") && !mount.writable {
            continue; // already there with /usr
        }
        if target == Path::new("/") || RESERVED.iter().any(|r| target.starts_with(r)) {
            return Err(LayoutError::Reserved(source.display().to_string(), target_text));
        }
        let is_dir = fs::metadata(source)
            .map_err(|e| LayoutError::Io { path: source.display().to_string(), source: e })?
            .is_dir();
        let relative = target_text.trim_start_matches('/').to_owned();
        entries.push(if is_dir {
            LayoutEntry::Dir { path: relative, mode: 0o755 }
        } else {
            LayoutEntry::MountFile { path: relative }
        });
        if mount.writable && !is_dir {
            return Err(LayoutError::WritableFile(source.display().to_string()));
        }
        binds.push(Bind {
            source: source.display().to_string(),
            target: target_text,
            writable: mount.writable,
            noexec: false,
        });
    }
    for file in &runtime.files {
        let (RuntimeFile::Text { sandbox, .. } | RuntimeFile::Link { sandbox, .. }) = file;
        if !sandbox.is_absolute() {
            return Err(LayoutError::NotAbsolute(sandbox.display().to_string()));
        }
        if sandbox.parent().is_none() || RESERVED.iter().any(|r| sandbox.starts_with(r)) {
            return Err(LayoutError::Reserved(String::from("a file"), sandbox.display().to_string()));
        }
        let path = sandbox.display().to_string().trim_start_matches('/').to_owned();
        entries.push(match file {
            RuntimeFile::Text { content, .. } => LayoutEntry::File { path, content: content.clone() },
            RuntimeFile::Link { target, .. } => LayoutEntry::Symlink { path, target: target.display().to_string() },
        });
    }
    Ok((entries, binds))
}

/// A minimal /etc written by airlock; nothing is copied from the host's.
fn etc_files() -> Vec<LayoutEntry> {
    let file = |name: &str, content: String| LayoutEntry::File { path: format!("etc/{name}"), content };
    vec![
        file(
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:airlock sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        file("group", format!("root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n")),
        file("hosts", "127.0.0.1\tlocalhost airlock\n::1\tlocalhost ip6-localhost ip6-loopback\n".into()),
        file("hostname", "airlock\n".into()),
        file("nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n".into()),
    ]
}

/// Mounts a fresh instance of the kernel filesystem `fstype` (tmpfs, proc).
fn mount_fs(fstype: &str, target: &Path, flags: MountFlags, options: &str) -> rustix::io::Result<()> {
    let options = std::ffi::CString::new(options).map_err(|_| rustix::io::Errno::INVAL)?;
    mount(fstype, target, fstype, flags, Some(options.as_c_str()))
}

/// Supervisor side, when the sandbox's user is not the caller (root, or an
/// ordinary user's subordinate id): the trees to bind must be open to others. Only the top of each is checked
/// (what a strict umask or a private home folder gets wrong is the whole
/// tree, and the top shows it).
pub fn check_readable_by_others(binds: &[Bind]) -> Result<(), String> {
    // A writable directory belongs to the sandbox's user for the sandbox's life.
    for bind in binds.iter().filter(|b| !b.writable) {
        // A source that is not there fails at the bind itself, saying so.
        let Ok(meta) = fs::metadata(&bind.source) else { continue };
        if !airlock_core::paths::open_to_others(Path::new(&bind.source)) {
            return Err(format!(
                "{} (mode {:o}) is closed to other users, and the sandbox runs as a host user of its own: open it \
                 with `chmod -R o+rX {}`, or install the interpreter or image elsewhere",
                bind.source,
                meta.permissions().mode() & 0o7777,
                bind.source
            ));
        }
    }
    Ok(())
}

/// The trees cloned at setup, ready to attach, and the host paths the
/// sandbox's mount table still shows (where an overlay could not hide them).
pub struct Trees {
    pub trees: Vec<(OwnedFd, PathBuf)>,
    pub host_paths_shown: Vec<String>,
}

/// Child side, as root at setup: a mount namespace of the helper's own, in
/// which it builds the sandbox's root with root's access to the host's
/// files before it gives up root.
pub fn enter_private_namespace() -> Result<(), Failure> {
    // SAFETY: the helper is single-threaded; CLONE_NEWNS unshares nothing Rust holds.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .map_err(|e| Failure::new("create the mount namespace", "unshare(CLONE_NEWNS)", &e.into()))
}

/// The trees cloned from the host, not yet attached anywhere.
pub struct Clones {
    binds: Vec<(Bind, OwnedFd)>,
    devices: Vec<(OwnedFd, PathBuf)>,
    submounted: Vec<String>,
}

/// Child side, at setup: clones the trees to bind (the host's /usr, the
/// interpreter, the devices) with the helper's access to the host's files
/// (the Python installation may lie below a folder only the caller may
/// enter), and before the stage covers /tmp (a source may lie below it).
pub fn clone_binds(binds: &[Bind], devices: Devices) -> Result<Clones, Failure> {
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| Failure::new("make mounts private", "/", &e.into()))?;
    let mut clones = Vec::new();
    for b in binds {
        // A writable directory is one host directory, not a tree: no mounts below it come along.
        let (attributes, recursive) = if b.writable { (WRITABLE, false) } else { (READ_ONLY, true) };
        clones.push((b.clone(), clone_tree(Path::new(&b.source), attributes | noexec(b), recursive)?));
    }
    // After the trees: the nodes' tmpfs covers /tmp, where a tree may lie.
    let source = match devices {
        Devices::OwnNodes => make_own_device_nodes().unwrap_or_else(|_| PathBuf::from("/dev")),
        Devices::Hosts => PathBuf::from("/dev"),
    };
    let mut devices = Vec::new();
    for name in DEVICES {
        // The five devices: the only mounts without nodev. Read-only mounts
        // (writing to a device on a read-only mount still works).
        let attributes = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC;
        devices.push((clone_tree(&source.join(name), attributes, false)?, stage_path(&format!("/dev/{name}"))));
    }
    Ok(Clones { submounted: submounted(binds), binds: clones, devices })
}

/// Child side, at setup, as root in its own mount namespace: the five
/// device nodes made anew on a small tmpfs of their own (without nodev: it
/// belongs to the host's user namespace) at [`STAGE`], and that folder
/// returned. The tmpfs stays below the scratch and the stage mounted there
/// next, in the sandbox's namespace only (see [`hide_host_paths`]), and goes
/// with the old root each run detaches. Nothing made is left on the host.
fn make_own_device_nodes() -> rustix::io::Result<PathBuf> {
    let dir = Path::new(STAGE);
    let options = format!("size=4k,nr_inodes={},mode=0755", DEVICES.len() + 1);
    mount_fs("tmpfs", dir, MountFlags::NOSUID | MountFlags::NOEXEC, &options)?;
    for (name, minor) in DEVICES.iter().zip(DEVICE_MINORS) {
        let path = dir.join(name);
        let mode = Mode::from_raw_mode(0o666);
        rustix::fs::mknodat(CWD, &path, FileType::CharacterDevice, mode, rustix::fs::makedev(1, minor))?;
        // The umask took its share.
        rustix::fs::chmod(&path, mode)?;
    }
    Ok(dir.to_path_buf())
}

/// A bind mount shows, in /proc/self/mountinfo, the path of its tree on the
/// host's filesystem and the host's block device: the data directory, the
/// interpreter's prefix, `/dev/vda1`. An overlay whose only layer is the
/// tree shows instead its own root, the source "airlock", and its layers as
/// they were named when it was made. So each tree is attached on a scratch
/// tmpfs under its sandbox path, the overlay made from there with that
/// path, relative, as its layer. The overlay keeps its own private copy of
/// the layer, so the scratch is of no further use, but it is not unmounted:
/// every unmount waits for an RCU grace period (0.1 to 0.3 ms here, on the
/// path of every cold run), and the stage is mounted over the scratch at the
/// same place, so each run's root, pivoted onto the stage, detaches the
/// scratch with the old root, in the unmount it makes anyway (see
/// [`pivot_into_stage`]; each run's copy of the namespace holds six mounts
/// more). It stays only in the sandbox's own mount namespace, where nothing
/// but airlock's helpers runs: the code's process joins a run's copy only
/// once the old root is detached. (An overlay without an upper layer needs
/// two lower ones: the second is an empty folder.)
///
/// A tree with mounts below it stays a plain recursive bind (an overlay
/// would hide them), as does one the kernel will not overlay; their host
/// paths are returned, for the record.
///
/// Child side, at setup, as a user the namespace maps (it makes folders).
pub fn hide_host_paths(clones: Clones) -> Result<Trees, Failure> {
    let step = "hide host paths";
    let scratch = Path::new(STAGE);
    mount_fs("tmpfs", scratch, MountFlags::NOSUID | MountFlags::NODEV, "size=64k,nr_inodes=256,mode=0700")
        .map_err(|e| Failure::new(step, "scratch tmpfs", &e.into()))?;
    fs::create_dir(scratch.join(EMPTY_LAYER)).map_err(|e| Failure::new(step, EMPTY_LAYER, &e))?;
    rustix::process::chdir(scratch).map_err(|e| Failure::new(step, "chdir", &e.into()))?;
    let mut trees = Vec::new();
    let mut shown = Vec::new();
    for (bind, clone) in clones.binds {
        let target = stage_path(&bind.target);
        let layer = bind.target.trim_start_matches('/').to_owned();
        let is_dir =
            rustix::fs::fstat(&clone).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        // A writable directory (an image build's) is written through, so it
        // cannot be a read-only overlay: its host path shows, and says so.
        if bind.writable || clones.submounted.contains(&bind.source) || !is_dir || layer.contains([':', ',']) {
            shown.push(bind.source.clone());
            trees.push((clone, target));
            continue;
        }
        fs::create_dir_all(&layer).map_err(|e| Failure::new(step, layer.clone(), &e))?;
        move_mount(clone.as_fd(), "", CWD, layer.as_str(), MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(|e| Failure::new(step, layer.clone(), &e.into()))?;
        match overlay(&layer, bind.noexec) {
            Ok(fd) => trees.push((fd, target)),
            Err(_) => {
                shown.push(bind.source.clone());
                trees.push((clone_tree(Path::new(&layer), READ_ONLY | noexec(&bind), true)?, target));
            }
        }
    }
    rustix::process::chdir("/").map_err(|e| Failure::new(step, "chdir /", &e.into()))?;
    trees.extend(clones.devices);
    Ok(Trees { trees, host_paths_shown: shown })
}

/// The `noexec` attribute where `bind` asks for it, else none.
fn noexec(bind: &Bind) -> u64 {
    if bind.noexec { sys::MOUNT_ATTR_NOEXEC } else { 0 }
}

/// The empty second layer of every overlay.
const EMPTY_LAYER: &str = ".empty";

/// A detached read-only overlay of `layer` (a path relative to the current
/// folder) over [`EMPTY_LAYER`], `noexec` if asked.
fn overlay(layer: &str, noexec: bool) -> rustix::io::Result<OwnedFd> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, fsconfig_create, fsconfig_set_string, fsmount, fsopen,
    };
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, "source", "airlock")?;
    fsconfig_set_string(&fs, "lowerdir", format!("{layer}:{EMPTY_LAYER}"))?;
    // Read-only, one real layer: nothing to redirect, copy up or index. Not
    // following redirect and metacopy attributes also means a tree carrying
    // them cannot send lookups elsewhere; and without them each lookup reads
    // fewer attributes (measured: a cold `import pandas` costs about 8 ms of
    // kernel time more than through a bind, 12 ms with the defaults).
    for (key, value) in [("redirect_dir", "nofollow"), ("metacopy", "off"), ("index", "off"), ("xino", "off")] {
        fsconfig_set_string(&fs, key, value)?;
    }
    fsconfig_create(&fs)?;
    let mut attributes =
        MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if noexec {
        attributes |= MountAttrFlags::MOUNT_ATTR_NOEXEC;
    }
    fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attributes)
}

/// The sources of `binds` that have mounts below them, from this process's mount table.
fn submounted(binds: &[Bind]) -> Vec<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let points: Vec<String> =
        table.lines().filter_map(|line| line.split(' ').nth(4)).map(unescape_mount_path).collect();
    binds
        .iter()
        .filter(|b| {
            let below = format!("{}/", b.source.trim_end_matches('/'));
            points.iter().any(|p| p.starts_with(&below))
        })
        .map(|b| b.source.clone())
        .collect()
}

/// A mount point as /proc/self/mountinfo writes it: space, tab, newline and
/// backslash as three octal digits.
fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Child side, at setup, once the binds are cloned: the sandbox's root on a
/// fresh stage tmpfs at [`STAGE`], with its layout and the trees attached.
/// `owner`: the host ids the root's files must belong to, when the helper
/// building it is not yet the sandbox's user (root).
pub fn build_root(
    bytes: u64,
    inodes: u64,
    layout: &[LayoutEntry],
    trees: Vec<(OwnedFd, PathBuf)>,
    owner: Option<(u32, u32)>,
) -> Result<(), Failure> {
    mount_stage(bytes, inodes)?;
    match owner {
        Some((uid, gid)) => {
            let step = "create the sandbox layout";
            let ids = |uid, gid| (Some(rustix::process::Uid::from_raw(uid)), Some(rustix::process::Gid::from_raw(gid)));
            let (u, g) = ids(uid, gid);
            rustix::fs::chown(STAGE, u, g).map_err(|e| Failure::new(step, "chown the stage", &e.into()))?;
            // This thread's filesystem ids only: what it makes is the sandbox user's.
            let previous = sys::set_thread_fs_ids(uid, gid).map_err(|e| Failure::new(step, "setfsuid", &e))?;
            let made = create_layout(layout);
            sys::set_thread_fs_ids(previous.0, previous.1).map_err(|e| Failure::new(step, "setfsuid back", &e))?;
            made?;
        }
        None => create_layout(layout)?,
    }
    attach_root(trees)
}

/// Child side, at setup, once the binds are cloned: mounts the stage tmpfs
/// at [`STAGE`].
fn mount_stage(bytes: u64, inodes: u64) -> Result<(), Failure> {
    let options = format!("size={bytes},nr_inodes={inodes},mode=0755");
    mount_fs("tmpfs", Path::new(STAGE), MountFlags::NOSUID | MountFlags::NODEV, &options)
        .map_err(|e| Failure::new("mount the work tmpfs", options, &e.into()))
}

/// Child side, at setup, once the layout exists: attaches the cloned trees
/// to their mountpoints, makes /work and /tmp mounts of their own, and the
/// rest of the root read-only. Runs copy this namespace, so they start from
/// a finished root.
fn attach_root(trees: Vec<(OwnedFd, PathBuf)>) -> Result<(), Failure> {
    for (tree, target) in trees {
        move_mount(tree.as_fd(), "", CWD, &target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(|e| Failure::new("bind-mount into the sandbox", target.display().to_string(), &e.into()))?;
    }
    for dir in ["/work", "/tmp"] {
        let path = stage_path(dir);
        let tree = clone_tree(&path, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV, false)?;
        move_mount(tree.as_fd(), "", CWD, &path, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(|e| Failure::new("mount /work and /tmp", dir, &e.into()))?;
    }
    mount_remount(Path::new(STAGE), MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV, "")
        .map_err(|e| Failure::new("make the root read-only", "", &e.into()))
}

/// Child side, at setup: creates the layout on the stage.
fn create_layout(entries: &[LayoutEntry]) -> Result<(), Failure> {
    let stage = Path::new(STAGE);
    let step = "create the sandbox layout";
    for entry in entries {
        let result = match entry {
            LayoutEntry::Dir { path, mode } => {
                let dir = stage.join(path);
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&dir)
                    // The umask may have cleared bits (1777 for /tmp): set them exactly.
                    .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(*mode)))
                    .map_err(|e| Failure::new(step, path.clone(), &e))
            }
            LayoutEntry::MountFile { path } => create_parent(stage, path)
                .and_then(|()| fs::File::create(stage.join(path)).map(drop))
                .map_err(|e| Failure::new(step, path.clone(), &e)),
            LayoutEntry::Symlink { path, target } => create_parent(stage, path)
                .and_then(|()| std::os::unix::fs::symlink(target, stage.join(path)))
                .map_err(|e| Failure::new(step, path.clone(), &e)),
            LayoutEntry::File { path, content } => create_parent(stage, path)
                .and_then(|()| fs::write(stage.join(path), content))
                .and_then(|()| fs::set_permissions(stage.join(path), fs::Permissions::from_mode(0o644)))
                .map_err(|e| Failure::new(step, path.clone(), &e)),
        };
        result?;
    }
    Ok(())
}

fn create_parent(stage: &Path, path: &str) -> io::Result<()> {
    match stage.join(path).parent() {
        Some(parent) => fs::DirBuilder::new().recursive(true).mode(0o755).create(parent),
        None => Ok(()),
    }
}

/// Opens a directory of the stage for the supervisor.
pub fn open_stage_dir(relative: &str) -> Result<OwnedFd, Failure> {
    let path = Path::new(STAGE).join(relative);
    rustix::fs::open(&path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())
        .map_err(|e| Failure::new("open the sandbox's directories", path.display().to_string(), &e.into()))
}

fn stage_path(sandbox_path: &str) -> PathBuf {
    Path::new(STAGE).join(sandbox_path.trim_start_matches('/'))
}

/// Clones the mount tree at `source` (detached), with `attributes` set on
/// it and, through mount_setattr, on every mount below it (which a remount of
/// the top alone would not do).
fn clone_tree(source: &Path, attributes: u64, recursive: bool) -> Result<OwnedFd, Failure> {
    let step = "bind-mount into the sandbox";
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let tree =
        open_tree(CWD, source, flags).map_err(|e| Failure::new(step, source.display().to_string(), &e.into()))?;
    sys::mount_setattr_recursive(tree.as_fd(), attributes)
        .map_err(|e| Failure::new(step, source.display().to_string(), &e))?;
    Ok(tree)
}

/// Binds `source` onto `target` with `attributes`.
fn bind(source: &Path, target: &Path, attributes: u64, recursive: bool) -> Result<(), Failure> {
    let tree = clone_tree(source, attributes, recursive)?;
    move_mount(tree.as_fd(), "", CWD, target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| Failure::new("bind-mount into the sandbox", target.display().to_string(), &e.into()))
}

const READ_ONLY: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
/// A directory an image build fills: writable, but nothing in it is a device
/// or gains privileges while the sandbox lives.
const WRITABLE: u64 = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;

/// Child side, for each run, the first half of its root: the program at
/// /.airlock. Returns the FIFOs named in `fifos`, in that order, each
/// opened for the supervisor. The second half is [`mount_run_proc`].
pub fn build_run_root(program_files: &[(String, Vec<u8>)], fifos: &[&str]) -> Result<Vec<OwnedFd>, Failure> {
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| Failure::new("make mounts private", "/", &e.into()))?;
    bind_stage_onto_itself()?;
    write_program(program_files, fifos)
}

/// Child side, for each run, after [`build_run_root`]: a fresh /proc for the
/// run's PID namespace with the host's kernel internals masked.
pub fn mount_run_proc() -> Result<(), Failure> {
    mount_proc(&stage_path("/proc"), bind)
}

/// Mounts a fresh /proc of this process's PID namespace at `proc_dir`, with
/// the host's kernel internals masked; `bind` makes each read-only bind.
///
/// Each kind of mask is made once, on the first of its targets this kernel
/// has: a read-only /dev/null, an empty read-only tmpfs. Every other target
/// of that kind gets a bind of the first, one mount(2) call that keeps the
/// first's flags, where a mask of its own took five calls (a file's) or a
/// superblock (a directory's): about a hundred calls fewer for each run. A
/// target this kernel lacks (ENOENT) is skipped.
fn mount_proc(proc_dir: &Path, bind: fn(&Path, &Path, u64, bool) -> Result<(), Failure>) -> Result<(), Failure> {
    mount_fs("proc", proc_dir, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, "")
        .map_err(|e| Failure::new("mount /proc", "", &e.into()))?;
    let files = PROC_MASKED_FILES.iter().map(|name| proc_dir.join(name));
    mask_each(files, |first| bind(Path::new("/dev/null"), first, READ_ONLY, false))?;
    let dirs = PROC_MASKED_DIRS.iter().map(|name| proc_dir.join(name));
    mask_each(dirs, |first| {
        let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        mount_fs("tmpfs", first, flags, "size=4k,nr_inodes=1")
            .map_err(|e| Failure::new("mask /proc", first.display().to_string(), &e.into()))
    })?;
    for name in PROC_READ_ONLY {
        let target = proc_dir.join(name);
        if target.is_dir() {
            bind(&target, &target, READ_ONLY | sys::MOUNT_ATTR_NOEXEC, true)?;
        }
    }
    Ok(())
}

/// Masks every one of `targets` that exists: the first with `mask`, each
/// other with a bind of the first.
fn mask_each(
    targets: impl Iterator<Item = PathBuf>,
    mask: impl Fn(&Path) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let mut first: Option<PathBuf> = None;
    for target in targets {
        match &first {
            None if target.exists() => {
                mask(&target)?;
                first = Some(target);
            }
            None => {}
            Some(first) => match rustix::mount::mount_bind(first.as_path(), &target) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(Failure::new("mask /proc", target.display().to_string(), &e.into())),
            },
        }
    }
    Ok(())
}

/// A fork of a forked pool's template, in its fresh mount namespace (see
/// `fork`): one fresh tmpfs with the run's disk caps holding its /work and
/// /tmp (and so /dev/shm, a link to /tmp), which hide the template's; a
/// fresh /proc of the run's PID namespace, masked as a cold run's; the
/// program's folder left as the template's, read-only and `noexec`. The
/// template's seccomp filter refuses the new mount API, so these are
/// mount(2)'s binds.
pub fn build_fork_root(bytes: u64, inodes: u64) -> Result<(), Failure> {
    let step = "make the fork's /work and /tmp";
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| Failure::new("make mounts private", "/", &e.into()))?;
    // The tmpfs goes on /work first; its two folders then cover /tmp and
    // /work, and its own root stays hidden below them.
    // Three inodes more than the run's: the tmpfs's root and its two folders.
    let options = format!("size={bytes},nr_inodes={},mode=0755", inodes + 3);
    mount_fs("tmpfs", Path::new("/work"), MountFlags::NOSUID | MountFlags::NODEV, &options)
        .map_err(|e| Failure::new(step, "mount", &e.into()))?;
    for (dir, mode) in [("/work/tmp", 0o1777), ("/work/work", 0o755)] {
        fs::create_dir(dir)
            .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(mode)))
            .map_err(|e| Failure::new(step, dir, &e))?;
    }
    for (source, target) in [("/work/tmp", "/tmp"), ("/work/work", "/work")] {
        rustix::mount::mount_bind(source, target).map_err(|e| Failure::new(step, target, &e.into()))?;
    }
    // The template's program folder, read-only and `noexec` as every
    // run's, is the fork's as it is.
    mount_proc(Path::new("/proc"), bind_by_mount)
}

/// [`bind`] through mount(2): a bind, then its flags by a remount (of the
/// top mount only: the trees bound here have none below them).
fn bind_by_mount(source: &Path, target: &Path, attributes: u64, recursive: bool) -> Result<(), Failure> {
    let step = "bind-mount into the sandbox";
    let fail = |e: rustix::io::Errno| Failure::new(step, target.display().to_string(), &e.into());
    if recursive {
        rustix::mount::mount_bind_recursive(source, target).map_err(fail)?;
    } else {
        rustix::mount::mount_bind(source, target).map_err(fail)?;
    }
    let mut flags = MountFlags::empty();
    for (attribute, flag) in [
        (sys::MOUNT_ATTR_RDONLY, MountFlags::RDONLY),
        (sys::MOUNT_ATTR_NOSUID, MountFlags::NOSUID),
        (sys::MOUNT_ATTR_NODEV, MountFlags::NODEV),
        (sys::MOUNT_ATTR_NOEXEC, MountFlags::NOEXEC),
    ] {
        if attributes & attribute != 0 {
            flags |= flag;
        }
    }
    remount_adding(target, flags).map_err(fail)
}

/// Remounts the bind mount at `target` with `flags` added to those it has:
/// a remount that cleared a flag its source's mount had locked (where root
/// built the sandbox) is refused.
fn remount_adding(target: &Path, flags: MountFlags) -> rustix::io::Result<()> {
    use rustix::fs::StatVfsMountFlags as Had;
    let had = rustix::fs::statvfs(target)?.f_flag;
    let mut flags = flags | MountFlags::BIND;
    for (kept, flag) in [
        (Had::RDONLY, MountFlags::RDONLY),
        (Had::NOSUID, MountFlags::NOSUID),
        (Had::NODEV, MountFlags::NODEV),
        (Had::NOEXEC, MountFlags::NOEXEC),
        (Had::NOATIME, MountFlags::NOATIME),
        (Had::NODIRATIME, MountFlags::NODIRATIME),
        (Had::RELATIME, MountFlags::RELATIME),
    ] {
        if had.contains(kept) {
            flags |= flag;
        }
    }
    mount_remount(target, flags, "")
}

/// Mounts a small tmpfs at /.airlock holding the program, then makes it
/// read-only. Kept apart from the stage so a full /work cannot stop the next
/// run from starting.
fn write_program(files: &[(String, Vec<u8>)], fifos: &[&str]) -> Result<Vec<OwnedFd>, Failure> {
    let step = "write the program";
    let dir = stage_path(PROGRAM_DIR);
    let bytes: usize = files.iter().map(|(_, c)| c.len().div_ceil(4096) * 4096).sum::<usize>() + 64 * 1024;
    let options = format!("size={bytes},nr_inodes=16,mode=0755");
    // Nothing here is executed: the driver is read, and the native library
    // a driver loads comes in a memfd (see `native`).
    mount_fs("tmpfs", &dir, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, &options)
        .map_err(|e| Failure::new(step, "mount", &e.into()))?;
    for (name, content) in files {
        if name.contains('/') || name.starts_with('.') {
            return Err(Failure::plain(step, format!("bad program file name {name:?}")));
        }
        let path = dir.join(name);
        fs::write(&path, content)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o444)))
            .map_err(|e| Failure::new(step, name.clone(), &e))?;
    }
    let mut opened = Vec::with_capacity(fifos.len());
    for name in fifos {
        let path = dir.join(name);
        rustix::fs::mknodat(CWD, &path, rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .map_err(|e| Failure::new(step, format!("the {name} FIFO"), &e.into()))?;
        // Open for reading and writing, so the supervisor never sees an early
        // end of file before the driver opens it, never blocks on it, and
        // the driver's own open never waits for the other end.
        let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| Failure::new(step, format!("open the {name} FIFO"), &e.into()))?;
        opened.push(fd);
    }
    mount_remount(
        &dir,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        options.as_str(),
    )
    .map_err(|e| Failure::new(step, "make read-only", &e.into()))?;
    Ok(opened)
}

/// Child side, in the run's private copy of the sandbox's mount namespace:
/// the stage as a fresh recursive bind onto itself. Where root built it,
/// this copy of the namespace holds it locked (a less privileged namespace
/// may not reveal what a more privileged one mounted), and pivot_root
/// refuses a locked new root; the top of a fresh bind is not locked, and
/// everything below it stays so. No attribute changes: /work stays writable.
pub fn bind_stage_onto_itself() -> Result<(), Failure> {
    let step = "bind the stage onto itself";
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE;
    let stage = open_tree(CWD, STAGE, flags).map_err(|e| Failure::new(step, STAGE, &e.into()))?;
    move_mount(stage.as_fd(), "", CWD, STAGE, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| Failure::new(step, STAGE, &e.into()))
}

/// Child side: makes the stage the root and detaches the old one, so nothing
/// of the host's filesystem remains reachable: the old root takes with it
/// every mount below it, the scratch tmpfs under the stage included (see
/// [`hide_host_paths`]).
pub fn pivot_into_stage() -> Result<(), Failure> {
    pivot_onto_stage()?;
    detach_old_root()
}

/// The first half of [`pivot_into_stage`]: the stage becomes the root, and
/// the old root stays stacked on top of it until [`detach_old_root`]. Until
/// then the host's filesystem is still reachable from this mount namespace:
/// no code may join it (a run's init seals it, see `child`).
pub fn pivot_onto_stage() -> Result<(), Failure> {
    let step = "pivot_root into the sandbox";
    rustix::process::chdir(STAGE).map_err(|e| Failure::new(step, "chdir", &e.into()))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; the
    // unmount in `detach_old_root` then detaches it (no directory for it needed).
    rustix::process::pivot_root(".", ".").map_err(|e| Failure::new(step, "pivot_root", &e.into()))
}

/// The second half of [`pivot_into_stage`], from the folder
/// [`pivot_onto_stage`] left this process in. The unmount waits for an RCU
/// grace period (0.1 to 0.2 ms here).
pub fn detach_old_root() -> Result<(), Failure> {
    let step = "pivot_root into the sandbox";
    unmount(".", UnmountFlags::DETACH).map_err(|e| Failure::new(step, "detach the old root", &e.into()))?;
    rustix::process::chdir("/").map_err(|e| Failure::new(step, "chdir /", &e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_closed_to_others_is_refused_with_the_fix() {
        let root = tempfile::tempdir().unwrap();
        let bind = |path: &Path| Bind {
            source: path.display().to_string(),
            target: "/x".to_owned(),
            writable: false,
            noexec: false,
        };
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(check_readable_by_others(&[bind(root.path())]), Ok(()));
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let refused = check_readable_by_others(&[bind(root.path())]).unwrap_err();
        assert!(refused.contains("mode 700") && refused.contains("chmod -R o+rX"), "{refused}");
    }
}
