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
