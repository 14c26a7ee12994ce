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
        "Limit": one_of_names(Limit::ALL.iter().map(|l| l.name()).collect()),
        "Language": one_of_names(vec![Language::Python.name(), Language::Sh.name()]),
        "Layer": one_of_names(Layer::ALL.iter().map(|l| l.name()).collect()),
        "OutputOverflow": one_of_names(vec![overflow_name(OutputOverflow::Truncate), overflow_name(OutputOverflow::Kill)]),
        "PolicySpec": object(&[], &[
            ("timeout_s", number()), ("cpu_time_s", number()), ("memory_mb", integer()), ("pids", integer()),
            ("cpus", number()), ("disk_mb", integer()), ("disk_inodes", integer()), ("max_output_bytes", integer()),
            ("on_output_limit", schema_ref("OutputOverflow")), ("max_file_bytes", integer()),
            ("max_files_total_bytes", integer()), ("open_files", integer()),
            ("env", json!({"type": "object", "additionalProperties": {"type": "string"}})),
            ("allow_hosts", strings()), ("max_network_bytes_out", integer()), ("max_network_bytes_in", integer()),
            ("max_connections", integer()), ("backend", string()), ("allow_degraded", strings()),
            ("with_packages", strings()),
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
        "Usage": object(&[("wall_ms", integer())], &[
            ("cpu_ms", integer()), ("peak_memory_bytes", integer()), ("image_ms", integer()), ("image_cached", boolean()),
        ]),
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

/// Checks `value` against the schema `name` of `document`'s components,
/// the way a client generated from the document would read it: types,
/// enums, required fields, and no field the schema does not list. Returns
/// the first mismatch with its JSON path. `seen` collects every
/// `Schema.field` met, so a test can tell that every documented field was
/// exercised.
pub fn validate(
    document: &Value,
    name: &str,
    value: &Value,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<(), String> {
    let schema = json!({"$ref": format!("#/components/schemas/{name}")});
    check(document, &schema, value, "$", seen)
}

fn check(
    document: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<(), String> {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.strip_prefix("#/components/schemas/").ok_or(format!("{at}: odd $ref {reference}"))?;
        let target = document["components"]["schemas"].get(name).ok_or(format!("{at}: no schema {name}"))?;
        if let (Some(properties), Value::Object(fields)) = (target.get("properties"), value) {
            for field in fields.keys() {
                if properties.get(field).is_some() {
                    seen.insert(format!("{name}.{field}"));
                }
            }
        }
        return check(document, target, value, at, seen);
    }
    if let Some(choices) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = choices.iter().filter(|choice| check(document, choice, value, at, seen).is_ok()).count();
        return if matching == 1 { Ok(()) } else { Err(format!("{at}: matches {matching} of oneOf, not 1")) };
    }
    if let Some(kind) = schema.get("type") {
        let kinds: Vec<&str> = match kind {
            Value::String(kind) => vec![kind.as_str()],
            Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
            _ => return Err(format!("{at}: odd type in the schema")),
        };
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let fits = kinds.contains(&actual) || (actual == "integer" && kinds.contains(&"number"));
        if !fits {
            return Err(format!("{at}: is {actual}, the document says {}", kinds.join(" or ")));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {}", Value::Array(allowed.clone())));
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for required in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                let required = required.as_str().unwrap_or_default();
                if !fields.contains_key(required) {
                    return Err(format!("{at}: lacks the required field {required}"));
                }
            }
            for (field, item) in fields {
                let path = format!("{at}.{field}");
                match (properties.and_then(|p| p.get(field)), schema.get("additionalProperties")) {
                    (Some(property), _) => check(document, property, item, &path, seen)?,
                    (None, Some(Value::Bool(false))) => {
                        return Err(format!("{path}: the document does not list this field"));
                    }
                    (None, Some(extra @ Value::Object(_))) => check(document, extra, item, &path, seen)?,
                    (None, _) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check(document, item_schema, item, &format!("{at}[{index}]"), seen)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Every `Schema.field` the document lists for object schemas.
pub fn documented_fields(document: &Value) -> std::collections::BTreeSet<String> {
    let mut fields = std::collections::BTreeSet::new();
    for (name, schema) in document["components"]["schemas"].as_object().into_iter().flatten() {
        for field in schema.get("properties").and_then(Value::as_object).into_iter().flatten().map(|(f, _)| f) {
            fields.insert(format!("{name}.{field}"));
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use airlock::audit::{AuditEntry, Page, RunSummary, StoredRun};
    use airlock::{
        ArtifactRecord, ErrorInfo, FigureRecord, ImageRef, InputRecord, Isolation, NetworkEvent, NetworkRecord,
        NetworkVerdict, Policy, PolicySpec, RunRecord, Usage,
    };

    use super::*;
    use crate::http::{ErrorBody, ErrorDetail, FileBody, Health, RunBody};

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
        assert_eq!(serde_json::to_value(OutputOverflow::Kill).unwrap(), json!(overflow_name(OutputOverflow::Kill)));
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

    fn full_spec() -> PolicySpec {
        let mut spec = Policy::default().to_spec();
        spec.allow_hosts = Some(vec!["example.com".into()]);
        spec.allow_degraded = Some(vec!["landlock".into()]);
        spec
    }

    #[test]
    fn every_field_of_every_body_is_documented_and_nothing_else() {
        let document = document();
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
            (
                "RunBody",
                serde_json::to_value(RunBody {
                    code: "1".into(),
                    language: Language::Python,
                    stdin_base64: Some("AA==".into()),
                    files: vec![FileBody { path: "a".into(), content_base64: "AA==".into() }],
                    outputs: vec!["/work/b".into()],
                    policy: full_spec(),
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
            validate(&document, name, body, &mut seen).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let undocumented_use: Vec<_> = documented_fields(&document).difference(&seen).cloned().collect();
        assert!(undocumented_use.is_empty(), "documented but never produced: {undocumented_use:?}");
    }

    #[test]
    fn the_validator_catches_what_it_should() {
        let document = document();
        let mut seen = BTreeSet::new();
        let mut record = serde_json::to_value(full_record()).unwrap();
        record["surprise"] = json!(1);
        assert!(validate(&document, "RunRecord", &record, &mut seen).unwrap_err().contains("surprise"));
        let mut record = serde_json::to_value(full_record()).unwrap();
        record["status"] = json!("exploded");
        assert!(validate(&document, "RunRecord", &record, &mut seen).is_err());
        record["status"] = json!("ok");
        record["usage"]["wall_ms"] = json!("fast");
        assert!(validate(&document, "RunRecord", &record, &mut seen).unwrap_err().contains("$.usage.wall_ms"));
        let mut record = serde_json::to_value(full_record()).unwrap();
        record.as_object_mut().unwrap().remove("code");
        assert!(validate(&document, "RunRecord", &record, &mut seen).unwrap_err().contains("code"));
    }

    #[test]
    fn every_route_is_documented() {
        let document = document();
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
