//! What the wasm tests share: one installed interpreter and compiled cache in
//! a fixed folder (the first test run downloads and compiles, about two
//! minutes; later runs reuse it), and helpers to run code.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use airlock_core::{Backend, Execution, Instance, Job, KillSwitch, Runtime};
use airlock_policy::{Limits, Policy};
use airlock_wasm::WasmBackend;

/// `$AIRLOCK_WASM_TEST_HOME`, else `<target>/tmp/airlock-test-home`.
pub fn test_home() -> PathBuf {
    std::env::var_os("AIRLOCK_WASM_TEST_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("airlock-test-home"))
}

pub fn backend() -> &'static WasmBackend {
    static BACKEND: OnceLock<WasmBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let backend = WasmBackend::with_worker(test_home(), env!("CARGO_BIN_EXE_airlock-wasm-worker"));
        backend.prepare(&mut |step| eprintln!("{step:?}")).expect("the wasm interpreter installs and loads");
        backend
    })
}

pub fn policy(wall_s: u64) -> Policy {
    Policy {
        limits: Limits { wall_time: Duration::from_secs(wall_s), ..Limits::default() },
        backend: airlock_policy::BackendKind::Wasm,
        ..Policy::default()
    }
}

pub fn sandbox(policy: &Policy) -> Box<dyn Instance> {
    backend().create(policy, &Runtime::default()).expect("the sandbox is made")
}

pub fn run_in(instance: &mut Box<dyn Instance>, code: &str) -> Execution {
    let job = Job { code: code.to_owned(), ..Job::default() };
    instance.run(&job, &KillSwitch::new()).expect("the sandbox runs the job")
}

pub fn run(policy: &Policy, code: &str) -> Execution {
    run_in(&mut sandbox(policy), code)
}

pub fn stdout(e: &Execution) -> String {
    String::from_utf8_lossy(&e.stdout.bytes).into_owned()
}

pub fn stderr(e: &Execution) -> String {
    String::from_utf8_lossy(&e.stderr.bytes).into_owned()
}

/// The value of the job's last expression.
pub fn value(e: &Execution) -> String {
    e.report.as_ref().and_then(|r| r.value.clone()).unwrap_or_default()
}

/// The type of the job's uncaught exception.
pub fn error_kind(e: &Execution) -> String {
    e.report.as_ref().and_then(|r| r.error.as_ref()).map(|err| err.kind.clone()).unwrap_or_default()
}
