//! airlock served to agents: an MCP server (stdio and streamable HTTP) and an
//! HTTP API, every run recorded in the audit store.
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use airlock_server::{ServerConfig, serve_http, shutdown_signal, start};
//! let config = ServerConfig::load(std::path::Path::new("airlock.toml"))?;
//! let engine = start(&config)?;                  // checks the config, opens the audit store
//! let listener = tokio::net::TcpListener::bind(&engine.settings().listen).await?;
//! serve_http(engine, listener, shutdown_signal()).await?;   // until SIGTERM or SIGINT
//! # Ok(()) }
//! ```
//!
//! The server holds no sandbox logic: a request becomes a
//! [`airlock::PolicySpec`], checked against the operator's ceiling with
//! [`airlock::PolicySpec::check_within`] and applied over the operator's
//! defaults, and an [`airlock::RunRequest`]; the facade runs it and records
//! it ([`airlock::Sandbox::run_checked`]). A run that could not be recorded
//! is not returned: the answer is 500, or 507 when the disk is full.
//!
//! Runs go on blocking threads, at most `concurrency` at once, with at most
//! `queue` waiting; past that a request gets 429 with `Retry-After`. Each
//! token with nothing running or waiting keeps one of the queue's places,
//! so that one token's burst never leaves another none ([`places`]). On
//! SIGTERM or SIGINT the server stops taking runs, lets running ones finish
//! for the grace period, kills the rest, and returns once every sandbox is
//! gone. Cgroups a crashed server left behind are removed when the next one
//! starts (the Linux backend does it when it first probes the host).

#![forbid(unsafe_code)]

pub mod artifacts;
pub mod config;
pub mod connections;
pub mod console;
pub mod engine;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod places;
pub mod request;

use std::future::Future;
use std::sync::Arc;

use airlock::audit::AuditStore;
use tokio_util::sync::CancellationToken;

pub use config::{ConfigError, FileConfig, PoolConfig, ServerConfig, Settings, TokenConfig, token_sha256};
pub use engine::{Engine, RunError, RunJob};
pub use mcp::McpServer;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Airlock(#[from] airlock::Error),
    #[error(transparent)]
    Audit(#[from] airlock::audit::AuditError),
    #[error("{0}")]
    Other(String),
}

/// Checks `config` against this host (cleaning up after a crashed server on
/// the way), resolves the runtime (building the default image on first use),
/// opens the audit store, and returns the engine both front doors share.
pub fn start(config: &ServerConfig) -> Result<Arc<Engine>, StartError> {
    raise_open_files_limit();
    let host = airlock::host_facts()?;
    let runtime = config::resolve_runtime(config)?;
    let settings = Settings::new(config, host, runtime, AuditStore::default_path()?)?;
    let audit = Arc::new(AuditStore::open(&settings.audit_db)?.with_contents(settings.contents));
    // Beside the audit store, named for it: audit.sqlite3 keeps audit.artifacts/.
    let store = settings.audit_db.with_extension("artifacts");
    let artifacts = artifacts::ArtifactStore::open(store.clone(), settings.artifact_store_bytes)
        .map_err(|error| StartError::Other(format!("the artefact store {}: {error}", store.display())))?;
    let pool = match &settings.pool {
        Some(options) => {
            Some(airlock::Pool::new(settings.defaults.clone(), Some(settings.runtime.clone()), options.clone())?)
        }
        None => None,
    };
    let engine = Engine::new(settings, audit, artifacts);
    Ok(Arc::new(match pool {
        Some(pool) => engine.with_pool(pool),
        None => engine,
    }))
}

/// Raises this process's open-files limit to its hard limit (systemd gives
/// a service 1,024 and allows 524,288). Each run's proxied connections,
/// helpers, pipes and cgroup files are the server's descriptors; under the
/// soft limit a few runs holding their connections made another's sandbox
/// fail to start (EMFILE). Best effort: a limit that cannot be raised is
/// left as it was.
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let _ = setrlimit(Resource::Nofile, rustix::process::Rlimit { current: limit.maximum, ..limit });
    }
}

/// Serves the HTTP API and MCP at `/mcp` on `listener` until `shutdown`
/// completes, within the connection, head, body and session limits of the
/// settings ([`connections`]); then drains as [`Engine::shutdown`] does,
/// still answering meanwhile (`/healthz` says `shutting_down`, new runs get
/// 503), and returns once every sandbox is gone and the answers are out.
pub async fn serve_http(
    engine: Arc<Engine>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Drained: every run ended or killed; then the listener closes.
    let drained = CancellationToken::new();
    let app = http::router(engine.clone(), mcp::http_service(engine.clone(), drained.child_token()));
    let draining = tokio::spawn({
        let engine = engine.clone();
        let drained = drained.clone();
        async move {
            shutdown.await;
            engine.shutdown().await;
            drained.cancel();
        }
    });
    // Connections still open this long after the drain (a client that never
    // reads its answer, an idle MCP stream) are dropped.
    let patience = std::time::Duration::from_secs(5);
    // Serves until the drain: the accept loop outlives every failed
    // connection and every refused accept.
    connections::serve(listener, app, engine.settings(), drained, patience).await;
    draining.await.map_err(|error| std::io::Error::other(format!("draining the runs failed: {error}")))
}

/// Serves MCP on standard input and output until the client closes it (runs
/// in progress then finish, as [`Engine::shutdown`] lets them) or `shutdown`
/// completes (a signal: runs in progress are killed at once and recorded,
/// since the client that asked is going away). Returns once every sandbox is
/// gone. The caller's runtime should then be shut down without waiting for
/// the thread that reads standard input, which no signal interrupts.
pub async fn serve_stdio(
    engine: Arc<Engine>,
    principal: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tokio::select! {
        result = mcp::serve_stdio(engine.clone(), principal) => {
            engine.shutdown().await;
            result
        }
        () = shutdown => {
            engine.stop_now().await;
            Ok(())
        }
    }
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // Without signal handlers the server is stopped by being killed;
        // the next start cleans up after it.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
