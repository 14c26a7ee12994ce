//! The HTTP API: runs, the audit trail, health, metrics, the OpenAPI
//! document, and MCP over streamable HTTP at `/mcp`.
//!
//! Every request body is checked against the schema the OpenAPI document
//! publishes before it is read ([`crate::request`]); every answer that is
//! not a success is an [`ErrorBody`], MCP's own included.

use std::sync::Arc;

use airlock::RunRecord;
use airlock::audit::ListFilter;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::connections::{BodyError, BodyLease, ReadError};
use crate::engine::{Engine, RunError, RunJob, StopReason};
use crate::mcp::McpHttp;
pub use crate::request::{FileBody, RunBody};

/// Every route, as the OpenAPI document lists it: (method, path).
pub const ROUTES: [(&str, &str); 10] = [
    ("post", "/v1/runs"),
    ("get", "/v1/runs"),
    ("get", "/v1/runs/{id}"),
    ("get", "/v1/runs/{id}/artifacts/{index}"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/mcp"),
    ("get", "/mcp"),
    ("delete", "/mcp"),
];

/// Every error answer: `{"error": {"code", "message", "field"?}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong, in a word and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ErrorDetail {
    /// A stable word: bad_request, unauthorized, forbidden, not_found, gone,
    /// method_not_allowed, not_acceptable, request_timeout, payload_too_large,
    /// unsupported_media_type, busy, shutting_down, stopped, sandbox_error,
    /// audit_failed, audit_disk_full, mcp_error.
    pub code: String,
    pub message: String,
    /// The request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The run this is about: one that happened but could not be recorded,
    /// or one airlock stopped (its record is in the audit store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// `GET /healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Health {
    /// `ok`, or `shutting_down`.
    pub status: String,
    pub sandboxes_active: usize,
    pub queue_depth: usize,
}

/// Who is asking: the token's name and what it may read.
#[derive(Clone, Debug)]
pub struct Caller {
    pub name: String,
    pub see_all_runs: bool,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: Box<ErrorDetail>,
    /// Extra headers: Retry-After, WWW-Authenticate, Allow.
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            detail: Box::new(ErrorDetail { code: code.to_owned(), message: message.into(), field: None, run_id: None }),
            headers: Vec::new(),
        }
    }

    fn header(mut self, name: header::HeaderName, value: HeaderValue) -> ApiError {
        self.headers.push((name, value));
        self
    }

    fn payload_too_large(cap: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is above the server's cap of {cap} bytes"),
        )
    }

    fn field(mut self, field: impl Into<String>) -> ApiError {
        self.detail.field = Some(field.into());
        self
    }

    fn bad_request(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message).field(field)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ErrorBody { error: *self.detail })).into_response();
        for (name, value) in self.headers {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

impl From<RunError> for ApiError {
    fn from(error: RunError) -> ApiError {
        let message = error.to_string();
        match error {
            RunError::BadRequest { field, message } => ApiError::bad_request(field, message),
            RunError::Busy { retry_after, .. } | RunError::CallerBusy { retry_after, .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", message)
                    .header(header::RETRY_AFTER, HeaderValue::from(retry_after.as_secs()))
            }
            RunError::ShuttingDown => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message),
            RunError::Stopped { run_id, why, .. } => {
                // Not the code's failure nor the sandbox's: airlock stopped it.
                let status = match why {
                    StopReason::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
                    // A cancelled HTTP run has nobody waiting for it; say so all the same.
                    StopReason::Cancelled => StatusCode::CONFLICT,
                };
                let mut api = ApiError::new(status, "stopped", message);
                api.detail.run_id = Some(run_id);
                api
            }
            RunError::Sandbox(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error", message),
            RunError::Unrecorded { run_id, error } => {
                let mut api = if error.is_disk_full() {
                    ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "audit_disk_full", message)
                } else {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", message)
                };
                api.detail.run_id = Some(run_id);
                api
            }
        }
    }
}

impl From<airlock::audit::AuditError> for ApiError {
    fn from(error: airlock::audit::AuditError) -> ApiError {
        match error {
            airlock::audit::AuditError::BadFilter { field, message } => ApiError::bad_request(field, message),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", other.to_string()),
        }
    }
}

/// Reads a JSON request body, at most `cap` bytes: 415 unless it says it is
/// JSON, 413 past the cap, else the bytes.
async fn json_bytes(headers: &HeaderMap, body: Body, cap: usize) -> Result<Bytes, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON, with Content-Type: application/json",
        ));
    }
    read_capped(body, cap).await
}

/// The whole body, or 413 once it passes `cap` (declared or not: a
/// chunked body is counted as it comes); 408 when it does not arrive
/// within `body_timeout_s`, 429 (with Retry-After) when the server is
/// reading as much as `body_bytes_in_flight` allows ([`crate::connections`]).
async fn read_capped(body: Body, cap: usize) -> Result<Bytes, ApiError> {
    crate::connections::read_body(body, cap).await.map_err(|error| {
        let message = error.to_string();
        match error {
            ReadError::TooLarge(cap) => ApiError::payload_too_large(cap),
            ReadError::Body(BodyError::TimedOut(_)) => {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
            }
            // Busy as when every run slot is taken: the server's budget, or this token's share of it.
            ReadError::Body(BodyError::OverBudget(_) | BodyError::OverShare(_)) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", message)
                    .header(header::RETRY_AFTER, HeaderValue::from_static("1"))
            }
            ReadError::Body(BodyError::Read(_)) | ReadError::Other(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
            }
        }
    })
}

type Shared = Arc<Engine>;

/// The router: the API behind bearer tokens, `/healthz` and
/// `/openapi.json` open, `mcp` (MCP over streamable HTTP) mounted at `/mcp`.
/// A new part of the server mounts itself in [`mounts`].
pub fn router(engine: Shared, mcp: McpHttp) -> Router {
    let cap = engine.settings().max_body_bytes;
    let api = Router::new()
        .route("/v1/runs", post(create_run).get(list_runs).fallback(not_allowed("/v1/runs")))
        .route("/v1/runs/{id}", get(get_run).fallback(not_allowed("/v1/runs/{id}")))
        .route(
            "/v1/runs/{id}/artifacts/{index}",
            get(get_artifact).fallback(not_allowed("/v1/runs/{id}/artifacts/{index}")),
        )
        .route("/metrics", get(metrics).fallback(not_allowed("/metrics")))
        .route(
            "/mcp",
            any(move |request: Request| {
                let mcp = mcp.clone();
                async move { mcp_adapter(mcp, cap, request).await }
            }),
        )
        .layer(middleware::from_fn_with_state(engine.clone(), require_token));
    let open = Router::new()
        .route("/healthz", get(health).fallback(not_allowed("/healthz")))
        .route("/openapi.json", get(openapi).fallback(not_allowed("/openapi.json")));
    mounts(open.merge(api), &engine).fallback(not_found).layer(DefaultBodyLimit::max(cap)).with_state(engine)
}

/// Where the server's parts are mounted beside the API.
fn mounts(router: Router<Shared>, engine: &Shared) -> Router<Shared> {
    router.merge(crate::console::for_engine(engine))
}

/// The answer to a method `path` does not take: 405, with `Allow` listing
/// the ones it does (from [`ROUTES`]; HEAD wherever GET), and an
/// [`ErrorBody`] like every other error.
fn not_allowed(path: &'static str) -> impl Fn() -> std::future::Ready<ApiError> + Clone + Send + 'static {
    move || {
        let mut methods: Vec<String> =
            ROUTES.iter().filter(|(_, p)| *p == path).map(|(m, _)| m.to_ascii_uppercase()).collect();
        if methods.iter().any(|m| m == "GET") {
            methods.push("HEAD".to_owned());
        }
        let allowed = methods.join(", ");
        let refused = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{path} does not take that method; it takes {allowed}"),
        );
        std::future::ready(match HeaderValue::from_str(&allowed) {
            Ok(value) => refused.header(header::ALLOW, value),
            Err(_) => refused,
        })
    }
}

/// MCP at `/mcp`: the body capped here (413, also for a chunked body), a
/// new session (a request without `Mcp-Session-Id`) opened only within the
/// caps of [`crate::mcp::SessionBook`] (429 past them), a session used only
/// by the token that opened it (another's is as absent as one that never
/// was), the session's DELETE answered 204 as MCP clients expect, and the
/// transport's own refusals (406, 415, 404...) as [`ErrorBody`]s.
async fn mcp_adapter(mcp: McpHttp, cap: usize, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    // Held until the transport has parsed the bytes: they stay counted in body_bytes_in_flight.
    let lease = parts.extensions.remove::<BodyLease>();
    let Some(caller) = parts.extensions.get::<Caller>().cloned() else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this endpoint needs Authorization: Bearer <token>",
        )
        .into_response();
    };
    // Read before any refusal, so that the connection stays usable after one.
    let bytes = match read_capped(body, cap).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused.into_response(),
    };
    let session =
        parts.headers.get("mcp-session-id").map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let ticket = match &session {
        Some(id) if !mcp.sessions.is_owned_by(id, &caller.name) => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("there is no MCP session {id:?} for this token; start one with initialize"),
            )
            .into_response();
        }
        Some(_) => None,
        None if parts.method == Method::POST => match mcp.sessions.reserve(&caller.name) {
            Ok(ticket) => Some(ticket),
            Err(full) => return ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", full.to_string()).into_response(),
        },
        None => None,
    };
    if let Some(ticket) = &ticket {
        parts.extensions.insert(ticket.clone());
    }
    let method = parts.method.clone();
    let response = mcp.service.handle(Request::from_parts(parts, Body::from(bytes))).await.map(Body::new);
    // The session, if one was opened, holds its place now; else it is given back.
    if let Some(ticket) = &ticket {
        ticket.release();
    }
    drop(lease);
    let status = response.status();
    if method == Method::DELETE && status == StatusCode::ACCEPTED {
        return StatusCode::NO_CONTENT.into_response();
    }
    if status.is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = read_capped(body, 64 << 10).await.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let code = match status {
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        _ => "mcp_error",
    };
    let mut refused = ApiError::new(status, code, if text.is_empty() { status.to_string() } else { text });
    for name in [header::ALLOW, header::WWW_AUTHENTICATE] {
        if let Some(value) = parts.headers.get(&name) {
            refused = refused.header(name, value.clone());
        }
    }
    refused.into_response()
}

/// The `Authorization` header's token, if it is `Bearer <token>` (the
/// scheme in any case, as RFC 9110 reads it).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(char::is_whitespace)?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// 401 unless the request carries `Authorization: Bearer <a configured token>`.
async fn require_token(State(engine): State<Shared>, mut request: Request, next: Next) -> Response {
    let token = bearer_token(request.headers()).and_then(|presented| engine.settings().token(presented));
    let Some(token) = token else {
        // RFC 6750: no credentials, a bare challenge; credentials that fail, invalid_token.
        let (message, challenge) = if request.headers().contains_key(header::AUTHORIZATION) {
            (
                "the Authorization header is not a valid bearer token for this server",
                "Bearer realm=\"airlock\", error=\"invalid_token\", error_description=\"the token is not valid for this server\"",
            )
        } else {
            ("this endpoint needs Authorization: Bearer <token>", "Bearer realm=\"airlock\"")
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
            .header(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge))
            .into_response();
    };
    let caller = Caller { name: token.name.clone(), see_all_runs: token.see_all_runs };
    // Its body, read later by the handler, counts against this token's share.
    if let Some(lease) = request.extensions().get::<BodyLease>() {
        lease.charge_to(&token.name);
    }
    // The token itself goes no further than this function.
    request.headers_mut().remove(header::AUTHORIZATION);
    request.extensions_mut().insert(caller);
    next.run(request).await
}

async fn create_run(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<RunRecord>, ApiError> {
    let bytes = json_bytes(&headers, body, engine.settings().max_body_bytes).await?;
    let body: RunBody = crate::request::read_json(&bytes, engine.run_schema())
        .map_err(|error| ApiError::bad_request(error.field, error.message))?;
    let job = job_from_body(body)?;
    let record = engine.run(job, Some(caller.name)).await?;
    Ok(Json(record))
}

fn job_from_body(body: RunBody) -> Result<RunJob, ApiError> {
    use base64::Engine as _;
    let decode = |field: String, text: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|error| ApiError::bad_request(field, format!("not valid base64: {error}")))
    };
    let stdin = match &body.stdin_base64 {
        Some(text) => decode("stdin_base64".to_owned(), text)?,
        None => Vec::new(),
    };
    let files = body
        .files
        .iter()
        .enumerate()
        .map(|(i, file)| Ok((file.path.clone(), decode(format!("files[{i}].content_base64"), &file.content_base64)?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(RunJob {
        code: body.code,
        language: body.language,
        stdin,
        files,
        outputs: body.outputs,
        policy: body.policy,
        display_name: None,
    })
}

/// The stored run `id`, if this caller may see it: another token's run is
/// as absent as one that never was.
async fn stored_run(engine: &Shared, caller: &Caller, id: &str) -> Result<airlock::audit::StoredRun, ApiError> {
    let store = engine.audit().clone();
    let lookup = id.to_owned();
    let run = tokio::task::spawn_blocking(move || store.get(&lookup))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", e.to_string()))??;
    run.filter(|run| caller.see_all_runs || run.entry.principal.as_deref() == Some(caller.name.as_str())).ok_or_else(
        || ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("there is no run {id:?} for this token")),
    )
}

async fn get_run(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(stored_run(&engine, &caller, &id).await?).into_response())
}

/// One artefact of a run, whole, as the run returned it.
async fn get_artifact(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, index)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let run = stored_run(&engine, &caller, &id).await?;
    let missing = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("run {id:?} has no artefact {index:?}; see its record's artifacts"),
        )
    };
    let artifact = index.parse::<usize>().ok().and_then(|i| run.record.artifacts.get(i)).ok_or_else(missing)?;
    let sha256 = artifact.sha256.as_deref().ok_or_else(missing)?;
    let data = engine.artifact(run.entry.principal.clone(), sha256.to_owned()).await.ok_or_else(|| {
        ApiError::new(
            StatusCode::GONE,
            "gone",
            format!("{} of run {id:?} is no longer kept: the store drops the oldest artefacts of the token holding the most", artifact.path),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

async fn list_runs(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListFilter>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(mut filter) = query.map_err(|rejection| ApiError::bad_request("query", rejection.body_text()))?;
    if !caller.see_all_runs {
        match &filter.principal {
            Some(name) if *name != caller.name => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "this token may list only its own runs; leave out principal",
                )
                .field("principal"));
            }
            _ => filter.principal = Some(caller.name),
        }
    }
    let store = engine.audit().clone();
    let page = tokio::task::spawn_blocking(move || store.list(&filter))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", e.to_string()))??;
    Ok(Json(page).into_response())
}

/// 200 `ok` while the server takes runs; 503 `shutting_down` from the
/// signal until it stops, so that a load balancer sends no more.
async fn health(State(engine): State<Shared>) -> Response {
    let gauges = engine.gauges();
    let accepting = engine.is_accepting();
    let health = Health {
        status: if accepting { "ok" } else { "shutting_down" }.to_owned(),
        sandboxes_active: gauges.sandboxes_active,
        queue_depth: gauges.queue_depth,
    };
    let status = if accepting { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(health)).into_response()
}

async fn metrics(State(engine): State<Shared>) -> Response {
    let text = engine.metrics().render(engine.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn openapi(State(engine): State<Shared>) -> Json<serde_json::Value> {
    Json(crate::openapi::document(&engine))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; see /openapi.json")
}
