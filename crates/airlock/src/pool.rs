//! A pool of warm sandboxes, so that a run answers in tens of milliseconds
//! and is still fresh.
//!
//! ```no_run
//! use airlock::{Policy, Pool, PoolOptions, RunRequest};
//!
//! let pool = Pool::new(Policy::default(), None, PoolOptions::default())?;
//! let record = pool.run(pool.policy(), &[("data.csv".to_owned(), b"x\n1\n".to_vec())],
//!                       &RunRequest::python("import pandas as pd\npd.read_csv('data.csv').x.sum()"))?;
//! assert_eq!(record.usage.start, Some(airlock::RunStart::Pooled));
//! # Ok::<(), airlock::Error>(())
//! ```
//!
//! The pool keeps `size` sandboxes ready for one policy and one image: each
//! a complete sandbox, made as a cold run's is (its own host ids,
//! namespaces, mounts, cgroup, rlimits, Landlock, seccomp), whose
//! interpreter has imported the preload and waits before the first byte of
//! code. A run takes one, copies its files in, releases its code, and the
//! sandbox is destroyed after it: never reused, never shared. A thread
//! refills the pool in the background, one sandbox at a time (at most one
//! CPU busy with it).
//!
//! A sandbox of the pool's (warm or cold) is destroyed off its caller's
//! path: dropped, it goes to the pool's reaper thread, which closes its
//! namespaces (unmounting its tmpfs) and gives its host ids back. Its run
//! is over by then, every process of it reaped and its cgroup removed, and
//! its record has all of it: what the reaper does observes nothing about
//! the run. At most [`REAPING_AT_MOST`] wait for it; past that, the caller
//! destroys its own. [`Pool::close`] (and dropping the pool) waits until
//! every sandbox handed over is gone.
//!
//! A run never waits for the pool: when it is empty, or when the run cannot
//! be served warm, it runs cold, and its record says why
//! (`isolation.details.pool`). What a claim can change: the files, the code,
//! its standard input, working directory and display name, a lower wall or
//! CPU time (both kept by the supervisor, from the release), and a lower
//! memory or process limit (written into the sandbox's cgroup by the
//! supervisor before the code's first byte, where the sandbox holds less
//! than the new limit then; otherwise the run goes cold), and the
//! variables of the environment the operator lists in
//! [`PoolOptions::env_at_claim`] (set by the driver after the claim, before
//! the code's first byte), and the network: a ready sandbox holds its
//! proxy's listener, and at the release starts the proxy with the run's
//! allowlist (and sets the proxy's variables), or closes the listener for a
//! run that allows no host (a forked pool's forks have no listener: a run
//! that allows hosts goes cold there). Everything else in force since the
//! sandbox started (the rest of the environment, CPUs, disk, output and
//! file caps, the image) must be the pool's, or the run goes cold.
//!
//! The environment is allowed by name, never guessed: the interpreter reads
//! some variables at its start, the preload's imports read others, and C
//! code reads what no one can list, so no rule can tell which are safe to
//! set late. Only the names the operator lists may differ; a name known to
//! be read at start-up ([`READ_AT_START`]) is refused in the list.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_core::{
    ArtifactError, Backend, Claim, Claimed, Execution, Instance, Job, KillSwitch, Runtime, SandboxError, Template,
    WarmInstance,
};
use airlock_policy::{BackendKind, Language, Limits, Policy, RunRecord, SandboxPath};

use crate::Error;
use crate::sandbox::{Audit, RunRequest, Sandbox, backend_for};

/// How a pool is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Sandboxes kept ready.
    pub size: usize,
    /// Modules each sandbox imports before it waits for its run.
    pub preload: Vec<String>,
    /// A sandbox ready for longer than this is destroyed and made anew.
    pub idle_expiry: Duration,
    /// The most memory (bytes) the ready sandboxes may hold together: no
    /// refill starts while one more sandbox (as large as the mean of those
    /// ready) would take them past it, so the pool stays smaller. `None`:
    /// no budget. (Its CPU is bounded already: one refill at a time, each
    /// under its sandbox's own CPU limit.)
    pub memory_budget: Option<u64>,
    /// Variables a run may set, change or remove at its claim, where its
    /// environment differs from the pool's: the driver applies them
    /// (`os.environ`, which calls `putenv`) after the claim, before the
    /// code's first byte. Only names nothing reads before then belong here
    /// (a task id, a request's name); a run whose environment differs in
    /// any other runs cold. [`PoolOptions::refused_env_at_claim`] names
    /// those known to be read at start-up, which [`Pool::new`] refuses.
    pub env_at_claim: Vec<String>,
    /// How the ready sandboxes are made.
    pub mode: PoolMode,
}

/// How a pool makes its ready sandboxes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolMode {
    /// Each one made as a cold run's sandbox is, its own interpreter
    /// started and its preload imported (a second or so each with pandas):
    /// nothing at all shared between runs. The default.
    #[default]
    Pooled,
    /// Each one forked from a template: one sandbox per pool whose
    /// interpreter imported the preload and runs no code; each fork makes
    /// its own namespaces, /work, /tmp, cgroup and layers before its run (tens
    /// of milliseconds). Forked runs share the template's address layout,
    /// hash seed and host ids (docs/design.md, "Forked starts"); the
    /// template is made anew at the idle expiry.
    Forked,
}

impl PoolMode {
    /// The mode a configuration names (`pooled`, `forked`).
    pub fn parse(name: &str) -> Option<PoolMode> {
        match name {
            "pooled" => Some(PoolMode::Pooled),
            "forked" => Some(PoolMode::Forked),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PoolMode::Pooled => "pooled",
            PoolMode::Forked => "forked",
        }
    }
}

/// Variables read when an interpreter starts or its preload is imported,
/// and by what (a `*` ends a prefix): too late to set at a claim, so never
/// in [`PoolOptions::env_at_claim`]. Not a list of what is safe: C code
/// reads variables no one can list, which is why the operator names the
/// safe ones.
pub const READ_AT_START: &[(&str, &str)] = &[
    ("PYTHON*", "the interpreter reads PYTHON* variables at its start"),
    ("LD_*", "the dynamic loader reads LD_* variables when the interpreter starts"),
    ("GLIBC_TUNABLES", "the C library reads it when the interpreter starts"),
    ("MALLOC_*", "the C library's allocator reads MALLOC_* variables at its start"),
    ("OMP_*", "OpenMP reads OMP_* variables when numpy's BLAS loads"),
    ("OPENBLAS_*", "OpenBLAS reads its variables when numpy loads it"),
    ("GOTO_*", "OpenBLAS reads GOTO_* variables when numpy loads it"),
    ("MKL_*", "MKL reads its variables when numpy loads it"),
    ("BLIS_*", "BLIS reads its variables when numpy loads it"),
    ("KMP_*", "Intel's OpenMP reads KMP_* variables when it loads"),
    ("NUMEXPR_*", "numexpr reads its variables at its import"),
    ("NUMPY_*", "numpy reads NUMPY_* variables at its import"),
    ("MPL*", "matplotlib reads MPLBACKEND and MPLCONFIGDIR at its import"),
    ("TZ", "the C library and pandas read the time zone when first used, often at import"),
    ("TZDIR", "the C library reads it with the time zone"),
    ("LANG", "the interpreter sets its locale and encodings from it at its start"),
    ("LANGUAGE", "the C library reads it with the locale"),
    ("LC_*", "the interpreter sets its locale and encodings from LC_* variables at its start"),
    ("HOME", "the interpreter's site module and matplotlib read it at start-up"),
    ("PATH", "the interpreter reads it at its start (sys.executable)"),
    ("TMPDIR", "tempfile and the preload's imports read it once and keep it"),
    ("TEMP", "tempfile reads it once and keeps it"),
    ("TMP", "tempfile reads it once and keeps it"),
    ("AIRLOCK_*", "airlock's own variables"),
];

/// What reads `name` before a warm sandbox's claim, if it is a name
/// [`READ_AT_START`] lists.
fn read_at_start(name: &str) -> Option<&'static str> {
    READ_AT_START.iter().find_map(|(pattern, reader)| {
        let listed = match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *pattern,
        };
        listed.then_some(*reader)
    })
}

impl PoolOptions {
    /// What the default image's interpreter imports before a run: the
    /// scientific stack (matplotlib renders off-screen, as every run's does).
    pub fn default_preload() -> Vec<String> {
        ["numpy", "pandas", "matplotlib"].map(String::from).to_vec()
    }

    /// The first name in the preload that is not a module's (`pandas`,
    /// `matplotlib.pyplot`: dotted identifiers), for an error naming it.
    pub fn bad_preload(&self) -> Option<&str> {
        let part_ok = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_');
        self.preload.iter().map(String::as_str).find(|m| m.is_empty() || !m.split('.').all(part_ok))
    }

    /// The first name in [`PoolOptions::env_at_claim`] that cannot be set
    /// at a claim, and why: not a variable's name, or read at start-up.
    pub fn refused_env_at_claim(&self) -> Option<(&str, String)> {
        self.env_at_claim.iter().find_map(|name| {
            if !airlock_policy::is_env_key(name) {
                return Some((name.as_str(), "it is not a variable's name (letters, digits and '_')".to_owned()));
            }
            read_at_start(name).map(|reader| {
                (name.as_str(), format!("{reader}, before a claim could set it; a run that sets it runs cold"))
            })
        })
    }

    /// Whether a run may set `name` at its claim.
    fn may_set_at_claim(&self, name: &str) -> bool {
        read_at_start(name).is_none() && self.env_at_claim.iter().any(|listed| listed == name)
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 2,
            preload: PoolOptions::default_preload(),
            idle_expiry: Duration::from_secs(600),
            memory_budget: None,
            env_at_claim: Vec::new(),
            mode: PoolMode::Pooled,
        }
    }
}

/// What a pool has done, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sandboxes it keeps ready when full ([`PoolOptions::size`]).
    pub size: usize,
    /// Sandboxes ready now.
    pub ready: usize,
    /// The memory the ready sandboxes hold now, their cgroups' usage
    /// summed (interpreters, preloaded modules, their tmpfs files); `None`
    /// where the backend cannot tell.
    pub memory_bytes: Option<u64>,
    /// Runs served warm.
    pub hits: u64,
    /// Runs that found no ready sandbox and ran cold.
    pub misses: u64,
    /// Runs whose policy could not be applied to a ready sandbox (cold).
    pub unsuited: u64,
    /// Sandboxes made ready, the milliseconds the last one took, and the
    /// milliseconds all of them took.
    pub refills: u64,
    pub last_refill_ms: Option<u64>,
    pub refill_ms_total: u64,
    /// Sandboxes that failed to become ready, and why the last one did.
    pub refill_failures: u64,
    pub last_refill_error: Option<String>,
    /// Ready sandboxes destroyed for their age.
    pub expired: u64,
    /// Templates started (a forked pool's), and the memory the live one
    /// holds (in `memory_bytes` too).
    pub templates: u64,
    pub template_memory_bytes: Option<u64>,
}

/// Sandboxes made ready ahead of their runs, for one policy and one
/// runtime. Dropping it destroys every ready sandbox.
pub struct Pool {
    shared: Arc<Shared>,
    /// The refill and reaper threads, joined by [`Pool::close`].
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Shared {
    backend: &'static dyn Backend,
    policy: Policy,
    runtime: Runtime,
    options: PoolOptions,
    audit: Option<Audit>,
    state: Mutex<State>,
    wake: Condvar,
    hits: AtomicU64,
    misses: AtomicU64,
    unsuited: AtomicU64,
    reaper: Reaper,
    /// A forked pool's template, and when it was started; the refill
    /// thread's alone.
    template: Mutex<Option<(Box<dyn Template>, Instant)>>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Entry>,
    closed: bool,
    refills: u64,
    last_refill_ms: Option<u64>,
    refill_ms_total: u64,
    refill_failures: u64,
    last_refill_error: Option<String>,
    expired: u64,
    templates: u64,
    template_memory: Option<u64>,
    /// Warm sandboxes handed out whose run has not ended (`InFlight`).
    in_flight: usize,
    /// When the last warm sandbox was handed out, and whether claims are
    /// sparse (`REFILL_DEFER`).
    last_claim: Option<Instant>,
    claims_sparse: bool,
    /// When a claim last found no ready sandbox (`MISS_MEMORY`).
    last_miss: Option<Instant>,
}

impl State {
    /// Whether a claim found the pool empty within `MISS_MEMORY`.
    fn missed_lately(&self) -> bool {
        self.last_miss.is_some_and(|miss| miss.elapsed() < MISS_MEMORY)
    }
}

/// A warm sandbox handed out, until its run ends or it is dropped unrun:
/// a refill waits for it, at most `REFILL_DEFER`. `Shared::take` counts
/// it (so no refill can look between the take and the count); this
/// uncounts it.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
        self.0.wake.notify_all();
    }
}

struct Entry {
    warm: Box<dyn WarmInstance>,
    ready_at: Instant,
}

/// What [`Shared::take`] found.
enum Taken {
    Ready(Entry),
    /// None ready.
    Empty,
    /// Some ready, each holding at least `least` bytes, not under the cap.
    AllHoldMore {
        least: u64,
    },
}

/// How long the refill thread rests after a failure before it tries again.
const REFILL_BACKOFF: Duration = Duration::from_secs(2);
/// How long a refill waits for the warm run in flight to end before it
/// starts, when claims are sparse: the claim came longer after the one
/// before than the last refill took plus this wait (an agent calling its
/// tool, say), and no claim found the pool empty lately (`MISS_MEMORY`).
/// A refill is a whole sandbox made (pooled) or a fork of the
/// template (forked), CPU the claimed run would otherwise share with it: on
/// this 2-core machine a forked `print(1+1)` took 10.5 ms with the wait,
/// 19.9 without. A busy pool refills at once: waiting there cut a saturated
/// forked pool from 43 to 15 jobs/s (bench/results/pool.md). Bounded, so
/// that a long run never holds the pool empty.
const REFILL_DEFER: Duration = Duration::from_millis(20);

/// How long a claim that found the pool empty keeps the refill from
/// waiting (`REFILL_DEFER`), until the first claim after it that finds a
/// sandbox: claims outrun the refill, and every one that misses runs cold,
/// which costs far more CPU than the wait saves. At
/// saturation claims can still come further apart than the last refill
/// took plus the wait, so the time rule alone kept waiting there (a 4 to
/// 15 % cost, bench/results/pool.md); a miss is the exact sign.
const MISS_MEMORY: Duration = Duration::from_secs(1);

/// The most sandboxes whose run is over that wait for the reaper: what
/// they still hold (their tmpfs, their host ids) stays bounded.
pub const REAPING_AT_MOST: usize = 4;

/// Destroys the pool's sandboxes whose run is over, on a thread of its own.
#[derive(Default)]
struct Reaper {
    state: Mutex<Reaping>,
    wake: Condvar,
}

#[derive(Default)]
struct Reaping {
    waiting: VecDeque<Pooled>,
    /// No thread takes any more: whoever hands one over destroys it.
    closed: bool,
}

impl Reaper {
    fn lock(&self) -> MutexGuard<'_, Reaping> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Destroys `sandbox` on the reaper's thread, or here when the reaper
    /// is closed or has enough waiting.
    fn hand_over(&self, sandbox: Pooled) {
        let mut state = self.lock();
        if state.closed || state.waiting.len() >= REAPING_AT_MOST {
            drop(state);
            drop(sandbox);
            return;
        }
        state.waiting.push_back(sandbox);
        drop(state);
        self.wake.notify_all();
    }

    /// The reaper's thread: destroys what is handed over, until closed
    /// with nothing left.
    fn reap(&self) {
        let mut state = self.lock();
        loop {
            if let Some(sandbox) = state.waiting.pop_front() {
                drop(state);
                drop(sandbox);
                state = self.lock();
            } else if state.closed {
                return;
            } else {
                state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// No more is handed over; the thread ends once it has destroyed
    /// what waits.
    fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }
}

impl Pool {
    /// A pool for `policy` running `runtime` (`None`: the default image,
    /// built on first use), on the policy's backend. Returns at once; the
    /// pool fills in the background.
    pub fn new(policy: Policy, runtime: Option<Runtime>, options: PoolOptions) -> Result<Pool, Error> {
        if policy.backend != BackendKind::Linux {
            return Err(Error::Sandbox(SandboxError::Unsupported {
                backend: "airlock",
                what: format!("keep a pool of ready sandboxes for the {} backend", policy.backend),
                reason: "only the linux backend starts sandboxes warm; run without a pool".to_owned(),
            }));
        }
        if !policy.with_packages.is_empty() {
            return Err(Error::Sandbox(SandboxError::Unsupported {
                backend: "airlock",
                what: "keep a pool of ready sandboxes with extra packages (with_packages)".to_owned(),
                reason: "a pool's sandboxes hold its image alone; make the pool without with_packages, and the runs \
                         that ask for them run cold, on the image that has them"
                    .to_owned(),
            }));
        }
        if let Some((name, why)) = options.refused_env_at_claim() {
            return Err(Error::Sandbox(SandboxError::Unsupported {
                backend: "airlock",
                what: format!("let runs set {name} at their claim (env_at_claim)"),
                reason: format!("{why}; take it out of env_at_claim"),
            }));
        }
        let backend = backend_for(policy.backend)?;
        let runtime = match runtime {
            Some(runtime) => runtime,
            None => crate::setup::resolve_runtime(policy.backend, None, None, &mut |_| {})?,
        };
        Ok(Pool::with_backend(backend, policy, runtime, options, None))
    }

    /// A pool on a backend of the caller's, its runs recorded in `audit`.
    pub fn with_backend(
        backend: &'static dyn Backend,
        policy: Policy,
        runtime: Runtime,
        options: PoolOptions,
        audit: Option<Audit>,
    ) -> Pool {
        let shared = Arc::new(Shared {
            backend,
            policy,
            runtime,
            options,
            audit,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            unsuited: AtomicU64::new(0),
            reaper: Reaper::default(),
            template: Mutex::new(None),
        });
        let mut threads = Vec::new();
        // A policy with extra packages suits no ready sandbox (`suits`):
        // making them would only hold memory.
        if shared.policy.with_packages.is_empty() {
            let refiller = shared.clone();
            threads.extend(
                std::thread::Builder::new().name("airlock-pool".to_owned()).spawn(move || refiller.refill()).ok(),
            );
        }
        let reaper = shared.clone();
        match std::thread::Builder::new().name("airlock-reaper".to_owned()).spawn(move || reaper.reaper.reap()) {
            Ok(thread) => threads.push(thread),
            // No thread to hand them to: each caller destroys its own.
            Err(_) => shared.reaper.close(),
        }
        Pool { shared, threads: Mutex::new(threads) }
    }

    pub fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    pub fn options(&self) -> &PoolOptions {
        &self.shared.options
    }

    pub fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        let held: Vec<Option<u64>> = state.ready.iter().map(|entry| entry.warm.memory_bytes()).collect();
        PoolStats {
            size: self.shared.options.size,
            ready: state.ready.len(),
            memory_bytes: held.iter().copied().sum::<Option<u64>>().map(|m| m + state.template_memory.unwrap_or(0)),
            hits: self.shared.hits.load(Ordering::Relaxed),
            misses: self.shared.misses.load(Ordering::Relaxed),
            unsuited: self.shared.unsuited.load(Ordering::Relaxed),
            refills: state.refills,
            last_refill_ms: state.last_refill_ms,
            refill_ms_total: state.refill_ms_total,
            refill_failures: state.refill_failures,
            last_refill_error: state.last_refill_error.clone(),
            expired: state.expired,
            templates: state.templates,
            template_memory_bytes: state.template_memory,
        }
    }

    /// Waits up to `timeout` until `n` sandboxes are ready (for benchmarks
    /// and tests; a run never needs to).
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.ready.len() < n.min(self.shared.options.size) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.shared.wake.wait_timeout(state, left).map(|(s, _)| s).unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// A sandbox for one run with `policy`: a ready one from the pool when
    /// there is one and the policy can be applied to it, else a cold one.
    /// Use it as any [`Sandbox`] (files in, one run, outputs out); its run's
    /// record says how it started, and, when cold, why
    /// (`isolation.details.pool`). A second run in it runs cold in the same
    /// sandbox, as a second run in any sandbox does. Never waits for the pool.
    pub fn sandbox(&self, policy: &Policy) -> Result<Sandbox, Error> {
        let shared = &self.shared;
        let warm = match shared.suits(policy) {
            Err(reason) => {
                shared.unsuited.fetch_add(1, Ordering::Relaxed);
                Err(reason)
            }
            Ok(lowered) => match shared.take(lowered.memory_bytes) {
                Taken::Ready(entry) => Ok(entry.warm),
                Taken::Empty => {
                    shared.misses.fetch_add(1, Ordering::Relaxed);
                    Err(shared.empty_reason())
                }
                // Checked before one is taken: a claim that could never
                // lower its limit would destroy a ready sandbox for
                // nothing, and any caller could drain the pool so.
                Taken::AllHoldMore { least } => {
                    shared.unsuited.fetch_add(1, Ordering::Relaxed);
                    Err(format!(
                        "its memory limit ({} MiB) is not above what each ready sandbox holds with its preload \
                         imported (at least {} MiB); the ready sandboxes stay in the pool",
                        lowered.memory_bytes.unwrap_or_default() >> 20,
                        least >> 20
                    ))
                }
            },
        };
        // `take` counted it, under the lock that handed it out.
        let in_flight = warm.is_ok().then(|| InFlight(shared.clone()));
        let (state, cold_why, runtime) = match warm {
            Ok(warm) => (Pooled::Warm(warm), None, shared.runtime.clone()),
            Err(why) => {
                // A cold run takes the way any sandbox does to its runtime:
                // with its extra packages, when it asks for them.
                let (runtime, _) =
                    crate::sandbox::runtime_with_extras(policy, shared.runtime.clone(), None, &mut |_| {})?;
                (Pooled::Ran(shared.backend.create(policy, &runtime)?), Some(why), runtime)
            }
        };
        let instance = PooledInstance {
            shared: shared.clone(),
            policy: policy.clone(),
            state,
            files: Vec::new(),
            cold_why,
            in_flight,
        };
        let mut sandbox = Sandbox::from_instance(Box::new(instance), policy.clone(), runtime);
        sandbox.set_audit(shared.audit.clone());
        Ok(sandbox)
    }

    /// Destroys every ready sandbox and stops making more; later runs are
    /// cold. Returns once the sandboxes ready, being made, or handed to the
    /// reaper are gone (a sandbox taken and not yet dropped lives on, and
    /// is destroyed where it is dropped). Dropping the pool does the same.
    pub fn close(&self) {
        let entries = {
            let mut state = self.shared.lock();
            state.closed = true;
            std::mem::take(&mut state.ready)
        };
        self.shared.wake.notify_all();
        self.shared.reaper.close();
        drop(entries);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
        // Its forks already handed out keep it alive until their runs end.
        drop(self.shared.template.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
    }

    /// Runs `request` with `policy` in [`Pool::sandbox`], `files` copied
    /// into /work first. `Err` only for what stops a run before it starts
    /// (a file refused, a sandbox that cannot be made).
    pub fn run(&self, policy: &Policy, files: &[(String, Vec<u8>)], request: &RunRequest) -> Result<RunRecord, Error> {
        let mut sandbox = self.sandbox(policy)?;
        for (path, data) in files {
            sandbox.write(path, data)?;
        }
        Ok(sandbox.run_request(request))
    }
}

/// Where a pool's sandbox is in its one run.
enum Pooled {
    /// Ready, waiting for its run.
    Warm(Box<dyn WarmInstance>),
    /// A sandbox that runs its code as any sandbox does: made cold, or a
    /// warm one after its run.
    Ran(Box<dyn Instance>),
    /// Lost to a failed claim.
    Spent,
}

/// The instance behind a pool's [`Sandbox`]: a warm sandbox until its run
/// claims it, the claimed (or a cold) sandbox after.
struct PooledInstance {
    shared: Arc<Shared>,
    policy: Policy,
    state: Pooled,
    /// Files written before the run, copied in by the claim.
    files: Vec<(SandboxPath, Vec<u8>)>,
    /// Why the next run is cold, for its record.
    cold_why: Option<String>,
    /// Held from the take until the run ends (a claim that fails or goes
    /// cold keeps it until the sandbox is dropped: a refill waits for it at
    /// most `REFILL_DEFER` either way).
    in_flight: Option<InFlight>,
}

impl PooledInstance {
    /// The warm sandbox goes; the run goes cold, in a sandbox made now with
    /// the files written so far.
    fn go_cold(&mut self, why: String) -> Result<&mut Box<dyn Instance>, SandboxError> {
        self.state = Pooled::Spent;
        self.cold_why = Some(why);
        let mut cold = self.shared.backend.create(&self.policy, &self.shared.runtime)?;
        for (path, data) in std::mem::take(&mut self.files) {
            cold.write(&path, &data)?;
        }
        self.state = Pooled::Ran(cold);
        match &mut self.state {
            Pooled::Ran(instance) => Ok(instance),
            _ => unreachable!("just set"),
        }
    }
}

impl Instance for PooledInstance {
    fn write(&mut self, path: &SandboxPath, data: &[u8]) -> Result<(), SandboxError> {
        match &mut self.state {
            Pooled::Ran(instance) => instance.write(path, data),
            Pooled::Warm(_) => {
                // Checked at the claim as well, with the same caps.
                let limits = &self.policy.limits;
                let total: u64 = self.files.iter().map(|(_, d)| d.len() as u64).sum::<u64>() + data.len() as u64;
                if data.len() as u64 > limits.file_bytes || total > limits.files_total_bytes {
                    return Err(SandboxError::Input {
                        path: path.to_string(),
                        reason: format!(
                            "above max_file_bytes ({}) or, with the files before it, max_files_total_bytes ({})",
                            limits.file_bytes, limits.files_total_bytes
                        ),
                    });
                }
                self.files.retain(|(p, _)| p != path);
                self.files.push((path.clone(), data.to_vec()));
                Ok(())
            }
            Pooled::Spent => Err(spent()),
        }
    }

    fn read(&mut self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>, ArtifactError> {
        match &mut self.state {
            Pooled::Ran(instance) => instance.read(path, max_bytes),
            // Before the run, /work holds what was written so far.
            _ => match self.files.iter().find(|(p, _)| p == path) {
                None => Err(ArtifactError::NotFound { path: path.to_string() }),
                Some((_, data)) if data.len() as u64 > max_bytes => {
                    Err(ArtifactError::TooLarge { path: path.to_string(), size: data.len() as u64, cap: max_bytes })
                }
                Some((_, data)) => Ok(data.clone()),
            },
        }
    }

    fn set_limits(&mut self, limits: Limits) {
        if let Pooled::Ran(instance) = &mut self.state {
            instance.set_limits(limits.clone());
        }
        self.policy.limits = limits;
    }

    fn run(&mut self, job: &Job, kill: &KillSwitch) -> Result<Execution, SandboxError> {
        let requested_at = Instant::now();
        let mut why = self.cold_why.take();
        let execution = match std::mem::replace(&mut self.state, Pooled::Spent) {
            Pooled::Ran(mut instance) => {
                let ran = instance.run(job, kill);
                self.state = Pooled::Ran(instance);
                ran
            }
            Pooled::Warm(warm) => match self.shared.suits_run(&self.policy, job) {
                Err(reason) => {
                    self.shared.unsuited.fetch_add(1, Ordering::Relaxed);
                    why = Some(reason.clone());
                    drop(warm);
                    self.go_cold(reason)?.run(job, kill)
                }
                Ok(lowered) => {
                    let claim = Claim {
                        job: job.clone(),
                        files: std::mem::take(&mut self.files),
                        wall_time: self.policy.limits.wall_time,
                        cpu_time: self.policy.limits.cpu_time,
                        memory_bytes: lowered.memory_bytes,
                        pids: lowered.pids,
                        env: lowered.env,
                        network: self.policy.network.clone(),
                        kill: kill.clone(),
                        requested_at,
                    };
                    let files = claim.files.clone();
                    match warm.claim(claim) {
                        Claimed::Ran { instance, execution } => {
                            self.shared.hits.fetch_add(1, Ordering::Relaxed);
                            self.state = Pooled::Ran(instance);
                            *execution
                        }
                        Claimed::Refused(error) => return Err(error),
                        Claimed::Unsuited(reason) => {
                            self.shared.unsuited.fetch_add(1, Ordering::Relaxed);
                            why = Some(reason.clone());
                            self.files = files;
                            self.go_cold(reason)?.run(job, kill)
                        }
                        Claimed::Stale(stale) => {
                            self.shared.misses.fetch_add(1, Ordering::Relaxed);
                            let reason = format!("the ready sandbox taken was stale ({stale})");
                            why = Some(reason.clone());
                            self.files = files;
                            self.go_cold(reason)?.run(job, kill)
                        }
                    }
                }
            },
            Pooled::Spent => return Err(spent()),
        };
        self.in_flight = None;
        let mut execution = execution?;
        if let Some(why) = why {
            execution.isolation.details.insert("pool".to_owned(), format!("ran cold: {why}"));
        }
        Ok(execution)
    }
}

fn spent() -> SandboxError {
    SandboxError::Setup {
        step: "start the run".to_owned(),
        detail: "this pooled sandbox was lost when its sandbox could not be made; take another".to_owned(),
    }
}

impl Drop for PooledInstance {
    /// Its sandbox is destroyed by the reaper, off the caller's path.
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, Pooled::Spent) {
            Pooled::Spent => {}
            sandbox => self.shared.reaper.hand_over(sandbox),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("options", &self.shared.options).field("stats", &self.stats()).finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a sandbox with `policy` can be a ready one, and the limits
    /// its claim lowers; if not, why.
    fn suits(&self, policy: &Policy) -> Result<Lowered, String> {
        if !policy.with_packages.is_empty() {
            return Err(
                "it asks for extra packages (with_packages), and a pool's sandboxes hold its image alone".to_owned()
            );
        }
        let pool = &self.policy;
        // The network is the claim's: a ready sandbox starts its proxy, with
        // the run's allowlist, at the release (or says it cannot).
        let differs = [
            ("backend", policy.backend != pool.backend),
            ("allow_degraded", policy.allow_degraded != pool.allow_degraded),
        ];
        if let Some((field, _)) = differs.iter().find(|(_, differs)| *differs) {
            return Err(format!("its {field} differs from the pool's, and is in force from a sandbox's start"));
        }
        if self.options.mode == PoolMode::Forked && policy.network.is_enabled() {
            return Err("it allows hosts, and a fork has no proxy listener (a pool in the pooled mode serves it warm)"
                .to_owned());
        }
        let lowered = limits_suit(&policy.limits, &pool.limits)?;
        Ok(Lowered { env: self.env_at_claim(policy)?, ..lowered })
    }

    /// The variables a claim sets (`Some`) or removes (`None`) for a run
    /// with `policy`, where its environment differs from the pool's; if a
    /// name that differs is not one the run may set at its claim, why not.
    fn env_at_claim(&self, policy: &Policy) -> Result<Vec<(String, Option<String>)>, String> {
        let (run, pool) = (self.runtime.environment(policy), self.runtime.environment(&self.policy));
        let names: std::collections::BTreeSet<&String> = run.keys().chain(pool.keys()).collect();
        let mut changes = Vec::new();
        for name in names {
            let wanted = run.get(name);
            if wanted == pool.get(name) {
                continue;
            }
            if let Some(reader) = read_at_start(name) {
                return Err(format!(
                    "its env differs from the pool's in {name}, which is in force from a sandbox's start ({reader}) \
                     and cannot be set at a claim, even when env_at_claim lists it"
                ));
            }
            if !self.options.may_set_at_claim(name) {
                return Err(format!(
                    "its env differs from the pool's in {name}, which is in force from a sandbox's start; a pool \
                     lets runs set it warm only when its operator lists it in env_at_claim ([pool] env_at_claim, \
                     PoolOptions::env_at_claim, Pool(env_at_claim=...)), which only a variable nothing reads \
                     before the code starts belongs in"
                ));
            }
            changes.push((name.clone(), wanted.cloned()));
        }
        Ok(changes)
    }

    /// Whether a ready sandbox can run `job` with `policy` (its limits may
    /// have been set for the run), and the limits its claim lowers.
    fn suits_run(&self, policy: &Policy, job: &Job) -> Result<Lowered, String> {
        if job.language != Language::Python {
            return Err("a pool's sandboxes wait with a Python interpreter; shell code runs cold".to_owned());
        }
        self.suits(policy)
    }

    /// The oldest ready sandbox still ready and young enough, and holding
    /// less memory than `memory_cap` (a claim's lower limit) where there is
    /// one, counted in flight (the caller holds it in an `InFlight`). Those
    /// that hold more stay ready for other runs.
    fn take(&self, memory_cap: Option<u64>) -> Taken {
        let mut stale = Vec::new();
        let taken = {
            let mut state = self.lock();
            let mut taken = Taken::Empty;
            let mut index = 0;
            while index < state.ready.len() {
                let entry = &state.ready[index];
                if !(entry.warm.is_ready() && entry.ready_at.elapsed() < self.options.idle_expiry) {
                    stale.extend(state.ready.remove(index));
                    continue;
                }
                let held = entry.warm.memory_bytes();
                if let (Some(cap), Some(held)) = (memory_cap, held)
                    && held >= cap
                {
                    let least = match taken {
                        Taken::AllHoldMore { least } => least.min(held),
                        _ => held,
                    };
                    taken = Taken::AllHoldMore { least };
                    index += 1;
                    continue;
                }
                let spare = Duration::from_millis(state.last_refill_ms.unwrap_or(0)) + REFILL_DEFER;
                state.claims_sparse =
                    state.last_claim.is_none_or(|last| last.elapsed() >= spare) && !state.missed_lately();
                state.last_claim = Some(Instant::now());
                state.in_flight += 1;
                taken = state.ready.remove(index).map_or(Taken::Empty, Taken::Ready);
                break;
            }
            if matches!(taken, Taken::Empty) {
                state.last_miss = Some(Instant::now());
                state.claims_sparse = false;
            }
            taken
        };
        self.wake.notify_all();
        drop(stale);
        taken
    }

    /// A forked pool's next sandbox: a fork of its template, started first
    /// when there is none, it ended, or it is past the idle expiry (the
    /// forks already made keep the old one alive until their runs are over).
    fn fork(&self) -> Result<Box<dyn WarmInstance>, SandboxError> {
        let mut template = self.template.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let fresh =
            |(t, made): &(Box<dyn Template>, Instant)| t.is_ready() && made.elapsed() < self.options.idle_expiry;
        if !template.as_ref().is_some_and(fresh) {
            *template = None;
            let started = self
                .backend
                .create_to_start_ahead(&self.policy, &self.runtime)
                .and_then(|instance| instance.start_template(&self.options.preload))?;
            *template = Some((started, Instant::now()));
            self.lock().templates += 1;
        }
        let (template, _) = template.as_ref().ok_or_else(|| SandboxError::Setup {
            step: "fork a run".to_owned(),
            detail: "the pool has no template".to_owned(),
        })?;
        let memory = template.memory_bytes();
        self.lock().template_memory = memory;
        template.fork()
    }

    /// Whether one more ready sandbox would take the pool past its memory
    /// budget, judged by the ones ready now (none ready: never).
    fn over_budget(&self, state: &State) -> bool {
        let Some(budget) = self.options.memory_budget else { return false };
        let held: Vec<u64> = state.ready.iter().filter_map(|entry| entry.warm.memory_bytes()).collect();
        let Some(count) = std::num::NonZeroU64::new(held.len() as u64) else { return false };
        let total: u64 = held.iter().sum::<u64>() + state.template_memory.unwrap_or(0);
        total + total / count > budget
    }

    fn empty_reason(&self) -> String {
        let state = self.lock();
        if state.closed {
            return "the pool is closed".to_owned();
        }
        match &state.last_refill_error {
            Some(error) if state.refill_failures > 0 => {
                format!("the pool was empty; its last refill failed: {error}")
            }
            _ => "the pool was empty".to_owned(),
        }
    }

    /// The refill thread: keeps `size` sandboxes ready, destroys those past
    /// their expiry, until the pool is dropped.
    fn refill(&self) {
        loop {
            {
                let mut state = self.lock();
                loop {
                    if state.closed {
                        return;
                    }
                    let expiry = self.options.idle_expiry;
                    let before = state.ready.len();
                    let old: Vec<Entry> = {
                        let (keep, old): (VecDeque<Entry>, VecDeque<Entry>) = std::mem::take(&mut state.ready)
                            .into_iter()
                            .partition(|e| e.warm.is_ready() && e.ready_at.elapsed() < expiry);
                        state.ready = keep;
                        old.into()
                    };
                    state.expired += (before - state.ready.len()) as u64;
                    if !old.is_empty() {
                        drop(state);
                        drop(old);
                        state = self.lock();
                        continue;
                    }
                    if state.ready.len() < self.options.size && !self.over_budget(&state) {
                        break;
                    }
                    let check = expiry.min(Duration::from_secs(5));
                    state = self.wake.wait_timeout(state, check).map(|(s, _)| s).unwrap_or_else(|e| e.into_inner().0);
                }
            }
            {
                let mut state = self.lock();
                if state.claims_sparse {
                    // A claim judged busy meanwhile (a miss among them) ends the wait.
                    state = match self
                        .wake
                        .wait_timeout_while(state, REFILL_DEFER, |s| s.in_flight > 0 && !s.closed && s.claims_sparse)
                    {
                        Ok((state, _)) => state,
                        Err(poisoned) => poisoned.into_inner().0,
                    };
                }
                // Closed while it waited: nothing more is made.
                if state.closed {
                    return;
                }
            }
            let began = Instant::now();
            let made = match self.options.mode {
                PoolMode::Pooled => self
                    .backend
                    .create_to_start_ahead(&self.policy, &self.runtime)
                    .and_then(|instance| instance.start_warm(&self.options.preload)),
                PoolMode::Forked => self.fork(),
            };
            let mut state = self.lock();
            match made {
                Ok(warm) => {
                    let took = began.elapsed().as_millis() as u64;
                    state.refills += 1;
                    state.last_refill_ms = Some(took);
                    state.refill_ms_total += took;
                    if state.closed {
                        return;
                    }
                    state.ready.push_back(Entry { warm, ready_at: Instant::now() });
                    drop(state);
                    self.wake.notify_all();
                }
                Err(error) => {
                    state.refill_failures += 1;
                    state.last_refill_error = Some(error.to_string());
                    // The whole backoff, whatever wakes the pool meanwhile:
                    // each claim does, and a refill that retried at each one
                    // made a sandbox (or a template) per claim while the
                    // image was gone. Only closing ends it early.
                    let _ = self.wake.wait_timeout_while(state, REFILL_BACKOFF, |s| !s.closed);
                }
            }
        }
    }
}

/// The limits a claim lowers in a ready sandbox, `None` where it keeps
/// the pool's, and the variables it sets or removes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Lowered {
    memory_bytes: Option<u64>,
    pids: Option<u32>,
    env: Vec<(String, Option<String>)>,
}

/// Whether a run's limits can be applied to a sandbox started with the
/// pool's, and which its claim lowers: the wall and CPU time (kept by the
/// supervisor from the release), the memory and the processes (written
/// into the sandbox's cgroup at the claim) may be lower; the rest is in
/// force since the start.
fn limits_suit(run: &Limits, pool: &Limits) -> Result<Lowered, String> {
    if run.wall_time > pool.wall_time || run.cpu_time > pool.cpu_time {
        return Err("its wall or CPU time is above the pool's".to_owned());
    }
    if run.memory_bytes > pool.memory_bytes || run.pids > pool.pids {
        return Err("its memory or process limit is above the pool's (in force from a sandbox's start)".to_owned());
    }
    let same = Limits {
        wall_time: pool.wall_time,
        cpu_time: pool.cpu_time,
        memory_bytes: pool.memory_bytes,
        pids: pool.pids,
        ..run.clone()
    };
    if same != *pool {
        return Err("its limits other than wall and CPU time, memory and processes differ from the pool's (in force \
                    from a sandbox's start)"
            .to_owned());
    }
    Ok(Lowered {
        memory_bytes: (run.memory_bytes < pool.memory_bytes).then_some(run.memory_bytes),
        pids: (run.pids < pool.pids).then_some(run.pids),
        env: Vec::new(),
    })
}
