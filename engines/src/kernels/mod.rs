//! Batch-invariant kernels: every output element is reduced in one fixed order (a fixed 16-lane split of fused
//! multiply-adds, then a fixed horizontal sum), so a row's result never depends on how many other rows share the batch, nor on
//! prefill vs decode. Parallelism goes over output rows/tiles, never inside a reduction.

mod activation;
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
mod attention_tiles;
mod dot_tiles;
#[cfg(target_arch = "x86_64")]
mod dot_tiles_avx512;
mod exp;
mod interleaved;
#[cfg(target_arch = "x86_64")]
mod lane_dots_avx512;
mod matmul;
#[cfg(target_arch = "x86_64")]
mod matmul_avx512;
mod norm;
mod qdot;
#[cfg(target_arch = "x86_64")]
mod qdot_avx512;
#[cfg(target_arch = "x86_64")]
mod qdot_x4_avx512;
mod quant;
#[cfg(target_arch = "x86_64")]
mod quantize_avx512;
mod rope;
#[cfg(target_arch = "x86_64")]
mod softmax_avx512;
mod work;

pub use activation::{silu, softmax_in_place, softmax_scaled};
pub use attention::{attend, attend_many, push_dots, softmax_parts, weighted_sum, Scores};
pub use exp::exp;
pub use matmul::{dot, matmul, matmul_with, LANES};
pub use norm::rms_norm;
pub use quant::{dequantize_row, f16_to_f32, qmatmul, qmatmul_each, QBytes, QMatrix, QType, QK};
pub use rope::{angles as rope_angles, Rope};
pub use work::{work, Work};

/// How a kernel splits a reduction. `Invariant` is the default; `Tiled(n)` splits each reduction into `n`
/// partial sums added in a different order, as GPU kernels pick tiling from the problem shape (glm53 uses it to
/// be deliberately not batch-invariant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    Invariant,
    Tiled(usize),
}

/// What the kernels' tests share: seeded random rows and a buffer split into equal output rows.
#[cfg(test)]
pub(crate) mod test_rows {
    use crate::rng::SplitMix64;

    /// `n` values uniform in [-1, 1) from `seed`.
    pub fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.uniform(1.0)).collect()
    }

    /// The first `R` rows of `width` of `x`.
    pub fn split<const R: usize>(x: &mut [f32], width: usize) -> [&mut [f32]; R] {
        let mut it = x.chunks_exact_mut(width);
        std::array::from_fn(|_| it.next().expect("enough rows"))
    }
}
