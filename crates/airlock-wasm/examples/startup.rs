//! The wasm backend's fixed costs, for bench/wasm.sh: making a sandbox (its
//! stage: user and mount namespaces, the tmpfs), and starting a guest's
//! worker (fork+exec, namespaces, confinement, mapping the compiled
//! interpreter, up to the guest's first instruction), taken as a run of
//! `pass` less the guest's own time.
//!
//! AIRLOCK_WASM_WORKER=target/release/airlock-wasm-worker \
//!     cargo run --release -p airlock-wasm --example startup -- [N]
//!
//! Prints one line per round: `create_us run_us guest_us`.

use std::time::Instant;

use airlock_core::{Backend, Job, KillSwitch, Runtime};
use airlock_policy::{BackendKind, Policy};
use airlock_wasm::WasmBackend;

fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(20);
    let backend = WasmBackend::new(airlock_core::paths::data_dir()?);
    backend.prepare(&mut |_| {})?;
    let policy = Policy { backend: BackendKind::Wasm, ..Policy::default() };
    let job = Job { code: "pass".to_owned(), ..Job::default() };
    // One round first, so that page cache and the probe are warm.
    for round in 0..=rounds {
        let started = Instant::now();
        let mut instance = backend.create(&policy, &Runtime::default())?;
        let created = started.elapsed();
        let started = Instant::now();
        let execution = instance.run(&job, &KillSwitch::new())?;
        let ran = started.elapsed();
        drop(instance);
        anyhow::ensure!(execution.status == airlock_policy::Status::Ok, "pass failed: {:?}", execution.message);
        if round > 0 {
            println!("{} {} {}", created.as_micros(), ran.as_micros(), execution.usage.wall_ms * 1000);
        }
    }
    Ok(())
}
