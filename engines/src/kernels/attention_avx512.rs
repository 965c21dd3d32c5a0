//! Attention's weighted sums on AVX-512, bitwise the portable fold: `Q` queries' sums over the same values at
//! once, each output element folded in value order with one fused multiply-add per value, so every value row is
//! loaded once for the `Q` queries.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::LANES;

/// `acc[q][at·16 .. (at + C)·16] += Σⱼ p[q][j] · v[j][..]`, value by value in order, one fused multiply-add per
/// element: the portable fold's bits. The `Q x C` sums stay in registers over all the values, and each value chunk
/// is loaded once for the `Q` queries.
///
/// # Safety
/// The CPU has AVX-512F; every `p[q]` holds at least `v.len()` weights, and every value row and every `acc[q]` at
/// least `(at + C) · 16` f32s.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn weighted<const Q: usize, const C: usize>(
    p: [&[f32]; Q],
    v: &[&[f32]],
    at: usize,
    acc: [&mut [f32]; Q],
) {
    const { assert!(Q * C <= 16, "sixteen accumulators at most") };
    let pp = p.map(<[f32]>::as_ptr);
    let op = acc.map(|a| a.as_mut_ptr());
    // SAFETY (every access below): the outputs and value rows hold chunks `at..at + C`, the weights `v.len()`
    // values (the caller's contract); unaligned loads and stores
    let mut a: [[__m512; C]; Q] =
        std::array::from_fn(|q| std::array::from_fn(|c| unsafe { _mm512_loadu_ps(op[q].add((at + c) * LANES)) }));
    for (j, row) in v.iter().enumerate() {
        let vp = row.as_ptr();
        let vv: [__m512; C] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(vp.add((at + c) * LANES)) });
        for (aq, w) in a.iter_mut().zip(&pp) {
            let wj = _mm512_set1_ps(unsafe { *w.add(j) });
            for (ac, vc) in aq.iter_mut().zip(&vv) {
                *ac = _mm512_fmadd_ps(wj, *vc, *ac);
            }
        }
    }
    for (o, aq) in op.iter().zip(&a) {
        for (c, ac) in aq.iter().enumerate() {
            unsafe { _mm512_storeu_ps(o.add((at + c) * LANES), *ac) };
        }
    }
}

/// `weighted` for `G` kv heads at once: head `g`'s `Q` queries (weights `p[g]`) over its value rows `v[j][g]`,
/// `C` chunks wide, continuing the sums in `acc[g]`. Each step takes every head's slice of value row `j`, so a
/// cached row holding the heads side by side is read once, start to end; each sum is still its query's own chain of
/// fused steps in value order: `weighted`'s bits for every head.
///
/// # Safety
/// The CPU has AVX-512F; every `p[g][q]` holds at least `v.len()` weights, and every value slice and every
/// `acc[g][q]` at least `C · 16` f32s.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn weighted_heads<const G: usize, const Q: usize, const C: usize>(
    p: [[&[f32]; Q]; G],
    v: &[[&[f32]; G]],
    acc: [[&mut [f32]; Q]; G],
) {
    let pp = p.map(|h| h.map(<[f32]>::as_ptr));
    let op = acc.map(|h| h.map(|a| a.as_mut_ptr()));
    // SAFETY (every access below): the caller's contract; unaligned loads and stores
    let mut a: [[[__m512; C]; Q]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|q| std::array::from_fn(|c| unsafe { _mm512_loadu_ps(op[g][q].add(c * LANES)) }))
    });
    for (j, row) in v.iter().enumerate() {
        for ((ag, vg), pg) in a.iter_mut().zip(row).zip(&pp) {
            let vp = vg.as_ptr();
            let vv: [__m512; C] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(vp.add(c * LANES)) });
            for (aq, w) in ag.iter_mut().zip(pg) {
                let wj = _mm512_set1_ps(unsafe { *w.add(j) });
                for (ac, vc) in aq.iter_mut().zip(&vv) {
                    *ac = _mm512_fmadd_ps(wj, *vc, *ac);
                }
            }
        }
    }
    for (og, ag) in op.iter().zip(&a) {
        for (o, aq) in og.iter().zip(ag) {
            for (c, ac) in aq.iter().enumerate() {
                unsafe { _mm512_storeu_ps(o.add(c * LANES), *ac) };
            }
        }
    }
}

/// `weighted` over `U` chunks of sixteen columns taken anywhere in a value row (a run of columns that may cross
/// heads): unit `u` folds its chunk `row(j)[u]` of value row `j`, weighted by `w[u][q][j]`, into `acc[u][q]` for `Q`
/// queries, value by value in order over `rows` rows. Each sum is its query's own chain of fused steps:
/// `weighted`'s bits. The chunks' addresses come from `row` as the rows are read (inlined here), not from a list
/// written first.
///
/// # Safety
/// The CPU has AVX-512F; every `w[u][q]` points at `rows` weights or more, and every `row(j)[u]` (`j < rows`) and
/// `acc[u][q]` at sixteen f32s or more.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn weighted_units<const U: usize, const Q: usize>(
    w: [[*const f32; Q]; U],
    rows: usize,
    row: impl Fn(usize) -> [*const f32; U],
    acc: [[*mut f32; Q]; U],
) {
    // SAFETY (every access below): the caller's contract; unaligned loads and stores
    let mut a: [[__m512; Q]; U] =
        std::array::from_fn(|u| std::array::from_fn(|q| unsafe { _mm512_loadu_ps(acc[u][q]) }));
    for j in 0..rows {
        let chunks = row(j);
        for ((au, vp), wu) in a.iter_mut().zip(chunks).zip(&w) {
            let vv = unsafe { _mm512_loadu_ps(vp) };
            for (ac, wq) in au.iter_mut().zip(wu) {
                *ac = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *wq.add(j) }), vv, *ac);
            }
        }
    }
    for (au, ou) in a.iter().zip(&acc) {
        for (ac, o) in au.iter().zip(ou) {
            unsafe { _mm512_storeu_ps(*o, *ac) };
        }
    }
}
