//! The OpenAPI 3.1 document served at `/openapi.json`, written by hand. A
//! test keeps it true: every route in it answers, every route answers in
//! it, and every field of every body is in it, with its type, and nothing
//! else is (`additionalProperties: false`).

use airlock::{Language, Layer, Limit, OutputOverflow, Status};
use serde_json::{Map, Value, json};

use crate::engine::RETRY_AFTER;

/// The document.
pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "airlock",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Run code a language model wrote in a disposable sandbox. Every run is recorded in a \
                hash-chained audit store. A request may lower the operator's limits but never raise one past its \
                ceiling, nor allow a host the operator did not allow."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/runs": {
                "post": {
                    "summary": "Run code and return its record",
                    "operationId": "createRun",
                    "requestBody": {"required": true, "content": json_content("RunBody")},
                    "responses": responses(&[
                        ("200", "The run's record, with artefacts and figures inline", Some("RunRecord")),
                        ("400", "Bad JSON, an unknown field, a wrong type, or a limit above the ceiling (the field is named)", Some("ErrorBody")),
                        ("401", "No token, a wrong token, or a malformed Authorization header", Some("ErrorBody")),
                        ("413", "The body is above the server's cap", Some("ErrorBody")),
                        ("415", "The body is not JSON", Some("ErrorBody")),
                        ("429", "Every slot and the queue are full; see Retry-After", Some("ErrorBody")),
                        ("500", "The sandbox could not be made, or the run could not be recorded", Some("ErrorBody")),
                        ("503", "The server is shutting down", Some("ErrorBody")),
                        ("507", "The run could not be recorded: the audit store's disk is full", Some("ErrorBody")),
                    ])
                },
                "get": {
                    "summary": "List recorded runs, newest first",
                    "operationId": "listRuns",
                    "parameters": [
                        query("status", json!({"$ref": "#/components/schemas/Status"}), "Only runs with this status"),
                        query("since", json!({"type": "string"}), "Runs started at or after this RFC 3339 time or date"),
                        query("until", json!({"type": "string"}), "Runs started before this RFC 3339 time or date"),
                        query("principal", json!({"type": "string"}), "Runs of this token name (tokens that may see all runs)"),
                        query("limit", json!({"type": "integer", "minimum": 1, "maximum": 1000}), "Runs per page (50 when absent)"),
                        query("cursor", json!({"type": "string"}), "The next_cursor of the previous page"),
                    ],
                    "responses": responses(&[
                        ("200", "One page of runs", Some("Page")),
                        ("400", "A filter that cannot be applied, or an unknown parameter", Some("ErrorBody")),
                        ("401", "No valid token", Some("ErrorBody")),
                        ("403", "The token may list only its own runs", Some("ErrorBody")),
                    ])
                }
            },
            "/v1/runs/{id}": {
                "get": {
                    "summary": "One recorded run, as stored (artefact and figure contents are not kept)",
                    "operationId": "getRun",
                    "parameters": [{
                        "name": "id", "in": "path", "required": true, "schema": {"type": "string"}
                    }],
                    "responses": responses(&[
                        ("200", "The stored run and its place in the chain", Some("StoredRun")),
                        ("401", "No valid token", Some("ErrorBody")),
                        ("404", "No such run for this token", Some("ErrorBody")),
                    ])
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Whether the server takes runs",
                    "operationId": "health",
                    "security": [],
                    "responses": responses(&[("200", "Alive", Some("Health"))])
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Counters in the Prometheus text format: runs by status, run time, queue depth, sandboxes active",
                    "operationId": "metrics",
                    "responses": {
                        "200": {"description": "Prometheus text format 0.0.4",
                                "content": {"text/plain": {"schema": {"type": "string"}}}},
                        "401": {"description": "No valid token", "content": json_content("ErrorBody")}
                    }
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}}
                }
            },
            "/mcp": {
                "post": {
                    "summary": "The Model Context Protocol over streamable HTTP: tools run_python and run_shell",
                    "operationId": "mcp",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}},
                    "responses": {
                        "200": {"description": "A JSON-RPC response, as JSON or an event stream",
                                "content": {"application/json": {"schema": {"type": "object"}},
                                            "text/event-stream": {"schema": {"type": "string"}}}},
                        "401": {"description": "No valid token", "content": json_content("ErrorBody")},
                        "413": {"description": "The body is above the server's cap", "content": json_content("ErrorBody")}
                    }
                }
            }
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "A token whose SHA-256 the operator listed in the config; runs are recorded under its name."}},
            "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": format!("Seconds to wait ({})", RETRY_AFTER.as_secs())}},
            "schemas": schemas()
        }
    })
}

fn json_content(schema: &str) -> Value {
    json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}})
}

fn responses(list: &[(&str, &str, Option<&str>)]) -> Value {
    let mut map = Map::new();
    for (code, description, schema) in list {
        let mut response = json!({"description": description});
        if let Some(schema) = schema {
            response["content"] = json_content(schema);
        }
        if *code == "429" {
            response["headers"] = json!({"Retry-After": {"$ref": "#/components/headers/Retry-After"}});
        }
        map.insert((*code).to_owned(), response);
    }
    Value::Object(map)
}

fn query(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description})
}

/// An object schema: `required` fields always present, `optional` ones
/// only when set; no others.
fn object(required: &[(&str, Value)], optional: &[(&str, Value)]) -> Value {
    let mut properties = Map::new();
    for (name, schema) in required.iter().chain(optional) {
        properties.insert((*name).to_owned(), schema.clone());
    }
    let names: Vec<&str> = required.iter().map(|(name, _)| *name).collect();
    json!({"type": "object", "properties": properties, "required": names, "additionalProperties": false})
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn t(kind: &str) -> Value {
    json!({"type": kind})
}

fn nullable(kind: &str) -> Value {
    json!({"type": [kind, "null"]})
}

fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn one_of_names(names: Vec<&str>) -> Value {
    json!({"type": "string", "enum": names})
}

fn schemas() -> Value {
    let string = || t("string");
    let integer = || t("integer");
    let boolean = || t("boolean");
    let number = || t("number");
    let strings = || array(t("string"));
    json!({
        "Status": one_of_names(Status::ALL.iter().map(|s| s.name()).collect()),
        "Limit": one_of_names(ALL_LIMITS.iter().map(|l| l.name()).collect()),
        "Language": one_of_names(vec![Language::Python.name(), Language::Sh.name()]),
        "Layer": one_of_names(ALL_LAYERS.iter().map(|l| l.name()).collect()),
        "OutputOverflow": one_of_names(vec![overflow_name(OutputOverflow::Truncate), overflow_name(OutputOverflow::Kill)]),
        "PolicySpec": object(&[], &[
            ("timeout_s", number()), ("cpu_time_s", number()), ("memory_mb", integer()), ("pids", integer()),
            ("cpus", number()), ("disk_mb", integer()), ("disk_inodes", integer()), ("max_output_bytes", integer()),
            ("on_output_limit", schema_ref("OutputOverflow")), ("max_file_bytes", integer()),
            ("max_files_total_bytes", integer()), ("open_files", integer()),
            ("env", json!({"type": "object", "additionalProperties": {"type": "string"}})),
            ("allow_hosts", strings()), ("max_network_bytes_out", integer()), ("max_network_bytes_in", integer()),
            ("max_connections", integer()), ("backend", string()), ("allow_degraded", strings()),
        ]),
        "FileBody": object(&[("path", string()), ("content_base64", string())], &[]),
        "RunBody": object(&[("code", string())], &[
            ("language", schema_ref("Language")), ("stdin_base64", string()),
            ("files", array(schema_ref("FileBody"))), ("outputs", strings()), ("policy", schema_ref("PolicySpec")),
        ]),
        "InputRecord": object(&[("path", string()), ("bytes", integer()), ("sha256", string())], &[]),
        "ArtifactRecord": object(&[("path", string())], &[
            ("bytes", integer()), ("sha256", string()), ("saved_to", string()), ("content_base64", string()),
            ("error", string()),
        ]),
        "FigureRecord": object(
            &[("name", string()), ("width", integer()), ("height", integer()), ("bytes", integer()), ("sha256", string())],
            &[("saved_to", string()), ("png_base64", string())],
        ),
        "ErrorInfo": object(&[("type", string()), ("message", string()), ("traceback", string())],
            &[("line", integer()), ("column", integer())]),
        "Usage": object(&[("wall_ms", integer())], &[("cpu_ms", integer()), ("peak_memory_bytes", integer())]),
        "Isolation": object(&[("backend", string()), ("layers", array(schema_ref("Layer")))], &[
            ("degraded", array(schema_ref("Layer"))),
            ("details", json!({"type": "object", "additionalProperties": {"type": "string"}})),
        ]),
        "ImageRef": object(&[("name", string()), ("hash", string())], &[]),
        "NetworkEvent": object(
            &[("host", string()), ("port", integer()), ("verdict", one_of_names(vec!["allowed", "denied"])),
              ("bytes_out", integer()), ("bytes_in", integer())],
            &[("resolved", string()), ("reason", string())],
        ),
        "NetworkRecord": object(&[("allowed_hosts", strings()), ("connections", array(schema_ref("NetworkEvent")))], &[]),
        "RunRecord": object(&[
            ("schema_version", integer()), ("id", string()), ("started_at", string()), ("status", schema_ref("Status")),
            ("limits_hit", array(schema_ref("Limit"))), ("exit_code", nullable("integer")), ("signal", nullable("integer")),
            ("stdout", string()), ("stderr", string()), ("stdout_truncated", boolean()), ("stderr_truncated", boolean()),
            ("code", string()), ("code_sha256", string()), ("language", schema_ref("Language")),
            ("policy", schema_ref("PolicySpec")), ("inputs", array(schema_ref("InputRecord"))),
            ("artifacts", array(schema_ref("ArtifactRecord"))), ("usage", schema_ref("Usage")),
            ("isolation", schema_ref("Isolation")),
        ], &[
            ("message", string()), ("stdout_base64", string()), ("stderr_base64", string()),
            ("figures", array(schema_ref("FigureRecord"))), ("value", string()), ("error", schema_ref("ErrorInfo")),
            ("image", schema_ref("ImageRef")), ("network", schema_ref("NetworkRecord")),
        ]),
        "AuditEntry": object(&[
            ("seq", integer()), ("run_id", string()), ("recorded_at", string()), ("principal", nullable("string")),
            ("prev_hash", string()), ("entry_hash", string()),
        ], &[]),
        "StoredRun": object(&[("entry", schema_ref("AuditEntry")), ("record", schema_ref("RunRecord")), ("hash_matches", boolean())], &[]),
        "RunSummary": object(&[
            ("seq", integer()), ("run_id", string()), ("started_at", string()), ("recorded_at", string()),
            ("status", schema_ref("Status")), ("principal", nullable("string")),
            ("language", json!({"oneOf": [schema_ref("Language"), {"type": "null"}]})),
            ("code_sha256", nullable("string")), ("exit_code", nullable("integer")), ("wall_ms", nullable("integer")),
            ("limits_hit", array(schema_ref("Limit"))),
        ], &[]),
        "Page": object(&[("runs", array(schema_ref("RunSummary"))), ("next_cursor", nullable("string"))], &[]),
        "ErrorDetail": object(&[("code", string()), ("message", string())], &[("field", string()), ("run_id", string())]),
        "ErrorBody": object(&[("error", schema_ref("ErrorDetail"))], &[]),
        "Health": object(&[("status", string()), ("sandboxes_active", integer()), ("queue_depth", integer())], &[]),
    })
}

fn overflow_name(overflow: OutputOverflow) -> &'static str {
    match overflow {
        OutputOverflow::Truncate => "truncate",
        OutputOverflow::Kill => "kill",
    }
}

/// Every limit, for the schema; a test checks the list against serde.
pub(crate) const ALL_LIMITS: [Limit; 11] = [
    Limit::WallTime,
    Limit::CpuTime,
    Limit::Memory,
    Limit::Pids,
    Limit::Disk,
    Limit::Inodes,
    Limit::OpenFiles,
    Limit::Output,
    Limit::Artifacts,
    Limit::NetworkBytes,
    Limit::NetworkConnections,
];

/// Every layer, for the schema.
pub(crate) const ALL_LAYERS: [Layer; 14] = [
    Layer::UserNamespace,
    Layer::PidNamespace,
    Layer::MountNamespace,
    Layer::NetworkNamespace,
    Layer::IpcNamespace,
    Layer::UtsNamespace,
    Layer::CgroupNamespace,
    Layer::Cgroups,
    Layer::Seccomp,
    Layer::Landlock,
    Layer::NoNewPrivs,
    Layer::CapabilitiesDropped,
    Layer::Rlimits,
    Layer::Wasm,
];
