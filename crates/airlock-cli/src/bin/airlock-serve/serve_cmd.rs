//! `airlock serve` (HTTP API and MCP at /mcp) and `airlock mcp` (MCP over
//! stdio), run: the only code of this package that uses airlock_server, kept
//! out of `airlock` itself (see the binary's main.rs).

use std::path::PathBuf;

use airlock_server::{FileConfig, PoolConfig, ServerConfig};
use anyhow::Context;

use crate::serve_args::{McpArgs, ServeArgs};

/// `airlock mcp` is warm by default: an agent calls its tool many times,
/// one at a time. Not for the wasm backend, which has no warm start.
const MCP_POOL_SIZE: usize = 1;

/// The operator's config at `config` (else the defaults), with the files
/// given on the command line added to its own.
fn load(config: Option<&PathBuf>, files: &[String]) -> anyhow::Result<ServerConfig> {
    let mut config = match config {
        Some(path) => ServerConfig::load(path)?,
        None => ServerConfig::default(),
    };
    config.files.extend(files.iter().map(|arg| FileConfig::parse(arg)));
    Ok(config)
}

/// The async runtime the server and the console run on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

/// Serves the HTTP API, and MCP at /mcp, until a signal stops it.
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

/// Serves MCP on standard input and output until the client closes them or
/// a signal stops it.
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
