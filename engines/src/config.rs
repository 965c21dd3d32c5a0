//! `config.json`: the shape of a model — the base every arch shares plus each arch's own options (the arch's
//! config type lives in its folder). Lenient on read for what an older file omits, strict on what a config has
//! no option for.

use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Size presets every bundled engine offers, named in snake_case (`tiny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Preset {
    /// Runs in milliseconds: CI.
    Tiny,
    /// Big enough for timing to mean something.
    Small,
    /// Prefill of 4k tokens takes measurable time.
    Bench,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Tiny, Preset::Small, Preset::Bench];
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl FromStr for Preset {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        Preset::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| EngineError::UnknownPreset(s.to_string()))
    }
}

fn default_theta() -> f32 {
    10000.0
}
fn default_eps() -> f32 {
    1e-5
}
fn one() -> usize {
    1
}
/// The serde default of an arch switch that is on unless a config turns it off (one home for every arch's).
pub(crate) fn on() -> bool {
    true
}

/// The fields every arch's config shares: the transformer's shape, the MoE FFN, and how the engine serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseConfig {
    pub arch: String,
    #[serde(default)]
    pub preset: Option<String>,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Intermediate size of one expert.
    pub ffn: usize,
    pub experts: usize,
    pub top_k: usize,
    #[serde(default = "one")]
    pub shared_experts: usize,
    pub max_ctx: usize,
    /// Positions allocated for a fresh slot; capacity grows (doubling) from there.
    pub initial_capacity: usize,
    /// Rows per prefill segment.
    pub prefill_chunk: usize,
    #[serde(default = "one")]
    pub slots: usize,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default = "default_eps")]
    pub norm_eps: f32,
}

impl BaseConfig {
    /// The shared shape of `preset`, before an arch sets its own options (and changes what it must).
    pub fn preset(arch: &str, preset: Preset) -> Self {
        let (hidden, layers, heads, kv_heads, head_dim, ffn, experts, max_ctx, initial_capacity, prefill_chunk) =
            match preset {
                Preset::Tiny => (64, 8, 4, 2, 16, 64, 4, 1024, 64, 16),
                Preset::Small => (256, 12, 8, 4, 32, 256, 8, 8192, 256, 64),
                Preset::Bench => (512, 12, 8, 4, 64, 512, 8, 16384, 1024, 128),
            };
        BaseConfig {
            arch: arch.into(),
            preset: Some(preset.name().into()),
            vocab: crate::tokenizer::VOCAB,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn,
            experts,
            top_k: 2,
            shared_experts: 1,
            max_ctx,
            initial_capacity,
            prefill_chunk,
            slots: 1,
            rope_theta: 10000.0,
            norm_eps: 1e-5,
        }
    }

    /// Shape checks that would otherwise surface as index panics deep in a kernel.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab", self.vocab),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("ffn", self.ffn),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("max_ctx", self.max_ctx),
            ("initial_capacity", self.initial_capacity),
            ("prefill_chunk", self.prefill_chunk),
            ("slots", self.slots),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("field `{name}` must be positive"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!("field `heads` ({}) must be a multiple of `kv_heads` ({})", self.heads, self.kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("field `head_dim` ({}) must be even (rope pairs)", self.head_dim));
        }
        if self.top_k > self.experts {
            return Err(format!("field `top_k` ({}) exceeds `experts` ({})", self.top_k, self.experts));
        }
        if self.vocab < crate::tokenizer::VOCAB {
            return Err(format!("field `vocab` ({}) is below the tokenizer's {}", self.vocab, crate::tokenizer::VOCAB));
        }
        if self.initial_capacity > self.max_ctx {
            return Err("field `initial_capacity` exceeds `max_ctx`".into());
        }
        Ok(())
    }
}

/// An arch's own checks that options are positive: the first of `fields` (name, value, what it is) that is 0 is
/// the error, naming the option, the arch and what the option is for.
pub fn check_positive(arch: &str, fields: &[(&str, usize, &str)]) -> std::result::Result<(), String> {
    match fields.iter().find(|(_, value, _)| *value == 0) {
        Some((name, _, what)) => Err(format!("field `{name}` must be positive for {arch} ({what})")),
        None => Ok(()),
    }
}

/// `Deref`/`DerefMut` of an arch config (a struct with a `base: BaseConfig` field) to its base, so the shared
/// fields read as the config's own (`c.hidden`).
#[macro_export]
macro_rules! derefs_to_base {
    ($config:ty) => {
        impl std::ops::Deref for $config {
            type Target = $crate::config::BaseConfig;
            fn deref(&self) -> &$crate::config::BaseConfig {
                &self.base
            }
        }
        impl std::ops::DerefMut for $config {
            fn deref_mut(&mut self) -> &mut $crate::config::BaseConfig {
                &mut self.base
            }
        }
    };
}

/// The sliding window of a preset, for an arch with ring layers.
pub fn preset_window(preset: Preset) -> usize {
    match preset {
        Preset::Tiny => 8,
        Preset::Small => 64,
        Preset::Bench => 256,
    }
}

/// The config of one arch: the shared base (which it derefs to) plus the arch's own options (`config.json`,
/// flat).
pub trait ArchConfig:
    Clone
    + std::fmt::Debug
    + PartialEq
    + Serialize
    + serde::de::DeserializeOwned
    + std::ops::Deref<Target = BaseConfig>
    + std::ops::DerefMut
{
    /// The arch's shape at `preset`.
    fn preset(preset: Preset) -> Self;
    fn base(&self) -> &BaseConfig {
        self
    }
    /// The base checks, then the arch's own.
    fn validate(&self) -> std::result::Result<(), String> {
        self.base().validate()
    }
    /// What feeding one position costs a model of this shape (the flops a report expects a turn to take).
    fn cost(&self) -> crate::model_cost::ModelCost;
}

/// The field list the model hash is taken over: every arch's options in one flat record, each option an arch
/// does not have at its neutral value (the serde defaults below). It is the layout `config.json` had when one
/// config served every arch, so a model hash pinned in a report or a document stays the hash of the same model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HashLayout {
    pub arch: String,
    pub preset: Option<String>,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub experts: usize,
    pub top_k: usize,
    pub shared_experts: usize,
    #[serde(default)]
    pub window: usize,
    #[serde(default = "on")]
    pub ring_kv: bool,
    #[serde(default)]
    pub global_every: usize,
    #[serde(default)]
    pub conv_kernel: usize,
    pub max_ctx: usize,
    pub initial_capacity: usize,
    pub prefill_chunk: usize,
    pub slots: usize,
    #[serde(default)]
    pub audio_frame_bytes: usize,
    #[serde(default)]
    pub kv_lora: usize,
    #[serde(default)]
    pub qk_rope: usize,
    #[serde(default)]
    pub mla_every: usize,
    #[serde(default)]
    pub compress_ratio: usize,
    #[serde(default)]
    pub prompt_rows: usize,
    #[serde(default)]
    pub draft_layers: usize,
    #[serde(default)]
    pub kv_share: bool,
    #[serde(default = "on")]
    pub prefix_cache: bool,
    pub rope_theta: f32,
    pub norm_eps: f32,
}

impl HashLayout {
    /// `config`'s fields (an arch config, flat as `config.json` holds it) placed in the layout: the options it has
    /// by name, the others neutral; an option the layout does not list (llama's `rope_dim`) is not hashed.
    pub fn of<C: ArchConfig>(config: &C) -> serde_json::Result<Self> {
        serde_json::from_value(serde_json::to_value(config)?)
    }
}

/// Keys of a config object that name the arch and preset rather than an option.
const FIXED: &[&str] = &["arch", "preset"];

/// `C` read from a JSON object, every key checked against `C`'s fields: an option `C`'s arch does not have is an
/// error naming the arch and the option, with the options it has.
pub fn from_json<C: ArchConfig>(fields: serde_json::Map<String, serde_json::Value>) -> std::result::Result<C, String> {
    let arch = fields.get("arch").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let known = option_names::<C>();
    if let Some(key) = fields.keys().find(|k| !FIXED.contains(&k.as_str()) && !known.contains(k)) {
        return Err(format!("{key}: {arch} has no option {key} (options: {})", known.join(", ")));
    }
    let config: C = serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| e.to_string())?;
    config.validate()?;
    Ok(config)
}

/// The options of `C` (every field but arch and preset), sorted, as a preset of `C` serialises them.
fn option_names<C: ArchConfig>() -> Vec<String> {
    let mut names: Vec<String> = match serde_json::to_value(C::preset(Preset::Tiny)) {
        Ok(serde_json::Value::Object(m)) => m.keys().filter(|k| !FIXED.contains(&k.as_str())).cloned().collect(),
        _ => Vec::new(),
    };
    names.sort_unstable();
    names
}

/// `C` at `preset` with `overrides` applied and validated. Errors name the key at fault:
/// `engine.config.<key>: ...` for a key, `engine.config: ...` for a value or a failed check.
pub fn with_overrides<C: ArchConfig>(
    preset: Preset,
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> std::result::Result<C, String> {
    apply_overrides(C::preset(preset), overrides, None)
}

/// `base` with `overrides` applied and validated; with `only`, just those options may be set (a model file fixes
/// the rest, e.g. a GGUF's shapes), and any other is an error naming it.
/// Every key of `keys` is one of `allowed`; the first that is not is an error saying it is fixed by `fixed_by`
/// (a GGUF engine's shape is the file's: only serving options may be set).
pub fn check_only<'k>(
    mut keys: impl Iterator<Item = &'k str>,
    allowed: &[&str],
    fixed_by: &str,
) -> std::result::Result<(), String> {
    match keys.find(|k| !allowed.contains(k)) {
        Some(key) => Err(format!("engine.config.{key}: fixed by {fixed_by} (options here: {})", allowed.join(", "))),
        None => Ok(()),
    }
}

pub fn apply_overrides<C: ArchConfig>(
    base: C,
    overrides: &serde_json::Map<String, serde_json::Value>,
    only: Option<(&[&str], &str)>,
) -> std::result::Result<C, String> {
    if overrides.is_empty() {
        return Ok(base);
    }
    let arch = base.base().arch.clone();
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(&base) else {
        return Err(format!("engine.config: the {arch} config is not an object"));
    };
    let known = option_names::<C>();
    for (key, value) in overrides {
        if FIXED.contains(&key.as_str()) {
            return Err(format!("engine.config.{key}: set by the engine's `{key}`, not by an override"));
        }
        if !known.contains(key) {
            return Err(format!("engine.config.{key}: {arch} has no option {key} (options: {})", known.join(", ")));
        }
        if let Some((allowed, fixed_by)) = only {
            check_only(std::iter::once(key.as_str()), allowed, fixed_by)?;
        }
        fields.insert(key.clone(), value.clone());
    }
    let config: C =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| format!("engine.config: {e}"))?;
    config.validate().map_err(|e| format!("engine.config: {e}"))?;
    Ok(config)
}

/// Read `config.json`: the arch's own config, unknown options and failed checks naming the file.
pub fn read_json(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io { path: path.into(), source })?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(EngineError::Config { path: path.into(), message: "not a JSON object".into() }),
        Err(e) => Err(EngineError::Config { path: path.into(), message: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{glm, llama};

    #[test]
    fn a_preset_has_one_name_in_json_scenarios_and_on_the_command_line() {
        assert_eq!(Preset::ALL.map(Preset::name), ["tiny", "small", "bench"]);
        for p in Preset::ALL {
            assert_eq!(serde_json::to_value(p).expect("json"), p.name());
            assert_eq!(p.name().parse::<Preset>().expect("parses"), p);
        }
    }

    #[test]
    fn an_arch_config_fills_its_options_in_the_hash_layout_and_leaves_the_others_neutral() {
        let mut c = glm::Config::preset(Preset::Tiny);
        c.kv_share = true;
        c.base.norm_eps = 1e-6;
        let layout = HashLayout::of(&c).expect("glm's options fit the layout");
        assert_eq!((layout.kv_lora, layout.qk_rope, layout.kv_share), (c.kv_lora, c.qk_rope, true));
        assert_eq!((layout.hidden, layout.norm_eps, layout.arch.as_str()), (c.hidden, 1e-6, "glm"));
        // options glm does not have stay at the values the one-config layout gave them
        assert_eq!((layout.window, layout.ring_kv, layout.compress_ratio, layout.prefix_cache), (0, true, 0, true));
        // an option the layout does not list is not hashed
        let l = llama::Config::preset(Preset::Tiny);
        let with_rope_dim = llama::Config { rope_dim: 2, ..l.clone() };
        assert_eq!(HashLayout::of(&l).expect("llama"), HashLayout::of(&with_rope_dim).expect("llama"));
    }
}
