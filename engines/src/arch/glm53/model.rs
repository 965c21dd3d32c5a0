//! glm53's weights: GQA attention whose rows are cached whole per position (full caches), a MoE FFN, and a small
//! MTP drafter (its own attention + dense FFN layers over the main model's embeddings and lm head).

use crate::arch::checkpoint_layout::{expert_specs, layer_name, load_expert, moe_specs, LayerExperts};
use crate::arch::model_hash::model_hash;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::fixture::{Init, TensorSpec};
use crate::kernels::Rope;
use crate::moe::{Expert, Moe};
use crate::weights::Weights;

/// The attention half of a layer (shared by the main layers and the drafter's).
#[derive(Debug, Clone)]
pub struct Attn {
    pub norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
}

/// One main transformer layer.
#[derive(Debug, Clone)]
pub struct Layer {
    pub attn: Attn,
    pub ffn_norm: Vec<f32>,
    pub moe: Moe,
}

/// One drafter layer: attention and a dense SiLU-gated FFN.
#[derive(Debug, Clone)]
pub struct DraftLayer {
    pub attn: Attn,
    pub ffn_norm: Vec<f32>,
    pub ffn: Expert,
}

/// The whole model; shared (`Arc`) by warm and cold instances.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: Vec<f32>,
    pub draft: Vec<DraftLayer>,
    pub draft_norm: Vec<f32>,
    pub rope: Rope,
    /// The position-fixed prefill grid (`prompt_rows`, or `prefill_chunk` when a config leaves it 0).
    pub grid: usize,
    /// Short hash of config + weights.
    pub hash: String,
}

fn draft_name(i: usize, rest: &str) -> String {
    format!("mtp.layers.{i}.{rest}")
}

fn attn_specs(name: &dyn Fn(&str) -> String, c: &ModelConfig, out: &mut Vec<TensorSpec>) {
    let (h, qd, kvd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    out.push(TensorSpec::new(name("input_layernorm.weight"), &[h], Init::Ones));
    out.push(TensorSpec::linear(name("self_attn.q_proj.weight"), qd, h));
    out.push(TensorSpec::linear(name("self_attn.k_proj.weight"), kvd, h));
    out.push(TensorSpec::linear(name("self_attn.v_proj.weight"), kvd, h));
    out.push(TensorSpec::linear(name("self_attn.o_proj.weight"), h, qd));
    out.push(TensorSpec::new(name("post_attention_layernorm.weight"), &[h], Init::Ones));
}

/// The checkpoint's tensors, in the order a fixture writes them.
pub fn tensor_specs(c: &ModelConfig) -> Vec<TensorSpec> {
    let h = c.hidden;
    let mut s = vec![TensorSpec::new("model.embed_tokens.weight", &[c.vocab, h], Init::Uniform(1.0))];
    for i in 0..c.layers {
        attn_specs(&|rest| layer_name(i, rest), c, &mut s);
        moe_specs(c, i, &mut s);
    }
    s.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    s.push(TensorSpec::linear("lm_head.weight", c.vocab, h));
    for i in 0..c.draft_layers {
        attn_specs(&|rest| draft_name(i, rest), c, &mut s);
        expert_specs(&draft_name(i, "mlp"), c, &mut s);
    }
    if c.draft_layers > 0 {
        s.push(TensorSpec::new("mtp.norm.weight", &[h], Init::Ones));
    }
    s
}

fn load_attn(w: &Weights, name: &dyn Fn(&str) -> String, c: &ModelConfig) -> Result<Attn> {
    let (h, qd, kvd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    Ok(Attn {
        norm: w.tensor(&name("input_layernorm.weight"), &[h])?,
        wq: w.tensor(&name("self_attn.q_proj.weight"), &[qd, h])?,
        wk: w.tensor(&name("self_attn.k_proj.weight"), &[kvd, h])?,
        wv: w.tensor(&name("self_attn.v_proj.weight"), &[kvd, h])?,
        wo: w.tensor(&name("self_attn.o_proj.weight"), &[h, qd])?,
    })
}

impl Model {
    pub fn load(c: ModelConfig, w: &Weights) -> Result<Model> {
        let bad = |message: String| EngineError::Config { path: w.path().into(), message };
        c.validate().map_err(bad)?;
        let grid = if c.prompt_rows > 0 { c.prompt_rows } else { c.prefill_chunk };
        let h = c.hidden;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let name = |rest: &str| layer_name(i, rest);
            let experts = LayerExperts::load(w, &c, i)?;
            layers.push(Layer {
                attn: load_attn(w, &name, &c)?,
                ffn_norm: w.tensor(&name("post_attention_layernorm.weight"), &[h])?,
                moe: experts.with_router(w, &c)?,
            });
        }
        let mut draft = Vec::with_capacity(c.draft_layers);
        for i in 0..c.draft_layers {
            let name = |rest: &str| draft_name(i, rest);
            draft.push(DraftLayer {
                attn: load_attn(w, &name, &c)?,
                ffn_norm: w.tensor(&name("post_attention_layernorm.weight"), &[h])?,
                ffn: load_expert(w, &name("mlp"), &c)?,
            });
        }
        let draft_norm = if c.draft_layers > 0 { w.tensor("mtp.norm.weight", &[h])? } else { Vec::new() };
        Ok(Model {
            embed: w.tensor("model.embed_tokens.weight", &[c.vocab, h])?,
            layers,
            final_norm: w.tensor("model.norm.weight", &[h])?,
            lm_head: w.tensor("lm_head.weight", &[c.vocab, h])?,
            draft,
            draft_norm,
            rope: Rope::new(c.head_dim, c.rope_theta),
            grid,
            hash: model_hash(&c, w),
            config: c,
        })
    }
}
