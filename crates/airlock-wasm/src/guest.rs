//! Running one guest: a fresh store and instance, its limits enforced by the
//! host, and what it printed.
//!
//! The guest runs as an async wasmtime call on a thread of its own (a large
//! native stack; the wasm itself runs on wasmtime's fiber stack). An epoch
//! ticker thread advances the engine's epoch every [`TICK`]; on each tick the
//! same checks ([`Watch`]) run from the epoch callback while the guest
//! computes, and from a timer raced against the call while it waits in a host
//! call (`poll_oneoff` for `time.sleep`), whose future is then dropped. So a
//! limit is noticed within a tick, computing or sleeping:
//! - wall time: the deadline;
//! - memory: a store limiter refuses linear memory past the cap by trapping
//!   (at once, not on a tick);
//! - CPU time: the guest thread's own CPU clock (the guest is one thread, so
//!   this is all the CPU it uses);
//! - output: capped buffers; past the cap the run goes on or traps, as the
//!   policy says;
//! - disk: the guest's writable folders, measured every
//!   [`DISK_EVERY_TICKS`] ticks and once at the end;
//! - open files: every file the guest opens is a host descriptor of this
//!   process, counted on every tick (over-counting, never under-counting,
//!   when other runs share the process).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_core::KillSwitch;
use airlock_core::output::{CappedBuffer, Captured};
use airlock_policy::{Limits, OutputOverflow};
use wasmtime::{Engine, InstancePre, Store, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::files;

/// How often the epoch advances, and so how late a limit can be noticed.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// The writable folders are measured every this many ticks.
pub(crate) const DISK_EVERY_TICKS: u64 = 10;
/// The native stack of the guest's thread.
const GUEST_THREAD_STACK: usize = 32 << 20;

/// What the guest's store holds.
pub(crate) struct GuestState {
    wasi: WasiP1Ctx,
    memory: MemoryGuard,
    stop: Option<Stop>,
}

/// The linear-memory cap, and the peak the guest reached.
struct MemoryGuard {
    cap: usize,
    peak: usize,
    refused: Option<usize>,
}

impl wasmtime::ResourceLimiter for MemoryGuard {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.refused = Some(desired);
            // A trap, not a failed grow: the run ends as `memory_limit`, as
            // an out-of-memory kill does on Linux, rather than as a
            // MemoryError the code might catch and hide.
            return Err(wasmtime::format_err!(
                "linear memory would grow to {desired} bytes, past the cap of {}",
                self.cap
            ));
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Table elements are 8 bytes of host memory each: bounded by the
        // memory cap too.
        Ok(desired.saturating_mul(8) <= self.cap)
    }
}

/// Why the host stopped a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    WallTime,
    CpuTime,
    Memory,
    Output,
    Disk,
    Inodes,
    OpenFiles,
    Killed,
}

/// How a guest ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// `run()` returned, or the guest called `proc_exit`.
    Exited(i32),
    /// The host stopped it.
    Stopped(Stop),
    /// It trapped by itself (a stack overflow, an unreachable).
    Trapped(String),
}

/// One guest run's outcome.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub ending: Ending,
    pub stdout: Captured,
    pub stderr: Captured,
    pub wall: Duration,
    pub cpu: Option<Duration>,
    pub peak_memory: Option<u64>,
    /// Limits reached without stopping the run (output truncated).
    pub output_truncated: bool,
    /// The memory the guest asked for when it was refused.
    pub memory_refused: Option<usize>,
}

/// A folder the guest sees.
#[derive(Clone, Debug)]
pub(crate) struct Preopen {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// Everything one run needs.
pub(crate) struct RunSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub preopens: Vec<Preopen>,
    /// The guest's writable folders, measured against the disk caps.
    pub writable: Vec<PathBuf>,
    pub limits: Limits,
}

/// The linker every guest is instantiated through: WASI preview 1, and the
/// interpreter's `host.call` door, which has no handler here.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<wasmtime::Linker<GuestState>> {
    let mut linker = wasmtime::Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |state: &mut GuestState| &mut state.wasi)?;
    // The door to host tools: -1 says "no host handler".
    linker.func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 { -1 })?;
    Ok(linker)
}

/// Runs one guest to its end on a thread of its own, and waits for it.
pub(crate) fn run(
    engine: &Engine,
    pre: &InstancePre<GuestState>,
    spec: RunSpec,
    kill: &KillSwitch,
) -> Result<Outcome, String> {
    let engine = engine.clone();
    let pre = pre.clone();
    let kill = kill.clone();
    let thread = std::thread::Builder::new()
        .name("airlock-wasm-guest".to_owned())
        .stack_size(GUEST_THREAD_STACK)
        .spawn(move || run_here(&engine, &pre, spec, &kill))
        .map_err(|e| format!("could not start the guest thread: {e}"))?;
    thread.join().map_err(|_| "the guest thread panicked".to_owned())?
}

fn run_here(
    engine: &Engine,
    pre: &InstancePre<GuestState>,
    spec: RunSpec,
    kill: &KillSwitch,
) -> Result<Outcome, String> {
    let limits = spec.limits.clone();
    let kill_on_overflow = limits.output_overflow == OutputOverflow::Kill;
    let overflowed = Arc::new(AtomicBool::new(false));
    let stdout = CaptureStream::new(limits.output_bytes, kill_on_overflow, overflowed.clone());
    let stderr = CaptureStream::new(limits.output_bytes, kill_on_overflow, overflowed.clone());

    let mut wasi = WasiCtxBuilder::new();
    // File calls run inline on the guest thread rather than on a blocking
    // pool: the guest is one thread, and imports read many small files.
    wasi.allow_blocking_current_thread(true)
        .args(&spec.argv)
        .envs(&spec.env)
        .stdin(MemoryInputPipe::new(spec.stdin))
        .stdout(stdout.clone())
        .stderr(stderr.clone());
    for p in &spec.preopens {
        let perms = if p.writable { FsPerms::ReadWrite } else { FsPerms::ReadOnly };
        wasi.preopened_dir(&p.host, &p.guest, perms)
            .map_err(|e| format!("could not open {} for the guest: {e:#}", p.host.display()))?;
    }
    let state = GuestState {
        wasi: wasi.build_p1(),
        memory: MemoryGuard { cap: usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX), peak: 0, refused: None },
        stop: None,
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("could not start the guest's event loop: {e}"))?;
    let started = Instant::now();
    let cpu_start = thread_cpu_time();
    let deadline = started + limits.wall_time;
    let _ticker = Ticker::start(engine.clone())?;

    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    store.set_epoch_deadline(1);
    let watch = Arc::new(Mutex::new(Watch {
        open_files_before: open_descriptors(),
        deadline,
        started,
        cpu_start,
        limits: limits.clone(),
        kill: kill.clone(),
        writable: spec.writable.clone(),
        ticks: 0,
        overflowed: overflowed.clone(),
    }));
    let watched = watch.clone();
    store.epoch_deadline_callback(move |mut ctx| {
        let mut watch = watched.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match watch.check() {
            Some(stop) => {
                ctx.data_mut().stop = Some(stop);
                Ok(UpdateDeadline::Interrupt)
            }
            None => {
                watch.throttle();
                Ok(UpdateDeadline::Continue(1))
            }
        }
    });

    let result = runtime.block_on(async {
        let call = async {
            let instance = pre.instantiate_async(&mut store).await?;
            // Looked up as an option: a failed typed lookup builds an error.
            if let Some(init) = instance.get_func(&mut store, "_initialize") {
                init.typed::<(), ()>(&store)?.call_async(&mut store, ()).await?;
            }
            let run = instance.get_typed_func::<(), i32>(&mut store, "run")?;
            run.call_async(&mut store, ()).await
        };
        // The same checks while the guest waits in a host call (a sleep),
        // where no epoch callback runs.
        let watch_waiting = async {
            loop {
                tokio::time::sleep(TICK).await;
                let stop = watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).check();
                if let Some(stop) = stop {
                    return stop;
                }
            }
        };
        tokio::select! {
            result = call => Ok(result),
            stop = watch_waiting => Err(stop),
        }
    });
    let wall = started.elapsed();
    let cpu = thread_cpu_time().zip(cpu_start).map(|(end, start)| end.saturating_sub(start));

    let state = store.data();
    let ending = match result {
        Err(stop) => Ending::Stopped(stop),
        Ok(_) if state.memory.refused.is_some() => Ending::Stopped(Stop::Memory),
        Ok(_) if kill_on_overflow && overflowed.load(Ordering::SeqCst) => Ending::Stopped(Stop::Output),
        Ok(_) if state.stop.is_some() => Ending::Stopped(state.stop.unwrap_or(Stop::Killed)),
        Ok(Ok(code)) => Ending::Exited(code),
        Ok(Err(error)) => match error.downcast_ref::<I32Exit>() {
            Some(exit) => Ending::Exited(exit.0),
            None => Ending::Trapped(trap_text(&error)),
        },
    };
    // A guest that wrote past the disk caps in its last moments is caught here.
    let ending = match ending {
        Ending::Exited(_) | Ending::Trapped(_) => match disk_over(&spec.writable, &limits) {
            Some(stop) => Ending::Stopped(stop),
            None => ending,
        },
        stopped => stopped,
    };
    let peak = state.memory.peak as u64;
    let memory_refused = state.memory.refused;
    drop(store);
    let stdout = stdout.finish();
    let stderr = stderr.finish();
    let output_truncated = stdout.truncated() || stderr.truncated();
    Ok(Outcome {
        ending,
        stdout,
        stderr,
        wall,
        cpu,
        peak_memory: (peak > 0).then_some(peak),
        output_truncated,
        memory_refused,
    })
}

fn trap_text(error: &wasmtime::Error) -> String {
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{error:#}").lines().next().unwrap_or("").chars().take(500).collect(),
    }
}

/// The disk limit the writable folders are past, if any.
fn disk_over(writable: &[PathBuf], limits: &Limits) -> Option<Stop> {
    let roots: Vec<&std::path::Path> = writable.iter().map(PathBuf::as_path).collect();
    let used = files::usage(&roots, limits.disk_bytes, limits.disk_inodes);
    if used.bytes > limits.disk_bytes {
        Some(Stop::Disk)
    } else if used.inodes > limits.disk_inodes {
        Some(Stop::Inodes)
    } else {
        None
    }
}

/// The checks the epoch callback makes on every tick.
struct Watch {
    /// This process's descriptors before the guest started.
    open_files_before: Option<usize>,
    deadline: Instant,
    started: Instant,
    cpu_start: Option<Duration>,
    limits: Limits,
    kill: KillSwitch,
    writable: Vec<PathBuf>,
    ticks: u64,
    overflowed: Arc<AtomicBool>,
}

impl Watch {
    fn check(&mut self) -> Option<Stop> {
        self.ticks += 1;
        if self.kill.is_killed() {
            return Some(Stop::Killed);
        }
        if Instant::now() >= self.deadline {
            return Some(Stop::WallTime);
        }
        if self.limits.output_overflow == OutputOverflow::Kill && self.overflowed.load(Ordering::SeqCst) {
            return Some(Stop::Output);
        }
        if self.cpu_used().is_some_and(|used| used >= self.limits.cpu_time) {
            return Some(Stop::CpuTime);
        }
        let opened = self.open_files_before.zip(open_descriptors()).map(|(before, now)| now.saturating_sub(before));
        if opened.is_some_and(|opened| opened > self.limits.open_files as usize) {
            return Some(Stop::OpenFiles);
        }
        if self.ticks % DISK_EVERY_TICKS == 0 {
            return disk_over(&self.writable, &self.limits);
        }
        None
    }

    fn cpu_used(&self) -> Option<Duration> {
        thread_cpu_time().zip(self.cpu_start).map(|(now, start)| now.saturating_sub(start))
    }

    /// Holds the guest to `cpus` of one core when that is below 1: after
    /// running ahead of its share, it sleeps until it is back to it.
    fn throttle(&self) {
        let cpus = self.limits.cpus;
        if cpus >= 1.0 {
            return;
        }
        let (Some(used), elapsed) = (self.cpu_used(), self.started.elapsed()) else {
            return;
        };
        let allowed = elapsed.mul_f64(cpus);
        if used > allowed {
            let wait = (used - allowed).div_f64(cpus);
            let left = self.deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(wait.min(left));
        }
    }
}

/// How many descriptors this process holds.
fn open_descriptors() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd").ok().map(|entries| entries.count())
}

/// The CPU time this thread has used.
fn thread_cpu_time() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Advances the engine's epoch every [`TICK`] until dropped.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    /// Fails closed: without the ticker no limit would be checked.
    fn start(engine: Engine) -> Result<Ticker, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("airlock-wasm-epoch".to_owned())
            .stack_size(64 << 10)
            .spawn(move || {
                // Parked rather than slept, so that a drop wakes it at once.
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(TICK);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| format!("could not start the epoch ticker: {e}"))?;
        Ok(Ticker { stop, thread: Some(thread) })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// A guest's stdout or stderr: the first bytes up to the cap, the rest
/// counted. Past the cap, a write traps when the policy says to kill.
#[derive(Clone)]
struct CaptureStream {
    inner: Arc<Mutex<CappedBuffer>>,
    kill_on_overflow: bool,
    overflowed: Arc<AtomicBool>,
}

impl CaptureStream {
    fn new(cap: u64, kill_on_overflow: bool, overflowed: Arc<AtomicBool>) -> CaptureStream {
        CaptureStream { inner: Arc::new(Mutex::new(CappedBuffer::new(cap))), kill_on_overflow, overflowed }
    }

    /// Adds `bytes`; false when the stream passed its cap and must stop.
    fn push(&self, bytes: &[u8]) -> bool {
        let mut buffer = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        buffer.push(bytes);
        if buffer.is_over() {
            self.overflowed.store(true, Ordering::SeqCst);
            return !self.kill_on_overflow;
        }
        true
    }

    fn finish(self) -> Captured {
        let mut buffer = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::replace(&mut *buffer, CappedBuffer::new(0)).finish()
    }
}

impl IsTerminal for CaptureStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CaptureStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CaptureStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CaptureStream {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        if self.push(&bytes) {
            Ok(())
        } else {
            Err(StreamError::trap("the output passed its cap and the policy stops the run"))
        }
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(1 << 20)
    }
}

impl tokio::io::AsyncWrite for CaptureStream {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if self.push(buf) {
            Poll::Ready(Ok(buf.len()))
        } else {
            Poll::Ready(Err(std::io::Error::other("the output passed its cap")))
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
