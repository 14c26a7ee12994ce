//! The JSON Schema every door publishes, derived from the types, and the
//! validator that makes a door accept exactly what its schema allows.
//!
//! [`PolicySpec::schema`] is derived from [`PolicySpec`] with schemars: its
//! doc comments are the descriptions, its attributes the bounds
//! [`crate::Policy::check`] enforces, from the same constants. A server
//! narrows it to its operator's ceiling with [`PolicySpec::schema_within`]
//! (maxima, the hosts and layers the operator allows), so that a request the
//! schema allows is one the server runs. [`validate`] checks a JSON value
//! against a schema before any door deserializes it: serde alone would take
//! an array for a struct (`"policy": [1.5, 1, 64]`), and the schema says
//! what is an object.
//!
//! Optional fields are nullable (`null` keeps the default), so that an agent
//! SDK's strict mode, which makes every field required, lets a model say
//! "no limit of my own" instead of inventing one.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Number, Value, json};

use crate::network::{HostPattern, HostRule};
use crate::policy::{Layer, OutputOverflow, Policy};
use crate::spec::PolicySpec;

/// The regular expressions the schemas use, written in the syntax JSON
/// Schema (ECMA-262) and the validator here (Rust's) read alike: classes,
/// groups, counted repetition, anchors; no look-around, no backreferences.
pub mod patterns {
    /// An environment variable's name.
    pub const ENV_KEY: &str = "^[A-Za-z_][A-Za-z0-9_]*$";
    /// Text without a NUL byte, which no process can receive.
    pub const NO_NUL: &str = "^[^\\u0000]*$";
    /// Canonical base64 (RFC 4648 with padding, zero trailing bits): what
    /// the server decodes, exactly.
    pub const BASE64: &str = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";
    /// A path below /work as [`crate::SandboxPath::parse`] takes it:
    /// `/work/...` or relative, no `..` component, a file named; each name
    /// at most 63 characters (so within the 255 bytes a file name may have,
    /// whatever the characters).
    pub const SANDBOX_PATH: &str = concat!(
        "^(?:/work/(?:\\.?/)*|(?:\\./(?:\\.?/)*)?)",
        "(?:[^/\\u0000.][^/\\u0000]{0,62}|\\.[^/\\u0000.][^/\\u0000]{0,61}|\\.\\.[^/\\u0000][^/\\u0000]{0,60})",
        "(?:/(?:\\.|[^/\\u0000.][^/\\u0000]{0,62}|\\.[^/\\u0000.][^/\\u0000]{0,61}|\\.\\.[^/\\u0000][^/\\u0000]{0,60})?)*$"
    );
}

/// The settings every schema here is generated with: JSON Schema 2020-12
/// (what OpenAPI 3.1 and MCP use), subschemas inlined (no `$ref` for a
/// client to chase), no `$schema` line (the schemas are embedded).
pub fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    })
}

/// The schema of any type, generated as [`settings`] says.
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut schema = settings().into_generator().into_root_schema_for::<T>().to_value();
    tidy(&mut schema);
    schema
}

/// The schema of a type as it is written out (a response): a field that is
/// left out when empty is not required.
pub fn output_schema_of<T: JsonSchema>() -> Value {
    let mut schema = settings().for_serialize().into_generator().into_root_schema_for::<T>().to_value();
    tidy(&mut schema);
    schema
}

/// schemars writes `format` for Rust's integer and float widths (`uint32`,
/// `double`), which JSON Schema does not define and validators ignore; the
/// bounds that matter are stated as `minimum` and `maximum`.
fn tidy(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("format").and_then(Value::as_str).is_some_and(is_width_format) {
                let width = map.remove("format");
                let max = match width.as_ref().and_then(Value::as_str) {
                    Some("uint8") => Some(u64::from(u8::MAX)),
                    Some("uint16") => Some(u64::from(u16::MAX)),
                    Some("uint32") => Some(u64::from(u32::MAX)),
                    Some("uint64" | "uint") => Some(u64::MAX),
                    _ => None,
                };
                if let Some(max) = max {
                    map.entry("maximum").or_insert(json!(max));
                }
            }
            map.values_mut().for_each(tidy);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

fn is_width_format(format: &str) -> bool {
    matches!(format, "uint8" | "uint16" | "uint32" | "uint64" | "uint" | "int32" | "int64" | "float" | "double")
}

/// `allow_degraded`'s items: the layers that may be lowered.
pub(crate) fn degradable_items(schema: &mut Schema) {
    let names: Vec<&str> = Layer::DEGRADABLE.iter().map(|layer| layer.name()).collect();
    schema.insert("items".to_owned(), json!({"type": "string", "enum": names}));
}

impl PolicySpec {
    /// The spec's JSON Schema: every field, its type, its bounds.
    pub fn schema() -> Value {
        schema_of::<PolicySpec>()
    }

    /// [`PolicySpec::schema`] narrowed to what a request may ask of a server
    /// whose operator allows at most `ceiling`
    /// ([`PolicySpec::check_within`]): every limit at most the ceiling's,
    /// hosts among the ceiling's, layers and backend as the ceiling has
    /// them. A request this schema allows passes `check_within`.
    pub fn schema_within(ceiling: &Policy) -> Value {
        let mut schema = PolicySpec::schema();
        let limits = serde_json::to_value(ceiling.to_spec()).unwrap_or_default();
        let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
            return schema;
        };
        for (name, property) in properties.iter_mut() {
            if let (Some(max @ Value::Number(_)), Some(map)) = (limits.get(name), property.as_object_mut()) {
                map.insert("maximum".to_owned(), max.clone());
            }
        }
        let nullable_enum = |values: Vec<Value>, description: Option<&Value>| {
            let mut values = values;
            values.push(Value::Null);
            let mut enumeration = json!({"type": ["string", "null"], "enum": values});
            if let Some(description) = description {
                enumeration["description"] = description.clone();
            }
            enumeration
        };
        if let Some(property) = properties.get_mut("on_output_limit") {
            let allowed = match ceiling.limits.output_overflow {
                OutputOverflow::Kill => vec![json!("kill")],
                OutputOverflow::Truncate => vec![json!("truncate"), json!("kill")],
            };
            *property = nullable_enum(allowed, property.get("description"));
        }
        if let Some(property) = properties.get_mut("backend") {
            *property = nullable_enum(vec![json!(ceiling.backend.to_string())], property.get("description"));
        }
        if let Some(property) = properties.get_mut("allow_degraded") {
            let names: Vec<&str> = ceiling.allow_degraded.iter().map(|layer| layer.name()).collect();
            narrow_items(property, names.iter().map(|name| json!({"const": name})).collect());
        }
        if let Some(property) = properties.get_mut("with_packages") {
            narrow_items(property, ceiling.with_packages.iter().map(|name| json!({"const": name})).collect());
        }
        if let Some(property) = properties.get_mut("allow_hosts") {
            narrow_items(property, ceiling.network.allow.iter().flat_map(host_choices).collect());
        }
        schema
    }
}

/// An array property whose items must be one of `choices`; none at all
/// when there are no choices.
fn narrow_items(property: &mut Value, choices: Vec<Value>) {
    let Some(map) = property.as_object_mut() else { return };
    if choices.is_empty() {
        map.insert("maxItems".to_owned(), json!(0));
    } else {
        map.insert("items".to_owned(), json!({"type": "string", "anyOf": choices}));
    }
}

/// The `allow_hosts` entries that `rule` covers, as schemas: the rule as
/// written, each of its ports alone, and for `*.domain` any name below it.
fn host_choices(rule: &HostRule) -> Vec<Value> {
    let host = match &rule.host {
        HostPattern::Name(name) => name.clone(),
        HostPattern::Subdomains(domain) => format!("*.{domain}"),
        HostPattern::Ip(std::net::IpAddr::V4(ip)) => ip.to_string(),
        HostPattern::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
    };
    let default_ports = rule.ports == crate::DEFAULT_PORTS;
    let mut exact: Vec<String> = rule.ports.iter().map(|port| format!("{host}:{port}")).collect();
    if default_ports {
        exact.insert(0, host.clone());
    }
    let mut choices = vec![json!({"enum": exact})];
    if let HostPattern::Subdomains(domain) = &rule.host {
        let label = "[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?";
        let names = format!("(?:{label}\\.)+{}", escape(domain));
        let ports: Vec<String> = rule.ports.iter().map(u16::to_string).collect();
        let longest_port = ports.iter().map(String::len).max().unwrap_or(0);
        choices.push(
            json!({"pattern": format!("^{names}:(?:{})$", ports.join("|")), "maxLength": 253 + 1 + longest_port}),
        );
        if default_ports {
            choices.push(json!({"pattern": format!("^{names}$"), "maxLength": 253}));
        }
    }
    choices
}

fn escape(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if !c.is_ascii_alphanumeric() && c != '_' && c != '-' {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// Why a value does not fit its schema: where (`policy.memory_mb`,
/// `files[0].path`, empty for the whole value) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct SchemaViolation {
    pub path: String,
    pub message: String,
}

/// Checks `value` against `schema` (a JSON Schema 2020-12 of the keywords
/// airlock's schemas use; `$ref`s are read within `schema` itself). Returns
/// the first violation. Keywords it does not know are annotations to it,
/// except that a schema using a keyword that asserts something it cannot
/// check is refused (fail closed): see [`ASSERTING`].
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaViolation> {
    Validator { root: schema }.check(schema, value, "")
}

/// [`validate`] against `schema` with its `$ref`s read in `document` (an
/// OpenAPI document's `#/components/schemas/...`).
pub fn validate_in(document: &Value, schema: &Value, value: &Value) -> Result<(), SchemaViolation> {
    Validator { root: document }.check(schema, value, "")
}

/// The asserting keywords [`validate`] checks. A schema with any other
/// asserting keyword of JSON Schema is refused rather than half-checked.
pub const ASSERTING: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "propertyNames",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$ref",
];

/// Asserting keywords of JSON Schema 2020-12 that [`validate`] does not check.
const UNCHECKED: &[&str] = &[
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "prefixItems",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "patternProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "if",
    "$dynamicRef",
];

struct Validator<'a> {
    root: &'a Value,
}

fn violation(path: &str, message: impl Into<String>) -> SchemaViolation {
    SchemaViolation { path: path.to_owned(), message: message.into() }
}

/// A value as an error may quote it: short.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        // JSON Schema counts 43.0 as an integer, as JSON itself does not tell them apart.
        Value::Number(n) if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `a` compared with `b`, exactly for integers.
fn compare(a: &Number, b: &Number) -> Option<std::cmp::Ordering> {
    let integer = |n: &Number| n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
    match (integer(a), integer(b)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

impl Validator<'_> {
    fn check(&self, schema: &Value, value: &Value, at: &str) -> Result<(), SchemaViolation> {
        let map = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(violation(at, "nothing is allowed here")),
            Value::Object(map) => map,
            _ => return Err(violation(at, "the schema itself is not a schema")),
        };
        if let Some(keyword) = UNCHECKED.iter().find(|keyword| map.contains_key(**keyword)) {
            return Err(violation(at, format!("the schema uses {keyword}, which this validator cannot check")));
        }
        if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
            let target = reference
                .strip_prefix('#')
                .and_then(|pointer| self.root.pointer(pointer))
                .ok_or_else(|| violation(at, format!("the schema's $ref {reference} leads nowhere")))?;
            self.check(target, value, at)?;
        }
        self.check_type(map, value, at)?;
        if let Some(allowed) = map.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            let choices: Vec<String> = allowed.iter().filter(|v| !v.is_null()).map(Value::to_string).collect();
            return Err(violation(at, format!("must be one of {}, not {}", choices.join(", "), shown(value))));
        }
        if let Some(constant) = map.get("const")
            && constant != value
        {
            return Err(violation(at, format!("must be {constant}")));
        }
        self.check_combinations(map, value, at)?;
        match value {
            Value::Object(fields) => self.check_object(map, fields, at),
            Value::Array(items) => self.check_array(map, items, at),
            Value::Number(number) => check_number(map, number, at),
            Value::String(text) => check_string(map, text, at),
            _ => Ok(()),
        }
    }

    fn check_type(&self, map: &Map<String, Value>, value: &Value, at: &str) -> Result<(), SchemaViolation> {
        let Some(kind) = map.get("type") else { return Ok(()) };
        let kinds: Vec<&str> = match kind {
            Value::String(kind) => vec![kind.as_str()],
            Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
            _ => return Err(violation(at, "the schema's type is neither a name nor a list")),
        };
        let actual = json_type(value);
        if kinds.contains(&actual) || (actual == "integer" && kinds.contains(&"number")) {
            return Ok(());
        }
        Err(violation(at, format!("must be {}, not {actual}", kinds.join(" or "))))
    }

    fn check_combinations(&self, map: &Map<String, Value>, value: &Value, at: &str) -> Result<(), SchemaViolation> {
        for sub in map.get("allOf").and_then(Value::as_array).into_iter().flatten() {
            self.check(sub, value, at)?;
        }
        if let Some(choices) = map.get("anyOf").and_then(Value::as_array) {
            let mut first = None;
            for choice in choices {
                match self.check(choice, value, at) {
                    Ok(()) => {
                        first = None;
                        break;
                    }
                    Err(error) => {
                        first.get_or_insert(error);
                    }
                }
            }
            if let Some(error) = first {
                // A nullable field (`X or null`) given a value that is not
                // null: what is wrong with it is what X says.
                let not_null: Vec<&Value> = choices
                    .iter()
                    .filter(|choice| choice.get("type").and_then(Value::as_str) != Some("null"))
                    .collect();
                return Err(match (choices.len(), not_null.as_slice()) {
                    (1, _) => error,
                    (_, [only]) if !value.is_null() => self.check(only, value, at).err().unwrap_or(error),
                    _ => violation(at, "matches none of the allowed forms"),
                });
            }
        }
        if let Some(choices) = map.get("oneOf").and_then(Value::as_array) {
            let matching = choices.iter().filter(|choice| self.check(choice, value, at).is_ok()).count();
            // A choice of one value: `const`, or an `enum` of one (as schemars writes either).
            let single = |c: &Value| {
                c.get("const").cloned().or_else(|| c.get("enum")?.as_array().filter(|v| v.len() == 1)?.first().cloned())
            };
            let constants: Option<Vec<String>> = choices.iter().map(|c| single(c).map(|v| v.to_string())).collect();
            if let (0, Some(constants)) = (matching, constants) {
                // An enumeration written as documented constants.
                return Err(violation(at, format!("must be one of {}, not {}", constants.join(", "), shown(value))));
            }
            if matching != 1 {
                return Err(violation(at, format!("matches {matching} of the forms allowed, not exactly one")));
            }
        }
        if let Some(forbidden) = map.get("not")
            && self.check(forbidden, value, at).is_ok()
        {
            return Err(violation(at, "is a value the schema forbids"));
        }
        Ok(())
    }

    fn check_object(
        &self,
        map: &Map<String, Value>,
        fields: &Map<String, Value>,
        at: &str,
    ) -> Result<(), SchemaViolation> {
        let join = |field: &str| if at.is_empty() { field.to_owned() } else { format!("{at}.{field}") };
        for required in map.get("required").and_then(Value::as_array).into_iter().flatten() {
            let required = required.as_str().unwrap_or_default();
            if !fields.contains_key(required) {
                return Err(violation(&join(required), "is required"));
            }
        }
        let properties = map.get("properties").and_then(Value::as_object);
        for (field, item) in fields {
            if let Some(names) = map.get("propertyNames") {
                self.check(names, &Value::String(field.clone()), &join(field))
                    .map_err(|e| violation(&join(field), format!("is not an allowed name: {}", e.message)))?;
            }
            match (properties.and_then(|p| p.get(field)), map.get("additionalProperties")) {
                (Some(property), _) => self.check(property, item, &join(field))?,
                (None, Some(Value::Bool(false))) => {
                    let known: Vec<&str> = properties.into_iter().flatten().map(|(name, _)| name.as_str()).collect();
                    return Err(violation(
                        &join(field),
                        if known.is_empty() {
                            "is not a field here".to_owned()
                        } else {
                            format!("is not a field here; the fields are {}", known.join(", "))
                        },
                    ));
                }
                (None, Some(extra)) => self.check(extra, item, &join(field))?,
                (None, None) => {}
            }
        }
        Ok(())
    }

    fn check_array(&self, map: &Map<String, Value>, items: &[Value], at: &str) -> Result<(), SchemaViolation> {
        let count = |key: &str| map.get(key).and_then(Value::as_u64);
        if let Some(min) = count("minItems")
            && (items.len() as u64) < min
        {
            return Err(violation(at, format!("must hold at least {min} items")));
        }
        if let Some(max) = count("maxItems")
            && items.len() as u64 > max
        {
            return Err(violation(
                at,
                if max == 0 { "must be empty here".to_owned() } else { format!("must hold at most {max} items") },
            ));
        }
        if let Some(item_schema) = map.get("items") {
            for (index, item) in items.iter().enumerate() {
                self.check(item_schema, item, &format!("{at}[{index}]"))?;
            }
        }
        Ok(())
    }
}

fn check_number(map: &Map<String, Value>, number: &Number, at: &str) -> Result<(), SchemaViolation> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let bound = |key: &str| map.get(key).and_then(Value::as_number);
    let order = |bound: &Number| compare(number, bound);
    if let Some(min) = bound("minimum")
        && !matches!(order(min), Some(Greater | Equal))
    {
        return Err(violation(at, format!("must be at least {min}, not {number}")));
    }
    if let Some(max) = bound("maximum")
        && !matches!(order(max), Some(Less | Equal))
    {
        return Err(violation(at, format!("must be at most {max}, not {number}")));
    }
    if let Some(min) = bound("exclusiveMinimum")
        && order(min) != Some(Greater)
    {
        return Err(violation(at, format!("must be more than {min}, not {number}")));
    }
    if let Some(max) = bound("exclusiveMaximum")
        && order(max) != Some(Less)
    {
        return Err(violation(at, format!("must be less than {max}, not {number}")));
    }
    Ok(())
}

fn check_string(map: &Map<String, Value>, text: &str, at: &str) -> Result<(), SchemaViolation> {
    let length = || text.chars().count() as u64;
    if let Some(min) = map.get("minLength").and_then(Value::as_u64)
        && length() < min
    {
        return Err(violation(at, format!("must be at least {min} characters long")));
    }
    if let Some(max) = map.get("maxLength").and_then(Value::as_u64)
        && length() > max
    {
        return Err(violation(at, format!("must be at most {max} characters long")));
    }
    if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
        let regex = compiled(pattern).map_err(|e| violation(at, format!("the schema's pattern is not usable: {e}")))?;
        if !regex.is_match(text) {
            return Err(violation(at, describe_pattern(pattern)));
        }
    }
    Ok(())
}

/// What a pattern asks for, in words where it is one of airlock's own.
fn describe_pattern(pattern: &str) -> String {
    match pattern {
        patterns::BASE64 => "is not valid base64 (RFC 4648, with padding)".to_owned(),
        patterns::NO_NUL => "contains a NUL byte, which no process can receive".to_owned(),
        patterns::ENV_KEY => "is not a variable name: letters, digits and '_', not starting with a digit".to_owned(),
        patterns::SANDBOX_PATH => {
            "is not a path below /work: write /work/name or a relative name, without '..', each name at most 63 \
             characters"
                .to_owned()
        }
        other => format!("does not match the pattern {other}"),
    }
}

/// Compiled patterns, kept: the same few are checked on every request.
fn compiled(pattern: &str) -> Result<regex_lite::Regex, regex_lite::Error> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, regex_lite::Regex>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(regex) = cache.lock().ok().and_then(|cache| cache.get(pattern).cloned()) {
        return Ok(regex);
    }
    let regex = regex_lite::Regex::new(pattern)?;
    if let Ok(mut cache) = cache.lock()
        && cache.len() < 256
    {
        cache.insert(pattern.to_owned(), regex.clone());
    }
    Ok(regex)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::HostFacts;
    use crate::{PolicySpec, SandboxPath};

    fn host() -> HostFacts {
        HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 }
    }

    fn accepts(schema: &Value, value: Value) -> bool {
        validate(schema, &value).is_ok()
    }

    #[test]
    fn the_schema_is_derived_strict_and_nullable() {
        let schema = PolicySpec::schema();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        let properties = schema["properties"].as_object().unwrap();
        let spec = serde_json::to_value(Policy::default().to_spec()).unwrap();
        assert_eq!(properties.len(), spec.as_object().unwrap().len(), "every field of the spec is in the schema");
        assert_eq!(properties["memory_mb"]["minimum"], 16);
        assert_eq!(properties["timeout_s"]["minimum"], 0.001);
        assert!(properties["timeout_s"]["description"].as_str().unwrap().contains("Wall-clock"));
        assert!(accepts(&schema, json!({"timeout_s": null, "memory_mb": 64})), "null keeps the default");
        assert!(!accepts(&schema, json!([1.5, 1, 64])), "an array is not a spec");
        assert!(!accepts(&schema, json!({"memroy_mb": 1})));
        assert!(!accepts(&schema, json!({"pids": 0})));
        assert!(!accepts(&schema, json!({"pids": 1.5})));
        assert!(!accepts(&schema, json!({"timeout_s": 5e-324})));
        assert!(!accepts(&schema, json!({"env": {"1X": "a"}})));
        assert!(!accepts(&schema, json!({"env": {"X": "a\u{0}"}})));
        assert!(!accepts(&schema, json!({"backend": "vm"})));
        assert!(!accepts(&schema, json!({"allow_degraded": ["seccomp"]})));
        assert!(!accepts(&schema, json!({"max_connections": 0})));
        assert!(!accepts(&schema, json!({"open_files": 4294967296u64})));
    }

    #[test]
    fn what_the_schema_allows_the_policy_takes_and_the_reverse() {
        // The bounds are the same constants: the edge of the schema is the edge of the check.
        let schema = PolicySpec::schema();
        let cases = [
            json!({"timeout_s": 0.001}),
            json!({"timeout_s": 86400}),
            json!({"cpus": 0.01}),
            json!({"memory_mb": 16}),
            json!({"open_files": 16}),
            json!({"disk_inodes": 64}),
            json!({"max_file_bytes": 100, "max_files_total_bytes": 10}),
            json!({"env": {"_A1": "x"}}),
        ];
        for case in cases {
            assert!(accepts(&schema, case.clone()), "{case}");
            let spec: PolicySpec = serde_json::from_value(case.clone()).unwrap();
            Policy::from_spec(&spec, &host()).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
        let refused = [
            json!({"timeout_s": 0.0009}),
            json!({"timeout_s": 86400.5}),
            json!({"cpus": 0.009}),
            json!({"memory_mb": 15}),
            json!({"open_files": 15}),
            json!({"disk_inodes": 63}),
            json!({"max_network_bytes_in": 0}),
        ];
        for case in refused {
            assert!(!accepts(&schema, case.clone()), "{case}");
            let spec: PolicySpec = serde_json::from_value(case.clone()).unwrap();
            assert!(Policy::from_spec(&spec, &host()).is_err(), "{case}");
        }
    }

    #[test]
    fn the_schema_within_a_ceiling_allows_what_check_within_allows() {
        let spec = PolicySpec {
            timeout_s: Some(30.0),
            allow_hosts: Some(vec!["*.example.org".into(), "pypi.org:443".into()]),
            allow_degraded: Some(vec!["landlock".into()]),
            on_output_limit: Some(OutputOverflow::Kill),
            ..PolicySpec::default()
        };
        let ceiling = Policy::from_spec(&spec, &host()).unwrap();
        let schema = PolicySpec::schema_within(&ceiling);
        let allowed = [
            json!({"timeout_s": 30}),
            json!({"allow_hosts": ["pypi.org:443", "files.example.org", "a.b.example.org:80", "*.example.org"]}),
            json!({"allow_degraded": ["landlock"], "on_output_limit": "kill", "backend": "linux"}),
        ];
        for case in allowed {
            assert!(accepts(&schema, case.clone()), "{case}: {:?}", validate(&schema, &case));
            let request: PolicySpec = serde_json::from_value(case.clone()).unwrap();
            request.check_within(&ceiling).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
        let refused = [
            json!({"timeout_s": 30.5}),
            json!({"memory_mb": 513}),
            json!({"allow_hosts": ["pypi.org"]}),
            json!({"allow_hosts": ["example.org"]}),
            json!({"allow_hosts": ["x.example.org:8080"]}),
            json!({"allow_degraded": ["cgroups"]}),
            json!({"on_output_limit": "truncate"}),
            json!({"backend": "wasm"}),
        ];
        for case in refused {
            assert!(!accepts(&schema, case.clone()), "{case}");
            let request: PolicySpec = serde_json::from_value(case.clone()).unwrap();
            assert!(request.check_within(&ceiling).is_err(), "{case}");
        }
        let closed = PolicySpec::schema_within(&Policy::default());
        assert!(!accepts(&closed, json!({"allow_hosts": ["example.com"]})));
        assert!(accepts(&closed, json!({"allow_hosts": []})));
    }

    #[test]
    fn violations_name_the_path() {
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {
            "policy": PolicySpec::schema(),
            "files": {"type": "array", "items": {"type": "object", "properties": {"path": {"type": "string"}}}},
        }});
        let error = validate(&schema, &json!({"policy": {"memory_mb": "lots"}})).unwrap_err();
        assert_eq!(error.path, "policy.memory_mb");
        assert!(error.to_string().starts_with("policy.memory_mb: must be integer or null"), "{error}");
        assert_eq!(validate(&schema, &json!({"files": [{"path": 1}]})).unwrap_err().path, "files[0].path");
        assert_eq!(validate(&schema, &json!({"surprise": 1})).unwrap_err().path, "surprise");
        assert_eq!(validate(&schema, &json!(["print(42)"])).unwrap_err().path, "");
    }

    #[test]
    fn base64_is_exactly_what_the_decoder_takes() {
        let schema = json!({"type": "string", "pattern": patterns::BASE64});
        for good in ["", "AA==", "AAA=", "AAAA", "aGVsbG8=", "+/+/"] {
            assert!(accepts(&schema, json!(good)), "{good}");
        }
        for bad in ["A", "AB==", "AAB=", "AA=", "AA==AA==", "@@@@", "AAAA\n"] {
            assert!(!accepts(&schema, json!(bad)), "{bad}");
        }
    }

    #[test]
    fn sandbox_paths_are_exactly_what_the_parser_takes() {
        let schema = json!({"type": "string", "pattern": patterns::SANDBOX_PATH});
        let cases = [
            "/work/a.csv",
            "a.csv",
            "a/b",
            "./a",
            ".//a",
            "/work//a/./b/",
            "..a",
            ".a",
            "a/..b",
            "work",
            "/work",
            "/work/",
            "/workx/a",
            "/etc/passwd",
            "../a",
            "a/../b",
            "a/..",
            ".",
            "./",
            "",
            "a\u{0}b",
            "/work/.",
            "/work/..",
            "//work/a",
            "/work/a/..",
        ];
        for case in cases {
            assert_eq!(accepts(&schema, json!(case)), SandboxPath::parse(case).is_ok(), "{case:?}");
        }
        // Names: 63 characters in the schema, 255 bytes in the parser.
        let long = |n: usize, c: char| format!("/work/{}", c.to_string().repeat(n));
        assert!(accepts(&schema, json!(long(63, 'é'))) && SandboxPath::parse(&long(63, 'é')).is_ok());
        assert!(!accepts(&schema, json!(long(64, 'a'))));
        assert!(accepts(&schema, json!(format!("/work/..{}", "a".repeat(61)))));
        assert!(!accepts(&schema, json!(format!("/work/..{}", "a".repeat(62)))));
        assert!(SandboxPath::parse(&long(256, 'a')).is_err() && SandboxPath::parse(&long(128, 'é')).is_err());
    }

    #[test]
    fn a_keyword_it_cannot_check_is_refused() {
        let schema = json!({"type": "array", "uniqueItems": true});
        assert!(validate(&schema, &json!([1, 1])).unwrap_err().message.contains("uniqueItems"));
    }
}
