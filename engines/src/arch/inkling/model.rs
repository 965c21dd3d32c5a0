//! Inkling's config and weights: GQA attention with short convolutions on k/v, sliding-window layers (rings) and
//! global layers (full caches) about 5:1, a MoE FFN, and an audio projection mixing frame payloads into the
//! embedding.

use serde::{Deserialize, Serialize};

use crate::arch::checkpoint_layout::Stack;
use crate::arch::cost;
use crate::arch::qk_norm_attn::QkNormProj;
use crate::config::{preset_window, ArchConfig, BaseConfig, Preset};
use crate::error::Result;
use crate::fixture::Init;
use crate::kernels::Rope;
use crate::model_cost::{ModelCost, Reach};
use crate::tensors::Source;

/// Inkling's config: the shared base plus its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// Sliding-window length of ring layers (0: none, every layer global).
    #[serde(default)]
    pub window: usize,
    /// Store sliding layers as rings of `window` rows (false: full caches, same attention; a reference for tests).
    #[serde(default = "crate::config::on")]
    pub ring_kv: bool,
    /// Every `global_every`-th layer (1-based) is global; the rest slide.
    #[serde(default)]
    pub global_every: usize,
    /// Short-convolution width on k/v (0: none).
    #[serde(default)]
    pub conv_kernel: usize,
    /// Bytes of one audio frame's payload (0: no audio).
    #[serde(default)]
    pub audio_frame_bytes: usize,
}

crate::derefs_to_base!(Config);

impl Config {
    /// Whether layer `i` is a global (full-attention) layer.
    pub fn is_global(&self, layer: usize) -> bool {
        self.window == 0 || self.global_every == 0 || (layer + 1).is_multiple_of(self.global_every)
    }
}

impl ArchConfig for Config {
    /// The base preset as it is, with rings, global layers about 1 in 6, and audio.
    fn preset(p: Preset) -> Self {
        Config {
            base: BaseConfig::preset("inkling", p),
            window: preset_window(p),
            ring_kv: true,
            global_every: if p == Preset::Tiny { 8 } else { 6 },
            conv_kernel: 3,
            audio_frame_bytes: if p == Preset::Tiny { 8 } else { 16 },
        }
    }

    /// Every layer: GQA projections and the MoE; global layers attend over the whole context, the others over
    /// their window.
    fn cost(&self) -> ModelCost {
        let mut m = ModelCost::default();
        for l in 0..self.layers {
            m.token_flops += cost::gqa_proj(self) + cost::moe(self);
            let reach = if self.is_global(l) { Reach::Full } else { Reach::Window(self.window) };
            m.attend(reach, cost::gqa_key(self));
        }
        m
    }
}

/// A layer's attention (`kvd = kv_heads · head_dim`).
#[derive(Debug, Clone)]
pub struct Attention {
    /// Global (full cache) or sliding (ring).
    pub global: bool,
    /// The q/k-normed GQA projections.
    pub proj: QkNormProj,
    /// Depthwise short convolution over time, `[conv_kernel, kvd]` (oldest tap first; empty without a kernel).
    pub conv_k: Vec<f32>,
    pub conv_v: Vec<f32>,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    pub stack: Stack<Attention>,
    /// `[hidden, audio_frame_bytes]` (empty without audio).
    pub audio_proj: Vec<f32>,
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

impl Model {
    /// The model from `src`, every tensor named once, in checkpoint order.
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        let (h, hd) = (c.hidden, c.head_dim);
        let kvd = c.kv_heads * hd;
        let conv_init = Init::Uniform((3.0 / c.conv_kernel.max(1) as f32).sqrt());
        let conv = |t: &mut dyn Source, name: &str| {
            if c.conv_kernel > 0 {
                t.take(name, &[c.conv_kernel, kvd], conv_init)
            } else {
                Ok(Vec::new())
            }
        };
        let stack = Stack::build(src, &c, |t, i| {
            Ok(Attention {
                global: c.is_global(i),
                proj: QkNormProj::load(t, &c)?,
                conv_k: conv(t, "self_attn.k_conv.weight")?,
                conv_v: conv(t, "self_attn.v_conv.weight")?,
            })
        })?;
        let audio_proj = if c.audio_frame_bytes > 0 {
            src.linear("model.audio_proj.weight", h, c.audio_frame_bytes)?
        } else {
            Vec::new()
        };
        Ok(Model { stack, audio_proj, rope: Rope::new(hd, c.rope_theta), hash, config: c })
    }
}
