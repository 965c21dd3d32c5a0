//! glm53's `Tiled` matmul on AVX2 (no AVX-512): `matmul_avx512::tiled` with eight x rows in the lanes of a ymm
//! register instead of sixteen, against six weight rows at a time (six part sums and six totals in registers).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::{place_lanes, tiled_walk};

/// X rows a `tiled` pass holds side by side: one per lane.
const TILED_LANES: usize = 8;
/// Weight rows a pass takes at once: six part sums, six totals, the x lanes and a broadcast weight fit sixteen
/// registers.
const WIDE: usize = 6;

/// The `Tiled` matmul, `y[r, o] = dot_tiled(x[r], w[o], parts)`: the lanes over eight x rows (copied transposed
/// once per call), each lane in `dot_tiled`'s order (the parts last to first, within a part `k` ascending, each
/// step a multiply then an add, every sum from -0.0), so the bits are the portable path's.
///
/// # Safety
/// The CPU has AVX2; `x` is `rows x in_dim`, `w` is `cols` weight rows of `in_dim`, `y` is `rows x cols`, and
/// `in_dim > 0`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tiled(x: &[f32], rows: usize, w: &[f32], cols: usize, in_dim: usize, parts: usize, y: &mut [f32]) {
    assert!(in_dim > 0 && x.len() == rows * in_dim && w.len() == cols * in_dim && y.len() == rows * cols);
    let parts = parts.clamp(1, in_dim);
    let step = in_dim.div_ceil(parts).max(1);
    tiled_walk::<TILED_LANES>(x, rows, in_dim, cols, |o, xt, r0, lanes| {
        // SAFETY (each arm): the CPU has AVX2; weight rows o..o + C exist, `xt` holds `in_dim` rows of lanes
        unsafe {
            match cols - o {
                WIDE.. => place_lanes(tiled_cols::<WIDE>(w, o, in_dim, xt, step), y, cols, r0, lanes, o),
                _ => place_lanes(tiled_cols::<1>(w, o, in_dim, xt, step), y, cols, r0, lanes, o),
            }
        }
    });
}

/// The sums of weight rows `o..o + C` against the eight transposed x rows of `xt`: `[C][lane]`.
///
/// # Safety
/// The CPU has AVX2; `w` holds rows `o..o + C` of `in_dim`; `xt` holds `in_dim` rows of 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn tiled_cols<const C: usize>(
    w: &[f32],
    o: usize,
    in_dim: usize,
    xt: &[f32],
    step: usize,
) -> [[f32; TILED_LANES]; C] {
    let wr: [&[f32]; C] = std::array::from_fn(|j| &w[(o + j) * in_dim..(o + j + 1) * in_dim]);
    assert!(xt.len() >= in_dim * TILED_LANES, "tiled: transposed rows too short");
    let neg_zero = _mm256_set1_ps(-0.0);
    let mut total = [neg_zero; C];
    for start in (0..in_dim).step_by(step).rev() {
        let end = (start + step).min(in_dim);
        let mut part = [neg_zero; C];
        for k in start..end {
            // SAFETY: `k < in_dim` and `xt` holds `in_dim` rows of 8 lanes (asserted); unaligned load
            let xv = unsafe { _mm256_loadu_ps(xt.as_ptr().add(k * TILED_LANES)) };
            for (p, row) in part.iter_mut().zip(&wr) {
                *p = _mm256_add_ps(*p, _mm256_mul_ps(xv, _mm256_set1_ps(row[k])));
            }
        }
        for (t, p) in total.iter_mut().zip(&part) {
            *t = _mm256_add_ps(*t, *p);
        }
    }
    total.map(|t| {
        let mut out = [0.0f32; TILED_LANES];
        // SAFETY: `out` is 8 f32s; unaligned store
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), t) };
        out
    })
}
