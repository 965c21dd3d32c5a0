//! `config.json`: the shape of a model. Lenient on read (defaults for what an older file omits).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Size presets every bundled engine offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Bench => "bench",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
fn yes() -> bool {
    true
}
fn one() -> usize {
    1
}

/// The model configuration shared by every arch; fields an arch does not use stay at their defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
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
    /// Sliding-window length of ring layers (0: none).
    #[serde(default)]
    pub window: usize,
    /// Store sliding layers as rings of `window` rows (false: full caches, same attention; a reference for tests).
    #[serde(default = "yes")]
    pub ring_kv: bool,
    /// Every `global_every`-th layer (1-based) is global; the rest slide.
    #[serde(default)]
    pub global_every: usize,
    /// Short-convolution width on k/v (0: none).
    #[serde(default)]
    pub conv_kernel: usize,
    pub max_ctx: usize,
    /// Positions allocated for a fresh slot; capacity grows (doubling) from there.
    pub initial_capacity: usize,
    /// Rows per prefill segment.
    pub prefill_chunk: usize,
    #[serde(default = "one")]
    pub slots: usize,
    /// Bytes of one audio frame's payload (0: no audio).
    #[serde(default)]
    pub audio_frame_bytes: usize,
    /// MLA (glm, kimi): width of the cached latent row and of the cached rope row per position.
    #[serde(default)]
    pub kv_lora: usize,
    #[serde(default)]
    pub qk_rope: usize,
    /// kimi: every `mla_every`-th layer (1-based) and the last are gated MLA; the rest are KDA.
    #[serde(default)]
    pub mla_every: usize,
    /// deepseek: positions per compressed row.
    #[serde(default)]
    pub compress_ratio: usize,
    /// glm53: the position-fixed prefill chunk grid.
    #[serde(default)]
    pub prompt_rows: usize,
    /// glm53: layers of the speculative drafter.
    #[serde(default)]
    pub draft_layers: usize,
    /// glm: cross-slot prefix sharing (off by default).
    #[serde(default)]
    pub kv_share: bool,
    /// glm53: the prefix cache switch; off reproduces the cold path bit for bit.
    #[serde(default = "yes")]
    pub prefix_cache: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default = "default_eps")]
    pub norm_eps: f32,
}

impl ModelConfig {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io { path: path.into(), source })?;
        let config: ModelConfig = serde_json::from_str(&text)
            .map_err(|e| EngineError::Config { path: path.into(), message: e.to_string() })?;
        config.validate().map_err(|message| EngineError::Config { path: path.into(), message })?;
        Ok(config)
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

    /// The built-in shape of `arch` at `preset`.
    pub fn preset(arch: &str, preset: Preset) -> Result<Self> {
        crate::bundled::arch(arch)?;
        let mut c = match preset {
            Preset::Tiny => ModelConfig {
                arch: arch.into(),
                preset: Some("tiny".into()),
                vocab: crate::tokenizer::VOCAB,
                hidden: 64,
                layers: 8,
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                ffn: 64,
                experts: 4,
                top_k: 2,
                shared_experts: 1,
                window: 8,
                ring_kv: true,
                global_every: 8,
                conv_kernel: 3,
                max_ctx: 1024,
                initial_capacity: 64,
                prefill_chunk: 16,
                slots: 1,
                audio_frame_bytes: 8,
                rope_theta: 10000.0,
                norm_eps: 1e-5,
                kv_lora: 0,
                qk_rope: 0,
                mla_every: 0,
                compress_ratio: 0,
                prompt_rows: 0,
                draft_layers: 0,
                kv_share: false,
                prefix_cache: true,
            },
            Preset::Small => ModelConfig {
                arch: arch.into(),
                preset: Some("small".into()),
                vocab: crate::tokenizer::VOCAB,
                hidden: 256,
                layers: 12,
                heads: 8,
                kv_heads: 4,
                head_dim: 32,
                ffn: 256,
                experts: 8,
                top_k: 2,
                shared_experts: 1,
                window: 64,
                ring_kv: true,
                global_every: 6,
                conv_kernel: 3,
                max_ctx: 8192,
                initial_capacity: 256,
                prefill_chunk: 64,
                slots: 1,
                audio_frame_bytes: 16,
                rope_theta: 10000.0,
                norm_eps: 1e-5,
                kv_lora: 0,
                qk_rope: 0,
                mla_every: 0,
                compress_ratio: 0,
                prompt_rows: 0,
                draft_layers: 0,
                kv_share: false,
                prefix_cache: true,
            },
            Preset::Bench => ModelConfig {
                arch: arch.into(),
                preset: Some("bench".into()),
                vocab: crate::tokenizer::VOCAB,
                hidden: 512,
                layers: 12,
                heads: 8,
                kv_heads: 4,
                head_dim: 64,
                ffn: 512,
                experts: 8,
                top_k: 2,
                shared_experts: 1,
                window: 256,
                ring_kv: true,
                global_every: 6,
                conv_kernel: 3,
                max_ctx: 16384,
                initial_capacity: 1024,
                prefill_chunk: 128,
                slots: 1,
                audio_frame_bytes: 16,
                rope_theta: 10000.0,
                norm_eps: 1e-5,
                kv_lora: 0,
                qk_rope: 0,
                mla_every: 0,
                compress_ratio: 0,
                prompt_rows: 0,
                draft_layers: 0,
                kv_share: false,
                prefix_cache: true,
            },
        };
        (crate::bundled::entry(arch)?.preset)(&mut c, preset);
        Ok(c)
    }

    /// Whether layer `i` is a global (full-attention) layer.
    pub fn is_global(&self, layer: usize) -> bool {
        self.window == 0 || self.global_every == 0 || (layer + 1).is_multiple_of(self.global_every)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        for p in Preset::ALL {
            ModelConfig::preset("inkling", p)
                .and_then(|c| c.validate().map_err(EngineError::BadRequest))
                .unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }

    #[test]
    fn tiny_has_one_global_layer() {
        let c = ModelConfig::preset("inkling", Preset::Tiny).expect("tiny");
        assert_eq!((0..c.layers).filter(|&l| c.is_global(l)).count(), 1);
    }

    #[test]
    fn bad_config_names_file_and_field() {
        let dir = std::env::temp_dir().join(format!("kvproof-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("config.json");
        let mut c = ModelConfig::preset("inkling", Preset::Tiny).expect("tiny");
        c.heads = 3;
        std::fs::write(&path, serde_json::to_string(&c).expect("json")).expect("write");
        let err = ModelConfig::load(&path).expect_err("invalid").to_string();
        assert!(err.contains("config.json") && err.contains("`heads`"), "{err}");
    }
}
