//! glm's weights (GLM-5 / DeepSeek-style MLA): each layer projects the input to a compressed latent
//! (`kv_lora` wide, normalised) plus one shared rope key (`qk_rope` wide) — the only things cached per position —
//! and `kv_b_proj` decompresses the latent into every head's key (nope part) and value at attention time.
//! The FFN is a MoE with routed and shared experts.

use crate::arch::checkpoint_layout::{layer_name, moe_specs, LayerExperts};
use crate::arch::model_hash::model_hash;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::fixture::{Init, TensorSpec};
use crate::kernels::Rope;
use crate::moe::Moe;
use crate::weights::Weights;

/// One transformer layer.
#[derive(Debug, Clone)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// `[heads * (head_dim + qk_rope), hidden]`: per head, the nope part then the rope part.
    pub wq: Vec<f32>,
    /// `[kv_lora + qk_rope, hidden]`: the latent, then the shared rope key.
    pub wkv_a: Vec<f32>,
    pub kv_norm: Vec<f32>,
    /// `[heads * 2 * head_dim, kv_lora]`: per head, `head_dim` key rows then `head_dim` value rows.
    pub wkv_b: Vec<f32>,
    /// `[hidden, heads * head_dim]`.
    pub wo: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub moe: Moe,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: Vec<f32>,
    /// Rotary embedding of the `qk_rope` dims (queries per head, the one shared key).
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

/// The checkpoint's tensors, in the order a fixture writes them.
pub fn tensor_specs(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, hd) = (c.hidden, c.head_dim);
    let mut s = vec![TensorSpec::new("model.embed_tokens.weight", &[c.vocab, h], Init::Uniform(1.0))];
    for i in 0..c.layers {
        s.push(TensorSpec::new(layer_name(i, "input_layernorm.weight"), &[h], Init::Ones));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.q_proj.weight"), c.heads * (hd + c.qk_rope), h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.kv_a_proj_with_mqa.weight"), c.kv_lora + c.qk_rope, h));
        s.push(TensorSpec::new(layer_name(i, "self_attn.kv_a_layernorm.weight"), &[c.kv_lora], Init::Ones));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.kv_b_proj.weight"), c.heads * 2 * hd, c.kv_lora));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.o_proj.weight"), h, c.heads * hd));
        s.push(TensorSpec::new(layer_name(i, "post_attention_layernorm.weight"), &[h], Init::Ones));
        moe_specs(c, i, &mut s);
    }
    s.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    s.push(TensorSpec::linear("lm_head.weight", c.vocab, h));
    s
}

impl Model {
    pub fn load(c: ModelConfig, w: &Weights) -> Result<Model> {
        let bad = |message: String| EngineError::Config { path: w.path().into(), message };
        c.validate().map_err(bad)?;
        if c.kv_lora == 0 {
            return Err(bad("field `kv_lora` must be positive for glm (the cached latent)".into()));
        }
        if c.qk_rope == 0 || c.qk_rope % 2 == 1 {
            return Err(bad(format!("field `qk_rope` ({}) must be positive and even for glm", c.qk_rope)));
        }
        let (h, hd) = (c.hidden, c.head_dim);
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = |rest: &str, shape: &[usize]| w.tensor(&layer_name(i, rest), shape);
            let experts = LayerExperts::load(w, &c, i)?;
            layers.push(Layer {
                attn_norm: t("input_layernorm.weight", &[h])?,
                wq: t("self_attn.q_proj.weight", &[c.heads * (hd + c.qk_rope), h])?,
                wkv_a: t("self_attn.kv_a_proj_with_mqa.weight", &[c.kv_lora + c.qk_rope, h])?,
                kv_norm: t("self_attn.kv_a_layernorm.weight", &[c.kv_lora])?,
                wkv_b: t("self_attn.kv_b_proj.weight", &[c.heads * 2 * hd, c.kv_lora])?,
                wo: t("self_attn.o_proj.weight", &[h, c.heads * hd])?,
                ffn_norm: t("post_attention_layernorm.weight", &[h])?,
                moe: experts.with_router(w, &c)?,
            });
        }
        Ok(Model {
            embed: w.tensor("model.embed_tokens.weight", &[c.vocab, h])?,
            layers,
            final_norm: w.tensor("model.norm.weight", &[h])?,
            lm_head: w.tensor("lm_head.weight", &[c.vocab, h])?,
            rope: Rope::new(c.qk_rope, c.rope_theta),
            hash: model_hash(&c, w),
            config: c,
        })
    }
}
