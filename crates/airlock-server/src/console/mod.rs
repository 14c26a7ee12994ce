//! The audit console: the audit trail in a browser, under `/ui`, for the
//! people who review what an assistant computed. `airlock serve` mounts it
//! on its listener; `airlock audit ui` serves it alone on loopback.
//!
//! - `/ui/runs`: runs newest first, paged by entry, filtered by status, who
//!   asked, time, and text in the code;
//! - `/ui/runs/{id}`: the code with line numbers beside its output, the
//!   error's line marked, figures inline, artefacts and inputs with their
//!   hashes, network, policy, usage, isolation, and the entry's place in the
//!   chain; `/ui/runs/{id}/report.html`, the same as one self-contained file;
//! - `/ui/chain`: the chain's head to note as an anchor, and verification
//!   from the page, naming the first broken link, by a viewer who may see
//!   every run; every verification is listed with who made it, when and
//!   against which anchor ([`verdicts`]).
//!
//! # Safe by construction
//!
//! Everything a run produced is hostile: code, output, file names, error
//! messages, figures. Pages are rendered on the server by askama, which
//! HTML-escapes every value; text from a run is also made terminal-safe
//! (control characters and direction overrides shown as `\u{..}`). Pages
//! carry no script at all, and a Content-Security-Policy that allows none,
//! nor anything from another origin, nor framing. Figures are served only
//! as `image/png`, only when their bytes hash to the recorded hash and start
//! with the PNG signature; artefacts only as downloads. Logging in exchanges
//! an API token for an HttpOnly, SameSite=Strict cookie ([`auth`]); every
//! form carries a CSRF token; a viewer sees only their own runs unless their
//! token may see all, as in the API, and another's run is as absent as one
//! that never was.

mod auth;
mod pages;
mod report;
mod verdicts;
mod view;

use std::sync::Arc;

use airlock::audit::AuditStore;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Router, extract::DefaultBodyLimit};
use sha2::Digest;

pub use auth::{Authenticate, Viewer};
pub use report::{ReportError, report};

/// The policy of every console page: nothing but this origin's stylesheet,
/// images and forms; no script, no framing.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                           frame-ancestors 'none'; base-uri 'none'";

/// Forms are a token and a few words: anything larger is not ours.
const MAX_FORM_BYTES: usize = 16 * 1024;

/// What a console is made of.
pub struct ConsoleOptions {
    /// The store it reads. A handle of its own, so that a long verification
    /// never holds the connection the server records runs through.
    pub store: Arc<AuditStore>,
    /// Turns a token into a viewer.
    pub authenticate: Authenticate,
    /// Served over TLS: cookies are marked Secure. (Behind a proxy that
    /// terminates TLS, `X-Forwarded-Proto: https` says so per request.)
    pub tls: bool,
}

impl std::fmt::Debug for ConsoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleOptions").field("store", &self.store).field("tls", &self.tls).finish_non_exhaustive()
    }
}

/// The console's state, shared by its handlers.
pub struct Console {
    store: Arc<AuditStore>,
    authenticate: Authenticate,
    sessions: auth::Sessions,
    tls: bool,
    /// The verifications made from the console, for every page to show.
    verdicts: verdicts::Verdicts,
    /// One verification at a time: each walks the whole chain.
    verifying: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("store", &self.store).field("tls", &self.tls).finish_non_exhaustive()
    }
}

impl Console {
    pub fn new(options: ConsoleOptions) -> Arc<Console> {
        Arc::new(Console {
            store: options.store,
            authenticate: options.authenticate,
            sessions: auth::Sessions::default(),
            tls: options.tls,
            verdicts: verdicts::Verdicts::default(),
            verifying: tokio::sync::Mutex::new(()),
        })
    }

    /// A console for one person on their own machine (`airlock audit ui`):
    /// one token, made here and shown to them, that sees every run of the
    /// store (they could read the file itself). Returns the console and
    /// the token.
    pub fn for_one_person(store: Arc<AuditStore>, name: &str) -> std::io::Result<(Arc<Console>, String)> {
        let token = auth::random_token()?;
        let only = crate::config::Token {
            name: name.to_owned(),
            sha256: sha2::Sha256::digest(token.as_bytes()).into(),
            see_all_runs: true,
        };
        let authenticate: Authenticate = Arc::new(move |presented: &str| {
            crate::config::find_token(std::slice::from_ref(&only), presented)
                .map(|token| Viewer { name: token.name.clone(), see_all_runs: token.see_all_runs })
        });
        Ok((Console::new(ConsoleOptions { store, authenticate, tls: false }), token))
    }
}

/// The console of `airlock serve`: the server's tokens, and a second handle
/// on its audit store (the engine's own if a second cannot be opened).
pub fn for_engine<S: Clone + Send + Sync + 'static>(engine: &crate::Engine) -> Router<S> {
    let store = match AuditStore::open_existing(engine.audit().path()) {
        Ok(store) => Arc::new(store),
        Err(error) => {
            eprintln!("airlock: the console reads through the server's own audit handle: {error}");
            engine.audit().clone()
        }
    };
    let tokens = engine.settings().tokens.clone();
    let authenticate: Authenticate = Arc::new(move |presented: &str| {
        crate::config::find_token(&tokens, presented)
            .map(|token| Viewer { name: token.name.clone(), see_all_runs: token.see_all_runs })
    });
    router(Console::new(ConsoleOptions { store, authenticate, tls: false }))
}

/// Every route of the console, under `/ui`, with its security headers.
pub fn router<S: Clone + Send + Sync + 'static>(console: Arc<Console>) -> Router<S> {
    routes(Router::new(), console)
}

/// The console's routes added to `base` (which may hold a fallback), then
/// the layers: everything `base` answers gets the security headers too.
fn routes<S: Clone + Send + Sync + 'static>(base: Router<Arc<Console>>, console: Arc<Console>) -> Router<S> {
    base.route("/ui", get(pages::home))
        .route("/ui/", get(pages::home))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/runs", get(pages::runs))
        .route("/ui/runs/{id}", get(pages::run))
        .route("/ui/runs/{id}/report.html", get(pages::run_report))
        .route("/ui/runs/{id}/figures/{index}", get(pages::figure))
        .route("/ui/runs/{id}/artifacts/{index}", get(pages::artifact))
        .route("/ui/chain", get(pages::chain))
        .route("/ui/chain/verify", post(pages::verify))
        .route("/ui/assets/console.css", get(pages::stylesheet))
        .route("/ui/{*rest}", get(pages::not_found))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn(harden))
        .with_state(console)
}

/// Serves the console alone on `listener` until `shutdown` completes: for
/// `airlock audit ui`.
pub async fn serve(
    console: Arc<Console>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Alone on its listener, everything else leads to the runs; the
    // fallback sits under the layers, so its redirect is hardened too.
    let app: Router = routes(Router::new().fallback(pages::home), console);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// The headers every console answer carries: its policy (unless the
/// handler set a stricter one), no sniffing, no framing, no referrer to other sites, and
/// no caching of pages that hold a run.
async fn harden(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PAGE_POLICY));
    }
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // same-origin, not no-referrer: under no-referrer browsers send
    // `Origin: null` with the console's own forms, which would look like
    // a request from nowhere. Run ids still never leave for another site.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    headers.insert(HeaderName::from_static("cross-origin-resource-policy"), HeaderValue::from_static("same-origin"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
