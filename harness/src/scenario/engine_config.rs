//! `engine.config` of a bundled engine: overrides of its arch's config (e.g. `{"kv_share": true}` turns on glm's
//! cross-slot sharing), applied to the preset before the fixture weights are generated.
//!
//! The engines crate checks every key against the arch's own config, so a typo or an option the arch does not
//! have is an input error naming the key (`engine.config.kv_share: inkling has no option kv_share (...)`) rather
//! than an override that silently does nothing.

use kvproof_engines::bundled::ModelConfig;
use kvproof_engines::config::Preset;
use serde_json::{Map, Value};

/// The overrides as written in the scenario file.
pub type ConfigOverrides = Map<String, Value>;

/// The config of `arch` at `preset` with `overrides` applied and validated. Errors name the key at fault.
pub fn model_config(arch: &str, preset: Preset, overrides: &ConfigOverrides) -> Result<ModelConfig, String> {
    ModelConfig::with_overrides(arch, preset, overrides)
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
        assert!(c.kv_share());
        let base = ModelConfig::preset("glm", Preset::Tiny).expect("preset");
        let ModelConfig::Glm(g) = c else { panic!("not glm: {c:?}") };
        assert_eq!(
            ModelConfig::from(kvproof_engines::arch::glm::Config { kv_share: false, ..g }),
            base,
            "nothing else changes"
        );
        assert_eq!(model_config("glm", Preset::Tiny, &ConfigOverrides::new()).expect("none"), base);
    }

    #[test]
    fn bad_overrides_name_the_key() {
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"kv_shared": true}"#)).expect_err("typo");
        assert!(
            e.starts_with("engine.config.kv_shared: glm has no option kv_shared") && e.contains("kv_share,"),
            "{e}"
        );
        let e = model_config("inkling", Preset::Tiny, &overrides(r#"{"kv_share": true}"#)).expect_err("not inkling's");
        assert!(
            e.starts_with("engine.config.kv_share: inkling has no option kv_share (options: ") && e.contains("window"),
            "{e}"
        );
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"kv_share": 3}"#)).expect_err("type");
        assert!(e.starts_with("engine.config:") && e.contains("boolean"), "{e}");
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"arch": "kimi"}"#)).expect_err("fixed");
        assert!(e.starts_with("engine.config.arch:"), "{e}");
        let e = model_config("glm", Preset::Tiny, &overrides(r#"{"heads": 3}"#)).expect_err("invalid");
        assert!(e.contains("`heads`"), "{e}");
        let e = model_config("nope", Preset::Tiny, &ConfigOverrides::new()).expect_err("arch");
        assert!(e.starts_with("engine.arch:"), "{e}");
    }
}
