//! `airlock backend install wasm`, until the CLI wires it: installs the
//! interpreter into airlock's data directory and compiles it once.
//!
//! cargo run --release -p airlock-wasm --example install

use airlock_wasm::{InstallProgress, WasmBackend};

fn main() -> anyhow::Result<()> {
    let data_dir = airlock_core::paths::data_dir()?;
    let backend = WasmBackend::new(data_dir);
    backend.prepare(&mut |step: InstallProgress| eprintln!("{step:?}"))?;
    eprintln!("ready");
    Ok(())
}
