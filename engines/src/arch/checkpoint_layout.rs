//! The part of a checkpoint every arch lays out the same way: per-layer tensor names and the MoE block
//! (router, routed experts, shared experts).
//!
//! Kept in one place so the fixtures every arch writes and the loaders that read them cannot drift apart.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::fixture::TensorSpec;
use crate::moe::{Expert, Moe};
use crate::weights::Weights;

/// The name of tensor `rest` in main-model layer `layer`.
pub fn layer_name(layer: usize, rest: &str) -> String {
    format!("model.layers.{layer}.{rest}")
}

/// One SiLU-gated FFN under `prefix`: gate, up, down.
pub fn expert_specs(prefix: &str, c: &ModelConfig, out: &mut Vec<TensorSpec>) {
    out.push(TensorSpec::linear(format!("{prefix}.gate_proj.weight"), c.ffn, c.hidden));
    out.push(TensorSpec::linear(format!("{prefix}.up_proj.weight"), c.ffn, c.hidden));
    out.push(TensorSpec::linear(format!("{prefix}.down_proj.weight"), c.hidden, c.ffn));
}

/// Layer `layer`'s MoE block in checkpoint order: the router, the routed experts, the shared experts.
pub fn moe_specs(c: &ModelConfig, layer: usize, out: &mut Vec<TensorSpec>) {
    out.push(TensorSpec::linear(layer_name(layer, "mlp.gate.weight"), c.experts, c.hidden));
    for e in 0..c.experts {
        expert_specs(&layer_name(layer, &format!("mlp.experts.{e}")), c, out);
    }
    for e in 0..c.shared_experts {
        expert_specs(&layer_name(layer, &format!("mlp.shared_experts.{e}")), c, out);
    }
}

/// Load the SiLU-gated FFN under `prefix`.
pub fn load_expert(w: &Weights, prefix: &str, c: &ModelConfig) -> Result<Expert> {
    Ok(Expert {
        gate: w.tensor(&format!("{prefix}.gate_proj.weight"), &[c.ffn, c.hidden])?,
        up: w.tensor(&format!("{prefix}.up_proj.weight"), &[c.ffn, c.hidden])?,
        down: w.tensor(&format!("{prefix}.down_proj.weight"), &[c.hidden, c.ffn])?,
    })
}

/// A layer's routed and shared experts, loaded ahead of its router.
///
/// The two steps are separate because every arch loads the experts at one point of a layer and the router at
/// another: a checkpoint that does not fit the config is reported by the first tensor that fails, and that
/// must stay the tensor it always was.
#[derive(Debug)]
pub struct LayerExperts {
    layer: usize,
    experts: Vec<Expert>,
    shared: Vec<Expert>,
}

impl LayerExperts {
    /// Load layer `layer`'s routed experts, then its shared experts.
    pub fn load(w: &Weights, c: &ModelConfig, layer: usize) -> Result<Self> {
        let experts = (0..c.experts)
            .map(|e| load_expert(w, &layer_name(layer, &format!("mlp.experts.{e}")), c))
            .collect::<Result<Vec<_>>>()?;
        let shared = (0..c.shared_experts)
            .map(|e| load_expert(w, &layer_name(layer, &format!("mlp.shared_experts.{e}")), c))
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerExperts { layer, experts, shared })
    }

    /// Load the layer's router and complete its MoE block.
    pub fn with_router(self, w: &Weights, c: &ModelConfig) -> Result<Moe> {
        Ok(Moe {
            hidden: c.hidden,
            ffn: c.ffn,
            top_k: c.top_k,
            router: w.tensor(&layer_name(self.layer, "mlp.gate.weight"), &[c.experts, c.hidden])?,
            experts: self.experts,
            shared: self.shared,
        })
    }
}
