//! The attention projections deepseek and inkling share: GQA q/k/v/o (`GqaProj`) with a per-head RMS norm on q and
//! k. One home, so both archs load the same tensors in the same order and compute q/k/v the same way.

use crate::arch::gqa_dims::Dims;
use crate::arch::gqa_proj::GqaProj;
use crate::config::BaseConfig;
use crate::error::Result;
use crate::kernels::{rms_norm, Reduction, Rope};
use crate::tensors::Source;

/// A layer's GQA projections and the `[head_dim]` q and k norms, applied per head.
#[derive(Debug, Clone)]
pub struct QkNormProj {
    pub gqa: GqaProj,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

impl QkNormProj {
    /// The six tensors under `t`, in checkpoint order.
    pub fn load(t: &mut dyn Source, c: &BaseConfig) -> Result<QkNormProj> {
        Ok(QkNormProj {
            gqa: GqaProj::load(t, c)?,
            q_norm: t.norm("self_attn.q_norm.weight", c.head_dim)?,
            k_norm: t.norm("self_attn.k_norm.weight", c.head_dim)?,
        })
    }

    /// q, k and v of the `s` normed rows `xn`, before their norms and rope.
    pub fn project(&self, xn: &[f32], s: usize, d: Dims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        self.gqa.project(Reduction::Invariant, xn, s, d)
    }

    /// The per-head q and k norms, then rope of each row at its position (`pos0` for the first).
    pub fn norm_rope(&self, q: &mut [f32], k: &mut [f32], rope: &Rope, eps: f32, pos0: usize, d: Dims) {
        rms_norm(q, &self.q_norm, eps);
        rms_norm(k, &self.k_norm, eps);
        for (i, (qr, kr)) in q.chunks_exact_mut(d.qd).zip(k.chunks_exact_mut(d.kvd)).enumerate() {
            let angles = rope.angles(pos0 + i);
            rope.rotate(qr, &angles);
            rope.rotate(kr, &angles);
        }
    }
}
