//! The GQA attention projections every GQA arch loads the same way (deepseek, inkling and glm53, main layers and
//! drafter): q `[qd, hidden]`, k and v `[kvd, hidden]`, o `[hidden, qd]` (`qd = heads · head_dim`,
//! `kvd = kv_heads · head_dim`). One home, so they are named, shaped and applied alike.

use crate::arch::gqa_dims::Dims;
use crate::config::BaseConfig;
use crate::error::Result;
use crate::kernels::{matmul_with, Reduction};
use crate::tensors::Source;

#[derive(Debug, Clone)]
pub struct GqaProj {
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
}

impl GqaProj {
    /// The four tensors under `t`, in checkpoint order.
    pub fn load(t: &mut dyn Source, c: &BaseConfig) -> Result<GqaProj> {
        let Dims { h, qd, kvd, .. } = Dims::of(c);
        Ok(GqaProj {
            wq: t.linear("self_attn.q_proj.weight", qd, h)?,
            wk: t.linear("self_attn.k_proj.weight", kvd, h)?,
            wv: t.linear("self_attn.v_proj.weight", kvd, h)?,
            wo: t.linear("self_attn.o_proj.weight", h, qd)?,
        })
    }

    /// q, k and v of the `s` normed rows `xn`, reduced in `red`'s order.
    pub fn project(&self, red: Reduction, xn: &[f32], s: usize, d: Dims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut q = vec![0.0; s * d.qd];
        let mut k = vec![0.0; s * d.kvd];
        let mut v = vec![0.0; s * d.kvd];
        matmul_with(red, xn, s, &self.wq, d.qd, d.h, &mut q);
        matmul_with(red, xn, s, &self.wk, d.kvd, d.h, &mut k);
        matmul_with(red, xn, s, &self.wv, d.kvd, d.h, &mut v);
        (q, k, v)
    }
}
