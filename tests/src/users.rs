//! The `airlock` command run as a given user: root, or an ordinary user
//! (nobody, through setpriv) in cgroups delegated to it, as an administrator
//! or systemd's `Delegate=yes` would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

use crate::{airlock_bin, helper};

/// The ordinary user the tests run as.
pub const NOBODY: u32 = 65534;

/// Who runs `airlock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    Root,
    Nobody,
}

/// A data directory the unprivileged user may write.
pub fn user_home() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown the home to nobody");
    dir
}

/// This process's own cgroup in each hierarchy airlock uses: where runs of
/// a root `airlock` started from here make their cgroups.
pub fn own_cgroups() -> Vec<PathBuf> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let hierarchy = airlock_linux::Hierarchy::from_tables(
        &std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo"),
        &membership,
        None,
        &|mount| std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default(),
    )
    .expect("this host has the cgroups airlock needs");
    match hierarchy {
        airlock_linux::Hierarchy::V1 { memory, pids, cpu, cpuacct } => {
            let mut dirs = vec![memory, pids, cpu];
            dirs.extend(cpuacct);
            dirs
        }
        airlock_linux::Hierarchy::V2 { parent, .. } => vec![parent],
    }
}

/// Cgroups made for a test and handed to nobody, removed when dropped.
#[derive(Debug)]
pub struct Delegated(pub Vec<PathBuf>);

impl Delegated {
    pub fn new() -> Delegated {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!("airlock-test-delegated-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let dirs: Vec<PathBuf> = own_cgroups().iter().map(|p| p.join(&name)).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).expect("create a cgroup to delegate");
            for entry in std::iter::once(dir.clone()).chain(["cgroup.procs", "tasks"].iter().map(|f| dir.join(f))) {
                if entry.exists() {
                    std::os::unix::fs::chown(&entry, Some(NOBODY), Some(NOBODY)).expect("delegate the cgroup");
                }
            }
        }
        Delegated(dirs)
    }
}

impl Default for Delegated {
    fn default() -> Delegated {
        Delegated::new()
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// `airlock ARGS` as nobody, using the system's Python (nobody cannot read
/// root's), after entering `cgroups`.
pub fn nobody_command(home: &Path, cgroups: &[PathBuf]) -> Command {
    let mut script = String::new();
    for dir in cgroups {
        script.push_str(&format!("echo $$ > {}/cgroup.procs && ", dir.display()));
    }
    script.push_str("exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$@\"");
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).arg("sh").arg(airlock_bin());
    with_clean_env(&mut command, home);
    command
}

fn with_clean_env(command: &mut Command, home: &Path) {
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AIRLOCK_HOME", home)
        .env("AIRLOCK_INIT", helper())
        .current_dir(home);
}

/// The `airlock` command as one user, with a data directory (and audit
/// store) of its own; nobody's runs get delegated cgroups, so every limit
/// holds for them too.
#[derive(Debug)]
pub struct AirlockAs {
    pub user: User,
    home: tempfile::TempDir,
    delegated: Option<Delegated>,
}

impl AirlockAs {
    pub fn new(user: User) -> AirlockAs {
        let delegated = (user == User::Nobody).then(Delegated::new);
        AirlockAs { user, home: user_home(), delegated }
    }

    /// `airlock ARGS`.
    pub fn command(&self) -> Command {
        match &self.delegated {
            Some(delegated) => nobody_command(self.home.path(), &delegated.0),
            None => {
                let mut command = Command::new(airlock_bin());
                with_clean_env(&mut command, self.home.path());
                command
            }
        }
    }

    /// Where the runs' cgroups are made.
    pub fn cgroup_parents(&self) -> Vec<PathBuf> {
        match &self.delegated {
            Some(delegated) => delegated.0.clone(),
            None => own_cgroups(),
        }
    }

    /// `airlock run --json --audit --python /usr/bin/python3 ARGS`: the
    /// record printed, and the command's output.
    pub fn run(&self, args: &[&str]) -> (Value, Output) {
        let output = self
            .command()
            .args(["run", "--json", "--audit", "--python", "/usr/bin/python3"])
            .args(args)
            .output()
            .expect("start airlock");
        (parse_record(&output), output)
    }

    /// Starts `airlock run --json --audit --python /usr/bin/python3 ARGS`.
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command()
            .args(["run", "--json", "--audit", "--python", "/usr/bin/python3"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start airlock")
    }

    /// The record the audit store holds for run `id`.
    pub fn stored(&self, id: &str) -> Value {
        let output = self.command().args(["audit", "show", id, "--json"]).output().expect("start airlock audit");
        let entry = parse_record(&output);
        assert_eq!(entry["hash_matches"], true, "{entry}");
        entry["record"].clone()
    }
}

/// The JSON a command printed, or a failure that shows what it said.
pub fn parse_record(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}
