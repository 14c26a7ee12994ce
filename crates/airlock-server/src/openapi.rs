//! The OpenAPI 3.1 document served at `/openapi.json`, made from the same
//! types the server reads and writes: the request schemas are the ones the
//! server checks bodies against ([`crate::request::run_body_schema`], the
//! policy narrowed to this operator's ceiling), the record's is derived from
//! [`airlock::RunRecord`]. Only the audit trail's answers are written here by
//! hand, and a test keeps them true. Every route in it answers, every route
//! answers in it, with the statuses it lists.

use airlock::schema::{output_schema_of, schema_of};
use airlock::{PolicySpec, RunRecord, Status};
use serde_json::{Map, Value, json};

use crate::engine::{Engine, RETRY_AFTER_MAX, RETRY_AFTER_MIN};
use crate::request::FileBody;

/// The document, for the server `engine` runs.
pub fn document(engine: &Engine) -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "airlock",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Run code a language model wrote in a disposable sandbox. Every run is recorded in a \
                hash-chained audit store. A request may ask for limits up to the operator's ceiling (the maxima \
                below are this server's), and hosts among those the operator allows."
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
                        ("400", "A body that does not fit the schema (the field is named), or files past a cap", Some("ErrorBody")),
                        ("401", "No token, or one that is not valid here", Some("ErrorBody")),
                        ("409", "The run was cancelled (its record is in the audit store; `run_id`)", Some("ErrorBody")),
                        ("408", "The body did not arrive whole within body_timeout_s", Some("ErrorBody")),
                        ("413", "The body is above the server's cap", Some("ErrorBody")),
                        ("415", "The body is not JSON", Some("ErrorBody")),
                        ("429", "Every slot and the queue are full, or the rest are kept for tokens that hold none, or the server is reading as many body bytes as body_bytes_in_flight allows; see Retry-After", Some("ErrorBody")),
                        ("500", "The sandbox could not be made, or the run could not be recorded", Some("ErrorBody")),
                        ("503", "The server is shutting down: no new runs, and a run still going at the end of \
                            the grace period is stopped (`stopped`, with its `run_id`)", Some("ErrorBody")),
                        ("507", "The run could not be recorded: the audit store's disk is full", Some("ErrorBody")),
                    ])
                },
                "get": {
                    "summary": "List recorded runs, newest first",
                    "operationId": "listRuns",
                    "parameters": [
                        query("status", json!({"type": "string", "enum": Status::ALL.iter().map(|s| s.name()).collect::<Vec<_>>()}), "Only runs with this status"),
                        query("since", time_schema(), "Runs started at or after this RFC 3339 time or date"),
                        query("until", time_schema(), "Runs started before this RFC 3339 time or date"),
                        query("principal", json!({"type": "string"}), "Runs of this token name (tokens that may see all runs)"),
                        query("limit", json!({"type": "integer", "minimum": 1, "maximum": 1000}), "Runs per page (50 when absent)"),
                        query("cursor", json!({"type": "string", "pattern": "^[1-9][0-9]{0,17}$"}), "The next_cursor of the previous page"),
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
                    "summary": "One recorded run, as stored (artefact and figure contents are not kept in it)",
                    "operationId": "getRun",
                    "parameters": [path_parameter("id", json!({"type": "string"}))],
                    "responses": responses(&[
                        ("200", "The stored run and its place in the chain", Some("StoredRun")),
                        ("401", "No valid token", Some("ErrorBody")),
                        ("404", "No such run for this token", Some("ErrorBody")),
                    ])
                }
            },
            "/v1/runs/{id}/artifacts/{index}": {
                "get": {
                    "summary": "One artefact of a run, whole: the index-th of its record's artifacts",
                    "operationId": "getArtifact",
                    "parameters": [
                        path_parameter("id", json!({"type": "string"})),
                        path_parameter("index", json!({"type": "integer", "minimum": 0, "maximum": 1000000})),
                    ],
                    "responses": {
                        "200": {"description": "The artefact's bytes",
                                "content": {"application/octet-stream": {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}}}},
                        "401": {"description": "No valid token", "content": json_content("ErrorBody")},
                        "404": {"description": "No such run for this token, or no such artefact", "content": json_content("ErrorBody")},
                        "410": {"description": "The artefact is no longer kept (past its cap the store drops the oldest artefacts of the token holding the most)", "content": json_content("ErrorBody")}
                    }
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Whether the server takes runs",
                    "operationId": "health",
                    "security": [],
                    "responses": responses(&[
                        ("200", "Taking runs", Some("Health")),
                        ("503", "Shutting down: taking no new runs, finishing the running ones", Some("Health")),
                    ])
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
            "/mcp": mcp_paths(engine.settings().max_body_bytes),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "A token whose SHA-256 the operator listed in the config; runs are recorded under its name."}},
            "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": RETRY_AFTER_MIN.as_secs(), "maximum": RETRY_AFTER_MAX.as_secs()},
                "description": "Seconds to wait: the runs ahead at the mean run time so far"}},
            "schemas": schemas(engine)
        }
    })
}

/// MCP over streamable HTTP: a JSON-RPC message in, a JSON-RPC answer (or
/// an event stream) out. The transport's refusals are documented as it
/// gives them: 400 for a message it cannot take (no session yet, a bad
/// header), 404 for a session it does not know, 406 without `Accept:
/// application/json, text/event-stream`.
fn mcp_paths(cap: usize) -> Value {
    let error = |description: &str| json!({"description": description, "content": json_content("ErrorBody")});
    let refusals = |extra: &[(&str, &str)]| {
        let mut map = Map::new();
        map.insert("400".to_owned(), error("Not a message the MCP transport takes here (a request before initialize, a header that does not match the body)"));
        map.insert("401".to_owned(), error("No valid token"));
        map.insert("404".to_owned(), error("An MCP session this server does not know (or no longer)"));
        for (code, description) in extra {
            map.insert((*code).to_owned(), error(description));
        }
        map
    };
    let mut post = refusals(&[
        ("406", "The request does not accept both application/json and text/event-stream"),
        ("408", "The body did not arrive whole within body_timeout_s"),
        ("413", &format!("The body is above the server's cap of {cap} bytes")),
        ("415", "The body is not JSON"),
        (
            "429",
            "The token or the server holds as many MCP sessions as max_mcp_sessions_per_token or max_mcp_sessions allow, or the server is reading as many body bytes as body_bytes_in_flight allows",
        ),
    ]);
    post.insert("200".to_owned(), json!({"description": "A JSON-RPC answer, as JSON or an event stream",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}}));
    post.insert("202".to_owned(), json!({"description": "A notification or response, taken"}));
    let mut get = refusals(&[
        ("405", "This server opens no stream outside a request"),
        ("406", "The request does not accept text/event-stream"),
    ]);
    get.insert(
        "200".to_owned(),
        json!({"description": "The session's event stream",
        "content": {"text/event-stream": {"schema": {"type": "string"}}}}),
    );
    let mut delete = refusals(&[]);
    delete.insert("204".to_owned(), json!({"description": "The session is closed"}));
    json!({
        "post": {
            "summary": "The Model Context Protocol over streamable HTTP: tools run_python and run_shell",
            "operationId": "mcp",
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "description": "A JSON-RPC 2.0 message of the Model Context Protocol",
                "type": "object",
                "properties": {"jsonrpc": {"const": "2.0"}, "method": {"type": "string"},
                               "id": {"type": ["string", "integer"]}, "params": {"type": "object"}},
                "required": ["jsonrpc"]
            }}}},
            "responses": post
        },
        "get": {"summary": "An MCP session's event stream", "operationId": "mcpStream", "responses": get},
        "delete": {"summary": "Closes an MCP session (Mcp-Session-Id)", "operationId": "mcpClose", "responses": delete}
    })
}

fn time_schema() -> Value {
    json!({"type": "string", "anyOf": [{"format": "date-time"}, {"format": "date"}]})
}

fn path_parameter(name: &str, schema: Value) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": schema})
}

fn json_content(schema: &str) -> Value {
    json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}})
}

fn responses(list: &[(&str, &str, Option<&str>)]) -> Value {
    let mut map = Map::new();
    for (code, description, schema) in list {
        let code = *code;
        let mut response = json!({"description": description});
        if let Some(schema) = schema {
            response["content"] = json_content(schema);
        }
        if code == "429" {
            response["headers"] = json!({"Retry-After": {"$ref": "#/components/headers/Retry-After"}});
        }
        map.insert(code.to_owned(), response);
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

/// The schemas: derived from the types the server reads and writes, but
/// for the audit trail's answers.
fn schemas(engine: &Engine) -> Value {
    let string = || t("string");
    let integer = || t("integer");
    let boolean = || t("boolean");
    let status = || json!({"type": "string", "enum": Status::ALL.iter().map(|s| s.name()).collect::<Vec<_>>()});
    let limits =
        || array(json!({"type": "string", "enum": airlock::Limit::ALL.iter().map(|l| l.name()).collect::<Vec<_>>()}));
    json!({
        "RunBody": engine.run_schema(),
        "FileBody": schema_of::<FileBody>(),
        "PolicySpec": PolicySpec::schema(),
        "RunRecord": output_schema_of::<RunRecord>(),
        "AuditEntry": object(&[
            ("seq", integer()), ("run_id", string()), ("recorded_at", string()), ("principal", nullable("string")),
            ("prev_hash", string()), ("entry_hash", string()),
        ], &[]),
        "StoredRun": object(&[("entry", schema_ref("AuditEntry")), ("record", schema_ref("RunRecord")), ("hash_matches", boolean())], &[]),
        "RunSummary": object(&[
            ("seq", integer()), ("run_id", string()), ("started_at", string()), ("recorded_at", string()),
            ("status", status()), ("principal", nullable("string")),
            ("language", json!({"type": ["string", "null"], "enum": ["python", "sh", null]})),
            ("code_sha256", nullable("string")), ("exit_code", nullable("integer")), ("wall_ms", nullable("integer")),
            ("limits_hit", limits()),
        ], &[]),
        "Page": object(&[("runs", array(schema_ref("RunSummary"))), ("next_cursor", nullable("string"))], &[]),
        "ErrorDetail": output_schema_of::<crate::http::ErrorDetail>(),
        "ErrorBody": {"type": "object", "properties": {"error": schema_ref("ErrorDetail")}, "required": ["error"], "additionalProperties": false},
        "Health": output_schema_of::<crate::http::Health>(),
    })
}

/// Checks `value` against the schema `name` of `document`'s components, as
/// a client generated from the document reads it. Returns the first
/// mismatch with its path.
pub fn validate(document: &Value, name: &str, value: &Value) -> Result<(), String> {
    let schema = document["components"]["schemas"].get(name).ok_or(format!("no schema {name}"))?;
    airlock::schema::validate_in(document, schema, value).map_err(|violation| format!("$.{violation}"))
}

/// Every `Schema.field` of `value` that the schema `name` lists, at any
/// depth, followed through `$ref`s: what a body exercised of the document.
pub fn fields_used(document: &Value, name: &str, value: &Value) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    if let Some(schema) = document["components"]["schemas"].get(name) {
        walk(document, name, schema, value, &mut seen);
    }
    seen
}

fn walk(document: &Value, name: &str, schema: &Value, value: &Value, seen: &mut std::collections::BTreeSet<String>) {
    if let Some(target) =
        schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/components/schemas/"))
    {
        if let Some(inner) = document["components"]["schemas"].get(target) {
            walk(document, target, inner, value, seen);
        }
        return;
    }
    match value {
        Value::Object(fields) => {
            for (field, item) in fields {
                if let Some(property) = schema.get("properties").and_then(|p| p.get(field)) {
                    seen.insert(format!("{name}.{field}"));
                    walk(document, &format!("{name}.{field}"), property, item, seen);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    walk(document, name, item_schema, item, seen);
                }
            }
        }
        _ => {}
    }
}

/// Every `Schema.field` the document lists, at any depth of object schemas.
pub fn documented_fields(document: &Value) -> std::collections::BTreeSet<String> {
    fn collect(name: &str, schema: &Value, out: &mut std::collections::BTreeSet<String>) {
        for (field, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
            out.insert(format!("{name}.{field}"));
            collect(&format!("{name}.{field}"), property, out);
        }
        if let Some(items) = schema.get("items") {
            collect(name, items, out);
        }
    }
    let mut fields = std::collections::BTreeSet::new();
    for (name, schema) in document["components"]["schemas"].as_object().into_iter().flatten() {
        collect(name, schema, &mut fields);
    }
    fields
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use std::sync::Arc;

    use airlock::audit::{AuditEntry, AuditStore, Page, RunSummary, StoredRun};
    use airlock::{
        ArtifactRecord, DisplayResult, ErrorInfo, FigureRecord, HostFacts, ImageRef, InputRecord, Isolation, Language,
        Layer, Limit, NetworkEvent, NetworkRecord, NetworkVerdict, Policy, PolicySpec, ResultKind, RunRecord, Runtime,
        Usage,
    };

    use super::*;
    use crate::config::{ServerConfig, Settings};
    use crate::http::{ErrorBody, ErrorDetail, Health};
    use crate::request::RunBody;

    /// An engine on a config of `toml`, its stores in `dir`.
    pub(crate) fn engine(toml: &str, dir: &std::path::Path) -> Engine {
        let config: ServerConfig = toml::from_str(toml).unwrap();
        let host = HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 };
        let settings = Settings::new(&config, host, Runtime::default(), dir.join("audit.sqlite3")).unwrap();
        let audit = Arc::new(AuditStore::open(&settings.audit_db).unwrap());
        let artifacts = crate::artifacts::ArtifactStore::open(dir.join("artifacts"), 1 << 20).unwrap();
        Engine::new(settings, audit, artifacts)
    }

    #[test]
    fn the_enumerations_are_named_as_serde_writes_them() {
        for limit in Limit::ALL {
            assert_eq!(serde_json::to_value(limit).unwrap(), json!(limit.name()));
        }
        for layer in Layer::ALL {
            assert_eq!(Layer::parse(layer.name()), Some(layer));
            assert_eq!(serde_json::to_value(layer).unwrap(), json!(layer.name()));
        }
        for status in Status::ALL {
            assert_eq!(serde_json::to_value(status).unwrap(), json!(status.name()));
        }
    }

    /// A record with every field set.
    fn full_record() -> RunRecord {
        let mut policy = Policy::default().to_spec();
        policy.env = Some(BTreeMap::from([("A".to_owned(), "b".to_owned())]));
        RunRecord {
            schema_version: 1,
            id: "r1".into(),
            started_at: "2026-11-29T10:00:00.000Z".into(),
            status: Status::Failed,
            limits_hit: Limit::ALL.to_vec(),
            message: Some("m".into()),
            exit_code: Some(1),
            signal: Some(9),
            stdout: "o".into(),
            stderr: "e".into(),
            stdout_truncated: true,
            stderr_truncated: false,
            stdout_base64: Some("AA==".into()),
            stderr_base64: Some("AA==".into()),
            code: "1/0".into(),
            code_sha256: "00".into(),
            language: Language::Sh,
            policy,
            inputs: vec![InputRecord { path: "/work/a".into(), bytes: 1, sha256: "00".into() }],
            artifacts: vec![ArtifactRecord {
                path: "/work/b".into(),
                bytes: Some(1),
                sha256: Some("00".into()),
                saved_to: Some("/tmp/b".into()),
                content_base64: Some("AA==".into()),
                error: Some("e".into()),
            }],
            figures: vec![FigureRecord {
                name: "figure-1.png".into(),
                width: 1,
                height: 1,
                bytes: 1,
                sha256: "00".into(),
                saved_to: Some("/tmp/f.png".into()),
                png_base64: Some("AA==".into()),
            }],
            value: Some("1".into()),
            results: vec![DisplayResult {
                kind: ResultKind::Display,
                data: BTreeMap::from([("text/plain".to_owned(), "1".to_owned())]),
            }],
            error: Some(ErrorInfo {
                kind: "ZeroDivisionError".into(),
                message: "division by zero".into(),
                traceback: "t".into(),
                line: Some(1),
                column: Some(1),
            }),
            usage: Usage {
                wall_ms: 1,
                cpu_ms: Some(1),
                peak_memory_bytes: Some(1),
                image_ms: Some(1),
                image_cached: Some(true),
                start: Some(airlock::RunStart::Pooled),
                pool_wait_ms: Some(1),
                first_instruction_ms: Some(1),
            },
            isolation: Isolation {
                backend: "linux".into(),
                layers: Layer::ALL.to_vec(),
                degraded: vec![Layer::Landlock],
                details: BTreeMap::from([("cgroup".to_owned(), "v2".to_owned())]),
            },
            image: Some(ImageRef { name: "python-data".into(), hash: "00".into() }),
            network: Some(NetworkRecord {
                allowed_hosts: vec!["example.com".into()],
                connections: vec![NetworkEvent {
                    host: "example.com".into(),
                    port: 443,
                    resolved: Some("93.184.216.34".into()),
                    verdict: NetworkVerdict::Denied,
                    reason: Some("r".into()),
                    bytes_out: 1,
                    bytes_in: 1,
                }],
            }),
        }
    }

    /// What a request may ask of a server with the default ceiling.
    fn request_spec() -> PolicySpec {
        let mut spec = Policy::default().to_spec();
        spec.env = Some(BTreeMap::from([("A".to_owned(), "b".to_owned())]));
        spec.allow_hosts = Some(vec![]);
        spec.allow_degraded = Some(vec![]);
        // What the operator alone sets.
        (spec.disk_mb, spec.disk_inodes, spec.max_file_bytes, spec.max_files_total_bytes) = (None, None, None, None);
        spec
    }

    fn full_spec() -> PolicySpec {
        let mut spec = Policy::default().to_spec();
        spec.allow_hosts = Some(vec!["example.com".into()]);
        spec.allow_degraded = Some(vec!["landlock".into()]);
        spec
    }

    #[test]
    fn every_field_of_every_body_is_documented_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let document = document(&engine("", dir.path()));
        let mut seen = BTreeSet::new();
        let entry = AuditEntry {
            seq: 1,
            run_id: "r1".into(),
            recorded_at: "t".into(),
            principal: Some("alice".into()),
            prev_hash: "0".into(),
            entry_hash: "1".into(),
        };
        let summary = RunSummary {
            seq: 1,
            run_id: "r1".into(),
            started_at: "t".into(),
            recorded_at: "t".into(),
            status: Status::Ok,
            principal: None,
            language: Some(Language::Python),
            code_sha256: None,
            exit_code: Some(0),
            wall_ms: None,
            limits_hit: vec![Limit::Output],
        };
        let bodies: Vec<(&str, Value)> = vec![
            ("RunRecord", serde_json::to_value(full_record()).unwrap()),
            ("PolicySpec", serde_json::to_value(full_spec()).unwrap()),
            ("FileBody", json!({"path": "a", "content_base64": "AA=="})),
            (
                "RunBody",
                serde_json::to_value(RunBody {
                    code: "1".into(),
                    language: Language::Python,
                    stdin_base64: Some("AA==".into()),
                    files: vec![FileBody { path: "a".into(), content_base64: "AA==".into() }],
                    outputs: vec!["/work/b".into()],
                    policy: request_spec(),
                })
                .unwrap(),
            ),
            (
                "StoredRun",
                serde_json::to_value(StoredRun { entry, record: full_record(), hash_matches: true }).unwrap(),
            ),
            (
                "Page",
                serde_json::to_value(Page { runs: vec![summary.clone()], next_cursor: Some("1".into()) }).unwrap(),
            ),
            ("Page", serde_json::to_value(Page { runs: vec![summary], next_cursor: None }).unwrap()),
            (
                "ErrorBody",
                serde_json::to_value(ErrorBody {
                    error: ErrorDetail {
                        code: "c".into(),
                        message: "m".into(),
                        field: Some("f".into()),
                        run_id: Some("r".into()),
                    },
                })
                .unwrap(),
            ),
            (
                "Health",
                serde_json::to_value(Health { status: "ok".into(), sandboxes_active: 0, queue_depth: 0 }).unwrap(),
            ),
        ];
        for (name, body) in &bodies {
            validate(&document, name, body).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.extend(fields_used(&document, name, body));
        }
        let undocumented_use: Vec<_> = documented_fields(&document).difference(&seen).cloned().collect();
        assert!(undocumented_use.is_empty(), "documented but never produced: {undocumented_use:?}");
    }

    #[test]
    fn the_validator_catches_what_it_should() {
        let dir = tempfile::tempdir().unwrap();
        let document = document(&engine("", dir.path()));
        let mut record = serde_json::to_value(full_record()).unwrap();
        record["surprise"] = json!(1);
        assert!(validate(&document, "RunRecord", &record).unwrap_err().contains("surprise"));
        let mut record = serde_json::to_value(full_record()).unwrap();
        record["status"] = json!("exploded");
        assert!(validate(&document, "RunRecord", &record).is_err());
        record["status"] = json!("ok");
        record["usage"]["wall_ms"] = json!("fast");
        assert!(validate(&document, "RunRecord", &record).unwrap_err().contains("$.usage.wall_ms"));
        let mut record = serde_json::to_value(full_record()).unwrap();
        record.as_object_mut().unwrap().remove("code");
        assert!(validate(&document, "RunRecord", &record).unwrap_err().contains("code"));
    }

    #[test]
    fn the_document_states_this_servers_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let document = document(&engine("[ceiling]\nmemory_mb = 1024\ntimeout_s = 60", dir.path()));
        let policy = &document["components"]["schemas"]["RunBody"]["properties"]["policy"]["properties"];
        assert_eq!(
            (policy["memory_mb"]["maximum"].as_u64(), policy["timeout_s"]["maximum"].as_f64()),
            (Some(1024), Some(60.0))
        );
        assert_eq!(policy["allow_hosts"]["maxItems"], 0, "no network allowed: no hosts may be named");
    }

    #[test]
    fn every_route_is_documented() {
        let dir = tempfile::tempdir().unwrap();
        let document = document(&engine("", dir.path()));
        let mut documented = BTreeSet::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                documented.insert((method.clone(), path.clone()));
            }
        }
        let routes: BTreeSet<(String, String)> =
            crate::http::ROUTES.iter().map(|(m, p)| ((*m).to_owned(), (*p).to_owned())).collect();
        assert_eq!(documented, routes);
    }
}
