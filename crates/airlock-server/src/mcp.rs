//! The MCP adapter: `run_python` and `run_shell`, one implementation served
//! over stdio (`airlock mcp`) and streamable HTTP (`/mcp` of `airlock serve`).
//!
//! What a model gets back is sized for its context: one result carries at
//! most the operator's `mcp_result_bytes`. The report (code, output, value
//! or error, status) comes first, its output cut to a quarter of that; then
//! figures and images, and the files named in `outputs`, while they fit;
//! what does not fit is a resource link (`airlock://runs/{id}/...`), read
//! with `resources/read` (and over HTTP with `GET
//! /v1/runs/{id}/artifacts/{index}`). The structured content is a summary
//! that carries the same report, so a client that hands the model the
//! structured content instead of the text shows it the same thing.

use std::fmt::Write as _;
use std::sync::Arc;

use airlock::schema::{patterns, schema_of};
use airlock::{Language, PolicySpec, RunRecord};
use base64::Engine as _;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, Implementation, JsonObject,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::model::{ClientJsonRpcMessage, GetExtensions as _, ServerJsonRpcMessage};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, RunError, RunJob, StopReason};
use crate::http::Caller;
use crate::request::{MAX_PATH_CHARS, nullable, read_value};

/// Text artefacts up to this size come back as text blocks, budget allowing.
pub const INLINE_TEXT_CAP: usize = 64 << 10;
/// The most one `resources/read` returns: MCP clients cap a message at
/// about 1 MiB (the official SDK's event size), and base64 grows by a third.
/// A larger artefact is read in parts: `...?offset=N`.
pub const READ_CHUNK: usize = 512 << 10;

const PYTHON_TOOL: &str = "run_python";
const SHELL_TOOL: &str = "run_shell";

/// The limits a tool call may set, each as the spec's schema states it.
pub const TOOL_LIMITS: [&str; 3] = ["timeout_s", "cpu_time_s", "memory_mb"];

/// The policy field a tool call may also set when the operator vets extra
/// packages: which of them to add.
const WITH_PACKAGES: &str = "with_packages";

/// The MCP server: the tools, on the shared engine. `principal` names who
/// asks when the transport does not (stdio); over HTTP the token's name is
/// taken from each request.
#[derive(Clone, Debug)]
pub struct McpServer {
    engine: Arc<Engine>,
    principal: Option<String>,
    /// Whether the HTTP API serves artefacts too (it does under `airlock serve`).
    over_http: bool,
}

/// A tool call's arguments besides the limits, which are [`PolicySpec`]'s.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ToolCode {
    /// The code.
    #[schemars(regex(pattern = patterns::NO_NUL))]
    code: String,
    /// Files under /work to return after the run, e.g. ["/work/out.csv"]; null for none.
    #[schemars(inner(regex(pattern = patterns::SANDBOX_PATH), length(min = 1, max = MAX_PATH_CHARS)))]
    #[serde(default)]
    outputs: Option<Vec<String>>,
}

impl McpServer {
    pub fn new(engine: Arc<Engine>, principal: Option<String>) -> McpServer {
        McpServer { engine, principal, over_http: false }
    }

    /// The tools, described from the server's own settings.
    pub fn tools(&self) -> Vec<Tool> {
        // Running code changes nothing outside its sandbox, but the same code
        // twice is not the same call: no idempotentHint.
        let annotations = ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .open_world(self.engine.settings().defaults.network.is_enabled());
        vec![
            Tool::new(PYTHON_TOOL, self.describe(Language::Python), self.input_schema(Language::Python))
                .with_title("Run Python in a sandbox")
                .with_annotations(annotations.clone()),
            Tool::new(SHELL_TOOL, self.describe(Language::Sh), self.input_schema(Language::Sh))
                .with_title("Run a shell script in a sandbox")
                .with_annotations(annotations),
        ]
    }

    fn describe(&self, language: Language) -> String {
        let settings = self.engine.settings();
        let limits = &settings.defaults.limits;
        let ceiling = &settings.ceiling.limits;
        let mut text = match language {
            Language::Python => format!(
                "Run Python code in a fresh, disposable sandbox and get back what it printed, the value of its last \
                 expression (as a notebook shows it; display() works too) or the exception with the line of your \
                 code it came from, and every matplotlib figure as a PNG image (call plt.show() or leave figures \
                 open). The interpreter: {}.",
                settings.runtime.describe
            ),
            Language::Sh => format!(
                "Run a POSIX shell script (/bin/sh) in a fresh, disposable sandbox and get back what it printed and \
                 its exit status. The sandbox has the usual command-line tools and {}.",
                settings.runtime.describe
            ),
        };
        if !settings.ceiling.with_packages.is_empty() {
            let extras: Vec<&str> = settings.ceiling.with_packages.iter().map(String::as_str).collect();
            let _ = write!(text, " More packages can be added to a call with with_packages: {}.", extras.join(", "));
        }
        let network = &settings.defaults.network;
        if network.is_enabled() {
            let hosts: Vec<String> = network.allow.iter().map(ToString::to_string).collect();
            let _ = write!(text, " Network: only {} (through a filtering proxy); nothing else.", hosts.join(", "));
        } else {
            text.push_str(" There is no network: installing packages or downloading data will fail.");
        }
        let _ = write!(
            text,
            " Limits per call: {} s wall time, {} s CPU time, {} MiB memory, {} processes, {} MiB of disk in /work \
             and /tmp, {} KiB kept of each of stdout and stderr.",
            limits.wall_time.as_secs_f64(),
            limits.cpu_time.as_secs_f64(),
            limits.memory_bytes >> 20,
            limits.pids,
            limits.disk_bytes >> 20,
            limits.output_bytes >> 10,
        );
        let same = limits.wall_time == ceiling.wall_time
            && limits.cpu_time == ceiling.cpu_time
            && limits.memory_bytes == ceiling.memory_bytes;
        if same {
            text.push_str(" timeout_s, cpu_time_s and memory_mb may ask for less; leave them out (or null) otherwise.");
        } else {
            let _ = write!(
                text,
                " timeout_s, cpu_time_s and memory_mb may ask for other limits up to {} s, {} s and {} MiB; leave \
                 them out (or null) for the defaults.",
                ceiling.wall_time.as_secs_f64(),
                ceiling.cpu_time.as_secs_f64(),
                ceiling.memory_bytes >> 20,
            );
        }
        if settings.files.files().is_empty() {
            text.push_str(" /work starts empty.");
        } else {
            let files: Vec<String> =
                settings.files.files().iter().map(|(path, data)| format!("{path} ({} bytes)", data.len())).collect();
            let _ = write!(text, " Files waiting in /work: {}.", files.join(", "));
        }
        let _ = write!(
            text,
            " Nothing persists between calls: each starts from those files. To get a file back, write it under \
             /work and name it in `outputs`. A result holds about {} KiB: longer output is cut, and files and \
             figures past that come back as resource links.",
            settings.mcp_result_bytes >> 10
        );
        text
    }

    /// The input schema: `code` and `outputs`, and the limits a call may
    /// set, each exactly as [`PolicySpec::schema_within`] the ceiling
    /// states it. Every optional field is nullable, so that an agent SDK's
    /// strict mode (every field required) leaves the model `null` to say
    /// "the default".
    pub fn input_schema(&self, language: Language) -> Arc<JsonObject> {
        let mut schema = schema_of::<ToolCode>();
        schema["properties"]["code"]["description"] = json!(match language {
            Language::Python => "The Python code. The value of the last expression is returned.",
            Language::Sh => "The shell script, run by /bin/sh.",
        });
        let policy = PolicySpec::schema_within(&self.engine.settings().ceiling);
        for field in TOOL_LIMITS {
            let mut property = policy["properties"][field].clone();
            nullable(&mut property);
            schema["properties"][field] = property;
        }
        let extras = &self.engine.settings().ceiling.with_packages;
        if !extras.is_empty() {
            // Offered only when the operator allows some, and then only those.
            schema["properties"][WITH_PACKAGES] = json!({
                "type": ["array", "null"],
                "items": {"type": "string", "enum": extras},
                "description": "Extra packages to install for this call, from the operator's vetted set (no network is opened); null for none."
            });
        }
        if let Some(map) = schema.as_object_mut() {
            map.remove("title");
        }
        match schema {
            Value::Object(map) => Arc::new(map),
            _ => Arc::new(JsonObject::new()),
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        caller: Option<Caller>,
        cancel: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let language = match request.name.as_ref() {
            PYTHON_TOOL => Language::Python,
            SHELL_TOOL => Language::Sh,
            other => {
                return Err(ErrorData::invalid_params(
                    format!("there is no tool {other:?}; the tools are {PYTHON_TOOL} and {SHELL_TOOL}"),
                    None,
                ));
            }
        };
        let schema = Value::Object((*self.input_schema(language)).clone());
        let mut arguments = request.arguments.unwrap_or_default();
        let limits: serde_json::Map<String, Value> = TOOL_LIMITS
            .iter()
            .chain(std::iter::once(&WITH_PACKAGES))
            .filter_map(|field| arguments.get(*field).map(|v| ((*field).to_owned(), v.clone())))
            .collect();
        if let Err(error) = airlock::validate(&schema, &Value::Object(arguments.clone())) {
            return Ok(refusal(&format!("the arguments are not usable: {error}")));
        }
        TOOL_LIMITS.iter().chain(std::iter::once(&WITH_PACKAGES)).for_each(|field| {
            arguments.remove(*field);
        });
        let code: ToolCode = match read_value(Value::Object(arguments), &Value::Bool(true)) {
            Ok(code) => code,
            Err(error) => return Ok(refusal(&format!("the arguments are not usable: {}", error.message))),
        };
        let policy: PolicySpec = match read_value(Value::Object(limits), &Value::Bool(true)) {
            Ok(policy) => policy,
            Err(error) => return Ok(refusal(&format!("the arguments are not usable: {}", error.message))),
        };
        let job = RunJob {
            code: code.code,
            language,
            outputs: code.outputs.unwrap_or_default(),
            policy,
            ..RunJob::default()
        };
        let principal = caller.map(|caller| caller.name).or_else(|| self.principal.clone());
        match self.engine.run_cancellable(job, principal, cancel).await {
            Ok(record) => Ok(self.tool_result(&record)),
            Err(RunError::BadRequest { field, message }) => {
                let field = field.strip_prefix("policy.").unwrap_or(&field);
                Ok(refusal(&if field.is_empty() { message } else { format!("{field}: {message}") }))
            }
            Err(RunError::Stopped { why, record, .. }) => {
                let mut result = self.tool_result(&record);
                let note = match why {
                    StopReason::Shutdown => "The server is shutting down and stopped this run; try again later.",
                    StopReason::Cancelled => "The run was cancelled.",
                };
                result.content.insert(0, ContentBlock::text(note));
                result.is_error = Some(true);
                Ok(result)
            }
            Err(error) => Ok(refusal(&error.to_string())),
        }
    }

    /// A run's result, within the operator's byte budget (see the module's doc).
    pub fn tool_result(&self, record: &RunRecord) -> CallToolResult {
        let budget = self.engine.settings().mcp_result_bytes;
        let view = model_view(record);
        let report = report_within(&view, budget / 4);
        let mut spent = report.len() * 2;
        let mut content = vec![ContentBlock::text(report.clone())];
        let mut notes = Vec::new();
        let mut figures = Vec::new();
        for (index, figure) in record.figures.iter().enumerate() {
            let uri = format!("airlock://runs/{}/figures/{index}", record.id);
            figures.push(json!({"name": figure.name, "width": figure.width, "height": figure.height, "uri": uri}));
            match &figure.png_base64 {
                Some(png) if spent + png.len() <= budget => {
                    spent += png.len();
                    content.push(ContentBlock::image(png.clone(), "image/png"));
                }
                _ => content.push(link(&uri, &figure.name, "image/png", figure.bytes)),
            }
        }
        for result in &record.results {
            for mime in airlock::DisplayResult::BINARY_TYPES {
                let Some(data) = result.data.get(mime) else { continue };
                if spent + data.len() <= budget {
                    spent += data.len();
                    content.push(ContentBlock::image(data.clone(), mime));
                } else {
                    notes.push(format!("a {mime} of a rich result was left out: it would pass this result's size"));
                }
            }
        }
        let mut artifacts = Vec::new();
        for (index, artifact) in record.artifacts.iter().enumerate() {
            let uri = format!("airlock://runs/{}/artifacts/{index}", record.id);
            artifacts.push(json!({
                "path": artifact.path, "bytes": artifact.bytes, "sha256": artifact.sha256,
                "uri": artifact.error.is_none().then_some(&uri), "error": artifact.error,
            }));
            let data = artifact
                .content_base64
                .as_deref()
                .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).ok());
            let Some(data) = data else { continue };
            let mime = mime_type(&artifact.path);
            match std::str::from_utf8(&data) {
                Ok(text) if data.len() <= INLINE_TEXT_CAP && !text.contains('\0') && spent + data.len() <= budget => {
                    spent += data.len();
                    content.push(ContentBlock::text(format!("── {} ──\n{text}", artifact.path)));
                }
                _ if data.len().div_ceil(3) * 4 + spent <= budget => {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
                    spent += b64.len();
                    content.push(ContentBlock::resource(ResourceContents::blob(b64, uri.clone()).with_mime_type(mime)));
                }
                _ => {
                    content.push(link(&uri, &artifact.path, mime, data.len() as u64));
                    if self.over_http {
                        notes.push(format!(
                            "{} ({} bytes) is linked, not included: GET /v1/runs/{}/artifacts/{index}",
                            artifact.path,
                            data.len(),
                            record.id
                        ));
                    }
                }
            }
        }
        if !notes.is_empty() {
            content.push(ContentBlock::text(notes.join("\n")));
        }
        let error = view.error.as_ref().map(|e| json!({"type": e.kind, "message": e.message, "line": e.line}));
        let summary = json!({
            "run_id": record.id,
            "status": record.status,
            "limit": record.stopping_limit(),
            "exit_code": record.exit_code,
            "value": view.value.as_deref().map(|v| cut(v, 4096)),
            "error": error,
            "report": report,
            "figures": figures,
            "artifacts": artifacts,
            "record": format!("airlock://runs/{}/record", record.id),
        });
        let mut result = if record.ok() { CallToolResult::success(content) } else { CallToolResult::error(content) };
        result.structured_content = Some(summary);
        result
    }

    /// Who is asking, for `resources/read`: the token's caller over HTTP,
    /// else the stdio server's principal.
    fn may_read(&self, caller: Option<&Caller>, principal: Option<&str>) -> bool {
        match caller {
            Some(caller) => caller.see_all_runs || principal == Some(caller.name.as_str()),
            None => principal == self.principal.as_deref(),
        }
    }

    async fn read(&self, uri: &str, caller: Option<Caller>) -> Result<ReadResourceResult, ErrorData> {
        let not_found = || ErrorData::resource_not_found(format!("there is no resource {uri:?}"), None);
        let (base, offset) = match uri.split_once("?offset=") {
            Some((base, offset)) => (base, offset.parse::<usize>().map_err(|_| not_found())?),
            None => (uri, 0),
        };
        let rest = base.strip_prefix("airlock://runs/").ok_or_else(not_found)?;
        let (id, what) = rest.split_once('/').ok_or_else(not_found)?;
        let store = self.engine.audit().clone();
        let lookup = id.to_owned();
        let run = tokio::task::spawn_blocking(move || store.get(&lookup))
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .filter(|run| self.may_read(caller.as_ref(), run.entry.principal.as_deref()))
            .ok_or_else(not_found)?;
        let record = &run.record;
        let (sha256, mime) = match what.split_once('/') {
            None if what == "record" => {
                let text = serde_json::to_string_pretty(record).unwrap_or_default();
                return Ok(ReadResourceResult::new(vec![
                    ResourceContents::text(text, uri).with_mime_type("application/json"),
                ]));
            }
            Some(("artifacts", index)) => {
                let artifact =
                    index.parse::<usize>().ok().and_then(|i| record.artifacts.get(i)).ok_or_else(not_found)?;
                (artifact.sha256.clone().ok_or_else(not_found)?, mime_type(&artifact.path))
            }
            Some(("figures", index)) => {
                let figure = index.parse::<usize>().ok().and_then(|i| record.figures.get(i)).ok_or_else(not_found)?;
                (figure.sha256.clone(), "image/png")
            }
            _ => return Err(not_found()),
        };
        let data = self.engine.artifact(run.entry.principal.clone(), sha256).await.ok_or_else(|| {
            ErrorData::resource_not_found(
                format!("{uri} is no longer kept (the store drops the oldest artefacts of the token holding the most)"),
                None,
            )
        })?;
        let start = offset.min(data.len());
        let end = (start + READ_CHUNK).min(data.len());
        let b64 = base64::engine::general_purpose::STANDARD.encode(&data[start..end]);
        let mut contents = vec![ResourceContents::blob(b64, uri).with_mime_type(mime)];
        if end < data.len() || start > 0 {
            let mut note = format!("bytes {start} to {end} of {}", data.len());
            if end < data.len() {
                let _ = write!(note, "; the rest from {base}?offset={end}");
            }
            if self.over_http {
                let _ = write!(note, "; all of it at once: GET /v1/runs/{id}/{what}");
            }
            contents.push(ResourceContents::text(note, uri).with_mime_type("text/plain"));
        }
        Ok(ReadResourceResult::new(contents))
    }
}

/// The record as a model should read it: without advice meant for
/// whoever runs airlock (a model cannot build images).
fn model_view(record: &RunRecord) -> RunRecord {
    let mut view = record.without_contents();
    if let Some(error) = view.error.as_mut() {
        error.message = airlock::without_operator_advice(&error.message).to_owned();
    }
    view
}

/// The readable report of `record` in at most about `max` bytes: stdout,
/// stderr, the value and display texts are cut first, each saying so and
/// where the whole of it is.
fn report_within(record: &RunRecord, max: usize) -> String {
    let full = airlock::report::render(record);
    if full.len() <= max {
        return full;
    }
    let whole = format!("airlock://runs/{}/record", record.id);
    let mut cut_record = record.clone();
    let mut empty = record.clone();
    empty.stdout.clear();
    empty.stderr.clear();
    empty.value = empty.value.as_ref().map(|_| String::new());
    for result in &mut empty.results {
        result.data.clear();
    }
    let rest = airlock::report::render(&empty).len() + 400;
    let share = max.saturating_sub(rest) / 4;
    let note = |name: &str, text: &str| {
        format!(
            "{}\n[… {name} cut at {share} of {} bytes for this result; all of it: {whole}]\n",
            cut(text, share),
            text.len()
        )
    };
    if cut_record.stdout.len() > share {
        cut_record.stdout = note("stdout", &record.stdout);
    }
    if cut_record.stderr.len() > share {
        cut_record.stderr = note("stderr", &record.stderr);
    }
    if let Some(value) = &record.value
        && value.len() > share
    {
        cut_record.value = Some(note("value", value));
    }
    for result in &mut cut_record.results {
        if let Some(text) = result.data.get_mut("text/plain")
            && text.len() > share
        {
            *text = note("display", text);
        }
    }
    let report = airlock::report::render(&cut_record);
    if report.len() <= max {
        report
    } else {
        format!("{}\n[… the report was cut at {max} bytes for this result; all of it: {whole}]\n", cut(&report, max))
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn link(uri: &str, name: &str, mime: &str, size: u64) -> ContentBlock {
    ContentBlock::resource_link(
        Resource::new(uri, name)
            .with_mime_type(mime)
            .with_size(size)
            .with_description("left out of this result for its size; read it with resources/read"),
    )
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "airlock runs code in a disposable sandbox. Use run_python for analysis (pandas, numpy, \
                 matplotlib figures come back as images) and run_shell for shell commands. Files and figures too \
                 big for a result come back as airlock:// resource links; read them with resources/read.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // `notifications/cancelled` cancels `context.ct`: the run is killed and its slot freed.
        self.call(request, caller(&context), context.ct.clone()).await.map(CallToolResponse::from)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        // Resources are the links results hand out; there is no catalogue.
        Ok(ListResourcesResult::default())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.read(&request.uri, caller(&context)).await.map(ReadResourceResponse::from)
    }
}

/// Over HTTP, the bearer token's caller, put there by the auth layer.
fn caller(context: &RequestContext<RoleServer>) -> Option<Caller> {
    context.extensions.get::<axum::http::request::Parts>().and_then(|parts| parts.extensions.get::<Caller>()).cloned()
}

/// A tool result for a call that did not run: the reason, as an error.
fn refusal(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("The code was not run: {message}"))])
}

fn mime_type(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, ext)| ext.to_ascii_lowercase());
    match extension.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("svg") => "image/svg+xml",
        Some("pdf") => "application/pdf",
        Some("json") => "application/json",
        Some("csv") => "text/csv",
        Some("txt" | "md" | "log") => "text/plain",
        Some("parquet") => "application/vnd.apache.parquet",
        Some("zip") => "application/zip",
        _ => "application/octet-stream",
    }
}

/// MCP over streamable HTTP, as [`http_service`] makes it.
pub type McpService = StreamableHttpService<McpServer, CappedSessions>;

/// MCP over streamable HTTP, for mounting at `/mcp`: the service and the
/// book of its sessions, which the mount consults before the service.
#[derive(Clone)]
pub struct McpHttp {
    pub service: McpService,
    pub sessions: Arc<SessionBook>,
}

impl std::fmt::Debug for McpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttp").field("sessions", &self.sessions).finish_non_exhaustive()
    }
}

/// MCP over streamable HTTP, for mounting at `/mcp`, its sessions capped as
/// the settings say ([`SessionBook`]). Cancelling `shutdown` ends every
/// session.
pub fn http_service(engine: Arc<Engine>, shutdown: CancellationToken) -> McpHttp {
    // The Host check guards a loopback server without credentials against
    // DNS rebinding; here every request needs a bearer token a browser page
    // does not have, and the check would refuse every non-loopback deployment.
    let config = StreamableHttpServerConfig::default().with_cancellation_token(shutdown).disable_allowed_hosts();
    let settings = engine.settings();
    let sessions = Arc::new(SessionBook::new(settings.max_mcp_sessions, settings.max_mcp_sessions_per_token));
    let manager = CappedSessions { inner: LocalSessionManager::default(), book: sessions.clone() };
    let service = StreamableHttpService::new(
        move || Ok(McpServer { engine: engine.clone(), principal: None, over_http: true }),
        Arc::new(manager),
        config,
    );
    McpHttp { service, sessions }
}

/// The MCP sessions open over HTTP, each bound to the token that opened
/// it: at most `total` in all and `per_token` for one token. Each costs a
/// task and its buffers for as long as it lives (until `DELETE /mcp`, or
/// 300 s idle), so without a cap `initialize` in a loop fills the memory.
#[derive(Debug)]
pub struct SessionBook {
    total: usize,
    per_token: usize,
    state: std::sync::Mutex<Booked>,
}

#[derive(Debug, Default)]
struct Booked {
    /// Session id -> the name of the token that opened it.
    owners: std::collections::HashMap<String, String>,
    /// Token name -> its sessions, open or being opened.
    held: std::collections::HashMap<String, usize>,
    /// Sessions open or being opened, in all.
    all: usize,
}

/// Why a session was not opened: the cap reached, naming its setting.
#[derive(Debug, thiserror::Error)]
pub enum SessionsFull {
    #[error(
        "this token holds {0} MCP sessions, the most max_mcp_sessions_per_token allows; end one (DELETE /mcp with its Mcp-Session-Id) or let one go idle for 300 s"
    )]
    ForToken(usize),
    #[error(
        "the server holds {0} MCP sessions, the most max_mcp_sessions allows; end one (DELETE /mcp with its Mcp-Session-Id), or ask the operator to raise max_mcp_sessions"
    )]
    InAll(usize),
}

impl SessionBook {
    pub fn new(total: usize, per_token: usize) -> SessionBook {
        SessionBook { total, per_token, state: std::sync::Mutex::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Booked> {
        // The book is consistent after every statement: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a new session of `token`, if the caps leave one: held
    /// until the session is opened on it, given back if it never is.
    pub fn reserve(self: &Arc<SessionBook>, token: &str) -> Result<SessionTicket, SessionsFull> {
        let mut state = self.state();
        let held = state.held.get(token).copied().unwrap_or(0);
        if held >= self.per_token {
            return Err(SessionsFull::ForToken(held));
        }
        if state.all >= self.total {
            return Err(SessionsFull::InAll(state.all));
        }
        state.all += 1;
        *state.held.entry(token.to_owned()).or_default() += 1;
        let place = Reservation { book: self.clone(), token: Some(token.to_owned()) };
        Ok(SessionTicket(Arc::new(std::sync::Mutex::new(Some(place)))))
    }

    /// Whether session `id` is open and was opened by `token`.
    pub fn is_owned_by(&self, id: &str, token: &str) -> bool {
        self.state().owners.get(id).is_some_and(|owner| owner == token)
    }

    /// Sessions open or being opened, in all.
    pub fn open(&self) -> usize {
        self.state().all
    }

    fn give_back(&self, token: &str) {
        let mut state = self.state();
        state.all = state.all.saturating_sub(1);
        if let Some(held) = state.held.get_mut(token) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                state.held.remove(token);
            }
        }
    }

    /// Binds session `id` to the token of `place`, which keeps its place.
    fn bind(&self, id: &str, mut place: Reservation) {
        if let Some(token) = place.token.take() {
            self.state().owners.insert(id.to_owned(), token);
        }
    }

    /// Session `id` ended: its place is given back.
    fn closed(&self, id: &str) {
        let token = self.state().owners.remove(id);
        if let Some(token) = token {
            self.give_back(&token);
        }
    }
}

/// A place reserved in the book for `token`, given back when dropped unless
/// a session was opened on it (which takes the token).
#[derive(Debug)]
struct Reservation {
    book: Arc<SessionBook>,
    token: Option<String>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.book.give_back(&token);
        }
    }
}

/// The place an `initialize` request holds, in its extensions, until the
/// session manager opens a session on it.
#[derive(Clone, Debug)]
pub struct SessionTicket(Arc<std::sync::Mutex<Option<Reservation>>>);

impl SessionTicket {
    fn take(&self) -> Option<Reservation> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Gives the place back if no session was opened on it.
    pub fn release(&self) {
        drop(self.take());
    }
}

/// Why the session manager refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error("an MCP session is opened only through /mcp, which reserves its place")]
    NoTicket,
}

/// rmcp's in-memory sessions, each opened on a place of the [`SessionBook`]
/// and given back when it closes.
#[derive(Debug)]
pub struct CappedSessions {
    inner: LocalSessionManager,
    book: Arc<SessionBook>,
}

impl SessionManager for CappedSessions {
    type Error = SessionError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), SessionError> {
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, SessionError> {
        let place = match &message {
            ClientJsonRpcMessage::Request(request) => request
                .request
                .extensions()
                .get::<axum::http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<SessionTicket>())
                .and_then(SessionTicket::take),
            _ => None,
        };
        let Some(place) = place else {
            let _ = self.inner.close_session(id).await;
            return Err(SessionError::NoTicket);
        };
        // Bound before the session can close, so that its close gives the place back.
        self.book.bind(id, place);
        match self.inner.initialize_session(id, message).await {
            Ok(answer) => Ok(answer),
            Err(error) => {
                self.book.closed(id);
                let _ = self.inner.close_session(id).await;
                Err(error.into())
            }
        }
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, SessionError> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), SessionError> {
        let closed = self.inner.close_session(id).await;
        self.book.closed(id);
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}

/// Serves MCP on standard input and output until the client goes away.
pub async fn serve_stdio(engine: Arc<Engine>, principal: Option<String>) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    let service = McpServer::new(engine, principal)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| std::io::Error::other(format!("MCP over stdio could not start: {error}")))?;
    service.waiting().await.map_err(|error| std::io::Error::other(format!("MCP over stdio: {error}")))?;
    Ok(())
}

#[cfg(test)]
mod session_tests {
    use super::*;

    #[test]
    fn sessions_are_capped_per_token_and_in_all_and_places_come_back() {
        let book = Arc::new(SessionBook::new(3, 2));
        let a1 = book.reserve("a").unwrap();
        let a2 = book.reserve("a").unwrap();
        assert!(matches!(book.reserve("a"), Err(SessionsFull::ForToken(2))));
        let b1 = book.reserve("b").unwrap();
        let error = book.reserve("b").unwrap_err();
        assert!(error.to_string().contains("max_mcp_sessions allows"), "{error}");
        // A ticket no session was opened on gives its place back.
        a2.release();
        assert_eq!(book.open(), 2);
        book.bind("s1", a1.take().unwrap());
        book.bind("s2", b1.take().unwrap());
        assert!(book.is_owned_by("s1", "a") && !book.is_owned_by("s1", "b") && !book.is_owned_by("s3", "a"));
        drop((a1, b1));
        assert_eq!(book.open(), 2, "an opened session keeps its place");
        book.closed("s1");
        book.closed("s1");
        assert_eq!(book.open(), 1, "closing twice gives back once");
        assert!(!book.is_owned_by("s1", "a"));
        book.reserve("a").unwrap().release();
        assert_eq!(book.open(), 1);
    }
}
