//! The MCP adapter: `run_python` and `run_shell`, one implementation served
//! over stdio (`airlock mcp`) and streamable HTTP (`/mcp` of `airlock serve`).

use std::fmt::Write as _;
use std::sync::Arc;

use airlock::{Language, PolicySpec, RunRecord};
use base64::Engine as _;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ResourceContents, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, RunError, RunJob};
use crate::http::Caller;

/// Text artefacts up to this size come back as text blocks.
pub const INLINE_TEXT_CAP: usize = 64 << 10;
/// Other artefacts come back as embedded resources while their total stays
/// under this; past it they are named, with their hash, and left out.
pub const EMBEDDED_CAP: usize = 8 << 20;

const PYTHON_TOOL: &str = "run_python";
const SHELL_TOOL: &str = "run_shell";

/// The MCP server: the tools, on the shared engine. `principal` names who
/// asks when the transport does not (stdio); over HTTP the token's name is
/// taken from each request.
#[derive(Clone, Debug)]
pub struct McpServer {
    engine: Arc<Engine>,
    principal: Option<String>,
}

/// A tool call's arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolArgs {
    code: String,
    #[serde(default)]
    outputs: Vec<String>,
    timeout_s: Option<f64>,
    cpu_time_s: Option<f64>,
    memory_mb: Option<u64>,
    #[serde(default)]
    with_packages: Option<Vec<String>>,
}

impl McpServer {
    pub fn new(engine: Arc<Engine>, principal: Option<String>) -> McpServer {
        McpServer { engine, principal }
    }

    /// The tools, described from the server's own settings.
    pub fn tools(&self) -> Vec<Tool> {
        let annotations = ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
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
                 expression (as a notebook shows it) or the exception with its line, and every matplotlib figure as \
                 a PNG image (call plt.show() or leave figures open). The interpreter: {}.",
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
             and /tmp, {} KiB kept of each of stdout and stderr; timeout_s, cpu_time_s and memory_mb may ask for \
             less (at most {} s, {} s and {} MiB).",
            limits.wall_time.as_secs_f64(),
            limits.cpu_time.as_secs_f64(),
            limits.memory_bytes >> 20,
            limits.pids,
            limits.disk_bytes >> 20,
            limits.output_bytes >> 10,
            ceiling.wall_time.as_secs_f64(),
            ceiling.cpu_time.as_secs_f64(),
            ceiling.memory_bytes >> 20,
        );
        if settings.files.is_empty() {
            text.push_str(" /work starts empty.");
        } else {
            let files: Vec<String> =
                settings.files.iter().map(|f| format!("{} ({} bytes)", f.path, f.data.len())).collect();
            let _ = write!(text, " Files waiting in /work: {}.", files.join(", "));
        }
        text.push_str(
            " Nothing persists between calls: each starts from those files. To get a file back, write it under \
             /work and name it in `outputs`.",
        );
        text
    }

    fn input_schema(&self, language: Language) -> Arc<JsonObject> {
        let ceiling = &self.engine.settings().ceiling.limits;
        let code = match language {
            Language::Python => "The Python code. The value of the last expression is returned.",
            Language::Sh => "The shell script, run by /bin/sh.",
        };
        let schema = json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": code},
                "outputs": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Files under /work to return after the run, e.g. [\"/work/out.csv\"]."
                },
                "timeout_s": {
                    "type": "number", "exclusiveMinimum": 0, "maximum": ceiling.wall_time.as_secs_f64(),
                    "description": "A lower wall-time limit, in seconds."
                },
                "cpu_time_s": {
                    "type": "number", "exclusiveMinimum": 0, "maximum": ceiling.cpu_time.as_secs_f64(),
                    "description": "A lower CPU-time limit, in seconds."
                },
                "memory_mb": {
                    "type": "integer", "minimum": 16, "maximum": ceiling.memory_bytes >> 20,
                    "description": "A lower memory limit, in MiB."
                }
            },
            "required": ["code"],
            "additionalProperties": false
        });
        let mut schema = schema;
        let extras = &self.engine.settings().ceiling.with_packages;
        if !extras.is_empty() {
            // Offered only when the operator allows some, and then only those.
            schema["properties"]["with_packages"] = json!({
                "type": "array",
                "items": {"type": "string", "enum": extras},
                "description": "Extra packages to install for this call, from the operator's vetted set (no network is opened)."
            });
        }
        match schema {
            serde_json::Value::Object(map) => Arc::new(map),
            _ => Arc::new(JsonObject::new()),
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        principal: Option<String>,
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
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let args: ToolArgs = match serde_json::from_value(arguments) {
            Ok(args) => args,
            Err(error) => return Ok(refusal(&format!("the arguments are not usable: {error}"))),
        };
        let job = RunJob {
            code: args.code,
            language,
            outputs: args.outputs,
            policy: PolicySpec {
                timeout_s: args.timeout_s,
                cpu_time_s: args.cpu_time_s,
                memory_mb: args.memory_mb,
                with_packages: args.with_packages,
                ..PolicySpec::default()
            },
            ..RunJob::default()
        };
        match self.engine.run(job, principal).await {
            Ok(record) => Ok(tool_result(&record)),
            Err(RunError::BadRequest { field, message }) => {
                Ok(refusal(&format!("{}: {message}", field.strip_prefix("policy.").unwrap_or(&field))))
            }
            Err(error) => Ok(refusal(&error.to_string())),
        }
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "airlock runs code in a disposable sandbox. Use run_python for analysis (pandas, numpy, \
                 matplotlib figures come back as images) and run_shell for shell commands.",
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
        // Over HTTP the bearer token's name, put there by the auth layer.
        let principal = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .map(|caller| caller.name.clone())
            .or_else(|| self.principal.clone());
        self.call(request, principal).await.map(CallToolResponse::from)
    }
}

/// A tool result for a call that did not run: the reason, as an error.
fn refusal(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("The code was not run: {message}"))])
}

/// The result of a run: the readable report, one image per figure, the
/// artefacts (small text inline, others embedded within a cap), and the
/// record as structured content. A run that did not end `ok` is an error.
pub fn tool_result(record: &RunRecord) -> CallToolResult {
    let mut report = airlock::report::render(record);
    let mut content = Vec::new();
    let mut embedded = 0usize;
    let mut artefacts = Vec::new();
    for artifact in &record.artifacts {
        let Some(data) = artifact
            .content_base64
            .as_deref()
            .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).ok())
        else {
            continue;
        };
        let uri = format!("file://{}", artifact.path);
        match std::str::from_utf8(&data) {
            Ok(text) if data.len() <= INLINE_TEXT_CAP && !text.contains('\0') => {
                artefacts.push(ContentBlock::text(format!("── {} ──\n{text}", artifact.path)));
            }
            _ if embedded + data.len() <= EMBEDDED_CAP => {
                embedded += data.len();
                let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
                let mime = mime_type(&artifact.path);
                artefacts.push(ContentBlock::resource(ResourceContents::blob(b64, uri).with_mime_type(mime)));
            }
            _ => {
                let _ = writeln!(
                    report,
                    "{} ({} bytes, sha256 {}) is not returned: the results would pass the {} MiB cap",
                    artifact.path,
                    data.len(),
                    artifact.sha256.as_deref().unwrap_or("?"),
                    EMBEDDED_CAP >> 20
                );
            }
        }
    }
    content.push(ContentBlock::text(report));
    for figure in &record.figures {
        if let Some(png) = &figure.png_base64 {
            content.push(ContentBlock::image(png.clone(), "image/png"));
        }
    }
    content.extend(artefacts);
    let mut result = if record.ok() { CallToolResult::success(content) } else { CallToolResult::error(content) };
    result.structured_content = serde_json::to_value(record.without_contents()).ok();
    result
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
        Some("parquet") => "application/vnd.apache.parquet",
        Some("zip") => "application/zip",
        _ => "application/octet-stream",
    }
}

/// MCP over streamable HTTP, for mounting at `/mcp`. Cancelling `shutdown`
/// ends every session.
pub fn http_service(
    engine: Arc<Engine>,
    shutdown: CancellationToken,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    // The Host check guards a loopback server without credentials against
    // DNS rebinding; here every request needs a bearer token a browser page
    // does not have, and the check would refuse every non-loopback deployment.
    let config = StreamableHttpServerConfig::default().with_cancellation_token(shutdown).disable_allowed_hosts();
    StreamableHttpService::new(move || Ok(McpServer::new(engine.clone(), None)), Default::default(), config)
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
