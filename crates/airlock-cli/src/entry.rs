//! What both binaries of this package, `airlock` and `airlock-serve`, do
//! around their subcommands: the static build's allocator, the parsing of
//! the command line, and the exit status of a failure.

use std::process::ExitCode;

/// Exit statuses, following `timeout` and `docker run`.
#[allow(dead_code, reason = "airlock-serve runs no code, so it exits only with SANDBOX_ERROR")]
pub mod exit {
    /// The run hit its wall-time limit.
    pub const TIMEOUT: u8 = 124;
    /// The sandbox itself failed, or the command was misused.
    pub const SANDBOX_ERROR: u8 = 125;
    /// The run was killed: memory, CPU time or output limit.
    pub const KILLED: u8 = 137;
}

/// The command built static, for musl, allocates with dlmalloc, as glibc's
/// allocator does: it keeps what is freed for the next allocation, where
/// musl's returns it to the kernel and faults it in again. With musl's, the
/// static build lost in allocation what it saved at its start (no dynamic
/// loader, no `cpuid` traps); with this one a cold run is 0.08x bare Python
/// faster than the glibc build (bench/results/startup.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// Set by `airlock` when it execs `airlock-serve`, to its own path: the
/// arguments it hands over are ones its parser accepted, so `airlock-serve`
/// refusing them means the two binaries come from different builds.
pub const STARTED_BY_ENV: &str = "AIRLOCK_SERVE_STARTED_BY";

/// Parses the command line as `C` and runs it: misuse and failures print on
/// stderr and exit 125 (the command's failure, not the code's, as docker
/// says it); `--help` and `--version` exit 0.
pub fn main<C: clap::Parser>(run: impl FnOnce(C) -> anyhow::Result<ExitCode>) -> ExitCode {
    // SAFETY: called once, first, while the program has one thread: it
    // registers fork handlers that take and release the allocator's lock, so
    // that a fork made while another thread allocates (none is made today:
    // helpers are spawned without allocating in the child) cannot leave the
    // child a lock no thread of its own holds.
    #[cfg(target_env = "musl")]
    unsafe {
        dlmalloc::enable_alloc_after_fork()
    };
    // Taken out of the environment at once, so that nothing this program
    // starts (a probe of the interpreter, a compile, pip) inherits it.
    let started_by = std::env::var_os(STARTED_BY_ENV);
    if started_by.is_some() {
        // SAFETY: called first, while the program has one thread: no other
        // thread reads or writes the environment meanwhile.
        unsafe { std::env::remove_var(STARTED_BY_ENV) };
    }
    let command = match C::try_parse() {
        Ok(command) => command,
        Err(error) => {
            let _ = error.print();
            if !error.use_stderr() {
                return ExitCode::SUCCESS;
            }
            if let Some(airlock) = started_by {
                let serve = std::env::current_exe().map(|path| path.display().to_string()).unwrap_or_default();
                eprintln!(
                    "\nairlock: {} accepted these arguments and airlock-serve ({serve}) refused them: the two are \
                     from different builds. Build both from one checkout (`scripts/build`, or `cargo build \
                     --release -p airlock-cli`), or set AIRLOCK_SERVE to the airlock-serve built with this airlock.",
                    std::path::Path::new(&airlock).display()
                );
            }
            return ExitCode::from(exit::SANDBOX_ERROR);
        }
    };
    match run(command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("airlock: {error:#}");
            ExitCode::from(exit::SANDBOX_ERROR)
        }
    }
}
