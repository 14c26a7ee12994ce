//! The guest itself, inside its worker: a fresh store and instance of the
//! interpreter, WASI with only the folders the plan names, the linear
//! memory capped by a limiter.
//!
//! Nothing here watches the clock, the CPU, the output or the disk: the
//! supervisor does, from outside the worker, and kills it; the kernel
//! refuses the byte past the disk cap and the descriptor past the open-file
//! cap. What only the host of the guest can see is here: how much linear
//! memory the guest asks for (refused past the cap by trapping), whether it
//! reached its open-file limit, and how the guest ended.

use std::fs::File;

use wasmtime::{CallHook, Engine, InstancePre, Linker, Module, Store};
use wasmtime_wasi::cli::OutputFile;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::protocol::{GuestEnd, Preopen};

/// What the guest's store holds.
pub(crate) struct GuestState {
    wasi: WasiP1Ctx,
    memory: MemoryGuard,
    /// The worker's RLIMIT_NOFILE, once set.
    fd_limit: Option<u64>,
    /// Every descriptor below the limit was taken at some moment.
    open_files_hit: bool,
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

/// What one guest is run with.
pub(crate) struct GuestSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub stdout: File,
    pub stderr: File,
    pub preopens: Vec<Preopen>,
    pub memory_bytes: u64,
}

/// A guest ready to start: its store (with WASI and the preopened folders
/// open) and the interpreter linked, so that nothing is left to open or
/// compile once the worker's last restrictions are in force.
pub(crate) struct Prepared {
    runtime: tokio::runtime::Runtime,
    store: Store<GuestState>,
    pre: InstancePre<GuestState>,
}

/// The linker every guest is instantiated through: WASI preview 1, and the
/// interpreter's `host.call` door, which has no handler here.
fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |state: &mut GuestState| &mut state.wasi)?;
    // The door to host tools: -1 says "no host handler".
    linker.func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 { -1 })?;
    Ok(linker)
}

/// Builds the guest's store and links the interpreter, opening the folders.
pub(crate) fn prepare(engine: &Engine, module: &Module, spec: GuestSpec) -> Result<Prepared, String> {
    let mut wasi = WasiCtxBuilder::new();
    // File calls run inline on the guest's thread rather than on a blocking
    // pool: the guest is one thread, and imports read many small files.
    wasi.allow_blocking_current_thread(true)
        .args(&spec.argv)
        .envs(&spec.env)
        .stdin(MemoryInputPipe::new(spec.stdin))
        // Straight to the supervisor's pipes: it caps them, not the worker.
        .stdout(OutputFile::new(spec.stdout))
        .stderr(OutputFile::new(spec.stderr));
    for p in &spec.preopens {
        let perms = if p.writable { FsPerms::ReadWrite } else { FsPerms::ReadOnly };
        wasi.preopened_dir(&p.host, &p.guest, perms).map_err(|e| format!("opening {} for the guest: {e:#}", p.host))?;
    }
    let state = GuestState {
        wasi: wasi.build_p1(),
        memory: MemoryGuard { cap: usize::try_from(spec.memory_bytes).unwrap_or(usize::MAX), peak: 0, refused: None },
        fd_limit: None,
        open_files_hit: false,
    };
    // Timers for poll_oneoff (time.sleep); no I/O driver, no threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("starting the guest's event loop: {e}"))?;
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    store.call_hook(watch_descriptors);
    let pre = linker(engine)
        .and_then(|linker| linker.instantiate_pre(module))
        .map_err(|e| format!("linking the interpreter: {e:#}"))?;
    Ok(Prepared { runtime, store, pre })
}

/// Notes, on every return from a WASI call, whether the guest has reached
/// its open-file limit: the kernel hands out the lowest free descriptor, so
/// the last one below the limit is open only once every one below it was,
/// at that moment. The kernel counts no EMFILE, so this is where it is seen
/// (the guest itself gets EIO, wasmtime's word for EMFILE).
fn watch_descriptors(mut ctx: wasmtime::StoreContextMut<'_, GuestState>, hook: CallHook) -> wasmtime::Result<()> {
    let state = ctx.data_mut();
    if matches!(hook, CallHook::ReturningFromHost) && !state.open_files_hit {
        if let Some(last) = state.fd_limit.and_then(|limit| limit.checked_sub(1)) {
            state.open_files_hit = is_open(last);
        }
    }
    Ok(())
}

fn is_open(fd: u64) -> bool {
    // SAFETY: fcntl(F_GETFD) takes a number, touches no memory and changes
    // nothing, whether or not the descriptor is open.
    unsafe { libc::fcntl(fd as libc::c_int, libc::F_GETFD) != -1 }
}

/// How many descriptors below `limit` this process holds (it has no /proc).
pub(crate) fn open_descriptors(limit: u64) -> u64 {
    (0..limit).filter(|&fd| is_open(fd)).count() as u64
}

impl Prepared {
    /// Tells the guest's host the open-file limit the worker set.
    pub(crate) fn set_fd_limit(&mut self, limit: u64) {
        self.store.data_mut().fd_limit = Some(limit);
    }

    /// Runs the guest to its end.
    pub(crate) fn run(self) -> GuestEnd {
        let Prepared { runtime, mut store, pre } = self;
        let result = runtime.block_on(async {
            let instance = pre.instantiate_async(&mut store).await?;
            // Looked up as an option: a failed typed lookup builds an error.
            if let Some(init) = instance.get_func(&mut store, "_initialize") {
                init.typed::<(), ()>(&store)?.call_async(&mut store, ()).await?;
            }
            let run = instance.get_typed_func::<(), i32>(&mut store, "run")?;
            run.call_async(&mut store, ()).await
        });
        let state = store.data();
        let mut end = GuestEnd {
            memory_refused: state.memory.refused.map(|bytes| bytes as u64),
            memory_peak: state.memory.peak as u64,
            open_files_hit: state.open_files_hit,
            ..GuestEnd::default()
        };
        match result {
            Ok(code) => end.exit_code = Some(code),
            Err(error) => match error.downcast_ref::<I32Exit>() {
                Some(exit) => end.exit_code = Some(exit.0),
                None => end.trap = Some(trap_text(&error)),
            },
        }
        end
    }
}

fn trap_text(error: &wasmtime::Error) -> String {
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{error:#}").lines().next().unwrap_or("").chars().take(500).collect(),
    }
}
