//! Limits the kernel keeps no count of, watched by the supervisor from
//! outside the run every [`SAMPLE_INTERVAL`], so that a limit reached and
//! then undone (a disk filled and emptied, descriptors opened and closed)
//! is still listed if it held for an interval:
//!
//! - the disk and its inodes: the stage tmpfs, through the supervisor's own
//!   descriptor of it (`fstatvfs`), full when no block or no inode is free;
//! - open files: each process's `/proc/PID/fd`, whose size Linux 6.2 and
//!   later report as its number of open descriptors to anyone who may see
//!   the process, undumpable or not. Older kernels give only the listing,
//!   which a process that made itself undumpable closes to everyone but
//!   root; such processes are counted as not counted, and the record says so.
//!
//! The run's processes are its cgroup's, or, without one, the run's init
//! and code and their descendants.

use std::collections::BTreeSet;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use airlock_policy::Limit;

/// How often the disk and the descriptors are looked at.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(10);

/// How this kernel lets descriptors be counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// The size of `/proc/PID/fd` (Linux 6.2 and later).
    Size,
    /// Listing `/proc/PID/fd`.
    Listing,
}

impl Counting {
    fn detect() -> Counting {
        // This process holds descriptors, so a size of 0 means the kernel
        // does not report the count.
        match rustix::fs::stat("/proc/self/fd") {
            Ok(stat) if stat.st_size > 0 => Counting::Size,
            _ => Counting::Listing,
        }
    }
}

/// The supervisor's sampler for one run.
#[derive(Debug)]
pub struct Sampler<'a> {
    stage: BorrowedFd<'a>,
    open_files: u64,
    counting: Counting,
    next: Option<Instant>,
    seen: BTreeSet<Limit>,
    /// Processes whose descriptors could not be counted.
    uncounted: BTreeSet<i32>,
}

impl<'a> Sampler<'a> {
    pub fn new(stage: BorrowedFd<'a>, open_files: u64) -> Sampler<'a> {
        Sampler {
            stage,
            open_files,
            counting: Counting::detect(),
            next: None,
            seen: BTreeSet::new(),
            uncounted: BTreeSet::new(),
        }
    }

    /// Starts sampling (the code has started).
    pub fn start(&mut self, now: Instant) {
        self.next = Some(now);
    }

    /// Stops sampling (the run has ended).
    pub fn stop(&mut self) {
        self.next = None;
    }

    /// When the next sample is due, while sampling.
    pub fn next_at(&self) -> Option<Instant> {
        self.next
    }

    /// Takes a sample if one is due; `processes` lists the run's.
    pub fn sample_if_due(&mut self, now: Instant, processes: impl FnOnce() -> Vec<i32>) {
        let Some(next) = self.next.filter(|next| now >= *next) else { return };
        self.next = Some((next + SAMPLE_INTERVAL).max(now));
        self.sample_disk();
        if !self.seen.contains(&Limit::OpenFiles) {
            for pid in processes() {
                match count_descriptors(pid, self.counting) {
                    Some(count) if count >= self.open_files => {
                        self.seen.insert(Limit::OpenFiles);
                        break;
                    }
                    Some(_) => {}
                    None => {
                        self.uncounted.insert(pid);
                    }
                }
            }
        }
    }

    /// Looks at the disk alone (a last look when the run has ended).
    pub fn sample_disk(&mut self) {
        if let Ok(vfs) = rustix::fs::fstatvfs(self.stage) {
            if vfs.f_bavail == 0 {
                self.seen.insert(Limit::Disk);
            }
            if vfs.f_favail == 0 {
                self.seen.insert(Limit::Inodes);
            }
        }
    }

    /// The limits seen reached, and a note when some processes'
    /// descriptors could not be counted.
    pub fn finish(self) -> (BTreeSet<Limit>, Option<String>) {
        let note = (!self.uncounted.is_empty() && !self.seen.contains(&Limit::OpenFiles)).then(|| {
            format!(
                "the open files of {} process(es) that made themselves undumpable could not be counted (this \
                 kernel, older than Linux 6.2, shows them only to root): whether they reached the open-file \
                 limit is unknown",
                self.uncounted.len()
            )
        });
        (self.seen, note)
    }
}

/// How many descriptors `pid` holds; `None` when it may not be counted.
/// A process that is gone holds none. Its threads share one table (seccomp
/// refuses them tables of their own), read through the process, or, once
/// its main thread has exited alone and holds none, through a thread left.
fn count_descriptors(pid: i32, counting: Counting) -> Option<u64> {
    let held = count_in(&format!("/proc/{pid}/fd"), counting);
    if held != Some(0) {
        return held;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return held };
    tasks.flatten().filter_map(|task| count_in(&format!("{}/fd", task.path().display()), counting)).max().or(held)
}

/// How many entries the descriptor folder `dir` holds.
fn count_in(dir: &str, counting: Counting) -> Option<u64> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    match counting {
        Counting::Size => match rustix::fs::stat(dir) {
            Ok(stat) => Some(stat.st_size as u64),
            Err(e) if gone(&e.into()) => Some(0),
            Err(_) => None,
        },
        Counting::Listing => match std::fs::read_dir(dir) {
            Ok(entries) => Some(entries.count() as u64),
            Err(e) if gone(&e) => Some(0),
            Err(_) => None,
        },
    }
}

/// The processes of a run without a cgroup: `roots` (the init and the
/// code) and their descendants, each process's children read from
/// `/proc/PID/task/TID/children`, which anyone who may see it can read.
/// Orphans go to the init, so nothing of the run falls outside the tree.
pub fn descendants(roots: &[i32]) -> Vec<i32> {
    let mut found: Vec<i32> = roots.to_vec();
    let mut next = 0;
    while next < found.len() && found.len() < MAX_PROCESSES {
        let pid = found[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            found.extend(children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
    }
    found
}

/// A bound on the tree walked, whatever the code does: well above any
/// policy's process limit.
const MAX_PROCESSES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_counted_and_the_tree_is_walked() {
        let counting = Counting::detect();
        let me = std::process::id() as i32;
        let held: Vec<std::fs::File> = (0..20).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let count = count_descriptors(me, counting).unwrap();
        assert!(count >= 20, "{count}");
        drop(held);
        assert_eq!(count_descriptors(i32::MAX, counting), Some(0), "a process that is gone holds none");
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tree = descendants(&[me]);
        assert!(tree.contains(&(child.id() as i32)), "{tree:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
