//! The HTTP API: runs, the audit trail, health, metrics, the OpenAPI
//! document, and MCP over streamable HTTP at `/mcp`.

use std::sync::Arc;

use airlock::audit::ListFilter;
use airlock::{Language, PolicySpec, RunRecord};
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::engine::{Engine, RETRY_AFTER, RunError, RunJob};
use crate::mcp::McpServer;

/// Every route, as the OpenAPI document lists it: (method, path).
pub const ROUTES: [(&str, &str); 7] = [
    ("post", "/v1/runs"),
    ("get", "/v1/runs"),
    ("get", "/v1/runs/{id}"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/mcp"),
];

/// The body of `POST /v1/runs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// The code to run.
    pub code: String,
    /// `python` (default) or `sh`.
    #[serde(default)]
    pub language: Language,
    /// Standard input, base64; absent means /dev/null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Files copied into /work before the run, after the operator's.
    #[serde(default)]
    pub files: Vec<FileBody>,
    /// Files in /work returned in the record, base64, after the run.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Limits lower than the operator's defaults, and hosts among those the
    /// operator allows.
    #[serde(default)]
    pub policy: PolicySpec,
}

/// One file of a run request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBody {
    /// Where it goes: `/work/x.csv` or `x.csv`.
    pub path: String,
    pub content_base64: String,
}

/// Every error answer: `{"error": {"code", "message", "field"?}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable word: bad_request, unauthorized, forbidden, not_found,
    /// payload_too_large, busy, shutting_down, sandbox_error, audit_failed,
    /// audit_disk_full, unsupported_media_type.
    pub code: String,
    pub message: String,
    /// The request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The run that happened but could not be recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// `GET /healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    detail: ErrorDetail,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            detail: ErrorDetail { code: code.to_owned(), message: message.into(), field: None, run_id: None },
        }
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
        let retry = self.status == StatusCode::TOO_MANY_REQUESTS;
        let unauthorized = self.status == StatusCode::UNAUTHORIZED;
        let mut response = (self.status, Json(ErrorBody { error: self.detail })).into_response();
        if retry {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER.as_secs()));
        }
        if unauthorized {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<RunError> for ApiError {
    fn from(error: RunError) -> ApiError {
        let message = error.to_string();
        match error {
            RunError::BadRequest { field, message } => ApiError::bad_request(field, message),
            RunError::Busy { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", message),
            RunError::ShuttingDown => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message),
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

/// A JSON body that could not be read: 400 naming the reason, 413 when too
/// large, 415 when not JSON.
fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::BytesRejection(inner) if inner.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the request body is above the server's cap",
        ),
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON, with Content-Type: application/json",
        ),
        JsonRejection::JsonDataError(inner) => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", inner.body_text()),
        other => ApiError::new(other.status(), "bad_request", other.body_text()),
    }
}

type Shared = Arc<Engine>;

/// The router: the API behind bearer tokens, `/healthz` and
/// `/openapi.json` open, `mcp` (MCP over streamable HTTP) mounted at `/mcp`.
pub fn router(engine: Shared, mcp: StreamableHttpService<McpServer, LocalSessionManager>) -> Router {
    let cap = engine.settings().max_body_bytes;
    let protected = Router::new()
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{id}", get(get_run))
        .route("/metrics", get(metrics))
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(engine.clone(), limit_body))
        .layer(middleware::from_fn_with_state(engine.clone(), require_token));
    Router::new()
        .route("/healthz", get(health))
        .route("/openapi.json", get(openapi))
        .merge(protected)
        .merge(crate::console::for_engine(&engine))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(cap))
        .with_state(engine)
}

/// 401 unless the request carries `Authorization: Bearer <a configured token>`.
async fn require_token(State(engine): State<Shared>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let Some(token) = presented.and_then(|presented| engine.settings().token(presented)) else {
        let message = if request.headers().contains_key(header::AUTHORIZATION) {
            "the Authorization header is not a valid bearer token for this server"
        } else {
            "this endpoint needs Authorization: Bearer <token>"
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    };
    let caller = Caller { name: token.name.clone(), see_all_runs: token.see_all_runs };
    // The token itself goes no further than this function.
    request.headers_mut().remove(header::AUTHORIZATION);
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Caps every body, including the ones the MCP service reads itself.
async fn limit_body(State(engine): State<Shared>, request: Request, next: Next) -> Response {
    let cap = engine.settings().max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > cap as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is above the server's cap of {cap} bytes"),
        )
        .into_response();
    }
    let (parts, body) = request.into_parts();
    let limited = Body::new(http_body_util::Limited::new(body, cap));
    next.run(Request::from_parts(parts, limited)).await
}

async fn create_run(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<RunBody>, JsonRejection>,
) -> Result<Json<RunRecord>, ApiError> {
    let Json(body) = body.map_err(json_rejection)?;
    let job = job_from_body(body)?;
    let record = engine.run(job, Some(caller.name)).await?;
    Ok(Json(record))
}

fn job_from_body(body: RunBody) -> Result<RunJob, ApiError> {
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

async fn get_run(
    State(engine): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let store = engine.audit().clone();
    let lookup = id.clone();
    let run = tokio::task::spawn_blocking(move || store.get(&lookup))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", e.to_string()))??;
    // Another token's run is as absent as one that never was.
    match run.filter(|run| caller.see_all_runs || run.entry.principal.as_deref() == Some(caller.name.as_str())) {
        Some(run) => Ok(Json(run).into_response()),
        None => {
            Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("there is no run {id:?} for this token")))
        }
    }
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

async fn health(State(engine): State<Shared>) -> Json<Health> {
    let gauges = engine.gauges();
    Json(Health {
        status: if engine.is_accepting() { "ok" } else { "shutting_down" }.to_owned(),
        sandboxes_active: gauges.sandboxes_active,
        queue_depth: gauges.queue_depth,
    })
}

async fn metrics(State(engine): State<Shared>) -> Response {
    let text = engine.metrics().render(engine.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint; see /openapi.json")
}
