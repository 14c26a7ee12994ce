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
//! A run never waits for the pool: when it is empty, or when the run cannot
//! be served warm, it runs cold, and its record says why
//! (`isolation.details.pool`). What a claim can change: the files, the code,
//! its standard input, working directory and display name, and a lower wall
//! or CPU time (both kept by the supervisor, from the release). Everything
//! else in force since the sandbox started (the environment, memory,
//! processes, CPUs, disk, output and file caps, the network, the image)
//! must be the pool's, or the run goes cold.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_core::record;
use airlock_core::{Backend, Claim, Claimed, KillSwitch, Runtime, WarmInstance};
use airlock_policy::{InputRecord, Language, Limits, Policy, RunRecord, SandboxPath};

use crate::Error;
use crate::sandbox::{Audit, RunRequest, Sandbox, backend_for, collapse};

/// How a pool is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Sandboxes kept ready.
    pub size: usize,
    /// Modules each sandbox imports before it waits for its run.
    pub preload: Vec<String>,
    /// A sandbox ready for longer than this is destroyed and made anew.
    pub idle_expiry: Duration,
}

impl PoolOptions {
    /// What the default image's interpreter imports before a run: the
    /// scientific stack (matplotlib renders off-screen, as every run's does).
    pub fn default_preload() -> Vec<String> {
        ["numpy", "pandas", "matplotlib"].map(String::from).to_vec()
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions { size: 2, preload: PoolOptions::default_preload(), idle_expiry: Duration::from_secs(600) }
    }
}

/// What a pool has done, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sandboxes ready now.
    pub ready: usize,
    /// Runs served warm.
    pub hits: u64,
    /// Runs that found no ready sandbox and ran cold.
    pub misses: u64,
    /// Runs whose policy could not be applied to a ready sandbox (cold).
    pub unsuited: u64,
    /// Sandboxes made ready, and the milliseconds the last one took.
    pub refills: u64,
    pub last_refill_ms: Option<u64>,
    /// Sandboxes that failed to become ready, and why the last one did.
    pub refill_failures: u64,
    pub last_refill_error: Option<String>,
    /// Ready sandboxes destroyed for their age.
    pub expired: u64,
}

/// Sandboxes made ready ahead of their runs, for one policy and one
/// runtime. Dropping it destroys every ready sandbox.
pub struct Pool {
    shared: Arc<Shared>,
    refill: Option<JoinHandle<()>>,
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
}

#[derive(Default)]
struct State {
    ready: VecDeque<Entry>,
    closed: bool,
    refills: u64,
    last_refill_ms: Option<u64>,
    refill_failures: u64,
    last_refill_error: Option<String>,
    expired: u64,
}

struct Entry {
    warm: Box<dyn WarmInstance>,
    ready_at: Instant,
}

/// How long the refill thread rests after a failure before it tries again.
const REFILL_BACKOFF: Duration = Duration::from_secs(2);

impl Pool {
    /// A pool for `policy` running `runtime` (`None`: the default image,
    /// built on first use), on the policy's backend. Returns at once; the
    /// pool fills in the background.
    pub fn new(policy: Policy, runtime: Option<Runtime>, options: PoolOptions) -> Result<Pool, Error> {
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
        });
        let refiller = shared.clone();
        let refill = std::thread::Builder::new().name("airlock-pool".to_owned()).spawn(move || refiller.refill()).ok();
        Pool { shared, refill }
    }

    pub fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    pub fn options(&self) -> &PoolOptions {
        &self.shared.options
    }

    pub fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        PoolStats {
            ready: state.ready.len(),
            hits: self.shared.hits.load(Ordering::Relaxed),
            misses: self.shared.misses.load(Ordering::Relaxed),
            unsuited: self.shared.unsuited.load(Ordering::Relaxed),
            refills: state.refills,
            last_refill_ms: state.last_refill_ms,
            refill_failures: state.refill_failures,
            last_refill_error: state.last_refill_error.clone(),
            expired: state.expired,
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

    /// Runs `request` with `policy` (its `limits`, if any, for this run),
    /// `files` copied into /work first: in a ready sandbox when one is there
    /// and the policy can be applied to it, else cold. Its audit store, if
    /// the pool has one, records it. `Err` only for what would stop a cold
    /// run before it started (a file refused, a sandbox that cannot be made).
    pub fn run(&self, policy: &Policy, files: &[(String, Vec<u8>)], request: &RunRequest) -> Result<RunRecord, Error> {
        let requested_at = Instant::now();
        let started_at = record::now_rfc3339();
        let mut run_policy = policy.clone();
        if let Some(limits) = &request.limits {
            run_policy.limits = limits.clone();
        }
        let mut parsed = Vec::with_capacity(files.len());
        for (path, data) in files {
            parsed.push((SandboxPath::parse(path)?, data.clone()));
        }
        let why_cold = match self.shared.suits(&run_policy, request) {
            Err(reason) => {
                self.shared.unsuited.fetch_add(1, Ordering::Relaxed);
                reason
            }
            Ok(()) => match self.shared.take() {
                None => {
                    self.shared.misses.fetch_add(1, Ordering::Relaxed);
                    self.shared.empty_reason()
                }
                Some(entry) => {
                    let claim = Claim {
                        job: request.job(),
                        files: parsed.clone(),
                        wall_time: run_policy.limits.wall_time,
                        cpu_time: run_policy.limits.cpu_time,
                        kill: KillSwitch::new(),
                        requested_at,
                    };
                    match entry.warm.claim(claim) {
                        Claimed::Ran { instance, execution } => {
                            self.shared.hits.fetch_add(1, Ordering::Relaxed);
                            let inputs = parsed.iter().map(|(p, d)| input_record(p, d)).collect();
                            let mut sandbox = Sandbox::from_instance(
                                instance,
                                run_policy,
                                self.shared.runtime.clone(),
                                inputs,
                                self.shared.audit.clone(),
                            );
                            let outcome = sandbox.finish_run(request, &request.job(), started_at, *execution);
                            return Ok(collapse(sandbox.audited(outcome)));
                        }
                        Claimed::Refused(error) => return Err(Error::Sandbox(error)),
                        Claimed::Stale(why) => {
                            self.shared.misses.fetch_add(1, Ordering::Relaxed);
                            format!("the ready sandbox taken was stale ({why})")
                        }
                    }
                }
            },
        };
        self.run_cold(run_policy, &parsed, request, why_cold)
    }

    /// A cold run, as a [`Sandbox`] makes it, its record saying why it was cold.
    fn run_cold(
        &self,
        policy: Policy,
        files: &[(SandboxPath, Vec<u8>)],
        request: &RunRequest,
        why: String,
    ) -> Result<RunRecord, Error> {
        let shared = &self.shared;
        let mut sandbox = Sandbox::create(shared.backend, policy, shared.runtime.clone(), None)?;
        sandbox.set_audit(shared.audit.clone());
        for (path, data) in files {
            sandbox.write(&path.to_string(), data)?;
        }
        // The per-run limits are already the sandbox's.
        let request = RunRequest { limits: None, ..request.clone() };
        let mut record = sandbox.run_request(&request);
        record.isolation.details.insert("pool".to_owned(), format!("ran cold: {why}"));
        Ok(record)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let entries = {
            let mut state = self.shared.lock();
            state.closed = true;
            std::mem::take(&mut state.ready)
        };
        self.shared.wake.notify_all();
        drop(entries);
        if let Some(thread) = self.refill.take() {
            let _ = thread.join();
        }
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

    /// Whether a run with `policy` can take a ready sandbox; if not, why.
    fn suits(&self, policy: &Policy, request: &RunRequest) -> Result<(), String> {
        let pool = &self.policy;
        if request.language != Language::Python {
            return Err("a pool's sandboxes wait with a Python interpreter; shell code runs cold".to_owned());
        }
        let differs = [
            ("env", policy.env != pool.env),
            ("network", policy.network != pool.network),
            ("backend", policy.backend != pool.backend),
            ("allow_degraded", policy.allow_degraded != pool.allow_degraded),
            ("with_packages", policy.with_packages != pool.with_packages),
        ];
        if let Some((field, _)) = differs.iter().find(|(_, differs)| *differs) {
            return Err(format!("its {field} differs from the pool's, and is in force from a sandbox's start"));
        }
        limits_suit(&policy.limits, &pool.limits)
    }

    /// The oldest ready sandbox still ready and young enough.
    fn take(&self) -> Option<Entry> {
        let mut stale = Vec::new();
        let taken = {
            let mut state = self.lock();
            let mut taken = None;
            while let Some(entry) = state.ready.pop_front() {
                if entry.warm.is_ready() && entry.ready_at.elapsed() < self.options.idle_expiry {
                    taken = Some(entry);
                    break;
                }
                stale.push(entry);
            }
            taken
        };
        self.wake.notify_all();
        drop(stale);
        taken
    }

    fn empty_reason(&self) -> String {
        let state = self.lock();
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
                    if state.ready.len() < self.options.size {
                        break;
                    }
                    let check = expiry.min(Duration::from_secs(5));
                    state = self.wake.wait_timeout(state, check).map(|(s, _)| s).unwrap_or_else(|e| e.into_inner().0);
                }
            }
            let began = Instant::now();
            let made = self
                .backend
                .create(&self.policy, &self.runtime)
                .and_then(|instance| instance.start_warm(&self.options.preload));
            let mut state = self.lock();
            match made {
                Ok(warm) => {
                    state.refills += 1;
                    state.last_refill_ms = Some(began.elapsed().as_millis() as u64);
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
                    let _ = self.wake.wait_timeout(state, REFILL_BACKOFF);
                }
            }
        }
    }
}

/// Whether a run's limits can be applied to a sandbox started with the
/// pool's: only the wall and CPU time, kept by the supervisor from the
/// release, may be lower; the rest is in force since the start.
fn limits_suit(run: &Limits, pool: &Limits) -> Result<(), String> {
    if run.wall_time > pool.wall_time || run.cpu_time > pool.cpu_time {
        return Err("its wall or CPU time is above the pool's".to_owned());
    }
    let same = Limits { wall_time: pool.wall_time, cpu_time: pool.cpu_time, ..run.clone() };
    if same != *pool {
        return Err("its limits other than wall and CPU time differ from the pool's (in force from a sandbox's start)"
            .to_owned());
    }
    Ok(())
}

fn input_record(path: &SandboxPath, data: &[u8]) -> InputRecord {
    InputRecord { path: path.to_string(), bytes: data.len() as u64, sha256: airlock_core::sha256_hex(data) }
}
