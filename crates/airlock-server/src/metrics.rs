//! The server's counters, in the Prometheus text format (`GET /metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use airlock::Status;

/// Upper bounds of the run-time histogram, in seconds.
const BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];

/// Why a run was refused before it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot and the queue were full (429).
    Busy,
    /// The server was shutting down (503).
    ShuttingDown,
}

/// Counters shared by every request; all updates are lock-free.
#[derive(Debug, Default)]
pub struct Metrics {
    runs_by_status: [AtomicU64; Status::ALL.len()],
    duration_buckets: [AtomicU64; BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_ms: AtomicU64,
    rejected_busy: AtomicU64,
    rejected_shutting_down: AtomicU64,
    audit_failures: AtomicU64,
}

/// The gauges read at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    pub queue_depth: usize,
    pub sandboxes_active: usize,
    pub slots: usize,
    pub queue_capacity: usize,
    /// The pool of ready sandboxes, when the server keeps one.
    pub pool: Option<PoolGauges>,
}

/// What the pool has done (counters) and holds (`size`, `ready`, `memory_bytes`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolGauges {
    pub size: u64,
    pub ready: u64,
    /// The ready sandboxes' memory, their cgroups' usage summed.
    pub memory_bytes: Option<u64>,
    pub hits: u64,
    pub misses: u64,
    pub unsuited: u64,
    pub refills: u64,
    pub refill_failures: u64,
    /// Milliseconds the refills that made a sandbox ready took, all and the last.
    pub refill_ms_total: u64,
    pub last_refill_ms: Option<u64>,
    /// A forked pool's templates started so far, and the memory the live
    /// one holds (counted in `memory_bytes` too).
    pub templates: u64,
    pub template_memory_bytes: Option<u64>,
}

impl Metrics {
    /// Counts a finished run by status and wall time.
    pub fn record_run(&self, status: Status, wall_ms: u64) {
        if let Some(index) = Status::ALL.iter().position(|s| *s == status) {
            self.runs_by_status[index].fetch_add(1, Ordering::Relaxed);
        }
        let seconds = wall_ms as f64 / 1000.0;
        for (bound, bucket) in BUCKETS.iter().zip(&self.duration_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_count.fetch_add(1, Ordering::Relaxed);
        self.duration_sum_ms.fetch_add(wall_ms, Ordering::Relaxed);
    }

    pub fn record_rejection(&self, why: Rejection) {
        match why {
            Rejection::Busy => &self.rejected_busy,
            Rejection::ShuttingDown => &self.rejected_shutting_down,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_audit_failure(&self) {
        self.audit_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The mean wall time of the runs finished so far, if any.
    pub fn mean_run_time(&self) -> Option<std::time::Duration> {
        let count = self.duration_count.load(Ordering::Relaxed);
        let sum = self.duration_sum_ms.load(Ordering::Relaxed);
        (count > 0).then(|| std::time::Duration::from_millis(sum / count))
    }

    /// Runs finished with `status` so far.
    pub fn runs(&self, status: Status) -> u64 {
        Status::ALL.iter().position(|s| *s == status).map_or(0, |i| self.runs_by_status[i].load(Ordering::Relaxed))
    }

    /// Everything, in the Prometheus text exposition format 0.0.4.
    pub fn render(&self, gauges: Gauges) -> String {
        let mut out = String::new();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        head(&mut out, "airlock_runs_total", "counter", "Runs finished, by status.");
        for (status, counter) in Status::ALL.iter().zip(&self.runs_by_status) {
            let _ = writeln!(out, "airlock_runs_total{{status=\"{status}\"}} {}", load(counter));
        }
        head(&mut out, "airlock_run_duration_seconds", "histogram", "Wall time of finished runs.");
        for (bound, bucket) in BUCKETS.iter().zip(&self.duration_buckets) {
            let _ = writeln!(out, "airlock_run_duration_seconds_bucket{{le=\"{bound}\"}} {}", load(bucket));
        }
        let count = load(&self.duration_count);
        let _ = writeln!(out, "airlock_run_duration_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "airlock_run_duration_seconds_sum {}", load(&self.duration_sum_ms) as f64 / 1000.0);
        let _ = writeln!(out, "airlock_run_duration_seconds_count {count}");
        head(&mut out, "airlock_runs_rejected_total", "counter", "Runs refused before they started, by reason.");
        let _ = writeln!(out, "airlock_runs_rejected_total{{reason=\"busy\"}} {}", load(&self.rejected_busy));
        let _ = writeln!(
            out,
            "airlock_runs_rejected_total{{reason=\"shutting_down\"}} {}",
            load(&self.rejected_shutting_down)
        );
        head(&mut out, "airlock_audit_failures_total", "counter", "Runs that could not be recorded.");
        let _ = writeln!(out, "airlock_audit_failures_total {}", load(&self.audit_failures));
        gauge(&mut out, "airlock_queue_depth", "Runs waiting for a slot.", gauges.queue_depth as u64);
        gauge(&mut out, "airlock_queue_capacity", "Runs that may wait for a slot.", gauges.queue_capacity as u64);
        gauge(&mut out, "airlock_sandboxes_active", "Sandboxes alive now.", gauges.sandboxes_active as u64);
        gauge(&mut out, "airlock_run_slots", "Runs that may go on at once.", gauges.slots as u64);
        if let Some(pool) = gauges.pool {
            gauge(&mut out, "airlock_pool_size", "Sandboxes the pool keeps ready when full.", pool.size);
            gauge(&mut out, "airlock_pool_ready", "Sandboxes ready in the pool, preload imported.", pool.ready);
            if let Some(bytes) = pool.memory_bytes {
                gauge(
                    &mut out,
                    "airlock_pool_memory_bytes",
                    "Memory the ready sandboxes hold (their cgroups').",
                    bytes,
                );
            }
            head(&mut out, "airlock_pool_runs_total", "counter", "Runs by how the pool served them.");
            for (served, count) in [("warm", pool.hits), ("empty", pool.misses), ("unsuited", pool.unsuited)] {
                let _ = writeln!(out, "airlock_pool_runs_total{{served=\"{served}\"}} {count}");
            }
            head(&mut out, "airlock_pool_refills_total", "counter", "Sandboxes the pool made ready, or failed to.");
            let _ = writeln!(out, "airlock_pool_refills_total{{result=\"ok\"}} {}", pool.refills);
            let _ = writeln!(out, "airlock_pool_refills_total{{result=\"failed\"}} {}", pool.refill_failures);
            head(&mut out, "airlock_pool_refill_seconds_total", "counter", "Time spent making sandboxes ready.");
            let _ = writeln!(out, "airlock_pool_refill_seconds_total {}", pool.refill_ms_total as f64 / 1000.0);
            if let Some(ms) = pool.last_refill_ms {
                let help = "Time the last sandbox made ready took, from its creation to its preload imported.";
                head(&mut out, "airlock_pool_last_refill_seconds", "gauge", help);
                let _ = writeln!(out, "airlock_pool_last_refill_seconds {}", ms as f64 / 1000.0);
            }
            head(&mut out, "airlock_pool_templates_total", "counter", "Templates a forked pool started.");
            let _ = writeln!(out, "airlock_pool_templates_total {}", pool.templates);
            if let Some(bytes) = pool.template_memory_bytes {
                let help = "Memory the forked pool's live template holds (in airlock_pool_memory_bytes too).";
                gauge(&mut out, "airlock_pool_template_memory_bytes", help, bytes);
            }
        }
        if let Some(rss) = resident_memory_bytes() {
            gauge(&mut out, "process_resident_memory_bytes", "Resident memory of the server.", rss);
        }
        out
    }
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    head(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

/// This process's resident memory, from /proc/self/statm.
pub fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_status_and_a_cumulative_histogram() {
        let metrics = Metrics::default();
        metrics.record_run(Status::Ok, 40);
        metrics.record_run(Status::Timeout, 3_000);
        metrics.record_rejection(Rejection::Busy);
        let pool = PoolGauges {
            size: 2,
            ready: 2,
            memory_bytes: Some(200 << 20),
            hits: 5,
            misses: 1,
            unsuited: 0,
            refills: 7,
            refill_failures: 0,
            refill_ms_total: 10_500,
            last_refill_ms: Some(1500),
            templates: 1,
            template_memory_bytes: Some(80 << 20),
        };
        let text = metrics.render(Gauges {
            queue_depth: 3,
            sandboxes_active: 2,
            slots: 2,
            queue_capacity: 8,
            pool: Some(pool),
        });
        for status in Status::ALL {
            assert!(text.contains(&format!("airlock_runs_total{{status=\"{status}\"}}")), "{status}");
        }
        assert!(text.contains("airlock_runs_total{status=\"ok\"} 1\n"));
        assert!(text.contains("airlock_run_duration_seconds_bucket{le=\"0.05\"} 1\n"));
        assert!(text.contains("airlock_run_duration_seconds_bucket{le=\"5\"} 2\n"));
        assert!(text.contains("airlock_run_duration_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("airlock_run_duration_seconds_sum 3.04\n"));
        assert!(text.contains("airlock_queue_depth 3\n"));
        assert!(text.contains("airlock_sandboxes_active 2\n"));
        assert!(text.contains("airlock_runs_rejected_total{reason=\"busy\"} 1\n"));
        assert!(text.contains("process_resident_memory_bytes "));
        assert!(text.contains("airlock_pool_ready 2\n"));
        assert!(text.contains("airlock_pool_runs_total{served=\"warm\"} 5\n"));
        assert!(text.contains("airlock_pool_refills_total{result=\"ok\"} 7\n"));
        assert!(text.contains("airlock_pool_size 2\n"));
        assert!(text.contains("airlock_pool_memory_bytes 209715200\n"));
        assert!(text.contains("airlock_pool_refill_seconds_total 10.5\n"));
        assert!(text.contains("airlock_pool_last_refill_seconds 1.5\n"));
        assert!(text.contains("airlock_pool_templates_total 1\n"));
        assert!(text.contains("airlock_pool_template_memory_bytes 83886080\n"));
    }
}
