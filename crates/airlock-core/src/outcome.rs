//! How a run ended, decided from what was observed: one pure function from
//! observations to a status, the limits reached and a sentence. Shared by
//! the backends, so that the same observations always read the same way,
//! and tested row by row.
//!
//! Every input comes from something the code cannot reach: the supervisor's
//! own decisions, the code's exit as its parent outside the run saw it, the
//! kernel's counters, samples taken from outside. Nothing the code (or its
//! driver) says decides a status or a limit.

use std::collections::BTreeSet;
use std::time::Duration;

use airlock_policy::{Limit, Limits, Status};

const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;

/// Why airlock itself stopped a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    WallTime,
    CpuTime,
    Output,
    /// A kill switch: a server shutting down, a caller giving up.
    Requested,
    /// Its socket buffers reached the memory cap (cgroup v1 counts them
    /// apart from the rest of its memory).
    SocketMemory,
    /// It asked for memory past its limit, and the interpreter's host (the
    /// wasm worker's limiter) refused it and stopped the run.
    MemoryRefused,
    /// Its files passed the disk cap, or their count the inode cap, where
    /// airlock measures them (no tmpfs holds them).
    Disk,
    Inodes,
}

/// How the code's process ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CodeEnd {
    Exited(i32),
    Signalled(i32),
    /// Its interpreter stopped on a fault of the code's own making (a
    /// WebAssembly trap), with neither an exit status nor a signal.
    Trapped,
    /// Airlock did not see it end: its own machinery failed first (a
    /// failure says why).
    #[default]
    Unknown,
}

impl CodeEnd {
    /// The exit code, for the record.
    pub fn exit_code(self) -> Option<i32> {
        match self {
            CodeEnd::Exited(code) => Some(code),
            _ => None,
        }
    }

    /// The terminating signal, for the record.
    pub fn signal(self) -> Option<i32> {
        match self {
            CodeEnd::Signalled(signal) => Some(signal),
            _ => None,
        }
    }
}

/// Everything observed of a run whose code started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observations {
    /// Airlock stopped the run itself (the first reason given).
    pub stop: Option<Stop>,
    pub code: CodeEnd,
    /// Every limit seen reached while the run went on, whether or not it
    /// stopped the run: kernel counters, samples, output and network caps.
    pub reached: BTreeSet<Limit>,
    /// The kernel's OOM killer killed a process of the run.
    pub oom_killed: bool,
    /// CPU time of the whole run, when measured.
    pub cpu_used: Option<Duration>,
    /// Facts worth saying beside the status (the run's init died first, a
    /// count of refused connections).
    pub notes: Vec<String>,
    /// Airlock's own machinery that failed during the run, each with its
    /// reason. Any makes the status `internal_error`.
    pub failures: Vec<String>,
}

/// The status, the limits reached, and a sentence saying why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    pub limits_hit: BTreeSet<Limit>,
    pub message: Option<String>,
}

/// Decides how a run ended from what was observed.
pub fn classify(seen: &Observations, limits: &Limits) -> Verdict {
    let mut hit = seen.reached.clone();
    if seen.oom_killed {
        hit.insert(Limit::Memory);
    }
    let over_cpu = seen.cpu_used.is_some_and(|used| used >= limits.cpu_time);
    let at_cpu_limit = || format!("stopped at the CPU-time limit of {}", seconds(limits.cpu_time));
    let (status, why) = match (seen.stop, seen.code) {
        (Some(Stop::WallTime), _) => {
            hit.insert(Limit::WallTime);
            (Status::Timeout, format!("stopped at the wall-time limit of {}", seconds(limits.wall_time)))
        }
        (Some(Stop::CpuTime), _) => {
            hit.insert(Limit::CpuTime);
            (Status::CpuLimit, at_cpu_limit())
        }
        (Some(Stop::Output), _) => {
            hit.insert(Limit::Output);
            (
                Status::OutputLimit,
                format!("stopped when its output passed the limit of {} bytes per stream", limits.output_bytes),
            )
        }
        (Some(Stop::SocketMemory), _) => {
            hit.insert(Limit::Memory);
            (
                Status::MemoryLimit,
                format!(
                    "stopped when its socket buffers reached the memory limit of {} MiB",
                    limits.memory_bytes >> 20
                ),
            )
        }
        (Some(Stop::MemoryRefused), _) => {
            hit.insert(Limit::Memory);
            (
                Status::MemoryLimit,
                format!("stopped when it asked for memory past its limit of {} MiB", limits.memory_bytes >> 20),
            )
        }
        (Some(Stop::Disk), _) => {
            hit.insert(Limit::Disk);
            (Status::Failed, format!("stopped when its files passed the disk cap of {} MiB", limits.disk_bytes >> 20))
        }
        (Some(Stop::Inodes), _) => {
            hit.insert(Limit::Inodes);
            (Status::Failed, format!("stopped when its files and folders passed the cap of {}", limits.disk_inodes))
        }
        (Some(Stop::Requested), _) => (Status::InternalError, "stopped on request before it finished".to_owned()),
        // Said of the run, not of the code's process: which process the
        // OOM killer chose is not known, and the code may kill itself once
        // it has seen a child of its killed.
        (None, CodeEnd::Unknown | CodeEnd::Signalled(SIGKILL)) if seen.oom_killed => (
            Status::MemoryLimit,
            format!(
                "the run reached its memory limit of {} MiB: the kernel's OOM killer ended a process of it, and the \
                 code ended by SIGKILL",
                limits.memory_bytes >> 20
            ),
        ),
        (None, CodeEnd::Unknown) => (Status::InternalError, "airlock did not see how the code ended".to_owned()),
        // The CPU rlimit's signals, the soft limit's SIGXCPU and the hard
        // one's SIGKILL a second later, count only with the CPU time spent:
        // the code can send either to itself, or lower its own rlimit, and
        // that is its own doing, not the run's limit.
        (None, CodeEnd::Signalled(SIGXCPU | SIGKILL)) if over_cpu => {
            hit.insert(Limit::CpuTime);
            (Status::CpuLimit, at_cpu_limit())
        }
        // SIGXFSZ is the file-size rlimit's (as large as the whole disk) or
        // the code's own: the disk is listed only where it was seen full
        // (`reached`), as for any other end.
        (None, CodeEnd::Exited(0)) => (Status::Ok, String::new()),
        (None, CodeEnd::Exited(_) | CodeEnd::Signalled(_) | CodeEnd::Trapped) => (Status::Failed, String::new()),
    };
    // Measured past its limit, the CPU time was reached whatever ended the
    // run: the supervisor samples it (every 50 ms), so a run that exits
    // between two samples may have spent up to a sample's worth more.
    if over_cpu {
        hit.insert(Limit::CpuTime);
    }
    let status = if seen.failures.is_empty() { status } else { Status::InternalError };
    let parts: Vec<&str> = std::iter::once(why.as_str())
        .chain(seen.notes.iter().map(String::as_str))
        .chain(seen.failures.iter().map(String::as_str))
        .filter(|part| !part.is_empty())
        .collect();
    Verdict { status, limits_hit: hit, message: (!parts.is_empty()).then(|| parts.join("; ")) }
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file-size rlimit's signal, which names no limit by itself.
    const SIGXFSZ: i32 = 25;

    fn exited(code: i32) -> Observations {
        Observations { code: CodeEnd::Exited(code), ..Observations::default() }
    }

    fn signalled(signal: i32) -> Observations {
        Observations { code: CodeEnd::Signalled(signal), ..Observations::default() }
    }

    fn stopped(stop: Stop) -> Observations {
        Observations { stop: Some(stop), ..signalled(SIGKILL) }
    }

    fn limits() -> Limits {
        Limits { cpu_time: Duration::from_secs(2), wall_time: Duration::from_secs(3), ..Limits::default() }
    }

    /// One row per way a run can end: the observations, then the status,
    /// the limits listed and a piece of the message (empty: no message).
    #[test]
    fn every_row_of_the_table() {
        use Limit::*;
        let reached =
            |seen: Observations, limits: &[Limit]| Observations { reached: limits.iter().copied().collect(), ..seen };
        let rows: Vec<(&str, Observations, Status, Vec<Limit>, &str)> = vec![
            ("exit 0", exited(0), Status::Ok, vec![], ""),
            ("exit 3", exited(3), Status::Failed, vec![], ""),
            ("its own signal", signalled(11), Status::Failed, vec![], ""),
            (
                "limits reached and survived",
                reached(exited(0), &[Disk, OpenFiles, Pids]),
                Status::Ok,
                vec![Disk, OpenFiles, Pids],
                "",
            ),
            ("wall clock", stopped(Stop::WallTime), Status::Timeout, vec![WallTime], "wall-time limit of 3 s"),
            (
                "wall clock, after other limits",
                reached(stopped(Stop::WallTime), &[Output]),
                Status::Timeout,
                vec![WallTime, Output],
                "wall-time",
            ),
            (
                "cpu time, by the supervisor",
                stopped(Stop::CpuTime),
                Status::CpuLimit,
                vec![CpuTime],
                "CPU-time limit of 2 s",
            ),
            (
                "cpu time, the rlimit's SIGXCPU",
                Observations { cpu_used: Some(Duration::from_secs(3)), ..signalled(SIGXCPU) },
                Status::CpuLimit,
                vec![CpuTime],
                "CPU-time",
            ),
            (
                "SIGXCPU under the cpu limit is the code's own",
                Observations { cpu_used: Some(Duration::from_millis(17)), ..signalled(SIGXCPU) },
                Status::Failed,
                vec![],
                "",
            ),
            ("SIGXCPU with no CPU time measured claims no limit", signalled(SIGXCPU), Status::Failed, vec![], ""),
            (
                "cpu time, the rlimit's SIGKILL",
                Observations { cpu_used: Some(Duration::from_secs(2)), ..signalled(SIGKILL) },
                Status::CpuLimit,
                vec![CpuTime],
                "CPU-time",
            ),
            (
                "SIGKILL under the cpu limit is the code's own",
                Observations { cpu_used: Some(Duration::from_secs(1)), ..signalled(SIGKILL) },
                Status::Failed,
                vec![],
                "",
            ),
            (
                "cpu time spent past the limit between two samples, then an exit of its own",
                Observations { cpu_used: Some(Duration::from_millis(2040)), ..exited(0) },
                Status::Ok,
                vec![CpuTime],
                "",
            ),
            ("output, killed", reached(stopped(Stop::Output), &[Output]), Status::OutputLimit, vec![Output], "100"),
            ("output, truncated", reached(exited(0), &[Output]), Status::Ok, vec![Output], ""),
            (
                "memory, the OOM killer",
                Observations { oom_killed: true, ..signalled(SIGKILL) },
                Status::MemoryLimit,
                vec![Memory],
                "memory limit of 512 MiB: the kernel's OOM killer ended a process of it",
            ),
            (
                "memory, one process killed and the code went on",
                Observations { oom_killed: true, ..exited(0) },
                Status::Ok,
                vec![Memory],
                "",
            ),
            ("SIGXFSZ alone claims no limit", signalled(SIGXFSZ), Status::Failed, vec![], ""),
            ("SIGXFSZ with the disk seen full", reached(signalled(SIGXFSZ), &[Disk]), Status::Failed, vec![Disk], ""),
            ("socket buffers", stopped(Stop::SocketMemory), Status::MemoryLimit, vec![Memory], "socket buffers"),
            (
                "memory refused by the worker",
                Observations { stop: Some(Stop::MemoryRefused), code: CodeEnd::Trapped, ..Observations::default() },
                Status::MemoryLimit,
                vec![Memory],
                "past its limit of 512 MiB",
            ),
            ("disk, measured", stopped(Stop::Disk), Status::Failed, vec![Disk], "disk cap"),
            ("inodes, measured", stopped(Stop::Inodes), Status::Failed, vec![Inodes], "files and folders"),
            ("a trap", Observations { code: CodeEnd::Trapped, ..Observations::default() }, Status::Failed, vec![], ""),
            ("stopped on request", stopped(Stop::Requested), Status::InternalError, vec![], "on request"),
            (
                "airlock lost the code's end",
                Observations { failures: vec!["the helper died".into()], ..Observations::default() },
                Status::InternalError,
                vec![],
                "did not see how the code ended; the helper died",
            ),
            (
                "teardown failed after a clean exit",
                Observations { failures: vec!["removing the run's cgroup failed".into()], ..exited(0) },
                Status::InternalError,
                vec![],
                "cgroup",
            ),
            (
                "teardown failed after a timeout: the limit stays listed",
                Observations { failures: vec!["removing the run's cgroup failed".into()], ..stopped(Stop::WallTime) },
                Status::InternalError,
                vec![WallTime],
                "wall-time limit of 3 s; removing",
            ),
            (
                "the init killed first: the code's own doing",
                Observations { notes: vec!["the run's init was killed".into()], ..signalled(SIGKILL) },
                Status::Failed,
                vec![],
                "init was killed",
            ),
        ];
        let limits = Limits { output_bytes: 100, ..limits() };
        for (name, seen, status, listed, message) in rows {
            let verdict = classify(&seen, &limits);
            assert_eq!(verdict.status, status, "{name}");
            assert_eq!(verdict.limits_hit, listed.into_iter().collect(), "{name}");
            match verdict.message {
                None => assert_eq!(message, "", "{name}: no message"),
                Some(said) => assert!(!message.is_empty() && said.contains(message), "{name}: {said:?}"),
            }
        }
    }

    #[test]
    fn the_code_end_reads_back_as_the_record_has_it() {
        assert_eq!((CodeEnd::Exited(2).exit_code(), CodeEnd::Exited(2).signal()), (Some(2), None));
        assert_eq!((CodeEnd::Signalled(9).exit_code(), CodeEnd::Signalled(9).signal()), (None, Some(9)));
        assert_eq!((CodeEnd::Unknown.exit_code(), CodeEnd::Unknown.signal()), (None, None));
        assert_eq!((CodeEnd::Trapped.exit_code(), CodeEnd::Trapped.signal()), (None, None));
    }
}
