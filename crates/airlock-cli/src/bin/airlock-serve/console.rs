//! The audit console, as `airlock audit show --html` and `airlock audit ui`
//! use it (through `audit_cmd`): here, in `airlock-serve`, the console of
//! airlock_server itself.

use airlock::audit::{AuditStore, StoredRun};
use anyhow::Context;

/// The run as one self-contained HTML page.
pub fn report(run: &StoredRun, store: &AuditStore) -> anyhow::Result<String> {
    Ok(airlock_server::console::report(run, store)?)
}

/// Serves the console on a loopback address until SIGINT or SIGTERM. The
/// sign-in token is made now and printed: other users of this machine can
/// reach loopback too, and any web page can send requests to it.
pub fn ui(store: AuditStore, listen: &str) -> anyhow::Result<()> {
    let address: std::net::SocketAddr =
        listen.parse().with_context(|| format!("--listen {listen:?}: write an address such as 127.0.0.1:8760"))?;
    if !address.ip().is_loopback() {
        anyhow::bail!(
            "--listen {listen}: `airlock audit ui` serves one person on their own machine, on loopback only \
             (127.0.0.1 or [::1]); to serve others, use `airlock serve`, whose tokens say who sees what"
        );
    }
    let (console, token) = airlock_server::console::Console::for_one_person(std::sync::Arc::new(store), "local")
        .context("making the sign-in token")?;
    crate::serve_cmd::runtime()?.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(address).await.with_context(|| format!("listening on {address}"))?;
        let bound = listener.local_addr().context("reading the listening address")?;
        // Scripts read these lines to find the port and the token.
        eprintln!("airlock: console at http://{bound}/ui");
        eprintln!("airlock: sign in with the token {token}");
        airlock_server::console::serve(console, listener, airlock_server::shutdown_signal()).await?;
        anyhow::Ok(())
    })
}
