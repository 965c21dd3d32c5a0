//! RMS normalisation, one row at a time.

use super::dot;

/// `x[r] = x[r] / rms(x[r]) * w` for every row of width `w.len()`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let ms = dot(row, row) / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}
