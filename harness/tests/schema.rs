//! scenarios/schema.json against every scenario file in the repository, and against the Rust loader: both must
//! accept every committed scenario, and both must reject the same malformed ones.
//!
//! The validator below implements the JSON Schema keywords schema.json uses and refuses any other keyword, so
//! the schema cannot quietly grow a rule this test does not enforce.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Validator<'a> {
    root: &'a Value,
}

const ANNOTATIONS: &[&str] = &["$schema", "$id", "title", "description", "$defs"];

impl Validator<'_> {
    fn resolve(&self, reference: &str) -> &Value {
        let path = reference.strip_prefix("#/").unwrap_or_else(|| panic!("only local refs are supported: {reference}"));
        path.split('/').fold(self.root, |v, key| v.get(key).unwrap_or_else(|| panic!("dangling $ref {reference}")))
    }

    fn type_ok(t: &str, v: &Value) -> bool {
        match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "number" => v.is_number(),
            "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
            other => panic!("unknown type {other}"),
        }
    }

    /// Errors of `v` against `schema`, each with the JSON pointer where it occurred.
    fn errors(&self, schema: &Value, v: &Value, at: &str) -> Vec<String> {
        let mut errs = Vec::new();
        let Some(obj) = schema.as_object() else {
            panic!("schema at {at} is not an object");
        };
        let num = |k: &str| obj.get(k).and_then(Value::as_f64);
        for (key, rule) in obj {
            match key.as_str() {
                k if ANNOTATIONS.contains(&k) => {}
                "type" => {
                    let ok = match rule {
                        Value::String(t) => Self::type_ok(t, v),
                        Value::Array(ts) => ts.iter().any(|t| Self::type_ok(t.as_str().unwrap_or_default(), v)),
                        _ => panic!("bad type rule"),
                    };
                    if !ok {
                        errs.push(format!("{at}: not of type {rule}"));
                    }
                }
                "enum" => {
                    if !rule.as_array().is_some_and(|a| a.contains(v)) {
                        errs.push(format!("{at}: {v} not in {rule}"));
                    }
                }
                "const" => {
                    if rule != v {
                        errs.push(format!("{at}: {v} is not {rule}"));
                    }
                }
                "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
                    if let (Some(x), Some(b)) = (v.as_f64(), num(key)) {
                        let ok = match key.as_str() {
                            "minimum" => x >= b,
                            "maximum" => x <= b,
                            "exclusiveMinimum" => x > b,
                            _ => x < b,
                        };
                        if !ok {
                            errs.push(format!("{at}: {x} violates {key} {b}"));
                        }
                    }
                }
                "minLength" => {
                    if let (Some(s), Some(n)) = (v.as_str(), num(key)) {
                        if (s.chars().count() as f64) < n {
                            errs.push(format!("{at}: shorter than {n}"));
                        }
                    }
                }
                "minItems" | "maxItems" => {
                    if let (Some(a), Some(n)) = (v.as_array(), num(key)) {
                        let len = a.len() as f64;
                        if (key == "minItems" && len < n) || (key == "maxItems" && len > n) {
                            errs.push(format!("{at}: {key} {n} violated ({len})"));
                        }
                    }
                }
                "items" => {
                    if let Some(a) = v.as_array() {
                        for (i, item) in a.iter().enumerate() {
                            errs.extend(self.errors(rule, item, &format!("{at}/{i}")));
                        }
                    }
                }
                "required" => {
                    if let Some(o) = v.as_object() {
                        for name in rule.as_array().into_iter().flatten().filter_map(Value::as_str) {
                            if !o.contains_key(name) {
                                errs.push(format!("{at}: missing required `{name}`"));
                            }
                        }
                    }
                }
                "properties" => {
                    if let (Some(o), Some(props)) = (v.as_object(), rule.as_object()) {
                        for (name, sub) in props {
                            if let Some(x) = o.get(name) {
                                errs.extend(self.errors(sub, x, &format!("{at}/{name}")));
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    assert_eq!(rule, &Value::Bool(false), "only additionalProperties: false is supported");
                    if let Some(o) = v.as_object() {
                        let props = obj.get("properties").and_then(Value::as_object);
                        for name in o.keys() {
                            if !props.is_some_and(|p| p.contains_key(name)) {
                                errs.push(format!("{at}: unknown key `{name}`"));
                            }
                        }
                    }
                }
                "$ref" => errs.extend(self.errors(self.resolve(rule.as_str().unwrap_or_default()), v, at)),
                "allOf" => {
                    for sub in rule.as_array().into_iter().flatten() {
                        errs.extend(self.errors(sub, v, at));
                    }
                }
                "oneOf" => {
                    let matching =
                        rule.as_array().into_iter().flatten().filter(|s| self.errors(s, v, at).is_empty()).count();
                    if matching != 1 {
                        errs.push(format!("{at}: matches {matching} of the oneOf branches, not exactly 1"));
                    }
                }
                "if" => {
                    if self.errors(rule, v, at).is_empty() {
                        if let Some(then) = obj.get("then") {
                            errs.extend(self.errors(then, v, at));
                        }
                    }
                }
                "then" => {}
                other => panic!("schema.json uses `{other}`, which this validator does not implement"),
            }
        }
        errs
    }
}

fn schema() -> Value {
    let text = std::fs::read_to_string(repo().join("scenarios/schema.json")).expect("scenarios/schema.json");
    serde_json::from_str(&text).expect("schema.json is JSON")
}

fn validate(schema: &Value, doc: &Value) -> Vec<String> {
    Validator { root: schema }.errors(schema, doc, "")
}

fn scenario_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read scenarios/") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            scenario_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "json") && p.file_name().is_some_and(|n| n != "schema.json") {
            out.push(p);
        }
    }
}

#[test]
fn every_scenario_in_the_repo_satisfies_the_schema_and_loads() {
    let schema = schema();
    let mut files = Vec::new();
    scenario_files(&repo().join("scenarios"), &mut files);
    assert!(files.len() >= 4, "expected the PR scenarios and examples, found {files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let doc: Value = serde_json::from_str(&text).expect("json");
        let errs = validate(&schema, &doc);
        assert!(errs.is_empty(), "{}: {errs:?}", f.display());
        kvproof::scenario::load_file(f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn schema_and_loader_agree_on_good_and_bad_documents() {
    let schema = schema();
    let good = [
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
        r#"{"name": "g", "engine": {"arch": "inkling", "preset": "small"}, "kind": "growth-curve",
            "params": {"turns": 10, "opening": 16, "user_len": 40, "max_tokens": 16, "repeats": 5, "cold_repeats": 2},
            "assert": {"max_warm_ratio": 1.2, "min_cold_ratio": 3, "min_speedup_of_ideal": 0.5, "min_reuse_fraction": 0.8}}"#,
        r#"{"name": "s", "engine": {"arch": "glm"}, "kind": "semantic-staleness",
            "params": {"cases": 3, "contexts": ["previous-turn", "other-slot"], "user_len": [4, 9], "other_slot": 2},
            "assert": {"max_failure_rate": 0.05}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling", "preset": "small", "seed": 3, "fault": null}, "kind": "boundary-matrix",
            "params": {"cases": ["extend", "diverge-last"], "max_tokens": 4, "slot": 0}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling", "fault": "memcmp-short"}, "kind": "stress-pairs",
            "params": {"pairs": 10, "turns": [2, 3], "user_len": [1, 9], "max_tokens": 2},
            "assert": {"max_failure_rate": 0.01, "confidence": 0.9, "state": false, "control": true}}"#,
        r#"{"$schema": "../schema.json", "name": "a", "description": "d", "seed": 4,
            "engine": {"command": ["x", "--y"], "timeout_ms": 100}, "kind": "stress-pairs"}"#,
        r#"{"name": "a", "engine": {"arch": "glm", "config": {"kv_share": true}}, "kind": "boundary-matrix",
            "params": {"cases": ["share", "grid-diverge", "cancel-retry"]}}"#,
    ];
    for g in good {
        let doc: Value = serde_json::from_str(g).expect("json");
        assert!(validate(&schema, &doc).is_empty(), "schema rejects {g}: {:?}", validate(&schema, &doc));
        kvproof::scenario::load_str(Path::new("good.json"), g).unwrap_or_else(|e| panic!("loader rejects {g}: {e}"));
    }
    let bad = [
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "extra": 1}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "assert": {"max_warm_ratio": 1.2}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": {"turns": 2}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": {"repeat": 2}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "assert": {"min_reuse_fraction": 1.5}}"#,
        r#"{"name": "a", "engine": {"arch": "glm"}, "kind": "semantic-staleness", "params": {"contexts": ["yesterday"]}}"#,
        r#"{"name": "a", "engine": {"arch": "glm"}, "kind": "semantic-staleness", "params": {"cases": 0}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"pair": 1}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"cases": ["nope"]}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"pairs": 3}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling", "command": ["x"]}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"command": ["x"], "seed": 1}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"command": ["x"], "config": {"kv_share": true}}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"arch": "glm", "config": 3}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"command": []}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"arch": "inkling", "preset": "huge"}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth"}"#,
        r#"{"engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
        r#"{"name": "", "engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "assert": {"confidence": 1}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [2]}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [1, 3]}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"pairs": -1}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "seed": 1.5}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"max_tokens": 100000}}"#,
        r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [2, 1000]}}"#,
    ];
    for b in bad {
        let doc: Value = serde_json::from_str(b).expect("json");
        assert!(!validate(&schema, &doc).is_empty(), "schema accepts {b}");
        assert!(kvproof::scenario::load_str(Path::new("bad.json"), b).is_err(), "loader accepts {b}");
    }
}

#[test]
fn the_validator_refuses_keywords_it_does_not_implement() {
    let schema: Value = serde_json::json!({"type": "object", "patternProperties": {}});
    let result = std::panic::catch_unwind(|| validate(&schema, &serde_json::json!({})));
    assert!(result.is_err(), "an unimplemented keyword must not be ignored");
}
