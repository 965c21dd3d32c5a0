//! The parts of a checkpoint every arch lays out the same way: the embedding, the per-layer prefix, the MoE
//! block (router, routed experts, shared experts), and the output head.

use crate::config::BaseConfig;
use crate::error::Result;
use crate::fixture::Init;
use crate::moe::{Expert, Moe};
use crate::tensors::{within, Source};

/// The prefix of main-model layer `layer`'s tensors.
pub fn layer_prefix(layer: usize) -> String {
    format!("model.layers.{layer}.")
}

/// The token embedding, `[vocab, hidden]`.
pub fn embedding(src: &mut dyn Source, c: &BaseConfig) -> Result<Vec<f32>> {
    src.take("model.embed_tokens.weight", &[c.vocab, c.hidden], Init::Uniform(1.0))
}

/// The final norm (`[hidden]`) and the lm head (`[vocab, hidden]`).
pub fn output_head(src: &mut dyn Source, c: &BaseConfig) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok((src.norm("model.norm.weight", c.hidden)?, src.linear("lm_head.weight", c.vocab, c.hidden)?))
}

/// One SiLU-gated FFN: gate and up `[ffn, hidden]`, down `[hidden, ffn]`.
pub fn expert(src: &mut dyn Source, c: &BaseConfig) -> Result<Expert> {
    Ok(Expert::new(
        src.linear("gate_proj.weight", c.ffn, c.hidden)?,
        src.linear("up_proj.weight", c.ffn, c.hidden)?,
        src.linear("down_proj.weight", c.hidden, c.ffn)?,
    ))
}

/// A layer's MoE block in checkpoint order: the router (`[experts, hidden]`), the routed experts, the shared ones.
pub fn moe(src: &mut dyn Source, c: &BaseConfig) -> Result<Moe> {
    let router = src.linear("mlp.gate.weight", c.experts, c.hidden)?;
    let experts =
        (0..c.experts).map(|e| expert(&mut within(src, format!("mlp.experts.{e}.")), c)).collect::<Result<_>>()?;
    let shared = (0..c.shared_experts)
        .map(|e| expert(&mut within(src, format!("mlp.shared_experts.{e}.")), c))
        .collect::<Result<_>>()?;
    Ok(Moe { hidden: c.hidden, ffn: c.ffn, top_k: c.top_k, router, experts, shared })
}

/// One decoder block: a pre-norm attention (or mixer) `A`, then a pre-norm MoE FFN.
#[derive(Debug, Clone)]
pub struct Block<A> {
    /// `[hidden]`.
    pub attn_norm: Vec<f32>,
    pub attn: A,
    /// `[hidden]`.
    pub ffn_norm: Vec<f32>,
    pub moe: Moe,
}

/// A decoder stack: the token embedding, the blocks, and the output head.
#[derive(Debug, Clone)]
pub struct Stack<A> {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<Block<A>>,
    /// `[hidden]`.
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]`.
    pub lm_head: Vec<f32>,
}

impl<A> Stack<A> {
    /// The stack from `src` in checkpoint order; `attn(t, i)` takes block `i`'s attention from `t` (the block's
    /// tensors, `model.layers.{i}.`).
    pub fn build(
        src: &mut dyn Source,
        c: &BaseConfig,
        mut attn: impl FnMut(&mut dyn Source, usize) -> Result<A>,
    ) -> Result<Self> {
        let embed = embedding(src, c)?;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = &mut within(src, layer_prefix(i));
            let attn_norm = t.norm("input_layernorm.weight", c.hidden)?;
            let attn = attn(t, i)?;
            let ffn_norm = t.norm("post_attention_layernorm.weight", c.hidden)?;
            layers.push(Block { attn_norm, attn, ffn_norm, moe: moe(t, c)? });
        }
        let (final_norm, lm_head) = output_head(src, c)?;
        Ok(Stack { embed, layers, final_norm, lm_head })
    }

    /// The embedding rows of `ids`, `hidden` wide each.
    pub fn embed_rows(&self, ids: &[u32], hidden: usize) -> Vec<f32> {
        let mut x = Vec::with_capacity(ids.len() * hidden);
        for &id in ids {
            x.extend_from_slice(&self.embed[id as usize * hidden..(id as usize + 1) * hidden]);
        }
        x
    }

    /// The logits of row `rows - 1` of `x` (`rows` rows of `c.hidden`).
    pub fn logits(&self, x: &[f32], rows: usize, c: &BaseConfig) -> Vec<f32> {
        crate::arch::output_head::last_row_logits(x, rows, c, &self.final_norm, &self.lm_head)
    }
}
