//! The FFN half of every arch's layer: RMS-norm the residual stream, run the MoE block, add its output back.
//!
//! Shared so the five forwards do these steps in one order; the arithmetic (and so every logit bit) is that of
//! the code each arch used to spell out.

use crate::kernels::{rms_norm, Reduction};
use crate::moe::Moe;

/// `x += moe(rms_norm(x, ffn_norm))` over `rows` rows of `x`, with the MoE matmuls reduced by `red`.
pub fn add_moe_sublayer(x: &mut [f32], ffn_norm: &[f32], norm_eps: f32, moe: &Moe, red: Reduction, rows: usize) {
    let mut xn = x.to_vec();
    rms_norm(&mut xn, ffn_norm, norm_eps);
    let f = moe.forward(red, &xn, rows);
    x.iter_mut().zip(&f).for_each(|(a, b)| *a += b);
}
