//! The AVX-512 `acc_tile`: one zmm register per (x row, w row) accumulator, one `vfmadd` per 16-lane chunk —
//! lane for lane the portable loop's `f32::mul_add` (a fused multiply-add rounds once, however it is computed).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::{Lanes, LANES};

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

/// Weight rows a `tiled` pass holds side by side: one per lane.
const TILED_LANES: usize = 16;

/// The `Tiled` matmul, `y[r, o] = dot_tiled(x[r], w[o], parts)`, with the lanes over sixteen weight rows (copied
/// transposed, so a lane reads its row's element `k` where the others read theirs) and eight x rows at a time. Each
/// lane keeps `dot_tiled`'s order: the parts last to first, within a part `k` ascending, each step a multiply then
/// an add (two roundings, as the portable loop), every sum from -0.0. So the bits are the portable path's.
///
/// # Safety
/// The CPU has AVX-512F; `x` is `rows x in_dim`, `w` is `out_dim x in_dim`, `y` is `rows x out_dim`, and
/// `in_dim > 0`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tiled(
    x: &[f32],
    rows: usize,
    w: &[f32],
    out_dim: usize,
    in_dim: usize,
    parts: usize,
    y: &mut [f32],
) {
    assert!(in_dim > 0 && x.len() == rows * in_dim && w.len() == out_dim * in_dim && y.len() == rows * out_dim);
    let parts = parts.clamp(1, in_dim);
    let step = in_dim.div_ceil(parts).max(1);
    let mut wt = vec![0.0f32; in_dim * TILED_LANES];
    for o in (0..out_dim).step_by(TILED_LANES) {
        let lanes = (out_dim - o).min(TILED_LANES);
        // lanes past the last weight row read zeros and are never stored
        wt.fill(0.0);
        for j in 0..lanes {
            for (k, v) in w[(o + j) * in_dim..(o + j + 1) * in_dim].iter().enumerate() {
                wt[k * TILED_LANES + j] = *v;
            }
        }
        let mask: __mmask16 = if lanes == TILED_LANES { !0 } else { (1u16 << lanes) - 1 };
        let mut r = 0;
        while r < rows {
            // SAFETY (both calls): the CPU has AVX-512F; the rows exist, `wt` holds `in_dim` lanes of 16, `y` rows
            // hold `o + lanes` outputs
            unsafe {
                if rows - r >= 8 {
                    tiled_rows::<8>(x, r, in_dim, &wt, step, y, out_dim, o, mask);
                    r += 8;
                } else {
                    tiled_rows::<1>(x, r, in_dim, &wt, step, y, out_dim, o, mask);
                    r += 1;
                }
            }
        }
    }
}

/// `R` x rows from `r` against the transposed block `wt`: `y[r + i, o + lane]` for the lanes in `mask`.
///
/// # Safety
/// As `tiled`, for the rows `r..r + R` and the outputs `o..o + popcount(mask)`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled_rows<const R: usize>(
    x: &[f32],
    r: usize,
    in_dim: usize,
    wt: &[f32],
    step: usize,
    y: &mut [f32],
    out_dim: usize,
    o: usize,
    mask: __mmask16,
) {
    let xr: [&[f32]; R] = std::array::from_fn(|i| &x[(r + i) * in_dim..(r + i + 1) * in_dim]);
    let neg_zero = _mm512_set1_ps(-0.0);
    let mut total = [neg_zero; R];
    for start in (0..in_dim).step_by(step).rev() {
        let end = (start + step).min(in_dim);
        let mut part = [neg_zero; R];
        for k in start..end {
            // SAFETY: `k < in_dim`, and `wt` holds `in_dim` rows of 16 lanes; unaligned load
            let wv = unsafe { _mm512_loadu_ps(wt.as_ptr().add(k * TILED_LANES)) };
            for (p, row) in part.iter_mut().zip(&xr) {
                *p = _mm512_add_ps(*p, _mm512_mul_ps(_mm512_set1_ps(row[k]), wv));
            }
        }
        for (t, p) in total.iter_mut().zip(&part) {
            *t = _mm512_add_ps(*t, *p);
        }
    }
    for (i, t) in total.iter().enumerate() {
        let at = (r + i) * out_dim + o;
        assert!(at + (mask.count_ones() as usize) <= y.len(), "tiled: output row too short");
        // SAFETY: the masked lanes are `o..o + lanes` of row `r + i`, inside `y` (asserted)
        unsafe { _mm512_mask_storeu_ps(y.as_mut_ptr().add(at), mask, *t) };
    }
}
