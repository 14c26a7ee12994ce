//! What a run request is, as a type and as its schema, and how a request
//! body becomes one: checked against the very schema the OpenAPI document
//! publishes before serde reads it, so that the server accepts nothing the
//! document forbids (an array for an object, a string that is not base64, a
//! path outside /work) and every refusal names the field.

use airlock::schema::{self, patterns};
use airlock::{Language, PolicySpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::Settings;

/// The body of `POST /v1/runs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "RunBody", description = "One run: the code, its files, and what it may use.")]
pub struct RunBody {
    /// The code to run.
    #[schemars(regex(pattern = patterns::NO_NUL))]
    pub code: String,
    /// `python` (default) or `sh`.
    #[serde(default)]
    pub language: Language,
    /// Standard input, base64; absent or null means /dev/null.
    #[schemars(regex(pattern = patterns::BASE64), extend("contentEncoding" = "base64"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Files copied into /work before the run, after the operator's (a file
    /// at a path already taken replaces the earlier one).
    #[serde(default)]
    pub files: Vec<FileBody>,
    /// Files in /work returned in the record (base64, within the caps) and
    /// kept for `GET /v1/runs/{id}/artifacts/{index}`.
    #[schemars(inner(regex(pattern = patterns::SANDBOX_PATH), length(min = 1, max = MAX_PATH_CHARS)))]
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Limits at most the operator's ceiling, and hosts among those the
    /// operator allows; what is left out keeps the operator's default.
    #[serde(default)]
    pub policy: PolicySpec,
}

/// Longest path a request may name, in characters: well within the 4,000
/// bytes a sandbox path may have, whatever the characters.
pub const MAX_PATH_CHARS: u32 = 1000;

/// One file of a run request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "FileBody", description = "A file copied into /work before the run.")]
pub struct FileBody {
    /// Where it goes: `/work/x.csv` or `x.csv`.
    #[schemars(regex(pattern = patterns::SANDBOX_PATH), length(min = 1, max = MAX_PATH_CHARS))]
    pub path: String,
    /// Its bytes, base64.
    #[schemars(regex(pattern = patterns::BASE64), extend("contentEncoding" = "base64"))]
    pub content_base64: String,
}

/// Policy fields a request leaves to the operator: the sandbox's disk and
/// copy caps, which the request's own files must fit. (A request that
/// lowered them under its own files would be refused for something its
/// schema allowed.)
pub const OPERATOR_ONLY: [&str; 4] = ["disk_mb", "disk_inodes", "max_file_bytes", "max_files_total_bytes"];

/// The schema of [`RunBody`] as this server accepts it: its policy narrowed
/// to the operator's ceiling ([`PolicySpec::schema_within`]) less
/// [`OPERATOR_ONLY`], each file at most the operator's per-file cap.
pub fn run_body_schema(settings: &Settings) -> Value {
    let mut body = schema::schema_of::<RunBody>();
    let mut policy = PolicySpec::schema_within(&settings.ceiling);
    if let Some(properties) = policy["properties"].as_object_mut() {
        OPERATOR_ONLY.iter().for_each(|field| {
            properties.remove(*field);
        });
    }
    body["properties"]["policy"] = policy;
    let file_cap = settings.defaults.limits.file_bytes;
    let encoded = file_cap.div_ceil(3).saturating_mul(4);
    body["properties"]["files"]["items"]["properties"]["content_base64"]["maxLength"] = json!(encoded);
    // Characters, which are never more than bytes: the engine checks bytes.
    body["properties"]["code"]["maxLength"] = json!(settings.max_code_bytes);
    body
}

/// Why a body was refused before it was read: `field` is the JSON path at
/// fault (empty for the body as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub field: String,
    pub message: String,
}

/// Reads `bytes` as JSON, checks it against `schema`, then deserializes it.
pub fn read_json<T: serde::de::DeserializeOwned>(bytes: &[u8], schema: &Value) -> Result<T, BodyError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|error| BodyError { field: String::new(), message: format!("the body is not JSON: {error}") })?;
    read_value(value, schema)
}

/// Checks `value` against `schema`, then deserializes it.
pub fn read_value<T: serde::de::DeserializeOwned>(mut value: Value, schema: &Value) -> Result<T, BodyError> {
    integers_as_integers(&mut value);
    schema::validate(schema, &value).map_err(|violation| BodyError {
        message: if violation.path.is_empty() {
            format!("the body {}", violation.message)
        } else {
            format!("{}: {}", violation.path, violation.message)
        },
        field: violation.path,
    })?;
    // What the schema allows, serde reads; a disagreement is named all the same.
    serde_path_to_error::deserialize(value).map_err(|error| {
        let field = error.path().to_string();
        let field = if field == "." { String::new() } else { field };
        BodyError { message: format!("{field}: {}", error.inner()), field }
    })
}

/// Writes `43.0` as `43` wherever it is found: JSON Schema (and so the
/// document) calls it an integer, serde would not read it as one. A whole
/// number past the integers' range stays as it is (and is past every
/// maximum).
fn integers_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let whole = n.as_f64().filter(|f| f.fract() == 0.0);
            // Exact below 2^63; a larger whole float is refused by its maximum.
            if let Some(i) = whole.filter(|f| f.abs() < 9.2e18).map(|f| f as i64) {
                *n = i.into();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integers_as_integers),
        Value::Object(map) => map.values_mut().for_each(integers_as_integers),
        _ => {}
    }
}

/// `{"type": T}` made nullable, for fields an agent SDK's strict mode makes
/// required: `null` then says "the default".
pub fn nullable(schema: &mut Value) {
    if let Some(kind) = schema.get("type").cloned() {
        let mut kinds = match kind {
            Value::Array(kinds) => kinds,
            other => vec![other],
        };
        if !kinds.contains(&json!("null")) {
            kinds.push(json!("null"));
        }
        schema["type"] = Value::Array(kinds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        let config: crate::config::ServerConfig = toml::from_str("").unwrap();
        let host = airlock::HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 };
        let settings = Settings::new(&config, host, airlock::Runtime::default(), "/tmp/a.sqlite3".into()).unwrap();
        run_body_schema(&settings)
    }

    fn refused(body: Value) -> BodyError {
        read_value::<RunBody>(body.clone(), &schema()).expect_err(&body.to_string())
    }

    #[test]
    fn the_server_accepts_nothing_the_document_forbids() {
        assert_eq!(refused(json!(["print(42)"])).field, "");
        assert_eq!(refused(json!({"code": "1", "policy": [1.5, 1, 64]})).field, "policy");
        assert_eq!(refused(json!({"code": "1", "stdin_base64": "not base64!"})).field, "stdin_base64");
        assert_eq!(
            refused(json!({"code": "1", "files": [{"path": "/etc/x", "content_base64": ""}]})).field,
            "files[0].path"
        );
        assert_eq!(refused(json!({"code": "1", "outputs": ["../x"]})).field, "outputs[0]");
        assert_eq!(refused(json!({"code": "1", "policy": {"memory_mb": "lots"}})).field, "policy.memory_mb");
        assert_eq!(refused(json!({"code": "1", "policy": {"memory_mb": 513}})).field, "policy.memory_mb");
        assert_eq!(refused(json!({"code": "1", "language": "perl"})).field, "language");
        assert_eq!(refused(json!({"code": "a\u{0}b"})).field, "code");
        assert_eq!(refused(json!({})).field, "code");
        assert_eq!(refused(json!({"code": "1", "policy": {"max_file_bytes": 2}})).field, "policy.max_file_bytes");
        assert_eq!(refused(json!({"code": "1", "policy": {"open_files": 43.5}})).field, "policy.open_files");
        let body: RunBody =
            read_value(json!({"code": "1", "stdin_base64": null, "policy": {"timeout_s": null}}), &schema()).unwrap();
        assert_eq!((body.stdin_base64, body.policy.timeout_s), (None, None));
    }

    /// Issue 14 item 6, found by Schemathesis: `43.0` is an integer to JSON
    /// Schema, so the server takes it where the document says integer.
    #[test]
    fn a_whole_number_written_with_a_point_is_an_integer() {
        let body: RunBody = read_value(json!({"code": "1", "policy": {"open_files": 43.0}}), &schema()).unwrap();
        assert_eq!(body.policy.open_files, Some(43));
        assert!(schema::validate(&json!({"type": "integer"}), &json!(43.0)).is_ok());
        assert!(schema::validate(&json!({"type": "integer"}), &json!(43.5)).is_err());
    }
}
