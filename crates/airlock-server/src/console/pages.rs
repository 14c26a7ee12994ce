//! The console's handlers: each checks the session, reads the store on a
//! blocking thread, and renders a template.

// A page that cannot be shown is answered with another page (a redirect,
// an error page): both sides of these results are whole responses, made
// once per request, so boxing the error side would buy nothing.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use airlock::Status;
use airlock::audit::{AuditError, AuditStore, Browse, ChainBreak, ChainHead, ContentState, Position, StoredRun};
use askama::Template;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::Console;
use super::auth::{self, LOGIN_COOKIE, SESSION_COOKIE, SESSION_LIFETIME, Session};
use super::verdicts::Verdict;
use super::view::{Contents, RunView, Source, StatusView, limits_text, path_segment};

type Shared = State<Arc<Console>>;

/// The stylesheet, compiled in: no asset comes from anywhere else.
pub(super) const STYLESHEET: &str = include_str!("../../assets/console.css");

/// The eight bytes every PNG starts with.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// What every page's frame shows: who is signed in, and the token of the
/// sign-out form.
#[derive(Clone, Debug, Default)]
pub(super) struct Frame {
    viewer: Option<String>,
    see_all: bool,
    csrf: String,
}

impl Frame {
    fn of(session: &Session) -> Frame {
        Frame {
            viewer: Some(airlock_core::terminal_safe(&session.viewer.name)),
            see_all: session.viewer.see_all_runs,
            csrf: session.csrf.clone(),
        }
    }
}

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    frame: Frame,
    problem: String,
    login_csrf: String,
    next: String,
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    frame: Frame,
    heading: String,
    message: String,
}

/// One row of the runs table.
struct RunRow {
    status: StatusView,
    limits: String,
    principal: String,
    started_at: String,
    took: String,
    first_line: String,
    id: String,
    id_path: String,
}

/// The filters as the viewer typed them, to show back in the form.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RunsQuery {
    status: String,
    principal: String,
    since: String,
    until: String,
    q: String,
    before: String,
    after: String,
}

#[derive(Template)]
#[template(path = "console/runs.html")]
struct RunsPage {
    frame: Frame,
    statuses: Vec<(String, String)>,
    filter: RunsQuery,
    problem: String,
    runs: Vec<RunRow>,
    newer: Option<String>,
    older: Option<String>,
    newest: String,
}

#[derive(Template)]
#[template(path = "console/run.html")]
struct RunPage {
    frame: Frame,
    run: RunView,
    chain_state: String,
}

/// One verification in the chain page's list.
struct VerdictRow {
    at: String,
    by: String,
    /// The anchor it was checked against; empty when none was given.
    anchor: String,
    outcome: String,
    class: &'static str,
}

#[derive(Template)]
#[template(path = "console/chain.html")]
struct ChainPage {
    frame: Frame,
    head: String,
    state: String,
    state_class: &'static str,
    detail: String,
    /// The anchor this viewer gave last (never another's).
    anchor: String,
    verdicts: Vec<VerdictRow>,
}

/// A page, or an answer that replaces it (a redirect, an error page).
type PageResult = Result<Response, Response>;

fn html(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(text) => (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response(),
        Err(error) => plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("the page could not be rendered: {error}")),
    }
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text.to_owned()).into_response()
}

fn error_page(status: StatusCode, frame: Frame, heading: &str, message: String) -> Response {
    html(status, &ErrorPage { frame, heading: heading.to_owned(), message: airlock_core::terminal_safe(&message) })
}

/// What a viewer is told of a store error: that it happened, never the
/// server's paths or SQLite's words. The detail goes to the server's log.
const STORE_TROUBLE: &str = "The audit store could not be read just now; the server's log says why.";

/// Logs `error` for the operator; returns what the viewer is told.
fn logged(error: &AuditError) -> String {
    eprintln!("airlock: console: {error}");
    STORE_TROUBLE.to_owned()
}

fn store_failed(frame: Frame, error: &AuditError) -> Response {
    error_page(StatusCode::INTERNAL_SERVER_ERROR, frame, "The audit store could not be read", logged(error))
}

/// The same answer for a run that is not there and one that is not yours.
fn no_such_run(frame: Frame, id: &str) -> Response {
    error_page(StatusCode::NOT_FOUND, frame, "No such run", format!("There is no run {id:?} that you may see."))
}

/// The session, or a redirect to the login form that comes back here.
fn signed_in(console: &Console, headers: &HeaderMap, uri: &Uri) -> Result<Session, Response> {
    console.sessions.find(headers).ok_or_else(|| {
        let back = uri.path_and_query().map_or("/ui/runs", |path| path.as_str());
        Redirect::to(&format!("/ui/login?next={}", path_segment(back))).into_response()
    })
}

/// The session, for a form that changes something: its CSRF token must
/// match, and the browser must not say it came from another site.
fn signed_in_form(console: &Console, headers: &HeaderMap, csrf: &str) -> Result<Session, Response> {
    let forbidden = |message: &str| error_page(StatusCode::FORBIDDEN, Frame::default(), "Refused", message.to_owned());
    if auth::cross_site(headers) {
        return Err(forbidden("This form was sent from another site."));
    }
    let session = console.sessions.find(headers).ok_or_else(|| forbidden("Sign in first; your session has ended."))?;
    if !auth::same_secret(&session.csrf, csrf) {
        return Err(forbidden("This form is stale or was not made by the console; reload the page and try again."));
    }
    Ok(session)
}

/// Runs `work` on a blocking thread: every store call waits on disk.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Response> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("the console's worker failed: {error}")))
}

/// A local path to go back to after a form: within the console, or the runs.
fn local_path(next: &str) -> &str {
    let inside = next == "/ui" || next.starts_with("/ui/");
    let plain = !next.contains("//") && !next.contains('\\') && !next.chars().any(char::is_control);
    if inside && plain { next } else { "/ui/runs" }
}

fn secure(console: &Console, headers: &HeaderMap) -> bool {
    console.tls
        || headers.get("x-forwarded-proto").and_then(|value| value.to_str().ok()).is_some_and(|proto| proto == "https")
}

fn see_other(location: &str) -> Response {
    Redirect::to(location).into_response()
}

pub(super) async fn home() -> Response {
    see_other("/ui/runs")
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct NextQuery {
    next: String,
}

pub(super) async fn login_form(State(console): Shared, headers: HeaderMap, Query(query): Query<NextQuery>) -> Response {
    let next = local_path(&query.next).to_owned();
    if console.sessions.find(&headers).is_some() {
        return see_other(&next);
    }
    login_page(&console, &headers, StatusCode::OK, String::new(), next)
}

/// The login form, with a fresh CSRF token in a cookie and in the form.
fn login_page(console: &Console, headers: &HeaderMap, status: StatusCode, problem: String, next: String) -> Response {
    let Ok(token) = auth::random_token() else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "the system's random number source failed");
    };
    let page = LoginPage { frame: Frame::default(), problem, login_csrf: token.clone(), next };
    let mut response = html(status, &page);
    let cookie = auth::set_cookie(LOGIN_COOKIE, Some(&token), SESSION_LIFETIME, secure(console, headers));
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

pub(super) async fn login(State(console): Shared, headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    let next = local_path(&form.next).to_owned();
    let expected = auth::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if auth::cross_site(&headers) || expected.is_empty() || !auth::same_secret(&expected, &form.csrf) {
        let problem = "The sign-in form had expired or came from elsewhere; here is a fresh one.".to_owned();
        return login_page(&console, &headers, StatusCode::FORBIDDEN, problem, next);
    }
    let Some(viewer) = (console.authenticate)(form.token.trim()) else {
        let problem = "That is not a token this server accepts.".to_owned();
        return login_page(&console, &headers, StatusCode::UNAUTHORIZED, problem, next);
    };
    let Ok(session) = console.sessions.start(viewer) else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "the system's random number source failed");
    };
    let secure = secure(&console, &headers);
    let mut response = see_other(&next);
    let cookies = response.headers_mut();
    cookies.append(header::SET_COOKIE, auth::set_cookie(SESSION_COOKIE, Some(&session), SESSION_LIFETIME, secure));
    cookies.append(header::SET_COOKIE, auth::set_cookie(LOGIN_COOKIE, None, SESSION_LIFETIME, secure));
    response
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(super) async fn logout(State(console): Shared, headers: HeaderMap, Form(form): Form<CsrfForm>) -> PageResult {
    signed_in_form(&console, &headers, &form.csrf)?;
    console.sessions.end(&headers);
    let mut response = see_other("/ui/login");
    let cookie = auth::set_cookie(SESSION_COOKIE, None, SESSION_LIFETIME, secure(&console, &headers));
    response.headers_mut().append(header::SET_COOKIE, cookie);
    Ok(response)
}

/// The filters of the runs page as a query string (without the page).
fn filter_query(query: &RunsQuery) -> String {
    let pairs = [
        ("status", &query.status),
        ("principal", &query.principal),
        ("since", &query.since),
        ("until", &query.until),
        ("q", &query.q),
    ];
    let parts: Vec<String> = pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!("{name}={}", path_segment(value)))
        .collect();
    parts.join("&")
}

fn page_link(filters: &str, position: Option<(&str, u64)>) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !filters.is_empty() {
        parts.push(filters.to_owned());
    }
    if let Some((name, seq)) = position {
        parts.push(format!("{name}={seq}"));
    }
    if parts.is_empty() { "/ui/runs".to_owned() } else { format!("/ui/runs?{}", parts.join("&")) }
}

/// The listing the query asks for, as this viewer may see it, or what is
/// wrong with the query.
fn browse_of(query: &RunsQuery, session: &Session) -> Result<Browse, String> {
    let given = |text: &str| Some(text.trim().to_owned()).filter(|text| !text.is_empty());
    let status = match given(&query.status) {
        None => None,
        Some(name) => Some(Status::parse(&name).ok_or_else(|| {
            let names: Vec<&str> = Status::ALL.iter().map(|status| status.name()).collect();
            format!("status {name:?} is not one of {}", names.join(", "))
        })?),
    };
    let seq = |name: &str, text: &str| {
        text.parse::<u64>().map_err(|_| format!("{name} {text:?} is not an entry number; use the page links"))
    };
    let from = match (given(&query.before), given(&query.after)) {
        (Some(before), _) => Position::Before(seq("before", &before)?),
        (None, Some(after)) => Position::After(seq("after", &after)?),
        (None, None) => Position::Newest,
    };
    // As in the API: a viewer who may not see every run lists only their own.
    let principal =
        if session.viewer.see_all_runs { given(&query.principal) } else { Some(session.viewer.name.clone()) };
    Ok(Browse {
        status,
        since: given(&query.since),
        until: given(&query.until),
        principal,
        code_contains: given(&query.q),
        from,
        limit: 50,
    })
}

pub(super) async fn runs(
    State(console): Shared,
    headers: HeaderMap,
    uri: Uri,
    Query(query): Query<RunsQuery>,
) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    let frame = Frame::of(&session);
    let statuses = Status::ALL.iter().map(|status| (status.name().to_owned(), StatusView::of(*status).word)).collect();
    let filters = filter_query(&query);
    let mut page = RunsPage {
        frame: frame.clone(),
        statuses,
        filter: query.clone(),
        problem: String::new(),
        runs: Vec::new(),
        newer: None,
        older: None,
        newest: page_link(&filters, None),
    };
    let browse = match browse_of(&query, &session) {
        Ok(browse) => browse,
        Err(problem) => {
            page.problem = problem;
            return Ok(html(StatusCode::BAD_REQUEST, &page));
        }
    };
    let store = console.store.clone();
    let listed = blocking(move || store.browse(&browse)).await?;
    let listed = match listed {
        Ok(listed) => listed,
        Err(AuditError::BadFilter { field, message }) => {
            page.problem = format!("{field}: {message}");
            return Ok(html(StatusCode::BAD_REQUEST, &page));
        }
        Err(AuditError::OldSchema { .. }) => {
            page.problem = "Searching the code needs a store at schema version 2; this one was written by an \
                            older airlock. Run `airlock audit migrate` on it, then search again."
                .to_owned();
            return Ok(html(StatusCode::BAD_REQUEST, &page));
        }
        Err(error) => return Err(store_failed(frame, &error)),
    };
    page.runs = listed
        .runs
        .into_iter()
        .map(|run| {
            let summary = run.summary;
            RunRow {
                status: StatusView::of(summary.status),
                limits: limits_text(summary.status.stopping_limit(), &summary.limits_hit),
                principal: summary.principal.as_deref().map_or_else(|| "-".to_owned(), airlock_core::terminal_safe),
                started_at: airlock_core::terminal_safe(&summary.started_at),
                took: summary.wall_ms.map_or_else(String::new, airlock::audit::human_seconds),
                first_line: airlock_core::terminal_safe(&run.first_line),
                id: airlock_core::terminal_safe(&summary.run_id),
                id_path: path_segment(&summary.run_id),
            }
        })
        .collect();
    page.newer = listed.newer.map(|seq| page_link(&filters, Some(("after", seq))));
    page.older = listed.older.map(|seq| page_link(&filters, Some(("before", seq))));
    Ok(html(StatusCode::OK, &page))
}

/// The run `id` if this session may see it: `Ok(None)` when it is absent
/// or another's, alike, and after the same work (one indexed look-up of
/// who asked for it), so that the time of the answer does not tell them apart.
fn visible_run(store: &AuditStore, id: &str, session: &Session) -> Result<Option<StoredRun>, AuditError> {
    match store.principal_of(id)? {
        Some(principal) if session.viewer.may_see(principal.as_deref()) => store.get(id),
        _ => Ok(None),
    }
}

/// Contents as the console serves them: URLs of its own, when kept.
struct Served<'a> {
    store: &'a AuditStore,
    id_path: String,
}

/// A kept content whose bytes no longer match its recorded hash.
pub(super) const ALTERED: &str = "ALTERED: the kept bytes no longer hash to the recorded sha256, so they are not shown";

const NOT_KEPT: &str = "not kept in the store (recorded by an older airlock, or returned to a file)";

impl Served<'_> {
    /// Where content `sha256` is served from, or why it is not: checked
    /// against its hash first, so an altered content says so rather than
    /// showing as a broken image.
    fn source(&self, kind: &str, index: usize, sha256: &str) -> Source {
        match self.store.content_state(sha256) {
            Ok(ContentState::Kept) => match self.store.content(sha256) {
                Ok(_) => Source::Url(format!("/ui/runs/{}/{kind}/{index}", self.id_path)),
                Err(AuditError::ContentAltered { .. }) => Source::Missing(ALTERED.to_owned()),
                Err(error) => Source::Missing(logged(&error)),
            },
            Ok(ContentState::Skipped(reason)) => Source::Missing(format!("not kept: {reason}")),
            Ok(ContentState::Absent) => Source::Missing(NOT_KEPT.to_owned()),
            Err(error) => Source::Missing(logged(&error)),
        }
    }
}

impl Contents for Served<'_> {
    fn figure(&self, index: usize, sha256: &str) -> Source {
        self.source("figures", index, sha256)
    }

    fn artifact(&self, index: usize, sha256: &str) -> Source {
        self.source("artifacts", index, sha256)
    }

    fn text(&self, sha256: &str) -> Option<String> {
        String::from_utf8(self.store.content(sha256).ok()??).ok()
    }
}

pub(super) async fn run(State(console): Shared, headers: HeaderMap, uri: Uri, Path(id): Path<String>) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    let frame = Frame::of(&session);
    let store = console.store.clone();
    let standing = console.verdicts.standing();
    let built = blocking(move || -> Result<Option<(RunView, String)>, AuditError> {
        let Some(run) = visible_run(&store, &id, &session)? else { return Ok(None) };
        let neighbours = store.neighbours(run.entry.seq)?;
        let contents = Served { store: &store, id_path: path_segment(&run.entry.run_id) };
        let view = RunView::new(&run, Some(&neighbours), &contents);
        let state = chain_state(standing.as_ref(), run.entry.seq);
        Ok(Some((view, state)))
    });
    match built.await? {
        Ok(Some((run, chain_state))) => Ok(html(StatusCode::OK, &RunPage { frame, run, chain_state })),
        Ok(None) => Err(no_such_run(frame, uri.path().trim_start_matches("/ui/runs/"))),
        Err(error) => Err(store_failed(frame, &error)),
    }
}

/// What the standing verdict (the latest break, else the latest check)
/// says about the chain, and about entry `seq`.
fn chain_state(standing: Option<&Verdict>, seq: u64) -> String {
    let Some(verdict) = standing else {
        return "The whole chain has not been verified from the console since it started.".to_owned();
    };
    let report = &verdict.report;
    let at = format!("{} by {}{}", verdict.at, airlock_core::terminal_safe(&verdict.by), against(verdict));
    match (&report.first_break, &report.last_good) {
        (Some(broken), _) if broken.seq <= seq => format!(
            "BROKEN: verified at {}, the chain breaks at entry {}, at or before this run; see the chain page.",
            at, broken.seq
        ),
        (Some(broken), _) => format!(
            "Verified at {}: the chain holds through this entry but breaks later, at entry {}; see the chain page.",
            at, broken.seq
        ),
        (None, Some(head)) if head.seq >= seq => {
            format!("Verified at {}: the whole chain holds, {} entries, head {head}.", at, report.entries_checked)
        }
        (None, _) => format!("Verified at {}, before this run was recorded; verify again to cover it.", at),
    }
}

pub(super) async fn run_report(
    State(console): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    let frame = Frame::of(&session);
    let store = console.store.clone();
    let built = blocking(move || -> Result<Option<(String, String)>, super::ReportError> {
        let Some(run) = visible_run(&store, &id, &session)? else { return Ok(None) };
        Ok(Some((super::report(&run, &store)?, run.entry.run_id)))
    });
    match built.await? {
        Ok(Some((text, run_id))) => {
            let file = format!("attachment; filename=\"airlock-run-{}.html\"", ascii_name(&run_id));
            let mut response =
                (StatusCode::OK, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_DISPOSITION, header_value(&file));
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                header_value(&format!("{}; frame-ancestors 'none'", super::report::policy())),
            );
            Ok(response)
        }
        Ok(None) => Err(no_such_run(frame, uri.path().trim_start_matches("/ui/runs/"))),
        Err(super::ReportError::Audit(error)) => Err(store_failed(frame, &error)),
        Err(error) => {
            eprintln!("airlock: console: {error}");
            Err(error_page(StatusCode::INTERNAL_SERVER_ERROR, frame, "The report failed", STORE_TROUBLE.to_owned()))
        }
    }
}

/// `text` reduced to what a file name in a header may safely hold.
fn ascii_name(text: &str) -> String {
    let name: String = text
        .chars()
        .take(100)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    let name = name.trim_start_matches('.').to_owned();
    if name.is_empty() { "file".to_owned() } else { name }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// Which of a run's contents.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Figure,
    Artifact,
}

/// Content `index` of kind `kind` of run `id`, if the session may see it.
async fn content(console: Arc<Console>, session: Session, id: String, index: usize, kind: Kind) -> Response {
    let store = console.store.clone();
    // The name it was recorded under, and its bytes if kept.
    type Named = (String, Option<Vec<u8>>);
    let found = blocking(move || -> Result<Option<Named>, AuditError> {
        let Some(run) = visible_run(&store, &id, &session)? else { return Ok(None) };
        let named = match kind {
            Kind::Figure => {
                run.record.figures.get(index).map(|figure| (figure.name.clone(), Some(figure.sha256.clone())))
            }
            Kind::Artifact => run.record.artifacts.get(index).map(|artifact| {
                (artifact.path.rsplit('/').next().unwrap_or_default().to_owned(), artifact.sha256.clone())
            }),
        };
        let Some((name, sha256)) = named else { return Ok(None) };
        let bytes = match sha256 {
            Some(sha256) => store.content(&sha256)?,
            None => None,
        };
        Ok(Some((name, bytes)))
    });
    match found.await {
        Err(response) => response,
        Ok(Ok(None)) => plain(StatusCode::NOT_FOUND, "there is no such content that you may see"),
        Ok(Ok(Some((_, None)))) => plain(StatusCode::NOT_FOUND, NOT_KEPT),
        Ok(Ok(Some((name, Some(bytes))))) => answer(kind, &name, bytes),
        Ok(Err(AuditError::ContentAltered { .. })) => plain(StatusCode::CONFLICT, ALTERED),
        Ok(Err(error)) => plain(StatusCode::INTERNAL_SERVER_ERROR, &logged(&error)),
    }
}

/// A figure only as `image/png`, and only when it starts as a PNG does
/// (its bytes already matched the recorded hash); an artefact only as a
/// download of bytes, under a sandboxing policy should anything open it.
fn answer(kind: Kind, name: &str, bytes: Vec<u8>) -> Response {
    match kind {
        Kind::Figure if !bytes.starts_with(PNG_SIGNATURE) => {
            plain(StatusCode::UNPROCESSABLE_ENTITY, "the recorded figure is not a PNG, so it is not shown")
        }
        Kind::Figure => {
            // no-store, as every page holding a run: a figure is a run's output.
            let headers = [(header::CONTENT_TYPE, "image/png"), (header::CACHE_CONTROL, "no-store")];
            (StatusCode::OK, headers, bytes).into_response()
        }
        Kind::Artifact => {
            let headers = [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
                (header::CONTENT_DISPOSITION, header_value(&format!("attachment; filename=\"{}\"", ascii_name(name)))),
                (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox; default-src 'none'")),
            ];
            (StatusCode::OK, headers, bytes).into_response()
        }
    }
}

pub(super) async fn figure(
    State(console): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path((id, index)): Path<(String, usize)>,
) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    Ok(content(console, session, id, index, Kind::Figure).await)
}

pub(super) async fn artifact(
    State(console): Shared,
    headers: HeaderMap,
    uri: Uri,
    Path((id, index)): Path<(String, usize)>,
) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    Ok(content(console, session, id, index, Kind::Artifact).await)
}

/// How a verdict names the anchor it was checked against.
fn against(verdict: &Verdict) -> String {
    match &verdict.anchor {
        Some(anchor) => format!(", against the anchor {anchor}"),
        None => ", without an anchor".to_owned(),
    }
}

/// The chain's verdict, as a viewer may read it: the run at a break is
/// named only to a viewer who may see it.
fn verdict_text(store: &AuditStore, verdict: &Verdict, session: &Session) -> (String, &'static str, String) {
    let report = &verdict.report;
    let at = format!("{} by {}{}", verdict.at, airlock_core::terminal_safe(&verdict.by), against(verdict));
    match &report.first_break {
        None => (format!("Intact: verified at {at}."), "good", report.to_string()),
        Some(broken) => {
            let mut shown: ChainBreak = broken.clone();
            let visible = broken
                .run_id
                .as_deref()
                .map(|id| matches!(visible_run(store, id, session), Ok(Some(_))))
                .unwrap_or(true);
            if !visible {
                shown.run_id = Some("of another principal".to_owned());
            }
            let mut detail = format!("The first broken link: {shown}\n");
            detail.push_str(&format!("{} entries before it check out", report.entries_checked));
            if let Some(good) = &report.last_good {
                detail.push_str(&format!(", the last being {good}"));
            }
            (format!("BROKEN at entry {}: verified at {at}.", broken.seq), "bad", detail)
        }
    }
}

pub(super) async fn chain(State(console): Shared, headers: HeaderMap, uri: Uri) -> PageResult {
    let session = signed_in(&console, &headers, &uri)?;
    let frame = Frame::of(&session);
    let store = console.store.clone();
    let standing = console.verdicts.standing();
    let verdicts = console.verdicts.newest_first();
    let anchor = console.verdicts.last_anchor_of(&session.viewer.name).map_or_else(String::new, |a| a.to_string());
    let built = blocking(move || -> Result<ChainPage, AuditError> {
        let head = store.head()?.map_or_else(String::new, |head| head.to_string());
        let (mut state, state_class, detail) = match &standing {
            Some(verdict) => verdict_text(&store, verdict, &session),
            None => ("Not verified from the console since it started.".to_owned(), "other", String::new()),
        };
        if standing.as_ref().is_some_and(Verdict::is_broken) && verdicts.first().is_some_and(|last| !last.is_broken()) {
            state.push_str(" Later checks found the chain consistent; a chain rewritten from some entry on is, so the break stands.");
        }
        let verdicts = verdicts.iter().map(|verdict| verdict_row(&store, verdict, &session)).collect();
        Ok(ChainPage {
            frame: Frame::default(),
            head,
            state,
            state_class,
            detail: airlock_core::terminal_safe(&detail),
            anchor,
            verdicts,
        })
    });
    match built.await? {
        Ok(mut page) => {
            page.frame = frame;
            Ok(html(StatusCode::OK, &page))
        }
        Err(error) => Err(store_failed(frame, &error)),
    }
}

fn verdict_row(store: &AuditStore, verdict: &Verdict, session: &Session) -> VerdictRow {
    let (outcome, class, _) = verdict_text(store, verdict, session);
    VerdictRow {
        at: verdict.at.clone(),
        by: airlock_core::terminal_safe(&verdict.by),
        anchor: verdict.anchor.as_ref().map_or_else(String::new, ChainHead::to_string),
        outcome,
        class,
    }
}

#[derive(Deserialize)]
pub(super) struct VerifyForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    anchor: String,
    #[serde(default)]
    back: String,
}

pub(super) async fn verify(State(console): Shared, headers: HeaderMap, Form(form): Form<VerifyForm>) -> PageResult {
    let session = signed_in_form(&console, &headers, &form.csrf)?;
    // The walk reads every entry, and its verdict names runs: it is for a
    // viewer who may see them all.
    if !session.viewer.see_all_runs {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            Frame::of(&session),
            "Refused",
            "Verifying the chain needs a token that may see every run (see_all_runs); ask whoever holds one."
                .to_owned(),
        ));
    }
    let anchor = match form.anchor.trim() {
        "" => None,
        text => Some(ChainHead::parse(text).ok_or_else(|| {
            error_page(
                StatusCode::BAD_REQUEST,
                Frame::of(&session),
                "Not an anchor",
                format!("{text:?} is not an anchor: write SEQ:HASH, as the chain page shows the head"),
            )
        })?),
    };
    let _one_at_a_time = console.verifying.lock().await;
    // Asked again within moments (by anyone, for the same anchor): the
    // verdict just made answers, and the chain is walked once.
    if console.verdicts.fresh(anchor.as_ref()).is_some() {
        return Ok(see_other(local_path(&form.back)));
    }
    let store = console.store.clone();
    let checked_anchor = anchor.clone();
    let report = blocking(move || match &checked_anchor {
        Some(anchor) => store.verify_anchored(anchor),
        None => store.verify(),
    })
    .await?
    .map_err(|error| store_failed(Frame::of(&session), &error))?;
    console.verdicts.record(Verdict::new(&session.viewer.name, anchor, report));
    Ok(see_other(local_path(&form.back)))
}

pub(super) async fn stylesheet() -> Response {
    let headers = [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "public, max-age=3600")];
    (StatusCode::OK, headers, STYLESHEET).into_response()
}

pub(super) async fn not_found(State(console): Shared, headers: HeaderMap) -> Response {
    let frame = console.sessions.find(&headers).map(|session| Frame::of(&session)).unwrap_or_default();
    error_page(StatusCode::NOT_FOUND, frame, "Not found", "The console has no such page.".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_gone_back_to() {
        assert_eq!(local_path("/ui/runs/r1"), "/ui/runs/r1");
        for bad in
            ["//evil.example/ui/", "https://evil.example", "/ui/..\\x", "/v1/runs", "javascript:alert(1)", "/ui//x"]
        {
            assert_eq!(local_path(bad), "/ui/runs", "{bad}");
        }
    }

    #[test]
    fn header_file_names_are_plain_ascii() {
        assert_eq!(ascii_name("report \"x\".csv\r\n"), "report__x_.csv__");
        assert_eq!(ascii_name("..hidden"), "hidden");
        assert_eq!(ascii_name("<script>"), "_script_");
        assert_eq!(ascii_name(""), "file");
    }
}
