//! The attention projections deepseek and inkling share: GQA q/k/v/o with a per-head RMS norm on q and k. One home,
//! so both archs load the same tensors in the same order and compute q/k/v the same way.

use crate::arch::gqa_dims::Dims;
use crate::config::BaseConfig;
use crate::error::Result;
use crate::kernels::{matmul, rms_norm, Rope};
use crate::tensors::Source;

/// A layer's projections: q `[qd, hidden]`, k and v `[kvd, hidden]`, o `[hidden, qd]` (`qd = heads · head_dim`,
/// `kvd = kv_heads · head_dim`), and the `[head_dim]` q and k norms, applied per head.
#[derive(Debug, Clone)]
pub struct QkNormProj {
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

impl QkNormProj {
    /// The six tensors under `t`, in checkpoint order.
    pub fn load(t: &mut dyn Source, c: &BaseConfig) -> Result<QkNormProj> {
        let Dims { h, hd, qd, kvd, .. } = Dims::of(c);
        Ok(QkNormProj {
            wq: t.linear("self_attn.q_proj.weight", qd, h)?,
            wk: t.linear("self_attn.k_proj.weight", kvd, h)?,
            wv: t.linear("self_attn.v_proj.weight", kvd, h)?,
            wo: t.linear("self_attn.o_proj.weight", h, qd)?,
            q_norm: t.norm("self_attn.q_norm.weight", hd)?,
            k_norm: t.norm("self_attn.k_norm.weight", hd)?,
        })
    }

    /// q, k and v of the `s` normed rows `xn`, before their norms and rope.
    pub fn project(&self, xn: &[f32], s: usize, d: Dims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut q = vec![0.0; s * d.qd];
        let mut k = vec![0.0; s * d.kvd];
        let mut v = vec![0.0; s * d.kvd];
        matmul(xn, s, &self.wq, d.qd, d.h, &mut q);
        matmul(xn, s, &self.wk, d.kvd, d.h, &mut k);
        matmul(xn, s, &self.wv, d.kvd, d.h, &mut v);
        (q, k, v)
    }

    /// The per-head q and k norms, then rope of each row at its position (`pos0` for the first).
    pub fn norm_rope(&self, q: &mut [f32], k: &mut [f32], rope: &Rope, eps: f32, pos0: usize, d: Dims) {
        rms_norm(q, &self.q_norm, eps);
        rms_norm(k, &self.k_norm, eps);
        for (i, (qr, kr)) in q.chunks_exact_mut(d.qd).zip(k.chunks_exact_mut(d.kvd)).enumerate() {
            rope.apply(qr, pos0 + i);
            rope.apply(kr, pos0 + i);
        }
    }
}
