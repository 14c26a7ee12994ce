//! The Python package's typed view of the policy (`python/airlock/_spec.py`)
//! is generated from [`PolicySpec::schema`], so that a limit added to the
//! spec reaches Python without a hand edit. This test fails when the file
//! differs from what the schema makes; `AIRLOCK_BLESS=1` rewrites it.

// A test: a failure is a failed test, said plainly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fmt::Write;

use airlock_policy::PolicySpec;
use serde_json::Value;

fn python_type(property: &Value) -> String {
    if let Some(choices) = property.get("anyOf").and_then(Value::as_array) {
        // `T | null`, as schemars writes an optional enum.
        let types: Vec<String> = choices.iter().map(python_type).collect();
        let null = types.iter().any(|t| t == "None");
        let others: Vec<&String> = types.iter().filter(|t| *t != "None").collect();
        let base = match others.as_slice() {
            [one] => (*one).clone(),
            _ => format!("Union[{}]", others.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")),
        };
        return if null { format!("Optional[{base}]") } else { base };
    }
    if let Some(choices) = property.get("oneOf").and_then(Value::as_array)
        && let Some(names) =
            choices.iter().map(|c| c["const"].as_str().map(|v| format!("{v:?}"))).collect::<Option<Vec<_>>>()
    {
        return format!("Literal[{}]", names.join(", "));
    }
    if property["type"] == "null" {
        return "None".to_owned();
    }
    let kinds: Vec<&str> = match &property["type"] {
        Value::String(kind) => vec![kind.as_str()],
        Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let enumerated =
        property.get("enum").and_then(Value::as_array).filter(|_| kinds.is_empty() || kinds.contains(&"string"));
    let base = match kinds.iter().find(|k| **k != "null").copied().or(enumerated.map(|_| "string")) {
        Some("number") => "float".to_owned(),
        Some("integer") => "int".to_owned(),
        Some("boolean") => "bool".to_owned(),
        Some("array") => format!("List[{}]", python_type(&property["items"])),
        Some("object") => "Dict[str, str]".to_owned(),
        Some("string") => match property.get("enum").and_then(Value::as_array) {
            Some(values) => {
                let names: Vec<String> = values.iter().filter_map(Value::as_str).map(|v| format!("{v:?}")).collect();
                format!("Literal[{}]", names.join(", "))
            }
            None => "str".to_owned(),
        },
        _ => "Any".to_owned(),
    };
    if kinds.contains(&"null") { format!("Optional[{base}]") } else { base }
}

fn render() -> String {
    let schema = PolicySpec::schema();
    let properties = schema["properties"].as_object().unwrap();
    let mut out = String::from(
        "# Generated from airlock-policy's PolicySpec schema: do not edit. Regenerate with\n\
         #   AIRLOCK_BLESS=1 cargo test -p airlock-policy --test python_stubs\n\
         \"\"\"The policy as airlock's one schema states it: fields, types, bounds.\"\"\"\n\n\
         from typing import Any, Dict, List, Literal, Optional, TypedDict, Union\n\n\n\
         class PolicySpec(TypedDict, total=False):\n    \"\"\"Every field optional; None keeps the default.\"\"\"\n\n",
    );
    for (name, property) in properties {
        let _ = writeln!(out, "    {name}: {}", python_type(property));
        let description = property["description"].as_str().unwrap_or("").replace('\n', " ");
        let _ = writeln!(out, "    \"\"\"{description}\"\"\"\n");
    }
    out.push_str("\n#: The bounds of each numeric field: (minimum, maximum), None where there is none.\nBOUNDS = {\n");
    for (name, property) in properties {
        if property.get("minimum").is_some() || property.get("maximum").is_some() {
            let bound = |key: &str| property.get(key).map_or("None".to_owned(), |v| v.to_string());
            let _ = writeln!(out, "    {name:?}: ({}, {}),", bound("minimum"), bound("maximum"));
        }
    }
    out.push_str("}\n\n#: The fields one run may set for itself (`Sandbox.run(..., timeout_s=...)`).\nPER_RUN = (\n");
    for field in PolicySpec::PER_RUN {
        let _ = writeln!(out, "    {field:?},");
    }
    out.push_str(")\n");
    out
}

#[test]
fn the_python_spec_is_generated_from_the_schema() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/airlock/_spec.py");
    let expected = render();
    if std::env::var_os("AIRLOCK_BLESS").is_some() {
        std::fs::write(&path, &expected).unwrap();
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{} is not what the schema makes; run AIRLOCK_BLESS=1 cargo test -p airlock-policy --test python_stubs",
        path.display()
    );
    for field in PolicySpec::PER_RUN {
        assert!(PolicySpec::schema()["properties"].get(field).is_some(), "{field} is not a spec field");
    }
}
