//! The end of every single-output forward: the last row of the residual stream through the final RMS norm and
//! the lm head gives the logits the next token is sampled from.

use crate::config::BaseConfig;
use crate::kernels::{matmul, rms_norm};

/// The logits of row `rows - 1` of `x` (`rows` rows of `c.hidden`).
pub fn last_row_logits(x: &[f32], rows: usize, c: &BaseConfig, final_norm: &[f32], lm_head: &[f32]) -> Vec<f32> {
    let h = c.hidden;
    let mut last = x[(rows - 1) * h..].to_vec();
    rms_norm(&mut last, final_norm, c.norm_eps);
    let mut logits = vec![0.0; c.vocab];
    matmul(&last, 1, lm_head, c.vocab, h, &mut logits);
    logits
}
