//! Batch-invariant kernels: every output element is reduced in one fixed order (a fixed 16-lane split of fused
//! multiply-adds, then a fixed horizontal sum), so a row's result never depends on how many other rows share the batch, nor on
//! prefill vs decode. Parallelism goes over output rows/tiles, never inside a reduction.

mod activation;
mod ask_rows;
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_avx2;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
mod attention_tiles;
mod dot_tiles;
#[cfg(target_arch = "x86_64")]
mod dot_tiles_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_tiles_avx512;
mod exp;
mod interleaved;
#[cfg(target_arch = "x86_64")]
mod lane_dots_avx512;
mod matmul;
#[cfg(target_arch = "x86_64")]
mod matmul_avx2;
#[cfg(target_arch = "x86_64")]
mod matmul_avx512;
mod norm;
mod panels;
#[cfg(target_arch = "x86_64")]
mod panels_avx512;
mod qdot;
#[cfg(target_arch = "x86_64")]
mod qdot_avx512;
#[cfg(target_arch = "x86_64")]
mod qdot_x4_avx2;
#[cfg(target_arch = "x86_64")]
mod qdot_x4_avx512;
mod quant;
#[cfg(target_arch = "x86_64")]
mod quantize_avx512;
mod rope;
#[cfg(target_arch = "x86_64")]
mod softmax_avx512;
mod softplus;
mod tail_blocks;
mod work;

pub use activation::{silu, softmax_in_place, softmax_scaled};
pub use ask_rows::ask_rows;
pub use attention::{attend, attend_many, push_dots, softmax_parts, weighted_sum, Scores};
pub use exp::exp;
pub use matmul::{dot, matmul, matmul_with, matmul_with_tail, matmuls_invariant, LANES};
pub use norm::rms_norm;
pub use panels::{matmul_panels, Panels};
pub use quant::{dequantize_row, f16_to_f32, qmatmul, qmatmul_each, QBytes, QMatrix, QType, QK};
pub use rope::{angles as rope_angles, Rope};
pub use softplus::softplus;
pub use tail_blocks::TailBlocks;
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

    /// A quantized-weight tile test's inputs: `rows` weight rows of `blocks` blocks of `ty` as a file lays them out
    /// (Q8_0 with -128 in row 1 and 127 in row 2, which llama.cpp never writes together but a file may hold), and
    /// 11 activation rows quantized; `wscale` and `xscale` (0..4) pick each side's magnitude, 0 to 300.
    pub fn quantized_tile_inputs(
        ty: super::QType,
        rows: usize,
        blocks: usize,
        seed: u64,
        (wscale, xscale): (u32, u32),
    ) -> (Vec<u8>, super::qdot::QActs) {
        let in_dim = blocks * super::QK;
        let scale = |s: u32| [0.0, 1e-3, 1.0, 300.0][s as usize];
        let w: Vec<f32> = random(rows * in_dim, seed).iter().map(|v| v * scale(wscale)).collect();
        let mut file = super::QMatrix::quantize(ty, &w, rows, in_dim).raw_bytes().to_vec();
        if ty == super::QType::Q8_0 {
            let rb = ty.row_bytes(in_dim);
            file[rb + 2 + (seed % 32) as usize] = 0x80;
            file[2 * rb + 2 + (seed % 31) as usize] = 0x7f;
        }
        let x: Vec<f32> = random(11 * in_dim, seed ^ 5).iter().map(|v| v * scale(xscale)).collect();
        (file, super::qdot::QActs::quantize(&x, 11, in_dim))
    }

    /// Group `g` of `inter` (`file`'s rows interleaved, `rb` bytes a row) through an interleaved kernel's `tile`
    /// against activation rows `r0..r0 + R` of `xq`: every element bitwise `qdot::dot_reference` on the file's rows.
    pub fn check_interleaved_group<const R: usize>(
        ty: super::QType,
        (file, inter, rb): (&[u8], &[u8], usize),
        g: usize,
        xq: &super::qdot::QActs,
        r0: usize,
        tile: impl FnOnce(&[u8], &mut [[f32; R]; 4]),
    ) {
        let mut out = [[0.0f32; R]; 4];
        tile(&inter[4 * g * rb..4 * (g + 1) * rb], &mut out);
        for (c, got) in out.iter().enumerate() {
            let w = &file[(4 * g + c) * rb..(4 * g + c + 1) * rb];
            for (r, v) in got.iter().enumerate() {
                let want = super::qdot::dot_reference(ty, w, xq.row(r0 + r));
                assert_eq!(v.to_bits(), want.to_bits(), "{ty:?} R {R}: group {g} row {c}, activation row {r}");
            }
        }
    }

    /// The first `R` rows of `width` of `x`.
    pub fn split<const R: usize>(x: &mut [f32], width: usize) -> [&mut [f32]; R] {
        let mut it = x.chunks_exact_mut(width);
        std::array::from_fn(|_| it.next().expect("enough rows"))
    }
}
