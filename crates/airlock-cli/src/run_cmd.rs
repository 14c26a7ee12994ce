//! `airlock run`.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock::image::BuildEvent;
use std::sync::Arc;

use airlock::audit::AuditStore;
use airlock::{
    Audit, CopyIn, Language, Output, Policy, PolicySpec, RunError, RunRecord, RunRequest, SandboxOptions, SandboxPath,
    Status,
};
use anyhow::{Context, bail};
use clap::Args;

use crate::exit;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script to run, or `-` to read the code from standard input.
    #[arg(value_name = "SCRIPT", required_unless_present = "code", conflicts_with = "code")]
    script: Option<PathBuf>,
    /// The code to run, instead of a script.
    #[arg(short = 'c', value_name = "CODE")]
    code: Option<String>,
    /// The language: python or sh (default: from the script's extension, else python).
    #[arg(long, value_name = "LANG")]
    lang: Option<String>,
    /// Wall-clock limit in seconds [default: 20].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    timeout: Option<f64>,
    /// CPU-time limit in seconds, all processes together [default: 20].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    cpu_time: Option<f64>,
    /// Memory limit in MiB, no swap [default: 512].
    #[arg(long, value_name = "MB")]
    memory: Option<u64>,
    /// Processes and threads at once [default: 64].
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// CPU bandwidth in CPUs [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    cpus: Option<f64>,
    /// Size of /work and /tmp together, in MiB [default: 64].
    #[arg(long, value_name = "MB")]
    disk: Option<u64>,
    /// Files and directories /work and /tmp may hold [default: 4096].
    #[arg(long, value_name = "N")]
    disk_inodes: Option<u64>,
    /// Bytes kept of each of stdout and stderr [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    max_output: Option<u64>,
    /// What to do past --max-output: truncate (keep running) or kill [default: truncate].
    #[arg(long, value_name = "ACTION")]
    on_output_limit: Option<String>,
    /// Open files per process [default: 256].
    #[arg(long, value_name = "N")]
    open_files: Option<u32>,
    /// Copy a host file in: HOST_PATH[:SANDBOX_PATH] (default /work/<name>). Repeatable.
    #[arg(long = "file", value_name = "HOST[:SANDBOX]")]
    files: Vec<String>,
    /// Read a file back: SANDBOX_PATH[:HOST_PATH] (default ./<name>). Repeatable.
    #[arg(long = "out", value_name = "SANDBOX[:HOST]")]
    outs: Vec<String>,
    /// Set a variable in the code's environment (nothing is inherited). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Give this file to the code as its standard input (`-`: airlock's own). Default: /dev/null.
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// The runtime image [default: python-data, built on first use].
    #[arg(long, value_name = "NAME", conflicts_with = "python")]
    image: Option<String>,
    /// Run this host interpreter as it is, instead of an image.
    #[arg(long, value_name = "INTERPRETER")]
    python: Option<String>,
    /// Add this package to the image, from its vetted set (`airlock image show NAME`
    /// lists it): built once into a derived image, cached. Repeatable.
    #[arg(long = "with", value_name = "PKG")]
    with_packages: Vec<String>,
    /// Allow the code to reach this host through airlock's proxy: HOST[:PORT],
    /// `*.DOMAIN[:PORT]` for subdomains, or an IP literal; without a port, 443 and 80. Repeatable.
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_hosts: Vec<String>,
    /// Bytes the code may receive through the proxy [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    max_network_bytes_in: Option<u64>,
    /// Bytes the code may send through the proxy [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    max_network_bytes_out: Option<u64>,
    /// Connections the code may open through the proxy [default: 64].
    #[arg(long, value_name = "N")]
    max_connections: Option<u32>,
    /// The isolation backend: linux (namespaces, seccomp, Landlock, cgroups) or
    /// wasm (CPython compiled to WebAssembly) [default: linux].
    #[arg(long, value_name = "BACKEND")]
    backend: Option<String>,
    /// Accept running without a layer this host lacks (cgroups, landlock). Repeatable.
    #[arg(long = "allow-degraded", value_name = "LAYER")]
    allow_degraded: Vec<String>,
    /// Where figures are saved [default: the current folder].
    #[arg(long, value_name = "DIR")]
    figures_dir: Option<PathBuf>,
    /// Print the run record as one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
    /// Record the run in the audit store (also: environment AIRLOCK_AUDIT=1).
    #[arg(long)]
    audit: bool,
}

/// The environment variable that turns `--audit` on.
const AUDIT_ENV: &str = "AIRLOCK_AUDIT";

/// The most standard input `--stdin` passes on.
const MAX_STDIN: u64 = 64 << 20;

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (code, display_name, from_stdin) = read_code(&args)?;
    let language = match &args.lang {
        Some(name) => Language::parse(name).with_context(|| format!("--lang {name:?}: use python or sh"))?,
        None => match args.script.as_ref().and_then(|s| s.extension()).and_then(|e| e.to_str()) {
            Some("sh") => Language::Sh,
            _ => Language::Python,
        },
    };
    let policy = policy_from_args(&args)?;
    let mut inputs = CopyIn::new(&policy.limits);
    for arg in &args.files {
        let (host, path) = parse_file(arg)?;
        inputs.add_host_file(&host, path).with_context(|| format!("--file {arg}"))?;
    }
    let outputs = args.outs.iter().map(|o| parse_out(o)).collect::<anyhow::Result<Vec<_>>>()?;
    let stdin = match &args.stdin {
        None => Vec::new(),
        Some(p) if p == Path::new("-") => {
            if from_stdin {
                bail!("--stdin - cannot be used when the code itself comes from standard input");
            }
            read_capped(std::io::stdin().lock(), "standard input")?
        }
        Some(p) => read_capped(std::fs::File::open(p).with_context(|| format!("--stdin {}", p.display()))?, "--stdin")?,
    };

    let audit = if args.audit || audit_from_env()? {
        let path = AuditStore::default_path()?;
        Some(Audit { store: Arc::new(AuditStore::open(&path)?), principal: None })
    } else {
        None
    };
    let mut progress = |event: BuildEvent| print_progress(&event);
    let mut sandbox = airlock::Sandbox::with_options(SandboxOptions {
        policy,
        image: args.image.clone(),
        python: args.python.clone(),
        on_build: Some(&mut progress),
        audit,
        images: None,
        backend: None,
    })?;
    inputs.write_into(&mut sandbox)?;
    let request =
        RunRequest { code, language, stdin, cwd: None, display_name: Some(display_name), outputs, limits: None };
    // A run that could not be recorded is shown, then fails the command.
    let (mut record, unrecorded) = match sandbox.run_checked(&request) {
        Ok(record) => (record, None),
        Err(failure) => match *failure {
            RunError::Sandbox { record, .. } => (*record, None),
            RunError::Unrecorded { record, error } => (*record, Some(error)),
        },
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        let dir = args.figures_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        crate::show::save_figures(&mut record, &dir);
        print!("{}", airlock::report::render(&record));
    }
    if let Some(error) = unrecorded {
        eprintln!("airlock: run {} was NOT recorded in the audit store: {error}", record.id);
        return Ok(ExitCode::from(exit::SANDBOX_ERROR));
    }
    Ok(ExitCode::from(exit_status(&record)))
}

/// Whether AIRLOCK_AUDIT asks for the run to be recorded.
fn audit_from_env() -> anyhow::Result<bool> {
    match std::env::var(AUDIT_ENV) {
        Err(_) => Ok(false),
        Ok(value) => match value.as_str() {
            "" | "0" | "false" | "no" => Ok(false),
            "1" | "true" | "yes" => Ok(true),
            other => bail!("{AUDIT_ENV}={other:?}: use 1 to record runs, 0 not to"),
        },
    }
}

/// The command's exit status for a run.
fn exit_status(record: &RunRecord) -> u8 {
    match record.status {
        Status::Ok => 0,
        Status::Timeout => exit::TIMEOUT,
        Status::MemoryLimit | Status::CpuLimit | Status::OutputLimit => exit::KILLED,
        Status::SandboxError | Status::InternalError => exit::SANDBOX_ERROR,
        Status::Failed => match (record.exit_code, record.signal) {
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
            (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
            (None, None) => 1,
        },
    }
}

fn read_code(args: &RunArgs) -> anyhow::Result<(String, String, bool)> {
    if let Some(code) = &args.code {
        return Ok((code.clone(), "<code>".to_owned(), false));
    }
    let Some(script) = &args.script else { bail!("give a SCRIPT, -c CODE, or - for standard input") };
    if script == Path::new("-") {
        if std::io::stdin().is_terminal() {
            eprintln!("airlock: reading the code from standard input (end it with Ctrl-D)");
        }
        let bytes = read_capped(std::io::stdin().lock(), "the code on standard input")?;
        let code = String::from_utf8(bytes).context("the code on standard input is not UTF-8")?;
        return Ok((code, "<stdin>".to_owned(), true));
    }
    let code = std::fs::read_to_string(script).with_context(|| format!("reading {}", script.display()))?;
    let name = script.file_name().map_or_else(|| script.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok((code, name, false))
}

fn read_capped(reader: impl Read, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut data = Vec::new();
    reader.take(MAX_STDIN + 1).read_to_end(&mut data).with_context(|| format!("reading {what}"))?;
    if data.len() as u64 > MAX_STDIN {
        bail!("{what} is larger than {} MiB; copy big data in with --file instead", MAX_STDIN >> 20);
    }
    Ok(data)
}

fn policy_from_args(args: &RunArgs) -> anyhow::Result<Policy> {
    let env = args
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--env {kv:?}: write KEY=VALUE"))
        })
        .collect::<anyhow::Result<_>>()?;
    let on_output_limit = match args.on_output_limit.as_deref() {
        None => None,
        Some("truncate") => Some(airlock::OutputOverflow::Truncate),
        Some("kill") => Some(airlock::OutputOverflow::Kill),
        Some(other) => bail!("--on-output-limit {other:?}: use truncate or kill"),
    };
    let spec = PolicySpec {
        timeout_s: args.timeout,
        cpu_time_s: args.cpu_time,
        memory_mb: args.memory,
        pids: args.pids,
        cpus: args.cpus,
        disk_mb: args.disk,
        disk_inodes: args.disk_inodes,
        max_output_bytes: args.max_output,
        on_output_limit,
        open_files: args.open_files,
        env: Some(env),
        allow_degraded: Some(args.allow_degraded.clone()),
        allow_hosts: Some(args.allow_hosts.clone()),
        backend: args.backend.clone(),
        max_network_bytes_in: args.max_network_bytes_in,
        max_network_bytes_out: args.max_network_bytes_out,
        max_connections: args.max_connections,
        with_packages: (!args.with_packages.is_empty()).then(|| args.with_packages.clone()),
        ..PolicySpec::default()
    };
    Ok(Policy::from_spec(&spec, &airlock::host_facts()?)?)
}

/// `HOST[:SANDBOX]` (default `/work/<name>`).
fn parse_file(arg: &str) -> anyhow::Result<(PathBuf, SandboxPath)> {
    let (host, inside) = match arg.split_once(':') {
        Some((h, s)) => (PathBuf::from(h), s.to_owned()),
        None => {
            let host = PathBuf::from(arg);
            let name = host
                .file_name()
                .with_context(|| format!("--file {arg:?}: name a file"))?
                .to_string_lossy()
                .into_owned();
            (host, format!("/work/{name}"))
        }
    };
    let path = SandboxPath::parse(&inside).with_context(|| format!("--file {arg:?}"))?;
    Ok((host, path))
}

/// `SANDBOX[:HOST]`.
fn parse_out(arg: &str) -> anyhow::Result<Output> {
    let (inside, host) = match arg.split_once(':') {
        Some((s, h)) => (s, Some(PathBuf::from(h))),
        None => (arg, None),
    };
    let path = SandboxPath::parse(inside).with_context(|| format!("--out {arg:?}"))?;
    let host = host.unwrap_or_else(|| PathBuf::from(path.file_name()));
    Ok(Output { path, save_to: Some(host), inline: false })
}

fn print_progress(event: &BuildEvent) {
    match event {
        BuildEvent::Step { index, total, what } => eprintln!("airlock: building the image [{index}/{total}] {what}"),
        BuildEvent::Package { index, total, name } => eprintln!("airlock:   ({index}/{total}) {name}"),
        BuildEvent::Reused { hash } => eprintln!("airlock: the image already exists ({hash})"),
        BuildEvent::Done { hash, size_bytes } => {
            eprintln!("airlock: image ready ({hash}, {:.0} MiB)", *size_bytes as f64 / 1048576.0)
        }
    }
}
