//! The depthwise causal short convolution inkling (on k/v) and kimi (on q/k/v) run over time.
//!
//! One definition so both archs convolve in the same order; where the older inputs live (the window rows) and
//! when they are kept is each arch's own state handling.

use crate::cache::Rows;

/// Convolve `raw` (rows at positions `pos0..`, `window.width` wide) with `weight` (`[kernel, width]`, oldest tap
/// first). Taps before `pos0` read the window's row `p % (kernel - 1)`; taps before position 0 are zero padding.
/// `kernel` must be at least 1.
pub fn short_conv(raw: &[f32], weight: &[f32], kernel: usize, window: &Rows, pos0: usize) -> Vec<f32> {
    let width = window.width;
    let taps = kernel - 1;
    let rows = raw.len() / width;
    let mut out = vec![0.0; raw.len()];
    for i in 0..rows {
        let t = pos0 + i;
        let o = &mut out[i * width..(i + 1) * width];
        for j in 0..kernel {
            // tap j reads position t - taps + j; negative positions are zero padding
            let Some(p) = (t + j).checked_sub(taps) else { continue };
            let src = if p >= pos0 { &raw[(p - pos0) * width..(p - pos0 + 1) * width] } else { window.row(p % taps) };
            let w = &weight[j * width..(j + 1) * width];
            for ((a, x), g) in o.iter_mut().zip(src).zip(w) {
                *a += x * g;
            }
        }
    }
    out
}
