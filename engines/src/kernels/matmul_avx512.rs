//! The AVX-512 `acc_tile`: one zmm register per (x row, w row) accumulator, one `vfmadd` per 16-lane chunk —
//! lane for lane the portable loop's `f32::mul_add` (a fused multiply-add rounds once, however it is computed).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::{place_lanes, tiled_walk, Lanes, LANES};

/// `acc[r][c][l] = Σ_k x[r][k][l] · w[c][k][l]`, each step fused, `k` ascending. Compiled on its own with the
/// shapes as constants, every accumulator lives in a register (the 4 x 4 step is 8 loads and 16 `vfmadd`, no
/// spills).
///
/// # Safety
/// The CPU has AVX-512F, and every row of `x` and `w` holds at least `n` chunks.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn acc_tile<const R: usize, const C: usize>(
    x: [&[Lanes]; R],
    w: [&[Lanes]; C],
    n: usize,
) -> [[Lanes; C]; R] {
    let xp = x.map(|r| r.as_ptr().cast::<f32>());
    let wp = w.map(|r| r.as_ptr().cast::<f32>());
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for k in 0..n {
        // SAFETY: `k < n` and every row holds `n` chunks of `LANES` f32s; unaligned loads
        let wv: [__m512; C] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(wp[c].add(k * LANES)) });
        for (a, p) in acc.iter_mut().zip(&xp) {
            // SAFETY: as above
            let xv = unsafe { _mm512_loadu_ps(p.add(k * LANES)) };
            for (ac, wc) in a.iter_mut().zip(&wv) {
                *ac = _mm512_fmadd_ps(xv, *wc, *ac);
            }
        }
    }
    acc.map(|a| {
        a.map(|v| {
            let mut out = [0.0f32; LANES];
            // SAFETY: `out` is 16 f32s; unaligned store
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
            out
        })
    })
}

/// X rows a `tiled` pass holds side by side: one per lane.
const TILED_LANES: usize = 16;

/// The `Tiled` matmul, `y[r, o] = dot_tiled(x[r], w[o], parts)`, with the lanes over sixteen x rows (copied
/// transposed once per call, so a lane reads its row's element `k` where the others read theirs) against sixteen
/// weight rows at a time (then eight, then one). Each lane keeps `dot_tiled`'s order: the parts last to first,
/// within a part `k` ascending, each step a multiply then an add (two roundings, as the portable loop), every sum
/// from -0.0. So the bits are the portable path's.
///
/// # Safety
/// The CPU has AVX-512F; `x` is `rows x in_dim`, `w` is `cols` weight rows of `in_dim`, `y` is `rows x cols`,
/// and `in_dim > 0`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tiled(x: &[f32], rows: usize, w: &[f32], cols: usize, in_dim: usize, parts: usize, y: &mut [f32]) {
    assert!(in_dim > 0 && x.len() == rows * in_dim && w.len() == cols * in_dim && y.len() == rows * cols);
    let parts = parts.clamp(1, in_dim);
    let step = in_dim.div_ceil(parts).max(1);
    tiled_walk::<TILED_LANES>(x, rows, in_dim, cols, |o, xt, r0, lanes| {
        // SAFETY (each arm): the CPU has AVX-512F; weight rows o..o + C exist, `xt` holds `in_dim` rows of lanes
        unsafe {
            match cols - o {
                16.. => place_lanes(tiled_cols::<16>(w, o, in_dim, xt, step), y, cols, r0, lanes, o),
                8..=15 => place_lanes(tiled_cols::<8>(w, o, in_dim, xt, step), y, cols, r0, lanes, o),
                _ => place_lanes(tiled_cols::<1>(w, o, in_dim, xt, step), y, cols, r0, lanes, o),
            }
        }
    });
}

/// The sums of weight rows `o..o + C` against the sixteen transposed x rows of `xt`: `[C][lane]`.
///
/// # Safety
/// The CPU has AVX-512F; `w` holds rows `o..o + C` of `in_dim`; `xt` holds `in_dim` rows of 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tiled_cols<const C: usize>(w: &[f32], o: usize, in_dim: usize, xt: &[f32], step: usize) -> [[f32; 16]; C] {
    let wr: [&[f32]; C] = std::array::from_fn(|j| &w[(o + j) * in_dim..(o + j + 1) * in_dim]);
    assert!(xt.len() >= in_dim * TILED_LANES, "tiled: transposed rows too short");
    let neg_zero = _mm512_set1_ps(-0.0);
    let mut total = [neg_zero; C];
    for start in (0..in_dim).step_by(step).rev() {
        let end = (start + step).min(in_dim);
        let mut part = [neg_zero; C];
        for k in start..end {
            // SAFETY: `k < in_dim` and `xt` holds `in_dim` rows of 16 lanes (asserted); unaligned load
            let xv = unsafe { _mm512_loadu_ps(xt.as_ptr().add(k * TILED_LANES)) };
            for (p, row) in part.iter_mut().zip(&wr) {
                *p = _mm512_add_ps(*p, _mm512_mul_ps(xv, _mm512_set1_ps(row[k])));
            }
        }
        for (t, p) in total.iter_mut().zip(&part) {
            *t = _mm512_add_ps(*t, *p);
        }
    }
    total.map(|t| {
        let mut out = [0.0f32; 16];
        // SAFETY: `out` is 16 f32s; unaligned store
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), t) };
        out
    })
}
