//! DeepSeek's weights (modelled on the DeepSeek V4 engine): GQA attention over a sliding window of raw k/v rows,
//! a per-layer compressor that pools every `ratio` positions into one compressed row, and a MoE FFN.
//!
//! Layers alternate compression ratios as V4 does: even layers use `compress_ratio` (4 in every preset, with
//! overlapping blocks: 2·ratio state rows, each position contributing two halves), odd layers `4 · compress_ratio`
//! without overlap.

use crate::arch::checkpoint_layout::{layer_name, moe_specs, LayerExperts};
use crate::arch::model_hash::model_hash;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::fixture::{Init, TensorSpec};
use crate::kernels::Rope;
use crate::moe::Moe;
use crate::weights::Weights;

/// The compressor of one layer: per position a kv row and a score row (`coff · width` wide, coff = 2 with overlap),
/// plus a learned per-slot bias (`ape`) on the scores.
#[derive(Debug, Clone)]
pub struct Compressor {
    pub ratio: usize,
    pub overlap: bool,
    /// Width of one compressed row (= kv_heads · head_dim).
    pub width: usize,
    /// `[coff · width, hidden]`.
    pub wkv: Vec<f32>,
    pub wgate: Vec<f32>,
    /// `[ratio, coff · width]`: added to the score of the position at slot `pos % ratio`.
    pub ape: Vec<f32>,
    /// RMS norm of the pooled row.
    pub norm: Vec<f32>,
}

impl Compressor {
    /// 2 with overlap (each position feeds this block and the next), else 1.
    pub fn coff(&self) -> usize {
        1 + usize::from(self.overlap)
    }
}

/// One transformer layer.
#[derive(Debug, Clone)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub comp: Compressor,
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
    pub rope: Rope,
    /// Short hash of config + weights.
    pub hash: String,
}

/// The compression ratio of layer `l`.
pub fn layer_ratio(c: &ModelConfig, l: usize) -> usize {
    if l.is_multiple_of(2) {
        c.compress_ratio
    } else {
        c.compress_ratio * 4
    }
}

/// V4 overlaps blocks on its ratio-4 layers only.
pub fn layer_overlap(c: &ModelConfig, l: usize) -> bool {
    layer_ratio(c, l) == 4
}

/// The checkpoint's tensors, in the order a fixture writes them.
pub fn tensor_specs(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, hd) = (c.hidden, c.head_dim);
    let (qd, kvd) = (c.heads * hd, c.kv_heads * hd);
    let mut s = vec![TensorSpec::new("model.embed_tokens.weight", &[c.vocab, h], Init::Uniform(1.0))];
    for i in 0..c.layers {
        let coff = 1 + usize::from(layer_overlap(c, i));
        let ratio = layer_ratio(c, i);
        s.push(TensorSpec::new(layer_name(i, "input_layernorm.weight"), &[h], Init::Ones));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.q_proj.weight"), qd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.k_proj.weight"), kvd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.v_proj.weight"), kvd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.o_proj.weight"), h, qd));
        s.push(TensorSpec::new(layer_name(i, "self_attn.q_norm.weight"), &[hd], Init::Ones));
        s.push(TensorSpec::new(layer_name(i, "self_attn.k_norm.weight"), &[hd], Init::Ones));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.compressor.wkv.weight"), coff * kvd, h));
        s.push(TensorSpec::linear(layer_name(i, "self_attn.compressor.wgate.weight"), coff * kvd, h));
        s.push(TensorSpec::new(layer_name(i, "self_attn.compressor.ape"), &[ratio, coff * kvd], Init::Uniform(0.5)));
        s.push(TensorSpec::new(layer_name(i, "self_attn.compressor.norm.weight"), &[kvd], Init::Ones));
        s.push(TensorSpec::new(layer_name(i, "post_attention_layernorm.weight"), &[h], Init::Ones));
        moe_specs(c, i, &mut s);
    }
    s.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    s.push(TensorSpec::linear("lm_head.weight", c.vocab, h));
    s
}

/// Shape checks of the fields only this arch reads.
fn validate(c: &ModelConfig) -> std::result::Result<(), String> {
    c.validate()?;
    if c.window == 0 {
        return Err("deepseek needs a sliding `window` > 0".into());
    }
    if c.compress_ratio == 0 {
        return Err("deepseek needs `compress_ratio` > 0".into());
    }
    if c.audio_frame_bytes != 0 {
        return Err("deepseek takes no audio: `audio_frame_bytes` must be 0".into());
    }
    Ok(())
}

impl Model {
    pub fn load(c: ModelConfig, w: &Weights) -> Result<Model> {
        validate(&c).map_err(|message| EngineError::Config { path: w.path().into(), message })?;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd) = (c.heads * hd, c.kv_heads * hd);
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = |rest: &str, shape: &[usize]| w.tensor(&layer_name(i, rest), shape);
            let (ratio, overlap) = (layer_ratio(&c, i), layer_overlap(&c, i));
            let coff = 1 + usize::from(overlap);
            let experts = LayerExperts::load(w, &c, i)?;
            layers.push(Layer {
                attn_norm: t("input_layernorm.weight", &[h])?,
                wq: t("self_attn.q_proj.weight", &[qd, h])?,
                wk: t("self_attn.k_proj.weight", &[kvd, h])?,
                wv: t("self_attn.v_proj.weight", &[kvd, h])?,
                wo: t("self_attn.o_proj.weight", &[h, qd])?,
                q_norm: t("self_attn.q_norm.weight", &[hd])?,
                k_norm: t("self_attn.k_norm.weight", &[hd])?,
                comp: Compressor {
                    ratio,
                    overlap,
                    width: kvd,
                    wkv: t("self_attn.compressor.wkv.weight", &[coff * kvd, h])?,
                    wgate: t("self_attn.compressor.wgate.weight", &[coff * kvd, h])?,
                    ape: t("self_attn.compressor.ape", &[ratio, coff * kvd])?,
                    norm: t("self_attn.compressor.norm.weight", &[kvd])?,
                },
                ffn_norm: t("post_attention_layernorm.weight", &[h])?,
                moe: experts.with_router(w, &c)?,
            });
        }
        Ok(Model {
            embed: w.tensor("model.embed_tokens.weight", &[c.vocab, h])?,
            layers,
            final_norm: w.tensor("model.norm.weight", &[h])?,
            lm_head: w.tensor("lm_head.weight", &[c.vocab, h])?,
            rope: Rope::new(hd, c.rope_theta),
            hash: model_hash(&c, w),
            config: c,
        })
    }
}
