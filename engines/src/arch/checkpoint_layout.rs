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
    Ok(Expert {
        gate: src.linear("gate_proj.weight", c.ffn, c.hidden)?,
        up: src.linear("up_proj.weight", c.ffn, c.hidden)?,
        down: src.linear("down_proj.weight", c.hidden, c.ffn)?,
    })
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
