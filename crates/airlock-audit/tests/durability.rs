//! Real failures: processes killed mid-append, a disk that fills, and many
//! writers at once, in threads and in processes.

// Test code: a failed unwrap is a failed test. Clippy allows that inside
// #[test] functions only, not in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_audit::{AuditEntry, AuditStore};
use airlock_policy::Status;
use common::{child, child_mode, python_verify, record, temp_db};

/// The helper the tests below start as child processes. Started by the test
/// runner itself (without a mode) it has nothing to do.
#[test]
#[ignore = "a helper that the durability tests run in child processes"]
fn child_process_entry() {
    match child_mode().as_deref() {
        Some("append-loop") => append_loop(),
        Some("full-disk") => fill_the_disk(),
        Some(other) => panic!("unknown child mode {other:?}"),
        None => {}
    }
}

fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Appends records (of varied sizes, so a kill can land in a long write)
/// and reports each one after `append` returned: `committed SEQ RUN_ID`.
/// Stops after `AUDIT_COUNT` appends, or never when it is 0.
fn append_loop() {
    let store = AuditStore::open(Path::new(&env_var("AUDIT_DB"))).unwrap();
    let prefix = env_var("AUDIT_PREFIX");
    let count: u64 = env_var("AUDIT_COUNT").parse().unwrap();
    for n in 0.. {
        if count != 0 && n == count {
            break;
        }
        let mut run = record(&format!("{prefix}-{n}"), Status::Ok);
        run.stdout = "y".repeat([10, 4_000, 300_000][n as usize % 3]);
        let entry = store.append(&run, Some(&prefix)).unwrap();
        println!("committed {} {}", entry.seq, entry.run_id);
    }
}

/// The run id of a `committed SEQ RUN_ID` line. The test runner's own
/// `test child_process_entry ... ` may precede it on the same line.
fn committed_run_id(line: &str) -> Option<&str> {
    line.split_once("committed ")?.1.split(' ').nth(1)
}

/// A small xorshift generator: the kill moments vary from run to run, and
/// the seed is printed so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("AUDIT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1);
        eprintln!("kill moments from seed {seed} (set AUDIT_TEST_SEED to replay)");
        Rng(seed)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Opens the store and checks the chain holds exactly `committed` plus at
/// most `unreported` entries (commits a killed child could not report).
fn check_chain(path: &Path, committed: &[String], unreported: u64) {
    let store = AuditStore::open(path).unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_intact(), "{report}");
    let entries = report.entries_checked;
    let reported = committed.len() as u64;
    assert!(entries >= reported && entries <= reported + unreported, "{entries} entries, {reported} reported");
    for run_id in committed {
        assert!(store.get(run_id).unwrap().is_some(), "committed run {run_id} was lost");
    }
}

#[test]
fn appends_reported_committed_survive_sigkill_at_random_moments() {
    let (_dir, path) = temp_db();
    let mut rng = Rng::new();
    let mut committed = Vec::new();
    let rounds = 8;
    for round in 0..rounds {
        let mut appender = child(&[], "child_process_entry", "append-loop")
            .env("AUDIT_DB", &path)
            .env("AUDIT_PREFIX", format!("round{round}"))
            .env("AUDIT_COUNT", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = appender.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(run_id) = committed_run_id(&line) {
                    let _ = sender.send(run_id.to_owned());
                }
            }
        });
        // Once the child is appending, kill it at a random moment of its loop.
        let first = receiver.recv_timeout(Duration::from_secs(60)).expect("the child appends");
        thread::sleep(Duration::from_micros(rng.below(60_000)));
        appender.kill().unwrap();
        appender.wait().unwrap();
        reader.join().unwrap();
        committed.push(first);
        committed.extend(receiver.try_iter());
        check_chain(&path, &committed, round + 1);
    }
    assert!(committed.len() > rounds as usize, "the children appended too little to test anything");
    assert_eq!(python_verify(&path).split(' ').next(), Some("intact"));
}

#[test]
fn sixteen_threads_appending_at_once_lose_nothing_and_never_fork_the_chain() {
    let (_dir, path) = temp_db();
    let threads = 16;
    let per_thread = 20;
    // Half the threads open their own connection (racing to create the
    // file, too); the other half share one handle, as a server does.
    let shared: Arc<std::sync::OnceLock<AuditStore>> = Arc::default();
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (path, shared, barrier) = (path.clone(), shared.clone(), barrier.clone());
            thread::spawn(move || -> Vec<AuditEntry> {
                barrier.wait();
                let own;
                let store = if t % 2 == 0 {
                    own = AuditStore::open(&path).unwrap();
                    &own
                } else {
                    shared.get_or_init(|| AuditStore::open(&path).unwrap())
                };
                (0..per_thread)
                    .map(|n| {
                        store.append(&record(&format!("t{t}-{n}"), Status::Ok), Some(&format!("client-{t}"))).unwrap()
                    })
                    .collect()
            })
        })
        .collect();
    let mut entries: Vec<AuditEntry> = workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect();
    entries.sort_by_key(|entry| entry.seq);
    let total = (threads * per_thread) as u64;
    assert_eq!(entries.iter().map(|entry| entry.seq).collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>());
    for pair in entries.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].entry_hash, "the chain forked at {}", pair[1].seq);
    }
    let store = AuditStore::open(&path).unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.entries_checked, total);
    assert_eq!(report.last_good.map(|head| head.entry_hash), entries.last().map(|entry| entry.entry_hash.clone()));
    assert_eq!(python_verify(&path), format!("intact {total} {}", store.head().unwrap().unwrap()));
}

#[test]
fn four_processes_appending_at_once_lose_nothing_and_never_fork_the_chain() {
    let (_dir, path) = temp_db();
    drop(AuditStore::open(&path).unwrap());
    let per_process = 40;
    let appenders: Vec<_> = (0..4)
        .map(|p| {
            child(&[], "child_process_entry", "append-loop")
                .env("AUDIT_DB", &path)
                .env("AUDIT_PREFIX", format!("process{p}"))
                .env("AUDIT_COUNT", per_process.to_string())
                .stderr(Stdio::null())
                .output_in_background()
        })
        .collect();
    let mut committed = Vec::new();
    for appender in appenders {
        let output = appender.join().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        committed.extend(stdout.lines().filter_map(committed_run_id).map(str::to_owned));
    }
    assert_eq!(committed.len(), 4 * per_process);
    check_chain(&path, &committed, 0);
}

trait OutputInBackground {
    fn output_in_background(&mut self) -> thread::JoinHandle<std::process::Output>;
}

impl OutputInBackground for Command {
    /// Starts the command now and collects its output on a thread, so
    /// several children run at once.
    fn output_in_background(&mut self) -> thread::JoinHandle<std::process::Output> {
        let child = self.stdout(Stdio::piped()).spawn().unwrap();
        thread::spawn(move || child.wait_with_output().unwrap())
    }
}

/// Runs in its own mount namespace (see the test below): mounts a 1 MiB
/// tmpfs, fills it with appends, and checks the store through and after.
fn fill_the_disk() {
    let dir = PathBuf::from(env_var("AUDIT_DIR"));
    let own_namespace = fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_ne!(
        own_namespace.to_string_lossy(),
        env_var("AUDIT_PARENT_MNT_NS"),
        "refusing to mount: this process is not in a mount namespace of its own"
    );
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "airlock-audit-test"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a tmpfs on {}", dir.display());

    let path = dir.join("audit.sqlite3");
    let store = AuditStore::open(&path).unwrap();
    let mut committed: Vec<AuditEntry> = Vec::new();
    let error = loop {
        let mut run = record(&format!("fill-{}", committed.len()), Status::Ok);
        run.stdout = "z".repeat(40 * 1024);
        match store.append(&run, None) {
            Ok(entry) => committed.push(entry),
            Err(error) => break error,
        }
        assert!(committed.len() < 200, "a 1 MiB disk took 200 appends of 40 KiB");
    };
    let message = error.to_string();
    assert!(error.is_disk_full(), "{message}");
    assert!(message.contains(&path.display().to_string()) && message.contains("disk is full"), "{message}");
    assert!(committed.len() >= 5, "the disk filled after {} appends", committed.len());

    let check = |store: &AuditStore, committed: &[AuditEntry]| {
        let report = store.verify().unwrap();
        assert!(report.is_intact(), "{report}");
        assert_eq!(report.entries_checked, committed.len() as u64);
        assert_eq!(report.last_good.map(|head| head.entry_hash), committed.last().map(|e| e.entry_hash.clone()));
    };
    check(&store, &committed);
    // Smaller appends: each one either fits whole or fails whole.
    let mut refused = 0;
    for (n, size) in [20_000, 5_000, 1_000, 100, 20_000, 10].into_iter().enumerate() {
        let mut run = record(&format!("small-{n}"), Status::Ok);
        run.stdout = "s".repeat(size);
        match store.append(&run, None) {
            Ok(entry) => committed.push(entry),
            Err(error) if error.is_disk_full() => refused += 1,
            Err(error) => panic!("not a full-disk error: {error}"),
        }
        check(&store, &committed);
    }
    assert!(refused > 0, "the full disk took every later append");
    drop(store);
    let reopened = AuditStore::open(&path).unwrap();
    check(&reopened, &committed);
    for entry in &committed {
        assert_eq!(reopened.get(&entry.run_id).unwrap().unwrap().entry, *entry);
    }
    println!("full-disk-ok {} appends, then: {message}", committed.len());
}

#[test]
fn a_full_disk_is_an_error_that_leaves_the_chain_intact() {
    let dir = tempfile::tempdir().unwrap();
    let small_disk = dir.path().join("small-disk");
    fs::create_dir(&small_disk).unwrap();
    let namespace = fs::read_link("/proc/self/ns/mnt").unwrap();
    // A private mount namespace: the tmpfs exists only for the child and
    // disappears with it, whatever happens.
    let output = child(&["unshare", "--mount", "--propagation", "private", "--"], "child_process_entry", "full-disk")
        .env("AUDIT_DIR", &small_disk)
        .env("AUDIT_PARENT_MNT_NS", namespace.as_os_str())
        .output()
        .expect("unshare (util-linux) on PATH");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("full-disk-ok"),
        "the child failed (this test needs root, or CAP_SYS_ADMIN, for its mount namespace):\n{stdout}\n{stderr}"
    );
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&small_disk.display().to_string()), "a mount was left behind");
    assert_eq!(fs::read_dir(&small_disk).unwrap().count(), 0, "the child wrote to the host, not its tmpfs");
}
