//! Benchmark: a large download on loopback, direct against through the proxy
//! (plain HTTP forwarding and a CONNECT tunnel), in paired rounds, from a
//! server as fast as loopback and from one paced to a real link's speed; and
//! the time to the first byte, direct against a proxy started for the request.
//!
//! cargo run --release -p airlock-net --example net_throughput -- --mib 512 --rounds 8 --pace-mbit 1000
//!
//! Prints a markdown report. The download server and the client run in this
//! process on their own threads, as the sandbox's client and the outside
//! server would; the proxy runs as the supervisor would run it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use airlock_net::{Proxy, ProxyConfig, SystemResolver};
use airlock_policy::HostRule;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut mib: u64 = 512;
    let mut rounds: usize = 6;
    let mut first_byte_samples: usize = 200;
    let mut pace_mbit: u64 = 1000;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--mib" => mib = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            "--first-byte-samples" => first_byte_samples = value.parse()?,
            "--pace-mbit" => pace_mbit = value.parse()?,
            other => {
                return Err(format!(
                    "unknown flag {other}; use --mib N --rounds N --first-byte-samples N --pace-mbit N (0: no paced run)"
                )
                .into());
            }
        }
    }
    let server = serve_downloads(None)?;
    let bytes = mib * 1024 * 1024;
    println!("## Throughput: {mib} MiB over loopback, {rounds} paired rounds\n");
    throughput(server, bytes, rounds)?;
    if pace_mbit > 0 {
        let paced = serve_downloads(Some(pace_mbit * 1_000_000 / 8))?;
        let paced_mib = (mib / 4).max(1);
        println!(
            "\n## Throughput: {paced_mib} MiB from a server paced to {pace_mbit} Mbit/s, {rounds} paired rounds\n"
        );
        throughput(paced, paced_mib * 1024 * 1024, rounds)?;
    }

    let (direct, proxied) = first_bytes(server, first_byte_samples)?;
    println!("\n## Time to first byte, {first_byte_samples} paired samples\n");
    println!("| mode | median | p90 |");
    println!("|---|---|---|");
    println!("| direct connect + GET | {:.0} us | {:.0} us |", median(&direct), percentile(&direct, 0.9));
    println!(
        "| Proxy::start + connect + GET through it | {:.0} us | {:.0} us |",
        median(&proxied),
        percentile(&proxied, 0.9)
    );
    Ok(())
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// User plus system CPU time of this whole process so far, from /proc.
fn process_cpu_seconds() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).ok_or("unreadable /proc/self/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// Downloads `bytes` direct and through the proxy both ways, paired, and
/// prints a table.
fn throughput(server: SocketAddr, bytes: u64, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let modes = [Mode::Direct, Mode::ProxyHttp, Mode::ProxyConnect];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    // Warm-up, not counted: page cache, CPU frequency, allocator.
    for mode in modes {
        download(server, mode, bytes / 8)?;
    }
    for round in 0..rounds {
        // A B C, then C B A: each mode runs early and late equally often.
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1, 2] } else { vec![2, 1, 0] };
        for index in order {
            let cpu_before = process_cpu_seconds()?;
            let seconds = download(server, modes[index], bytes)?;
            samples[index].push(bytes as f64 / seconds / (1024.0 * 1024.0));
            cpu[index].push((process_cpu_seconds()? - cpu_before) * 1000.0 / (bytes as f64 / GIB));
        }
    }
    println!(
        "| mode | median MiB/s | min | max | median ratio to direct (paired) | CPU ms per GiB (all threads: server, client, proxy) |"
    );
    println!("|---|---|---|---|---|---|");
    for (index, mode) in modes.iter().enumerate() {
        let ratios: Vec<f64> = samples[index].iter().zip(&samples[0]).map(|(m, d)| m / d).collect();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} |",
            mode.name(),
            median(&samples[index]),
            min(&samples[index]),
            max(&samples[index]),
            median(&ratios),
            median(&cpu[index])
        );
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Mode {
    Direct,
    ProxyHttp,
    ProxyConnect,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::ProxyHttp => "proxy, plain HTTP (GET http://...)",
            Mode::ProxyConnect => "proxy, CONNECT tunnel",
        }
    }
}

/// A server that answers `GET /N` with N bytes, at `pace` bytes per second
/// if given (a real link's speed), else as fast as loopback goes.
fn serve_downloads(pace: Option<u64>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let block = Arc::new(vec![b'x'; 1 << 20]);
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let block = Arc::clone(&block);
            thread::spawn(move || {
                let _ = answer(stream, &block, pace);
            });
        }
    });
    Ok(addr)
}

fn answer(mut stream: TcpStream, block: &[u8], pace: Option<u64>) -> io::Result<()> {
    let started = Instant::now();
    stream.set_nodelay(true)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let size: u64 = text.split(' ').nth(1).and_then(|p| p.trim_start_matches('/').parse().ok()).unwrap_or(0);
    let mut response = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n").into_bytes();
    // The head and the start of the body in one write, as a real server would.
    let first = size.min(block.len() as u64) as usize;
    response.extend_from_slice(&block[..first]);
    stream.write_all(&response)?;
    let mut left = size - first as u64;
    while left > 0 {
        if let Some(rate) = pace {
            let due = Duration::from_secs_f64((size - left) as f64 / rate as f64);
            thread::sleep(due.saturating_sub(started.elapsed()));
        }
        let n = left.min(block.len() as u64) as usize;
        stream.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn config(server: SocketAddr) -> Result<ProxyConfig, Box<dyn std::error::Error>> {
    Ok(ProxyConfig {
        rules: vec![HostRule::parse(&server.to_string())?],
        max_bytes_in: u64::MAX,
        max_bytes_out: u64::MAX,
        max_connections: 1024,
        resolver: Arc::new(SystemResolver),
        head_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
    })
}

/// Downloads `bytes` from the server; returns the seconds from connect to last byte.
fn download(server: SocketAddr, mode: Mode, bytes: u64) -> Result<f64, Box<dyn std::error::Error>> {
    let proxy = match mode {
        Mode::Direct => None,
        _ => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            Some((Proxy::start(listener, config(server)?)?, addr))
        }
    };
    let started = Instant::now();
    let mut stream = match (&proxy, mode) {
        (Some((_, addr)), Mode::ProxyHttp) => {
            let mut stream = TcpStream::connect(addr)?;
            stream.write_all(format!("GET http://{server}/{bytes} HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
            stream
        }
        (Some((_, addr)), _) => {
            let mut stream = TcpStream::connect(addr)?;
            stream.write_all(format!("CONNECT {server} HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
            read_head(&mut stream)?;
            stream.write_all(format!("GET /{bytes} HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
            stream
        }
        (None, _) => {
            let mut stream = TcpStream::connect(server)?;
            stream.write_all(format!("GET /{bytes} HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
            stream
        }
    };
    read_head(&mut stream)?;
    let mut buffer = vec![0u8; 256 * 1024];
    let mut received = 0u64;
    while received < bytes {
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            return Err(format!("{}: the download ended after {received} of {bytes} bytes", mode.name()).into());
        }
        received += n as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some((proxy, _)) = proxy {
        drop(stream);
        proxy.finish();
    }
    Ok(seconds)
}

fn read_head(stream: &mut TcpStream) -> io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no response head"));
        }
        head.push(byte[0]);
    }
    Ok(())
}

/// Microseconds to the first body byte of a 1-byte download: direct, and
/// from starting a proxy to the first byte through it (paired samples).
fn first_bytes(server: SocketAddr, samples: usize) -> Result<(Vec<f64>, Vec<f64>), Box<dyn std::error::Error>> {
    let mut direct = Vec::new();
    let mut proxied = Vec::new();
    for _ in 0..samples {
        let started = Instant::now();
        let mut stream = TcpStream::connect(server)?;
        stream.set_nodelay(true)?;
        stream.write_all(format!("GET /1 HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
        read_head(&mut stream)?;
        stream.read_exact(&mut [0u8; 1])?;
        direct.push(started.elapsed().as_secs_f64() * 1e6);

        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let config = config(server)?;
        let started = Instant::now();
        let proxy = Proxy::start(listener, config)?;
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.write_all(format!("GET http://{server}/1 HTTP/1.1\r\nHost: {server}\r\n\r\n").as_bytes())?;
        read_head(&mut stream)?;
        stream.read_exact(&mut [0u8; 1])?;
        proxied.push(started.elapsed().as_secs_f64() * 1e6);
        drop(stream);
        proxy.finish();
    }
    Ok((direct, proxied))
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 0.5)
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let sorted = sorted(values);
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn min(values: &[f64]) -> f64 {
    sorted(values).first().copied().unwrap_or(f64::NAN)
}

fn max(values: &[f64]) -> f64 {
    sorted(values).last().copied().unwrap_or(f64::NAN)
}
