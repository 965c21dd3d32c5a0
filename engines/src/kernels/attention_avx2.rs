//! Attention's weighted sums on AVX2 with FMA (no AVX-512), bitwise the portable fold: every output element is its
//! own chain of fused multiply-adds in value order, so the `Q x C` chunks of a fold (up to 32 ymm registers of
//! sums) are taken a sub-tile at a time, `QG` queries by `G` half-chunks that fit the sixteen registers beside a
//! weight and a value row's half-chunk. Each value row is loaded once per sub-tile; the rows of a block stay in L1.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::LANES;

/// Lanes of a ymm register: half of a chunk.
const HALF: usize = 8;

/// `attention_avx512::weighted` on AVX2: `acc[q][at·16 .. (at + C)·16] += Σⱼ p[q][j] · v[j][..]`, value by value in
/// order, one fused multiply-add per element.
///
/// # Safety
/// The CPU has AVX2 and FMA; every `p[q]` holds at least `v.len()` weights, and every value row and every `acc[q]`
/// at least `(at + C) · 16` f32s.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) unsafe fn weighted<const Q: usize, const C: usize>(
    p: [&[f32]; Q],
    v: &[&[f32]],
    at: usize,
    acc: [&mut [f32]; Q],
) {
    let pp = p.map(<[f32]>::as_ptr);
    let op = acc.map(|a| a.as_mut_ptr());
    let halves = 2 * C;
    // queries a sub-tile: the largest of 4, 3, 2, 1 that divides Q; then as many half-chunks as keep it at 12 sums
    let qg = [4, 3, 2, 1].into_iter().find(|g| Q.is_multiple_of(*g)).unwrap_or(1);
    let g = (12 / qg).min(halves);
    let g = [8, 4, 2, 1].into_iter().find(|c| *c <= g && halves.is_multiple_of(*c)).unwrap_or(1);
    for q0 in (0..Q).step_by(qg) {
        for h0 in (0..halves).step_by(g) {
            let first = at * LANES + h0 * HALF;
            macro_rules! sub {
                ($($qg:literal x $g:literal),*) => {
                    match (qg, g) {
                        $(($qg, $g) => {
                            let w: [*const f32; $qg] = std::array::from_fn(|i| pp[q0 + i]);
                            let o: [*mut f32; $qg] = std::array::from_fn(|i| op[q0 + i]);
                            // SAFETY: the sub-tile's columns lie inside `(at + C) · 16` (the caller's contract)
                            unsafe { sub_tile::<$qg, $g>(w, v, first, o) }
                        })*
                        _ => unreachable!("fold sub-tile {qg} x {g}"),
                    }
                };
            }
            sub!(4 x 2, 3 x 4, 3 x 2, 2 x 4, 2 x 2, 1 x 8, 1 x 4, 1 x 2);
        }
    }
}

/// `QG` queries' sums over `G` half-chunks from column `first`: loaded, folded over every value, stored.
///
/// # Safety
/// AVX2 and FMA; the weights hold `v.len()` values; value rows and outputs hold `first + G · 8` f32s.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn sub_tile<const QG: usize, const G: usize>(
    w: [*const f32; QG],
    v: &[&[f32]],
    first: usize,
    out: [*mut f32; QG],
) {
    // SAFETY (every access below): inside the rows by the caller's contract; unaligned loads and stores
    let mut a: [[__m256; G]; QG] =
        std::array::from_fn(|q| std::array::from_fn(|c| unsafe { _mm256_loadu_ps(out[q].add(first + c * HALF)) }));
    for (j, row) in v.iter().enumerate() {
        let vp = row.as_ptr();
        let vv: [__m256; G] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(vp.add(first + c * HALF)) });
        for (aq, wq) in a.iter_mut().zip(&w) {
            let wj = _mm256_set1_ps(unsafe { *wq.add(j) });
            for (ac, vc) in aq.iter_mut().zip(&vv) {
                *ac = _mm256_fmadd_ps(wj, *vc, *ac);
            }
        }
    }
    for (o, aq) in out.iter().zip(&a) {
        for (c, ac) in aq.iter().enumerate() {
            unsafe { _mm256_storeu_ps(o.add(first + c * HALF), *ac) };
        }
    }
}
