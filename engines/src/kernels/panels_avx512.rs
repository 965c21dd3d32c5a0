//! The AVX-512 lane passes of `panels`: a tile of up to six x rows against one panel of 64 outputs, 24
//! accumulators in registers, each step four weight loads, six broadcasts and 24 `vfmadd` (lane for lane the
//! portable passes' `f32::mul_add`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::LANES;
use super::panels::{PANEL, TILE_ROWS};

/// Registers across a panel's 64 outputs.
const VECS: usize = PANEL / LANES;

/// `panels::panel_tile_portable`'s sums for `n` lane-major x rows against `panel`.
///
/// # Safety
/// The CPU has AVX-512F; `x` holds `n` rows of `in_dim` floats, `panel` `PANEL * in_dim`, `out` at least `n`
/// rows, and `1 <= n <= TILE_ROWS`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn panel_tile(x: &[f32], n: usize, panel: &[f32], in_dim: usize, out: &mut [[f32; PANEL]]) {
    debug_assert!(x.len() >= n * in_dim && panel.len() >= PANEL * in_dim && out.len() >= n && n <= TILE_ROWS);
    // SAFETY: as this function's own contract, with the row count a constant
    unsafe {
        match n {
            1 => tile::<1>(x, panel, in_dim, out),
            2 => tile::<2>(x, panel, in_dim, out),
            3 => tile::<3>(x, panel, in_dim, out),
            4 => tile::<4>(x, panel, in_dim, out),
            5 => tile::<5>(x, panel, in_dim, out),
            _ => tile::<TILE_ROWS>(x, panel, in_dim, out),
        }
    }
}

/// A tile's 4R registers: row `r`'s sums for the panel's 64 outputs in `[r][q]`.
type Sums<const R: usize> = [[__m512; VECS]; R];

/// `a + b`, register by register.
#[target_feature(enable = "avx512f")]
#[inline]
fn add<const R: usize>(a: Sums<R>, b: Sums<R>) -> Sums<R> {
    std::array::from_fn(|r| std::array::from_fn(|q| _mm512_add_ps(a[r][q], b[r][q])))
}

/// One tile of `R` rows: the sixteen lane passes, folded into `dot`'s tree as they come (lanes `l` and `l + 8`
/// first, then the pairs `h[g] + h[g + 4]`, then those four pairwise), so no more than a few passes' sums wait
/// in memory; then the tail fused in.
///
/// # Safety
/// As [`panel_tile`], with `n == R`.
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn tile<const R: usize>(x: &[f32], panel: &[f32], in_dim: usize, out: &mut [[f32; PANEL]]) {
    let chunks = in_dim / LANES;
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    // lane `l`'s sums: `dot`'s lane-`l` chain for each output, the chunks in order
    let pass = |l: usize| -> Sums<R> {
        let mut acc = [[_mm512_setzero_ps(); VECS]; R];
        // SAFETY: lane `l`'s chunks of row `r` are `x[r * in_dim + l * chunks..][..chunks]`, its weights
        // `panel[l * chunks * PANEL..][..chunks * PANEL]`, inside the slices (contract)
        let (xl, wl) = unsafe { (xp.add(l * chunks), wp.add(l * chunks * PANEL)) };
        for c in 0..chunks {
            // SAFETY: as above, `c < chunks`; unaligned loads
            let w: [__m512; VECS] = std::array::from_fn(|q| unsafe { _mm512_loadu_ps(wl.add(c * PANEL + q * LANES)) });
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as above, `r < R == n`
                let xb = _mm512_set1_ps(unsafe { *xl.add(r * in_dim + c) });
                for (aq, wq) in a.iter_mut().zip(&w) {
                    *aq = _mm512_fmadd_ps(xb, *wq, *aq);
                }
            }
        }
        acc
    };
    // `finish`'s tree: h[g] = lane g + lane (g + 8), then ((h0 + h4) + (h1 + h5)) + ((h2 + h6) + (h3 + h7))
    let h = |g: usize| add(pass(g), pass(g + 8));
    let pair = |g: usize| add(h(g), h(g + 4));
    let sums = add(add(pair(0), pair(1)), add(pair(2), pair(3)));
    for (r, row) in out.iter_mut().enumerate().take(R) {
        for (q, &sum) in sums[r].iter().enumerate() {
            let mut s = sum;
            for t in chunks * LANES..in_dim {
                // SAFETY: `t < in_dim`: the row's tail element and the panel's tail row `t`
                let (xv, wv) = unsafe { (*xp.add(r * in_dim + t), _mm512_loadu_ps(wp.add(t * PANEL + q * LANES))) };
                s = _mm512_fmadd_ps(_mm512_set1_ps(xv), wv, s);
            }
            // SAFETY: `row` holds PANEL floats; unaligned store
            unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(q * LANES), s) };
        }
    }
}
