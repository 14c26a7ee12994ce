//! Paired benchmark: the weighted-median job run in a pooled sandbox
//! through the library, against bare cold Python running the same script
//! (`bench/pool.sh` sets it up). A B A B, the order swapped every round.
//!
//! usage: pool_bench ROUNDS BARE_PYTHON BARE_SCRIPT SANDBOX_SCRIPT CSV JSON_OUT
//!
//! Each pooled run is timed from the call to `Pool::run` to its record,
//! files in and out included; the pool is given time to refill between
//! runs (not timed): the steady state of an agent calling its tool a few
//! times a minute. The sandbox's own clock (`usage.wall_ms`, from the
//! release) and the time to the first instruction are reported too.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock::{Output, Policy, Pool, PoolOptions, RunRequest, RunStart, SandboxPath, Status};

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, rounds, bare_python, bare_script, sandbox_script, csv, json_out] = args.as_slice() else {
        return Err("usage: pool_bench ROUNDS BARE_PYTHON BARE_SCRIPT SANDBOX_SCRIPT CSV JSON_OUT".into());
    };
    let rounds: usize = rounds.parse()?;
    let code = std::fs::read_to_string(sandbox_script)?;
    let files = vec![("/work/sales.csv".to_owned(), std::fs::read(csv)?)];
    let out = SandboxPath::parse("/work/out.json")?;
    let request = RunRequest {
        display_name: Some("weighted_median.py".to_owned()),
        outputs: vec![Output { path: out, save_to: None, inline: true }],
        ..RunRequest::python(code)
    };
    let pool = Pool::new(Policy::default(), None, PoolOptions { size: 1, ..PoolOptions::default() })?;

    let bare = || -> Result<f64, Box<dyn std::error::Error>> {
        let start = Instant::now();
        let status = Command::new(bare_python).arg(bare_script).stdout(Stdio::null()).status()?;
        let elapsed = start.elapsed().as_secs_f64() * 1000.0;
        if !status.success() {
            return Err(format!("bare python failed: {status}").into());
        }
        Ok(elapsed)
    };
    let pooled = || -> Result<(f64, u64, Option<u64>), Box<dyn std::error::Error>> {
        if !pool.wait_ready(1, Duration::from_secs(120)) {
            return Err(format!("the pool did not refill: {:?}", pool.stats()).into());
        }
        let start = Instant::now();
        let record = pool.run(pool.policy(), &files, &request)?;
        let elapsed = start.elapsed().as_secs_f64() * 1000.0;
        if record.status != Status::Ok || record.usage.start != Some(RunStart::Pooled) {
            return Err(
                format!("a pooled run failed: {:?} {:?} {}", record.status, record.message, record.stderr).into()
            );
        }
        if record.artifacts.first().and_then(|a| a.content_base64.as_ref()).is_none() {
            return Err("the pooled run returned no out.json".into());
        }
        Ok((elapsed, record.usage.wall_ms, record.usage.first_instruction_ms))
    };

    for _ in 0..3 {
        bare()?;
        pooled()?;
    }
    let (mut bare_ms, mut pooled_ms, mut ratios, mut inside_ms, mut first_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (b, (p, inside, first)) = if round % 2 == 0 {
            let b = bare()?;
            (b, pooled()?)
        } else {
            let p = pooled()?;
            (bare()?, p)
        };
        bare_ms.push(b);
        pooled_ms.push(p);
        ratios.push(p / b);
        inside_ms.push(inside as f64);
        first_ms.extend(first.map(|f| f as f64));
    }
    let (bare_median, pooled_median) = (median(&mut bare_ms), median(&mut pooled_ms));
    let paired = median(&mut ratios);
    let result = serde_json::json!({
        "rounds": rounds,
        "bare_median_ms": (bare_median * 100.0).round() / 100.0,
        "pooled_median_ms": (pooled_median * 100.0).round() / 100.0,
        "ratio_of_medians": (pooled_median / bare_median * 1000.0).round() / 1000.0,
        "median_paired_ratio": (paired * 1000.0).round() / 1000.0,
        "pooled_wall_ms_inside_median": median(&mut inside_ms),
        "first_instruction_ms_median": if first_ms.is_empty() { None } else { Some(median(&mut first_ms)) },
        "pool": format!("{:?}", pool.stats()),
    });
    println!("bare    median {bare_median:8.2} ms");
    println!("pooled  median {pooled_median:8.2} ms   x{:.3} (paired x{paired:.3})", pooled_median / bare_median);
    std::fs::write(json_out, serde_json::to_string_pretty(&result)? + "\n")?;
    Ok(())
}
