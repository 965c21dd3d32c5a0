//! Inkling's weights: GQA attention with short convolutions on k/v, sliding-window layers (rings) and global
//! layers (full caches) about 5:1, a MoE FFN, and an audio projection mixing frame payloads into the embedding.

use crate::arch::checkpoint_layout::{layer_name, moe_specs, LayerExperts};
use crate::arch::model_hash::model_hash;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::fixture::{Init, TensorSpec};
use crate::kernels::Rope;
use crate::moe::Moe;
use crate::weights::Weights;

/// One transformer layer.
#[derive(Debug, Clone)]
pub struct Layer {
    pub global: bool,
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// Depthwise short convolution over time, `[conv_kernel, kv_dim]` (oldest tap first).
    pub conv_k: Vec<f32>,
    pub conv_v: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub moe: Moe,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub embed: Vec<f32>,
    /// `[hidden, audio_frame_bytes]`.
    pub audio_proj: Vec<f32>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: Vec<f32>,
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

/// The checkpoint's tensors, in the order a fixture writes them.
pub fn tensor_specs(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, hd) = (c.hidden, c.head_dim);
    let (qd, kvd) = (c.heads * hd, c.kv_heads * hd);
    let mut s = vec![TensorSpec::new("model.embed_tokens.weight", &[c.vocab, h], Init::Uniform(1.0))];
    if c.audio_frame_bytes > 0 {
        s.push(TensorSpec::linear("model.audio_proj.weight", h, c.audio_frame_bytes));
    }
    for i in 0..c.layers {
        s.push(TensorSpec::new(layer_name(i, "input_layernorm.weight"), &[h], Init::Ones));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.q_proj.weight"), qd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.k_proj.weight"), kvd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.v_proj.weight"), kvd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.o_proj.weight"), h, qd));
        s.push(TensorSpec::new(layer_name(i, "self_attn.q_norm.weight"), &[hd], Init::Ones));
        s.push(TensorSpec::new(layer_name(i, "self_attn.k_norm.weight"), &[hd], Init::Ones));
        if c.conv_kernel > 0 {
            let a = (3.0 / c.conv_kernel as f32).sqrt();
            s.push(TensorSpec::new(layer_name(i, "self_attn.k_conv.weight"), &[c.conv_kernel, kvd], Init::Uniform(a)));
            s.push(TensorSpec::new(layer_name(i, "self_attn.v_conv.weight"), &[c.conv_kernel, kvd], Init::Uniform(a)));
        }
        s.push(TensorSpec::new(layer_name(i, "post_attention_layernorm.weight"), &[h], Init::Ones));
        moe_specs(c, i, &mut s);
    }
    s.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    s.push(TensorSpec::linear("lm_head.weight", c.vocab, h));
    s
}

impl Model {
    pub fn load(c: ModelConfig, w: &Weights) -> Result<Model> {
        c.validate().map_err(|message| crate::error::EngineError::Config { path: w.path().into(), message })?;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd) = (c.heads * hd, c.kv_heads * hd);
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = |rest: &str, shape: &[usize]| w.tensor(&layer_name(i, rest), shape);
            let conv = |rest: &str| {
                if c.conv_kernel > 0 {
                    t(rest, &[c.conv_kernel, kvd])
                } else {
                    Ok(Vec::new())
                }
            };
            let experts = LayerExperts::load(w, &c, i)?;
            layers.push(Layer {
                global: c.is_global(i),
                attn_norm: t("input_layernorm.weight", &[h])?,
                wq: t("self_attn.q_proj.weight", &[qd, h])?,
                wk: t("self_attn.k_proj.weight", &[kvd, h])?,
                wv: t("self_attn.v_proj.weight", &[kvd, h])?,
                wo: t("self_attn.o_proj.weight", &[h, qd])?,
                q_norm: t("self_attn.q_norm.weight", &[hd])?,
                k_norm: t("self_attn.k_norm.weight", &[hd])?,
                conv_k: conv("self_attn.k_conv.weight")?,
                conv_v: conv("self_attn.v_conv.weight")?,
                ffn_norm: t("post_attention_layernorm.weight", &[h])?,
                moe: experts.with_router(w, &c)?,
            });
        }
        let audio_proj = if c.audio_frame_bytes > 0 {
            w.tensor("model.audio_proj.weight", &[h, c.audio_frame_bytes])?
        } else {
            Vec::new()
        };
        Ok(Model {
            embed: w.tensor("model.embed_tokens.weight", &[c.vocab, h])?,
            audio_proj,
            layers,
            final_norm: w.tensor("model.norm.weight", &[h])?,
            lm_head: w.tensor("lm_head.weight", &[c.vocab, h])?,
            rope: Rope::new(hd, c.rope_theta),
            hash: model_hash(&c, w),
            config: c,
        })
    }
}
