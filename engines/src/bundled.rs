//! The registry of bundled engines: which arches exist, their configs, presets and faults, and how to open one.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::arch::{deepseek, glm, glm53, inkling, kimi, llama};
use crate::config::{ArchConfig, BaseConfig, Preset};
use crate::engine::Engine;
use crate::engine_loop::Arch;
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::fixture::TensorSpec;
use crate::weights::Weights;

pub use crate::engine_loop::{ArchInfo, DeclaredReuse};

/// The config of a bundled engine: one arch's own config type.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ModelConfig {
    Inkling(inkling::Config),
    DeepSeek(deepseek::Config),
    Kimi(kimi::Config),
    Glm53(glm53::Config),
    Glm(glm::Config),
    Llama(llama::Config),
}

/// `$body` with `$c` bound to the arch's config and `$a` to its model type, for whichever arch `$config` is.
macro_rules! with_arch {
    ($config:expr, |$c:ident, $a:ident| $body:expr) => {
        with_arch!(@each $config, $c, $a, $body,
            Inkling => inkling, DeepSeek => deepseek, Kimi => kimi, Glm53 => glm53, Glm => glm, Llama => llama)
    };
    (@each $config:expr, $c:ident, $a:ident, $body:expr, $($variant:ident => $module:ident),*) => {
        match $config {
            $(ModelConfig::$variant($c) => {
                type $a = $module::Model;
                $body
            })*
        }
    };
}

/// A bundled arch's config type, and the variant of `ModelConfig` it is.
trait Bundled: ArchConfig + Into<ModelConfig> + 'static {
    type Model: Arch<Config = Self>;
}

macro_rules! bundled {
    ($($variant:ident => $module:ident),*) => {$(
        impl From<$module::Config> for ModelConfig {
            fn from(c: $module::Config) -> Self {
                ModelConfig::$variant(c)
            }
        }
        impl Bundled for $module::Config {
            type Model = $module::Model;
        }
    )*};
}

bundled!(Inkling => inkling, DeepSeek => deepseek, Kimi => kimi, Glm53 => glm53, Glm => glm, Llama => llama);

impl ModelConfig {
    /// The built-in shape of `arch` at `preset`.
    pub fn preset(arch: &str, preset: Preset) -> Result<Self> {
        Ok((entry(arch)?.preset)(preset))
    }

    /// `arch` at `preset` with `overrides` (a scenario's `engine.config`) applied and validated. Errors name what is
    /// at fault: `engine.arch: ...`, `engine.config.<key>: ...` (a fixed key, or an option the arch does not have,
    /// e.g. `engine.config.kv_share: inkling has no option kv_share (options: ...)`), `engine.config: ...` (a
    /// value of the wrong type, or a failed check).
    pub fn with_overrides(
        arch: &str,
        preset: Preset,
        overrides: &Map<String, Value>,
    ) -> std::result::Result<Self, String> {
        let entry = entry(arch).map_err(|e| format!("engine.arch: {e}"))?;
        (entry.with_overrides)(preset, overrides)
    }

    /// Read a model directory's `config.json`: the arch's own config, an option it does not have an error.
    pub fn load(path: &Path) -> Result<Self> {
        let fields = crate::config::read_json(path)?;
        let bad = |message: String| EngineError::Config { path: path.into(), message };
        let arch = fields.get("arch").and_then(Value::as_str).ok_or_else(|| bad("no `arch` field".into()))?;
        (entry(arch)?.parse)(fields.clone()).map_err(bad)
    }

    pub fn base(&self) -> &BaseConfig {
        with_arch!(self, |c, _A| c.base())
    }

    pub fn arch(&self) -> &str {
        &self.base().arch
    }

    /// The base checks, then the arch's own.
    pub fn validate(&self) -> std::result::Result<(), String> {
        with_arch!(self, |c, _A| c.validate())
    }

    /// Whether the engine shares prefixes across slots (glm's `kv_share`).
    pub fn kv_share(&self) -> bool {
        matches!(self, ModelConfig::Glm(c) if c.kv_share)
    }

    /// The tensors the checkpoint holds, in checkpoint order.
    pub fn tensors(&self) -> Result<Vec<TensorSpec>> {
        with_arch!(self, |c, A| crate::engine_loop::tensors::<A>(c))
    }
}

/// What the registry knows of one arch: its description and how to make its config.
pub struct Entry {
    pub info: ArchInfo,
    /// The arch's config at a preset.
    pub preset: fn(Preset) -> ModelConfig,
    /// The arch's config from a `config.json` object.
    pub parse: fn(Map<String, Value>) -> std::result::Result<ModelConfig, String>,
    /// The arch's config at a preset with a scenario's overrides.
    pub with_overrides: fn(Preset, &Map<String, Value>) -> std::result::Result<ModelConfig, String>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("info", &self.info).finish()
    }
}

fn preset_of<C: Bundled>(p: Preset) -> ModelConfig {
    C::preset(p).into()
}

fn parse_of<C: Bundled>(fields: Map<String, Value>) -> std::result::Result<ModelConfig, String> {
    crate::config::from_json::<C>(fields).map(Into::into)
}

fn overrides_of<C: Bundled>(p: Preset, o: &Map<String, Value>) -> std::result::Result<ModelConfig, String> {
    crate::config::with_overrides::<C>(p, o).map(Into::into)
}

const fn entry_of<C: Bundled>() -> Entry {
    Entry { info: C::Model::INFO, preset: preset_of::<C>, parse: parse_of::<C>, with_overrides: overrides_of::<C> }
}

/// Every bundled engine, in the order `kvproof list` shows them.
pub const ENTRIES: &[Entry] = &[
    entry_of::<inkling::Config>(),
    entry_of::<deepseek::Config>(),
    entry_of::<kimi::Config>(),
    entry_of::<glm53::Config>(),
    entry_of::<glm::Config>(),
    entry_of::<llama::Config>(),
];

/// The descriptions of every bundled engine.
pub fn arches() -> impl Iterator<Item = &'static ArchInfo> {
    ENTRIES.iter().map(|e| &e.info)
}

fn known() -> String {
    arches().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

pub fn entry(name: &str) -> Result<&'static Entry> {
    ENTRIES.iter().find(|e| e.info.name == name).ok_or_else(|| EngineError::UnknownArch(name.to_string(), known()))
}

pub fn arch(name: &str) -> Result<&'static ArchInfo> {
    entry(name).map(|e| &e.info)
}

/// The reuse rule an engine described by `info` declares (CAPS `reuse_rule=`), when it is a bundled arch's.
pub fn declared_rule(info: &crate::engine::EngineInfo) -> Option<String> {
    arch(&info.arch).ok()?.declared_rule(info)
}

/// Check that `fault` applies to `arch`.
pub fn check_fault(arch_name: &str, fault: Option<Fault>) -> Result<()> {
    let info = arch(arch_name)?;
    match fault {
        Some(f) if !info.faults.contains(&f) => Err(EngineError::UnknownFault {
            name: f.name().to_string(),
            arch: arch_name.to_string(),
            known: info.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        }),
        _ => Ok(()),
    }
}

/// Open an engine over a model directory (config.json + model.safetensors).
pub fn open_dir(dir: &Path, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    let config = ModelConfig::load(&dir.join("config.json"))?;
    let weights = Weights::open(&dir.join("model.safetensors"))?;
    open(config, weights, fault)
}

/// Open an engine over a generated fixture held in memory (no files).
pub fn open_preset(arch_name: &str, preset: Preset, seed: u64, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    let config = ModelConfig::preset(arch_name, preset)?;
    let weights = crate::fixture::generate_weights(&config, seed)?;
    open(config, weights, fault)
}

/// Open an engine of `config`'s arch.
pub fn open(config: ModelConfig, weights: Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    check_fault(config.arch(), fault)?;
    with_arch!(config, |c, A| crate::engine_loop::open::<A>(c, &weights, fault))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_of_every_arch_validates() {
        for a in arches() {
            for p in Preset::ALL {
                let c = ModelConfig::preset(a.name, p).expect("preset");
                c.validate().unwrap_or_else(|e| panic!("{} {p}: {e}", a.name));
                assert_eq!((c.arch(), c.base().preset.as_deref()), (a.name, Some(p.name())));
            }
        }
    }

    #[test]
    fn tiny_inkling_has_one_global_layer() {
        let c = inkling::Config::preset(Preset::Tiny);
        assert_eq!((0..c.layers).filter(|&l| c.is_global(l)).count(), 1);
    }

    #[test]
    fn the_tiny_inkling_info_fixture_is_what_a_tiny_inkling_reports() {
        let engine = open_preset("inkling", Preset::Tiny, 0, None).expect("tiny inkling");
        let reported = crate::engine::EngineInfo { model_hash: String::new(), cost: None, ..engine.info() };
        assert_eq!(reported, crate::engine::EngineInfo::tiny_inkling());
    }

    /// `json` as `<dir>/<name>/config.json`.
    fn write_config(dir: &std::path::Path, name: &str, json: &Value) -> std::path::PathBuf {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("config.json");
        std::fs::write(&path, json.to_string()).expect("write");
        path
    }

    #[test]
    fn config_json_round_trips_and_bad_ones_name_file_and_field() {
        let dir = crate::scratch_dir::ScratchDir::new(&format!("config-{}", std::process::id()));
        for a in arches() {
            let c = ModelConfig::preset(a.name, Preset::Small).expect("preset");
            let path = write_config(&dir, a.name, &serde_json::to_value(&c).expect("json"));
            assert_eq!(ModelConfig::load(&path).expect("load"), c, "{}", a.name);
        }
        let mut json = serde_json::to_value(ModelConfig::preset("inkling", Preset::Tiny).expect("tiny")).expect("json");
        json["heads"] = 3.into();
        let err = ModelConfig::load(&write_config(&dir, "heads", &json)).expect_err("invalid").to_string();
        assert!(err.contains("config.json") && err.contains("`heads`"), "{err}");
        json["heads"] = 4.into();
        json["kv_share"] = true.into();
        let err = ModelConfig::load(&write_config(&dir, "option", &json)).expect_err("not inkling's").to_string();
        assert!(err.contains("config.json") && err.contains("inkling has no option kv_share (options: "), "{err}");
    }

    #[test]
    fn an_option_another_arch_has_is_an_error_naming_arch_and_option() {
        let o = |json: &str| serde_json::from_str::<Map<String, Value>>(json).expect("json");
        for (arch, option) in [
            ("inkling", "kv_share"),
            ("deepseek", "conv_kernel"),
            ("kimi", "window"),
            ("glm", "prompt_rows"),
            ("glm53", "kv_lora"),
        ] {
            let e =
                ModelConfig::with_overrides(arch, Preset::Tiny, &o(&format!("{{\"{option}\": 1}}"))).expect_err(option);
            assert!(e.starts_with(&format!("engine.config.{option}: {arch} has no option {option} (options: ")), "{e}");
        }
        for (arch, option) in
            [("deepseek", "window"), ("deepseek", "compress_ratio"), ("kimi", "conv_kernel"), ("glm", "kv_lora")]
        {
            let e =
                ModelConfig::with_overrides(arch, Preset::Tiny, &o(&format!("{{\"{option}\": 0}}"))).expect_err(option);
            assert!(e.starts_with(&format!("engine.config: field `{option}` must be positive for {arch} (")), "{e}");
        }
        let c = ModelConfig::with_overrides("glm", Preset::Tiny, &o(r#"{"kv_share": true, "initial_capacity": 16}"#))
            .expect("glm");
        assert!(c.kv_share());
        assert_eq!(c.base().initial_capacity, 16);
    }
}
