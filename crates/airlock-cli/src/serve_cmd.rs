//! `airlock serve` (HTTP API and MCP at /mcp) and `airlock mcp` (MCP over stdio).

use std::path::PathBuf;

use airlock_server::{FileConfig, PoolConfig, ServerConfig};
use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The operator's config: defaults, ceilings, tokens, files (TOML; see `airlock_server::config`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen on this address instead of the config's [default: 127.0.0.1:8750].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Copy a host file into every run's /work: HOST_PATH[:SANDBOX_PATH]. Repeatable.
    #[arg(long = "file", value_name = "HOST[:SANDBOX]")]
    files: Vec<String>,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The operator's config: defaults, ceilings, files (TOML). Tokens are not used over stdio.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Copy a host file into every run's /work: HOST_PATH[:SANDBOX_PATH]. Repeatable.
    #[arg(long = "file", value_name = "HOST[:SANDBOX]")]
    files: Vec<String>,
    /// The name runs are recorded under in the audit store.
    #[arg(long, value_name = "NAME")]
    principal: Option<String>,
    /// Sandboxes kept ready, preload imported, so that a run answers in
    /// milliseconds [default: the config's [pool], else 1]; 0: every run cold.
    #[arg(long, value_name = "N")]
    pool: Option<usize>,
}

/// `airlock mcp` is warm by default: an agent calls its tool many times,
/// one at a time. Not for the wasm backend, which has no warm start.
const MCP_POOL_SIZE: usize = 1;

fn load(config: Option<&PathBuf>, files: &[String]) -> anyhow::Result<ServerConfig> {
    let mut config = match config {
        Some(path) => ServerConfig::load(path)?,
        None => ServerConfig::default(),
    };
    config.files.extend(files.iter().map(|arg| FileConfig::parse(arg)));
    Ok(config)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = load(args.config.as_ref(), &args.files)?;
    if let Some(listen) = args.listen {
        config.listen = Some(listen);
    }
    if config.tokens.is_empty() {
        anyhow::bail!(
            "the config lists no [[tokens]], so nobody could call the API; add one with its name and \
             sha256 (printf %s \"$TOKEN\" | sha256sum)"
        );
    }
    let engine = airlock_server::start(&config)?;
    runtime()?.block_on(async move {
        let listen = engine.settings().listen.clone();
        let listener =
            tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
        let address = listener.local_addr().context("reading the listening address")?;
        // Scripts read this line to find the port when listening on :0.
        eprintln!("airlock: serving http://{address} (API at /v1, MCP at /mcp)");
        airlock_server::serve_http(engine, listener, airlock_server::shutdown_signal()).await?;
        eprintln!("airlock: stopped; every sandbox is gone");
        Ok(())
    })
}

pub fn mcp(args: McpArgs) -> anyhow::Result<()> {
    let mut config = load(args.config.as_ref(), &args.files)?;
    let wasm = config.defaults.backend.as_deref() == Some("wasm");
    match (&mut config.pool, args.pool) {
        (Some(pool), Some(size)) => pool.size = Some(size),
        (None, size) if !wasm || size.is_some() => {
            config.pool = Some(PoolConfig { size: Some(size.unwrap_or(MCP_POOL_SIZE)), ..PoolConfig::default() });
        }
        _ => {}
    }
    let engine = airlock_server::start(&config)?;
    let runtime = runtime()?;
    let served =
        runtime.block_on(airlock_server::serve_stdio(engine, args.principal, airlock_server::shutdown_signal()));
    // The thread reading standard input blocks until the client closes it;
    // after a signal nothing will, so the runtime does not wait for it.
    runtime.shutdown_background();
    Ok(served?)
}
