//! The fixed schema and description of each tool, and a validator of call arguments against that schema.
//!
//! The schemas are flat (every argument is a string), so a small hand-written validator covers them exactly and
//! the system prompt and the sandbox can never disagree about what a call must carry.

use serde_json::{json, Map, Value};

use crate::scenario::params::ToolName;

/// The arguments of a tool: (name, JSON type) pairs, all required.
fn arguments(t: ToolName) -> &'static [(&'static str, &'static str)] {
    match t {
        ToolName::ListDir | ToolName::ReadFile => &[("path", "string")],
        ToolName::WriteFile => &[("path", "string"), ("content", "string")],
        ToolName::Search => &[("pattern", "string")],
        ToolName::RunTests => &[],
        ToolName::Calculator => &[("expression", "string")],
        ToolName::Finish => &[("answer", "string")],
    }
}

/// The JSON Schema of a tool's arguments, as the system prompt shows it.
pub fn schema(t: ToolName) -> Value {
    let mut properties = Map::new();
    for (key, ty) in arguments(t) {
        properties.insert((*key).to_string(), json!({ "type": ty }));
    }
    let required: Vec<&str> = arguments(t).iter().map(|(key, _)| *key).collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// A one-line description of what the tool does (short: small models read it in a small context).
pub fn describe(t: ToolName) -> &'static str {
    match t {
        ToolName::ListDir => "List a directory (\"\" is the root); directories end with /.",
        ToolName::ReadFile => "Read a file's text.",
        ToolName::WriteFile => "Replace or create a file with the given text.",
        ToolName::Search => "Find lines containing a string in every file, as path:line: text.",
        ToolName::RunTests => "Run the task's tests over the files.",
        ToolName::Calculator => "Evaluate an arithmetic expression (+ - * / % and parentheses).",
        ToolName::Finish => "End the session with your answer.",
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether `args` fits the tool's schema: an object, every required key present with the right JSON type, no
/// other key. The error names the key and what was wrong with it.
pub fn check_arguments(t: ToolName, args: &Value) -> Result<(), String> {
    let Value::Object(map) = args else {
        return Err(format!("{}: arguments must be an object, not {}", t.name(), type_of(args)));
    };
    let expected = arguments(t);
    for (key, ty) in expected {
        match map.get(*key) {
            None => return Err(format!("{}: missing required argument `{key}`", t.name())),
            Some(v) if type_of(v) != *ty => {
                return Err(format!("{}: argument `{key}` must be a {ty}, not {}", t.name(), type_of(v)))
            }
            Some(_) => {}
        }
    }
    if let Some(key) = map.keys().find(|k| !expected.iter().any(|(e, _)| e == k)) {
        let shown: String = key.chars().take(64).collect();
        return Err(format!("{}: unknown argument `{shown}`", t.name()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    #[test]
    fn every_schema_is_a_closed_object_whose_required_keys_are_its_properties() {
        for t in ToolName::iter() {
            let s = schema(t);
            assert_eq!(s["type"], "object");
            assert_eq!(s["additionalProperties"], false);
            let props = s["properties"].as_object().expect("properties");
            let required = s["required"].as_array().expect("required");
            assert_eq!(props.len(), required.len(), "{t}");
            for r in required {
                assert!(props.contains_key(r.as_str().expect("key")), "{t}: {r}");
            }
            assert!(!describe(t).is_empty());
        }
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        assert!(check_arguments(ToolName::ReadFile, &json!({"path": "a.txt"})).is_ok());
        assert!(check_arguments(ToolName::RunTests, &json!({})).is_ok());
        let e = check_arguments(ToolName::WriteFile, &json!({"path": "a"})).expect_err("missing");
        assert!(e.contains("`content`") && e.contains("missing"), "{e}");
        let e = check_arguments(ToolName::ReadFile, &json!({"path": 3})).expect_err("type");
        assert!(e.contains("`path`") && e.contains("string") && e.contains("number"), "{e}");
        let e = check_arguments(ToolName::RunTests, &json!({"verbose": true})).expect_err("unknown");
        assert!(e.contains("`verbose`"), "{e}");
        let e = check_arguments(ToolName::Finish, &json!(["x"])).expect_err("not an object");
        assert!(e.contains("object") && e.contains("array"), "{e}");
    }
}
