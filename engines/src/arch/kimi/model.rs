//! Kimi's weights (modelled on kimi_k3.c): most layers are KDA — gated delta-rule linear attention with a
//! per-channel decay, a matrix state per head and short convolutions on q/k/v — and every `mla_every`-th layer and
//! the last are gated MLA without rope (NoPE), caching one latent row per position. MoE FFN everywhere.

use crate::arch::checkpoint_layout::{layer_name, moe_specs, LayerExperts};
use crate::arch::model_hash::model_hash;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::fixture::{Init, TensorSpec};
use crate::moe::Moe;
use crate::weights::Weights;

/// Kimi Delta Attention: `S ← (I − β k kᵀ) Diag(α) S + β k vᵀ`, `o = Sᵀ q`, per head.
#[derive(Debug, Clone)]
pub struct Kda {
    /// `[heads · head_dim, hidden]` each.
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    /// Depthwise causal convolutions `[conv_kernel, heads · head_dim]` (oldest tap first).
    pub conv_q: Vec<f32>,
    pub conv_k: Vec<f32>,
    pub conv_v: Vec<f32>,
    /// Per-channel decay input `[heads · head_dim, hidden]`; α = exp(−A_h · softplus(f)).
    pub wf: Vec<f32>,
    /// `[heads]`: A_h = 0.1 · exp(a_log_h).
    pub a_log: Vec<f32>,
    /// Write strength `[heads, hidden]`; β = sigmoid.
    pub wb: Vec<f32>,
    /// Output gate `[heads · head_dim, hidden]`.
    pub wg: Vec<f32>,
    pub o_norm: Vec<f32>,
    pub wo: Vec<f32>,
}

/// Gated MLA (NoPE): queries are absorbed into the latent space, so attention reads the cached latent rows
/// directly as keys and values, and the per-head value up-projection runs on the pooled latent.
#[derive(Debug, Clone)]
pub struct Mla {
    pub wq: Vec<f32>,
    /// Down-projection to the latent `[kv_lora, hidden]`, and its norm.
    pub w_dkv: Vec<f32>,
    pub kv_norm: Vec<f32>,
    /// Per head, the key up-projection transposed: `[heads][kv_lora, head_dim]` (absorbs q into the latent).
    pub k_up_t: Vec<Vec<f32>>,
    /// Per head, the value up-projection `[heads][head_dim, kv_lora]`.
    pub v_up: Vec<Vec<f32>>,
    pub wg: Vec<f32>,
    pub wo: Vec<f32>,
}

#[derive(Debug, Clone)]
pub enum Mixer {
    Kda(Kda),
    Mla(Mla),
}

#[derive(Debug, Clone)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub mixer: Mixer,
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
    /// Short hash of config + weights.
    pub hash: String,
}

/// Whether layer `l` is a gated MLA layer (every `mla_every`-th, 1-based, and the last); the rest are KDA.
pub fn is_mla(c: &ModelConfig, l: usize) -> bool {
    l + 1 == c.layers || (c.mla_every > 0 && (l + 1).is_multiple_of(c.mla_every))
}

/// The checkpoint's tensors, in the order a fixture writes them.
pub fn tensor_specs(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, hd) = (c.hidden, c.head_dim);
    let qd = c.heads * hd;
    let mut s = vec![TensorSpec::new("model.embed_tokens.weight", &[c.vocab, h], Init::Uniform(1.0))];
    for i in 0..c.layers {
        s.push(TensorSpec::new(layer_name(i, "input_layernorm.weight"), &[h], Init::Ones));
        let a = |rest: &str| layer_name(i, &format!("self_attn.{rest}"));
        if is_mla(c, i) {
            s.push(TensorSpec::linear(a("q_proj.weight"), qd, h));
            s.push(TensorSpec::linear(a("kv_a_proj.weight"), c.kv_lora, h));
            s.push(TensorSpec::new(a("kv_a_norm.weight"), &[c.kv_lora], Init::Ones));
            s.push(TensorSpec::linear(a("k_up_proj.weight"), qd, c.kv_lora));
            s.push(TensorSpec::linear(a("v_up_proj.weight"), qd, c.kv_lora));
            s.push(TensorSpec::linear(a("g_proj.weight"), qd, h));
            s.push(TensorSpec::linear(a("o_proj.weight"), h, qd));
        } else {
            let conv = Init::Uniform((3.0 / c.conv_kernel.max(1) as f32).sqrt());
            for p in ["q", "k", "v"] {
                s.push(TensorSpec::linear(a(&format!("{p}_proj.weight")), qd, h));
            }
            for p in ["q", "k", "v"] {
                s.push(TensorSpec::new(a(&format!("{p}_conv.weight")), &[c.conv_kernel, qd], conv));
            }
            s.push(TensorSpec::linear(a("f_proj.weight"), qd, h));
            s.push(TensorSpec::new(a("a_log"), &[c.heads], Init::Uniform(1.0)));
            s.push(TensorSpec::linear(a("b_proj.weight"), c.heads, h));
            s.push(TensorSpec::linear(a("g_proj.weight"), qd, h));
            s.push(TensorSpec::new(a("o_norm.weight"), &[hd], Init::Ones));
            s.push(TensorSpec::linear(a("o_proj.weight"), h, qd));
        }
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
    if c.kv_lora == 0 {
        return Err("kimi needs a latent width `kv_lora` > 0".into());
    }
    if c.qk_rope != 0 {
        return Err("kimi's MLA layers are NoPE: `qk_rope` must be 0".into());
    }
    if c.conv_kernel == 0 {
        return Err("kimi's KDA layers need a short convolution: `conv_kernel` > 0".into());
    }
    if c.audio_frame_bytes != 0 {
        return Err("kimi takes no audio: `audio_frame_bytes` must be 0".into());
    }
    Ok(())
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

impl Model {
    pub fn load(c: ModelConfig, w: &Weights) -> Result<Model> {
        validate(&c).map_err(|message| EngineError::Config { path: w.path().into(), message })?;
        let (h, hd) = (c.hidden, c.head_dim);
        let qd = c.heads * hd;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = |rest: &str, shape: &[usize]| w.tensor(&layer_name(i, rest), shape);
            let a = |rest: &str, shape: &[usize]| t(&format!("self_attn.{rest}"), shape);
            let mixer = if is_mla(&c, i) {
                let k_up = a("k_up_proj.weight", &[qd, c.kv_lora])?;
                let v_up = a("v_up_proj.weight", &[qd, c.kv_lora])?;
                let per_head = hd * c.kv_lora;
                Mixer::Mla(Mla {
                    wq: a("q_proj.weight", &[qd, h])?,
                    w_dkv: a("kv_a_proj.weight", &[c.kv_lora, h])?,
                    kv_norm: a("kv_a_norm.weight", &[c.kv_lora])?,
                    k_up_t: k_up.chunks_exact(per_head).map(|m| transpose(m, hd, c.kv_lora)).collect(),
                    v_up: v_up.chunks_exact(per_head).map(<[f32]>::to_vec).collect(),
                    wg: a("g_proj.weight", &[qd, h])?,
                    wo: a("o_proj.weight", &[h, qd])?,
                })
            } else {
                let conv = |p: &str| a(&format!("{p}_conv.weight"), &[c.conv_kernel, qd]);
                Mixer::Kda(Kda {
                    wq: a("q_proj.weight", &[qd, h])?,
                    wk: a("k_proj.weight", &[qd, h])?,
                    wv: a("v_proj.weight", &[qd, h])?,
                    conv_q: conv("q")?,
                    conv_k: conv("k")?,
                    conv_v: conv("v")?,
                    wf: a("f_proj.weight", &[qd, h])?,
                    a_log: a("a_log", &[c.heads])?,
                    wb: a("b_proj.weight", &[c.heads, h])?,
                    wg: a("g_proj.weight", &[qd, h])?,
                    o_norm: a("o_norm.weight", &[hd])?,
                    wo: a("o_proj.weight", &[h, qd])?,
                })
            };
            let experts = LayerExperts::load(w, &c, i)?;
            layers.push(Layer {
                attn_norm: t("input_layernorm.weight", &[h])?,
                mixer,
                ffn_norm: t("post_attention_layernorm.weight", &[h])?,
                moe: experts.with_router(w, &c)?,
            });
        }
        Ok(Model {
            embed: w.tensor("model.embed_tokens.weight", &[c.vocab, h])?,
            layers,
            final_norm: w.tensor("model.norm.weight", &[h])?,
            lm_head: w.tensor("lm_head.weight", &[c.vocab, h])?,
            hash: model_hash(&c, w),
            config: c,
        })
    }
}
