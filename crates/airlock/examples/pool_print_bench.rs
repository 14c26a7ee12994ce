//! Paired benchmark (issue 15): a pooled `print(1+1)` through the library
//! (`airlock::Pool`, every run recorded in an audit store as the server's
//! are) and through `POST /v1/runs` (`airlock serve`, `[pool] size = 1`,
//! one kept-alive loopback connection), against bare `python -c
//! 'print(1+1)'`; the arms' order rotated every round (`bench/pool_arms.sh`, `ONLY=print-rust`
//! sets it up).
//!
//! usage: pool_print_bench ROUNDS IMAGE BARE_PYTHON AIRLOCK_BINARY
//!
//! `POOL_MODE=forked` makes both pools forked (default `pooled`).
//!
//! Each pooled run is timed from the call to its record (the library's:
//! `Pool::run`, whose sandbox is dropped before it returns); before each,
//! both pools are given time to refill (untimed). Prints one JSON line.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock::{Audit, BackendKind, Policy, Pool, PoolMode, PoolOptions, RunRequest, RunStart, Status};
use sha2::Digest;

const TOKEN: &str = "pool-print-bench-token";

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

/// `airlock serve` with a pool of one, on loopback, and one connection to it.
/// Stopped when dropped, so that no path out of the benchmark (an error
/// included) leaves it serving.
struct Server {
    process: Child,
    connection: BufReader<TcpStream>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Server {
    fn start(airlock: &str, dir: &std::path::Path, mode: &str) -> Result<Server, Box<dyn std::error::Error>> {
        let sha = hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()));
        let config = dir.join("airlock.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nconcurrency = 2\nqueue = 64\naudit_db = \"{}/server-audit.sqlite3\"\n\
                 [pool]\nsize = 1\nmode = \"{mode}\"\n[[tokens]]\nname = \"bench\"\nsha256 = \"{sha}\"\n",
                dir.display()
            ),
        )?;
        let mut process =
            Command::new(airlock).arg("serve").arg("--config").arg(&config).stderr(Stdio::piped()).spawn()?;
        let mut log = BufReader::new(process.stderr.take().ok_or("no stderr")?);
        let port = loop {
            let mut line = String::new();
            if log.read_line(&mut line)? == 0 {
                return Err("airlock serve ended before it listened".into());
            }
            if let Some(at) = line.find("http://127.0.0.1:") {
                let rest = &line[at + "http://127.0.0.1:".len()..];
                break rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse::<u16>()?;
            }
        };
        // The rest of its log, drained so it never blocks.
        std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Server { process, connection: BufReader::new(stream) })
    }

    fn request(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.connection.get_mut();
        stream.write_all(format!("{head}{body}").as_bytes())?;
        let mut status_line = String::new();
        self.connection.read_line(&mut status_line)?;
        let status: u16 = status_line.split(' ').nth(1).ok_or("no status")?.parse()?;
        let mut length = None;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            self.connection.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = Some(value.trim().parse::<usize>()?);
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.connection.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim(), 16)?;
                let mut chunk = vec![0; size + 2];
                self.connection.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            body = vec![0; length.ok_or("no content-length")?];
            self.connection.read_exact(&mut body)?;
        }
        Ok((status, body))
    }

    fn ready(&mut self) -> Result<bool, Box<dyn std::error::Error>> {
        let (_, text) = self.request("GET", "/metrics", "")?;
        Ok(String::from_utf8_lossy(&text).lines().any(|l| l.starts_with("airlock_pool_ready ") && !l.ends_with(" 0")))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, rounds, image, bare_python, airlock_binary] = args.as_slice() else {
        return Err("usage: pool_print_bench ROUNDS IMAGE BARE_PYTHON AIRLOCK_BINARY".into());
    };
    let rounds: usize = rounds.parse()?;
    let mode_name = std::env::var("POOL_MODE").unwrap_or_else(|_| "pooled".to_owned());
    let mode = PoolMode::parse(&mode_name).ok_or("POOL_MODE is pooled or forked")?;
    let start_kind = if mode == PoolMode::Forked { RunStart::Forked } else { RunStart::Pooled };
    let dir = std::env::temp_dir().join(format!("airlock-pool-print-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = airlock::resolve_runtime(BackendKind::Linux, Some(image), None, &mut |_| {})?;
    let store = airlock::audit::AuditStore::open(&dir.join("library-audit.sqlite3"))?;
    let audit = Audit { store: std::sync::Arc::new(store), principal: None };
    let options = PoolOptions { size: 1, mode, ..PoolOptions::default() };
    let backend = airlock::backend_for(BackendKind::Linux)?;
    let pool = Pool::with_backend(backend, Policy::default(), runtime, options, Some(audit));
    let mut server = Server::start(airlock_binary, &dir, &mode_name)?;
    let request = RunRequest::python("print(1+1)");
    let body = r#"{"code": "print(1+1)"}"#;

    let both_ready = |server: &mut Server| -> Result<(), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + Duration::from_secs(120);
        if !pool.wait_ready(1, Duration::from_secs(120)) {
            return Err(format!("the library's pool did not refill: {:?}", pool.stats()).into());
        }
        while !server.ready()? {
            if Instant::now() > deadline {
                return Err("the server's pool did not refill".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Let the refill's last steps (its thread, the kernel's) settle.
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    };
    let arm = |which: usize, server: &mut Server| -> Result<f64, Box<dyn std::error::Error>> {
        match which {
            0 => {
                let start = Instant::now();
                let status = Command::new(bare_python).args(["-c", "print(1+1)"]).stdout(Stdio::null()).status()?;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                if !status.success() {
                    return Err(format!("bare python failed: {status}").into());
                }
                Ok(ms)
            }
            1 => {
                both_ready(server)?;
                let start = Instant::now();
                let record = pool.run(pool.policy(), &[], &request)?;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                if record.status != Status::Ok || record.usage.start != Some(start_kind) {
                    return Err(
                        format!("a library run failed or went cold: {:?} {:?}", record.status, record.message).into()
                    );
                }
                Ok(ms)
            }
            _ => {
                both_ready(server)?;
                let start = Instant::now();
                let (status, text) = server.request("POST", "/v1/runs", body)?;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                let record: serde_json::Value = serde_json::from_slice(&text)?;
                if status != 200 || record["status"] != "ok" || record["usage"]["start"] != mode_name.as_str() {
                    return Err(format!("POST /v1/runs: {status}: {}", String::from_utf8_lossy(&text)).into());
                }
                Ok(ms)
            }
        }
    };
    // Warm-up: two of each, untimed.
    for _ in 0..2 {
        for which in 0..3 {
            arm(which, &mut server)?;
        }
    }
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..3 {
            let which = (round + k) % 3;
            times[which].push(arm(which, &mut server)?);
        }
    }
    drop(server);
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
    let paired = |i: usize| -> Vec<f64> { times[i].iter().zip(&times[0]).map(|(t, b)| t / b).collect() };
    let over: Vec<f64> = times[2].iter().zip(&times[1]).map(|(h, l)| h - l).collect();
    let json = serde_json::json!({
        "measure": "print(1+1) latency, paired",
        "mode": mode_name,
        "rounds": rounds,
        "bare_median_ms": median(&times[0]),
        "library_median_ms": median(&times[1]),
        "library_paired_ratio": median(&paired(1)),
        "http_median_ms": median(&times[2]),
        "http_paired_ratio": median(&paired(2)),
        "http_minus_library_paired_median_ms": median(&over),
        "times_ms": times,
    });
    println!("{json}");
    Ok(())
}
