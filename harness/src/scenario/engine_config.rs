//! `engine.config` of a bundled engine: overrides of its model config (e.g. `{"kv_share": true}` turns on glm's
//! cross-slot sharing), applied to the preset's `ModelConfig` before the fixture weights are generated.
//!
//! Keys are checked against the arch's config at load time, so a typo is an input error naming the key rather
//! than an override that silently does nothing.

use kvproof_engines::config::{ModelConfig, Preset};
use serde_json::{Map, Value};

/// The overrides as written in the scenario file.
pub type ConfigOverrides = Map<String, Value>;

/// Keys the engine spec itself sets: overriding them would make the label and the manifest lie.
const FIXED: &[&str] = &["arch", "preset"];

/// The config of `arch` at `preset` with `overrides` applied and validated. Errors name the key at fault.
pub fn model_config(arch: &str, preset: Preset, overrides: &ConfigOverrides) -> Result<ModelConfig, String> {
    let base = ModelConfig::preset(arch, preset).map_err(|e| format!("engine.arch: {e}"))?;
    if overrides.is_empty() {
        return Ok(base);
    }
    let Value::Object(mut fields) =
        serde_json::to_value(&base).map_err(|e| format!("engine.config: cannot represent the {arch} config: {e}"))?
    else {
        return Err(format!("engine.config: the {arch} config is not an object"));
    };
    for (key, value) in overrides {
        if FIXED.contains(&key.as_str()) {
            return Err(format!("engine.config.{key}: set by the engine's `{key}`, not by an override"));
        }
        if !fields.contains_key(key) {
            let mut known: Vec<&str> =
                fields.keys().map(String::as_str).filter(|k| !FIXED.contains(k)).collect::<Vec<_>>();
            known.sort_unstable();
            return Err(format!("engine.config.{key}: not a field of the model config (fields: {})", known.join(", ")));
        }
        fields.insert(key.clone(), value.clone());
    }
    let config: ModelConfig =
        serde_json::from_value(Value::Object(fields)).map_err(|e| format!("engine.config: {e}"))?;
    config.validate().map_err(|e| format!("engine.config: {e}"))?;
    Ok(config)
}

/// A short rendering for labels: `{"kv_share":true}`.
pub fn describe(overrides: &ConfigOverrides) -> String {
    Value::Object(overrides.clone()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overrides(json: &str) -> ConfigOverrides {
        match serde_json::from_str(json).expect("json") {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn overrides_apply_to_the_preset() {
        let c = model_config("glm", Preset::Tiny, &overrides(r#"{"kv_share": true}"#)).expect("config");
        assert!(c.kv_share);
        let base = ModelConfig::preset("glm", Preset::Tiny).expect("preset");
        assert_eq!(ModelConfig { kv_share: false, ..c }, base, "nothing else changes");
        assert_eq!(model_config("glm", Preset::Tiny, &ConfigOverrides::new()).expect("none"), base);
    }

    #[test]
    fn bad_overrides_name_the_key() {
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"kv_shared": true}"#)).expect_err("typo");
        assert!(e.starts_with("engine.config.kv_shared: not a field") && e.contains("kv_share"), "{e}");
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"kv_share": 3}"#)).expect_err("type");
        assert!(e.starts_with("engine.config:") && e.contains("boolean"), "{e}");
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"arch": "kimi"}"#)).expect_err("fixed");
        assert!(e.starts_with("engine.config.arch:"), "{e}");
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"heads": 3}"#)).expect_err("invalid");
        assert!(e.contains("`heads`"), "{e}");
    }
}
