//! glm's config and weights (GLM-5 / DeepSeek-style MLA): each layer projects the input to a compressed latent
//! (`kv_lora` wide, normalised) plus one shared rope key (`qk_rope` wide) — the only things cached per position —
//! and `kv_b_proj` decompresses the latent into every head's key (nope part) and value at attention time.
//! The FFN is a MoE with routed and shared experts.

use serde::{Deserialize, Serialize};

use crate::arch::checkpoint_layout::Stack;
use crate::arch::cost;
use crate::config::{check_positive, ArchConfig, BaseConfig, Preset};
use crate::error::Result;
use crate::kernels::Rope;
use crate::model_cost::{ModelCost, Reach};
use crate::tensors::Source;

/// glm's config: the shared base plus its options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub base: BaseConfig,
    /// Width of the cached latent row per position.
    pub kv_lora: usize,
    /// Width of the cached shared rope key per position (even: rope pairs).
    pub qk_rope: usize,
    /// Cross-slot prefix sharing: a request on an empty slot copies the longest matching prefix another slot holds.
    #[serde(default)]
    pub kv_share: bool,
}

crate::derefs_to_base!(Config);

impl ArchConfig for Config {
    /// Four slots, MLA widths by preset, sharing off; MLA has no kv heads (the latent is shared by every head).
    fn preset(p: Preset) -> Self {
        let base = BaseConfig::preset("glm", p);
        let base = BaseConfig { slots: 4, kv_heads: base.heads, ..base };
        let (kv_lora, qk_rope) = match p {
            Preset::Tiny => (32, 8),
            Preset::Small => (64, 16),
            Preset::Bench => (128, 32),
        };
        Config { base, kv_lora, qk_rope, kv_share: false }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        self.base.validate()?;
        check_positive("glm", &[("kv_lora", self.kv_lora, "the cached latent")])?;
        if self.qk_rope == 0 || self.qk_rope % 2 == 1 {
            return Err(format!("field `qk_rope` ({}) must be positive and even for glm", self.qk_rope));
        }
        Ok(())
    }

    /// Every layer: MLA projections, each head's query absorbed into the latent and its output decompressed, the
    /// MoE; attention over the whole context, a latent and a rope row per key and head.
    fn cost(&self) -> ModelCost {
        let (h, hd, heads, lora, rope) = (self.hidden, self.head_dim, self.heads, self.kv_lora, self.qk_rope);
        let per_layer = cost::matmul(h, heads * (hd + rope))
            + cost::matmul(h, lora + rope)
            + cost::matmul(heads * hd, h)
            + heads as u64 * 2 * cost::matmul(hd, lora)
            + cost::moe(self);
        let per_key = heads as u64 * (cost::matmul(lora + rope, 1) + cost::matmul(lora, 1));
        let mut m = ModelCost { token_flops: per_layer * self.layers as u64, attention: Vec::new() };
        m.attend(Reach::Full, per_key * self.layers as u64);
        m
    }
}

/// A layer's MLA attention.
#[derive(Debug, Clone)]
pub struct Attention {
    /// `[heads * (head_dim + qk_rope), hidden]`: per head, the nope part then the rope part.
    pub wq: Vec<f32>,
    /// `[kv_lora + qk_rope, hidden]`: the latent, then the shared rope key.
    pub wkv_a: Vec<f32>,
    /// `[kv_lora]`.
    pub kv_norm: Vec<f32>,
    /// `[heads * 2 * head_dim, kv_lora]`: per head, `head_dim` key rows then `head_dim` value rows.
    pub wkv_b: Vec<f32>,
    /// `[hidden, heads * head_dim]`.
    pub wo: Vec<f32>,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    pub stack: Stack<Attention>,
    /// Rotary embedding of the `qk_rope` dims (queries per head, the one shared key).
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

impl Model {
    /// The model from `src`, every tensor named once, in checkpoint order.
    pub fn build(c: Config, src: &mut dyn Source, hash: String) -> Result<Model> {
        let (h, hd) = (c.hidden, c.head_dim);
        let stack = Stack::build(src, &c, |t, _| {
            Ok(Attention {
                wq: t.linear("self_attn.q_proj.weight", c.heads * (hd + c.qk_rope), h)?,
                wkv_a: t.linear("self_attn.kv_a_proj_with_mqa.weight", c.kv_lora + c.qk_rope, h)?,
                kv_norm: t.norm("self_attn.kv_a_layernorm.weight", c.kv_lora)?,
                wkv_b: t.linear("self_attn.kv_b_proj.weight", c.heads * 2 * hd, c.kv_lora)?,
                wo: t.linear("self_attn.o_proj.weight", h, c.heads * hd)?,
            })
        })?;
        Ok(Model { stack, rope: Rope::new(c.qk_rope, c.rope_theta), hash, config: c })
    }
}
