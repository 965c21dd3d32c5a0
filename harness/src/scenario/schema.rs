//! The JSON schema of scenario files (`scenarios/schema.json`, printed by `kvproof schema`), generated from the
//! types the loader reads: every params struct, `Assertions`, `EngineSpec` and the enums derive `JsonSchema`, so
//! their documentation and defaults are the schema's. The top level is read by a hand-written visitor; its
//! schema below says what that visitor accepts.

use std::borrow::Cow;
use strum::IntoEnumIterator;

use kvproof_engines::config::Preset;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};

use super::params::{AgenticParams, BoundaryParams, GrowthParams, StalenessParams, StressParams};
use super::types::{Assertions, EngineSpec, Kind, Scenario};

/// Where the schema says it lives; editors resolve scenario files' `"$schema": "../schema.json"` by path.
const ID: &str = "https://kvproof.invalid/scenarios/schema.json";

/// The assertions only growth curves may carry (the loader rejects them on any other kind).
const GROWTH_ASSERTIONS: [&str; 5] =
    ["max_warm_ratio", "max_warm_ratio_over_expected", "min_cold_ratio", "min_speedup_of_ideal", "min_reuse_fraction"];

/// The name of a model preset, as scenario files write it.
pub struct PresetName;

impl JsonSchema for PresetName {
    fn schema_name() -> Cow<'static, str> {
        "Preset".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        json_schema!({ "type": "string", "enum": names })
    }
}

/// The schema of `params` for one kind.
fn params_schema(kind: Kind, generator: &mut SchemaGenerator) -> Schema {
    match kind {
        Kind::BoundaryMatrix => generator.subschema_for::<BoundaryParams>(),
        Kind::StressPairs => generator.subschema_for::<StressParams>(),
        Kind::GrowthCurve => generator.subschema_for::<GrowthParams>(),
        Kind::SemanticStaleness => generator.subschema_for::<StalenessParams>(),
        Kind::Agentic => generator.subschema_for::<AgenticParams>(),
    }
}

/// For each kind: `params` has that kind's type, and only growth curves carry the growth assertions.
fn per_kind(generator: &mut SchemaGenerator) -> Vec<Value> {
    Kind::iter()
        .map(|kind| {
            let mut then = Map::new();
            then.insert("params".into(), params_schema(kind, generator).to_value());
            if kind != Kind::GrowthCurve {
                let forbidden: Map<String, Value> =
                    GROWTH_ASSERTIONS.iter().map(|name| (name.to_string(), Value::Bool(false))).collect();
                then.insert("assert".into(), serde_json::json!({ "properties": forbidden }));
            }
            serde_json::json!({
                "if": { "properties": { "kind": { "const": kind.name() } }, "required": ["kind"] },
                "then": { "properties": then },
            })
        })
        .collect()
}

impl JsonSchema for Scenario {
    fn schema_name() -> Cow<'static, str> {
        "Scenario".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let engine = generator.subschema_for::<EngineSpec>();
        let kind = generator.subschema_for::<Kind>();
        let assert = generator.subschema_for::<Assertions>();
        let per_kind = per_kind(generator);
        json_schema!({
            "$id": ID,
            "title": "kvproof scenario",
            "description": "One scenario: an engine, a kind of trial, its parameters and its assertions. Unknown keys \
                            are rejected. `kind` must come before `params` in the file (params are parsed as the \
                            kind's type).",
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "engine", "kind"],
            "properties": {
                "$schema": { "type": "string", "description": "The schema editors check the file against." },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Unique within a run; keys results and reports."
                },
                "description": { "type": "string", "description": "What the scenario proves." },
                "engine": engine,
                "seed": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Seeds every text, length and order the scenario generates."
                },
                "kind": kind,
                "params": {
                    "type": "object",
                    "description": "The parameters of the kind: each kind's type below (defaults when left out)."
                },
                "assert": assert,
            },
            "allOf": per_kind,
        })
    }
}

/// Doc comments are wrapped at the source's width; a description is read in an editor's tooltip, so each
/// paragraph becomes one line.
fn unwrap_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(text) if key == "description" => {
                        *text = text.split("\n\n").map(|p| p.replace('\n', " ")).collect::<Vec<_>>().join("\n\n");
                    }
                    _ => unwrap_descriptions(value),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// The schema of scenario files, as `scenarios/schema.json` holds it (pretty JSON with the usual keywords first,
/// one trailing newline).
pub fn schema_json() -> String {
    let mut schema = schemars::schema_for!(Scenario);
    if let Some(root) = schema.as_object_mut() {
        let mut value = Value::Object(std::mem::take(root));
        unwrap_descriptions(&mut value);
        if let Value::Object(map) = value {
            *root = map;
        }
    }
    // A schema is a JSON value: it always has a text form.
    let text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    format!("{text}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_selects_its_params_and_only_growth_curves_take_growth_assertions() {
        let schema: Value = serde_json::from_str(&schema_json()).expect("json");
        let all_of = schema["allOf"].as_array().expect("allOf");
        assert_eq!(all_of.len(), Kind::iter().count());
        for (rule, kind) in all_of.iter().zip(Kind::iter()) {
            assert_eq!(rule["if"]["properties"]["kind"]["const"], kind.name());
            let params = rule["then"]["properties"]["params"]["$ref"].as_str().expect("$ref");
            assert!(schema.pointer(&params.replacen('#', "", 1)).is_some(), "dangling {params}");
            let forbids = rule["then"]["properties"]["assert"]["properties"]["max_warm_ratio"] == Value::Bool(false);
            assert_eq!(forbids, kind != Kind::GrowthCurve, "{kind}");
        }
        assert_eq!(schema["additionalProperties"], Value::Bool(false));
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    }

    #[test]
    fn documentation_and_defaults_come_from_the_types() {
        let schema: Value = serde_json::from_str(&schema_json()).expect("json");
        let growth = &schema["$defs"]["GrowthParams"]["properties"];
        assert_eq!(growth["turns"]["default"], 12);
        assert_eq!(growth["turns"]["minimum"], 3);
        assert!(growth["turns"]["description"].as_str().is_some_and(|d| d.starts_with("Turns of the conversation")));
        let presets = &schema["$defs"]["Preset"]["enum"];
        assert_eq!(presets, &serde_json::json!(["tiny", "small", "bench"]));
        let rate = schema["$defs"]["Assertions"]["properties"]["max_failure_rate"]["description"].as_str();
        assert!(rate.is_some_and(|d| d.contains("exceeds this. When set, it replaces")), "{rate:?}");
    }
}
