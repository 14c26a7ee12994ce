//! A warm sandbox: one run started ahead of demand, with every layer of a
//! cold run in force (its own host ids, namespaces, mounts, cgroup,
//! rlimits, Landlock, seccomp), whose driver has imported the preload and
//! waits, blocked on the code FIFO, before the first byte of code. A claim
//! copies its files in and releases its code; the sandbox is then that
//! run's alone, and destroyed after it: never run twice.
//!
//! The supervisor's loop for the run lives on a thread of its own, which
//! waits in the run's gate (`supervise::Gate`) for the claim. Only the
//! claim's clocks count: the wall clock and the CPU time start at the
//! release (the cgroup's usage then is subtracted); memory the preload
//! holds stays in the run's cgroup, under its memory limit. A claim may
//! lower the memory and process limits: the supervisor writes them into
//! the cgroup before the code's first byte, where the sandbox holds less
//! than them then; otherwise the claim is `Unsuited` and the run goes cold.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use airlock_core::backend::{Claim, Claimed, WarmInstance};
use airlock_core::{Execution, Instance, Job, KillSwitch, SandboxError, driver};
use airlock_policy::{Language, SandboxPath};

use crate::instance::{LinuxInstance, Mode, Warm};
use crate::supervise::{Gate, Release, Waiting};

/// Where the kernel says whether transparent huge pages may be used.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Whether a warm driver may move its preload into huge pages: the host's
/// setting is `always` or `madvise`, not `never`, and readable. (The
/// driver's `MADV_COLLAPSE` would ignore `never`, and the sandbox has no
/// `/sys` to read it from, so the supervisor asks for it.) Read once.
pub(crate) fn host_allows_huge_pages() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| std::fs::read_to_string(THP_ENABLED).is_ok_and(|setting| thp_setting_allows(&setting)))
}

/// `[always] madvise never` and the like: the bracketed word is the setting.
fn thp_setting_allows(setting: &str) -> bool {
    matches!(setting.split('[').nth(1).and_then(|rest| rest.split(']').next()), Some("always" | "madvise"))
}

/// What a warm sandbox's thread runs: a sandbox started ahead of its run
/// (a [`LinuxInstance`]), or a template's fork (`forked`).
pub(crate) trait WarmRun: Send + 'static {
    /// Runs it warm: `job` gives the language; the run waits in `gate`
    /// for its claim.
    fn run(&self, preload: &[String], job: &Job, gate: &mut Gate<'_>) -> Result<Execution, SandboxError>;
    /// Copies one of the claim's files in, before the release; the bytes
    /// copied for the run so far.
    fn copy_in(
        &self,
        waiting: &Waiting<'_>,
        written: u64,
        path: &SandboxPath,
        data: &[u8],
    ) -> Result<u64, SandboxError>;
    /// The sandbox once its run is over, for reading its outputs.
    fn into_instance(self: Box<Self>) -> Box<dyn Instance>;
    /// Once its driver waits, before it is counted ready: what a fork's own
    /// /tmp needs that a sandbox's has from its start.
    fn prepare(&self, _waiting: &Waiting<'_>) -> Result<(), SandboxError> {
        Ok(())
    }
    /// Why a run that allows hosts cannot be served here, if it cannot: a
    /// sandbox started warm holds its proxy's listener for the claim.
    fn refuses_network(&self) -> Option<&'static str> {
        None
    }
}

impl WarmRun for LinuxInstance {
    fn run(&self, preload: &[String], job: &Job, gate: &mut Gate<'_>) -> Result<Execution, SandboxError> {
        let unclaimed = KillSwitch::new();
        self.run_as(job, &unclaimed, Mode::Warm(Warm { preload, gate }))
    }

    fn copy_in(
        &self,
        _waiting: &Waiting<'_>,
        written: u64,
        path: &SandboxPath,
        data: &[u8],
    ) -> Result<u64, SandboxError> {
        LinuxInstance::copy_in(self, written, path, data)
    }

    fn into_instance(self: Box<Self>) -> Box<dyn Instance> {
        self
    }
}

/// A [`LinuxInstance`] started warm.
pub struct WarmSandbox {
    /// Dropping it ends the run unclaimed.
    claims: Option<mpsc::SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
    /// Set once the run has ended.
    ended: Arc<AtomicBool>,
    /// Where the kernel keeps the memory it holds (its cgroup's usage).
    memory_usage: Option<PathBuf>,
}

struct Request {
    claim: Claim,
    reply: mpsc::Sender<Claimed>,
}

impl WarmSandbox {
    /// Starts `instance` warm; returns once its preload is imported.
    pub(crate) fn start(instance: Box<dyn WarmRun>, preload: &[String]) -> Result<WarmSandbox, SandboxError> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (claims, claim_rx) = mpsc::sync_channel(1);
        let ended = Arc::new(AtomicBool::new(false));
        let preload = preload.to_vec();
        let flag = ended.clone();
        let thread = std::thread::Builder::new()
            .name("airlock-warm".to_owned())
            .spawn(move || {
                hold(instance, &preload, &ready_tx, &claim_rx);
                flag.store(true, Ordering::SeqCst);
            })
            .map_err(|e| SandboxError::io("starting a warm sandbox's thread", e))?;
        let ready = ready_rx.recv();
        let mut warm = WarmSandbox { claims: Some(claims), thread: Some(thread), ended, memory_usage: None };
        match ready {
            Ok(Ok(memory_usage)) => {
                warm.memory_usage = memory_usage;
                Ok(warm)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => {
                warm.end();
                Err(SandboxError::Setup {
                    step: "start a warm sandbox".to_owned(),
                    detail: "its thread ended without a word".to_owned(),
                })
            }
        }
    }

    fn end(&mut self) {
        self.claims = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for WarmSandbox {
    fn drop(&mut self) {
        self.end();
    }
}

impl WarmInstance for WarmSandbox {
    fn is_ready(&self) -> bool {
        !self.ended.load(Ordering::SeqCst)
    }

    fn memory_bytes(&self) -> Option<u64> {
        let file = self.memory_usage.as_ref().filter(|_| self.is_ready())?;
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    fn claim(mut self: Box<Self>, claim: Claim) -> Claimed {
        let gone = || Claimed::Stale("the warm sandbox had ended".to_owned());
        let Some(claims) = &self.claims else { return gone() };
        let (reply, answer) = mpsc::channel();
        if claims.send(Request { claim, reply }).is_err() {
            return gone();
        }
        let claimed = answer.recv().unwrap_or_else(|_| gone());
        self.end();
        claimed
    }
}

/// The warm run's thread: start the run, say when it is ready, wait for
/// the claim, run it, hand the claim the sandbox and what it did.
fn hold(
    instance: Box<dyn WarmRun>,
    preload: &[String],
    ready_tx: &mpsc::Sender<Result<Option<PathBuf>, SandboxError>>,
    claims: &mpsc::Receiver<Request>,
) {
    let job = Job { language: Language::Python, ..Job::default() };
    let mut was_ready = false;
    let mut claimed: Option<(mpsc::Sender<Claimed>, std::time::Duration)> = None;
    let outcome = {
        let mut gate = |waiting: &Waiting<'_>| -> Option<Release> {
            was_ready = true;
            if let Err(error) = instance.prepare(waiting) {
                let _ = ready_tx.send(Err(error));
                return None;
            }
            let ready_at = Instant::now();
            ready_tx.send(Ok(waiting.memory_usage_file())).ok()?;
            // The pool dropped the sandbox: end the run unclaimed.
            let Request { claim, reply } = claims.recv().ok()?;
            let waited = ready_at.elapsed();
            if !waiting.alive() {
                let _ = reply.send(Claimed::Stale("its interpreter ended while it waited".to_owned()));
                return None;
            }
            if let Some(why) = instance.refuses_network().filter(|_| claim.network.is_enabled()) {
                let _ = reply.send(Claimed::Unsuited(why.to_owned()));
                return None;
            }
            // Before the first byte of the code: what it holds then is the
            // preload's, and nothing of the run's can grow meanwhile.
            if let Err(why) = waiting.lower_limits(claim.memory_bytes, claim.pids) {
                let _ = reply.send(Claimed::Unsuited(format!("its lower limits could not be applied: {why}")));
                return None;
            }
            let mut written = 0;
            for (path, data) in &claim.files {
                match instance.copy_in(waiting, written, path, data) {
                    Ok(total) => written = total,
                    Err(error) => {
                        let _ = reply.send(Claimed::Refused(error));
                        return None;
                    }
                }
            }
            let mut env = claim.env;
            if claim.network.is_enabled() {
                // Its proxy starts at the release: clients find it here.
                let proxy = std::net::SocketAddr::V4(crate::PROXY_ADDR);
                env.extend(
                    airlock_net::proxy_environment(proxy).into_iter().map(|(key, value)| (key.to_owned(), Some(value))),
                );
            }
            claimed = Some((reply, waited));
            Some(Release {
                feed: driver::feed(&claim.job, &env),
                network: claim.network,
                stdin: claim.job.stdin,
                wall_time: claim.wall_time,
                cpu_time: claim.cpu_time,
                kill: claim.kill,
                requested_at: claim.requested_at,
            })
        };
        instance.run(preload, &job, &mut gate)
    };
    match claimed {
        Some((reply, waited)) => {
            let execution = outcome.map(|mut execution| {
                execution.usage.pool_wait_ms = Some(waited.as_millis() as u64);
                execution
            });
            let _ = reply.send(Claimed::Ran { instance: instance.into_instance(), execution: Box::new(execution) });
        }
        None if !was_ready => {
            let _ = ready_tx.send(Err(never_ready(outcome)));
        }
        None => {}
    }
}

/// Why a warm run ended before its preload was imported.
fn never_ready(outcome: Result<Execution, SandboxError>) -> SandboxError {
    match outcome {
        Err(error) => error,
        Ok(execution) => {
            let stderr = String::from_utf8_lossy(&execution.stderr.bytes);
            let tail: String =
                stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            SandboxError::Setup {
                step: "import the preload".to_owned(),
                detail: format!(
                    "the interpreter ended ({}) before its preload was imported{}",
                    execution.message.unwrap_or_else(|| execution.status.to_string()),
                    if tail.is_empty() { String::new() } else { format!(": {tail}") }
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::thp_setting_allows;

    #[test]
    fn only_always_and_madvise_allow_huge_pages() {
        assert!(thp_setting_allows("[always] madvise never\n"));
        assert!(thp_setting_allows("always [madvise] never\n"));
        assert!(!thp_setting_allows("always madvise [never]\n"));
        assert!(!thp_setting_allows(""));
        assert!(!thp_setting_allows("madvise"));
    }
}
