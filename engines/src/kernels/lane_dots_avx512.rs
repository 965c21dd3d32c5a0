//! Attention scores with sixteen queries in the lanes of a register, bitwise `dot`: lane `r` of accumulator `l`
//! sums `qᵣ[16c + l] · k[16c + l]` over the chunks `c` in ascending order with one fused multiply-add each — the
//! very sum lane `l` of `dot(qᵣ, k)` holds — and `finish`'s tree over the sixteen accumulators is sixteen vertical
//! adds. A tile of pairs in `dot`'s layout (`dot_tiles_avx512`) needs about three shuffles and adds per score to
//! sum its lanes across a register; here a score costs one add, and the fused multiply-adds are nearly all the
//! work.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::LANES;

/// Keys scored at once: each loaded query register serves `KEYS` multiply-adds.
const KEYS: usize = 4;

/// `out[j · 16 + r] = dot(qᵣ, keys[j])` over the first `chunks` chunks (`finish`'s tree, no tail), where `qt` is
/// the sixteen queries transposed (`qt[e · 16 + r] = qᵣ[e]`). `keys.len()` is a multiple of `K`. Widths up to
/// eight chunks (128) run with the chunk count fixed at compile time, so a tile is straight-line code.
///
/// # Safety
/// The CPU has AVX-512F; `qt` holds `chunks · 256` f32s, every key `chunks · 16` and `out` `keys.len() · 16`.
#[target_feature(enable = "avx512f")]
unsafe fn dots16<const K: usize>(qt: &[f32], keys: &[&[f32]], chunks: usize, out: &mut [f32]) {
    // SAFETY (every arm): the caller's contract, passed on
    unsafe {
        match chunks {
            1 => tiles::<K, 1>(qt, keys, chunks, out),
            2 => tiles::<K, 2>(qt, keys, chunks, out),
            3 => tiles::<K, 3>(qt, keys, chunks, out),
            4 => tiles::<K, 4>(qt, keys, chunks, out),
            5 => tiles::<K, 5>(qt, keys, chunks, out),
            6 => tiles::<K, 6>(qt, keys, chunks, out),
            7 => tiles::<K, 7>(qt, keys, chunks, out),
            8 => tiles::<K, 8>(qt, keys, chunks, out),
            _ => tiles::<K, 0>(qt, keys, chunks, out),
        }
    }
}

/// `dots16` with `C` chunks (`C = 0`: `chunks`, known only at run time).
///
/// # Safety
/// `dots16`'s.
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn tiles<const K: usize, const C: usize>(qt: &[f32], keys: &[&[f32]], chunks: usize, out: &mut [f32]) {
    let chunks = if C == 0 { chunks } else { C };
    let (qp, op) = (qt.as_ptr(), out.as_mut_ptr());
    for (t, tile) in keys.chunks_exact(K).enumerate() {
        let kp: [*const f32; K] = std::array::from_fn(|j| tile[j].as_ptr());
        // `hₗ = aₗ + aₗ₊₈` of every key, where accumulator `aₗ`'s lanes are the queries, element 16c + l of the
        // key broadcast to all of them
        let h = |l: usize| -> [__m512; K] {
            let (mut a, mut b) = ([_mm512_setzero_ps(); K], [_mm512_setzero_ps(); K]);
            for c in 0..chunks {
                let (e, f) = (c * LANES + l, c * LANES + l + 8);
                // SAFETY: e, f < chunks · 16, so qt's rows e and f and each key's elements e and f are in bounds
                let (qe, qf) = unsafe { (_mm512_loadu_ps(qp.add(e * LANES)), _mm512_loadu_ps(qp.add(f * LANES))) };
                for j in 0..K {
                    a[j] = _mm512_fmadd_ps(qe, _mm512_set1_ps(unsafe { *kp[j].add(e) }), a[j]);
                    b[j] = _mm512_fmadd_ps(qf, _mm512_set1_ps(unsafe { *kp[j].add(f) }), b[j]);
                }
            }
            std::array::from_fn(|j| _mm512_add_ps(a[j], b[j]))
        };
        let add =
            |x: [__m512; K], y: [__m512; K]| -> [__m512; K] { std::array::from_fn(|j| _mm512_add_ps(x[j], y[j])) };
        // finish's tree over the hₗ: ((h₀ + h₄) + (h₁ + h₅)) + ((h₂ + h₆) + (h₃ + h₇))
        let f0 = add(add(h(0), h(4)), add(h(1), h(5)));
        let f1 = add(add(h(2), h(6)), add(h(3), h(7)));
        for (j, s) in add(f0, f1).iter().enumerate() {
            // SAFETY: out holds keys.len() · 16 f32s; this is key t · K + j's
            unsafe { _mm512_storeu_ps(op.add((t * K + j) * LANES), *s) };
        }
    }
}

/// Keys whose scores are staged (key-major, 16 KiB) before they go to the queries' score rows.
const STAGE: usize = 256;

/// `s[r · n + at + j] = dot(queries[r], keys[j])` for sixteen queries of a width that is whole chunks: the
/// queries transposed once, the keys `K` at a time (the last few one by one), the scores staged key-major and then
/// written to each query's row.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score_rows(queries: &[&[f32]], keys: &[&[f32]], at: usize, n: usize, s: &mut [f32]) {
    assert_eq!(queries.len(), LANES, "score_rows: sixteen queries");
    let width = queries[0].len();
    assert!(width.is_multiple_of(LANES), "score_rows: a width of whole chunks");
    assert!(queries.iter().chain(keys).all(|r| r.len() == width), "score_rows: rows of different widths");
    assert!(at + keys.len() <= n && s.len() >= LANES * n, "score_rows: score rows too short");
    let chunks = width / LANES;
    let mut qt = vec![0.0f32; width * LANES];
    for (r, q) in queries.iter().enumerate() {
        for (e, x) in q.iter().enumerate() {
            qt[e * LANES + r] = *x;
        }
    }
    let mut stage = [0.0f32; STAGE * LANES];
    for (b, block) in keys.chunks(STAGE).enumerate() {
        let whole = block.len() / KEYS * KEYS;
        // SAFETY: the CPU has AVX-512F; qt holds chunks · 256 f32s, every key chunks · 16 (asserted), the stage
        // STAGE · 16 ≥ block.len() · 16
        unsafe {
            dots16::<KEYS>(&qt, &block[..whole], chunks, &mut stage);
            dots16::<1>(&qt, &block[whole..], chunks, &mut stage[whole * LANES..]);
        }
        // sixteen keys' scores at a time transposed in registers into the sixteen rows, the last few one by one
        let first = at + b * STAGE;
        let sixteens = block.len() / LANES * LANES;
        let sp = s.as_mut_ptr();
        for j in (0..sixteens).step_by(LANES) {
            // SAFETY: the stage holds keys j..j + 16 (j + 16 <= block.len()); row r's scores r · n + first + j ..
            // + 16 lie within s (first + block.len() <= at + keys.len() <= n, and s holds 16 rows of n)
            let keys16: [__m512; LANES] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(&stage[(j + i) * LANES]) });
            for (r, v) in transpose16(keys16).iter().enumerate() {
                unsafe { _mm512_storeu_ps(sp.add(r * n + first + j), *v) };
            }
        }
        for (r, row) in s.chunks_exact_mut(n).take(LANES).enumerate() {
            for (j, x) in row[first..first + block.len()].iter_mut().enumerate().skip(sixteens) {
                *x = stage[j * LANES + r];
            }
        }
    }
}

/// The sixteen registers `rows` transposed: lane `i` of result `c` is lane `c` of `rows[i]`. Pairs of rows
/// interleaved as singles, then as pairs, then 128-bit blocks exchanged twice: 64 shuffles.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(rows: [__m512; LANES]) -> [__m512; LANES] {
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved, per 128-bit block (elements 4L, 4L + 1, then 4L + 2, 4L + 3)
    let t: [__m512; LANES] = std::array::from_fn(|k| {
        let (a, b) = (rows[k & !1], rows[k | 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4g + m]: block L holds rows 4g..4g + 4 of column 4L + m
    let u: [__m512; LANES] = std::array::from_fn(|k| {
        let (g, m) = (k / 4, k % 4);
        let (a, b) = (_mm512_castps_pd(t[4 * g + m / 2]), _mm512_castps_pd(t[4 * g + 2 + m / 2]));
        _mm512_castpd_ps(if m % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
    });
    // column 4L + m: block g of it is block L of u[4g + m]
    let mut out = [_mm512_setzero_ps(); LANES];
    for m in 0..4 {
        let a: [__m512; 4] = std::array::from_fn(|g| u[4 * g + m]);
        let v0 = _mm512_shuffle_f32x4::<0x44>(a[0], a[1]);
        let v1 = _mm512_shuffle_f32x4::<0xEE>(a[0], a[1]);
        let v2 = _mm512_shuffle_f32x4::<0x44>(a[2], a[3]);
        let v3 = _mm512_shuffle_f32x4::<0xEE>(a[2], a[3]);
        out[m] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        out[4 + m] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
        out[8 + m] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        out[12 + m] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Every score is `dot`'s bits, at every width of whole chunks, across the stage's and the key tiles'
        /// edges, written at its offset of each query's row and nowhere else.
        #[test]
        fn score_rows_are_dot(chunks in 1usize..9, keys in 0usize..600, at in 0usize..5, seed in any::<u64>()) {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                return Ok(());
            }
            let width = chunks * LANES;
            let mut rng = SplitMix64::new(seed);
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(2.0)).collect() };
            let (q, k) = (v(LANES * width), v(keys * width));
            let queries: Vec<&[f32]> = q.chunks_exact(width).collect();
            let key_rows: Vec<&[f32]> = k.chunks_exact(width).collect();
            let n = at + keys + 3;
            let mut s = vec![f32::NAN; LANES * n];
            // SAFETY: checked above that the CPU has AVX-512F
            unsafe { score_rows(&queries, &key_rows, at, n, &mut s) };
            for (r, row) in s.chunks_exact(n).enumerate() {
                prop_assert!(row[..at].iter().chain(&row[at + keys..]).all(|x| x.is_nan()), "query {} written outside", r);
                for (j, kr) in key_rows.iter().enumerate() {
                    prop_assert_eq!(row[at + j].to_bits(), dot(queries[r], kr).to_bits(), "query {} key {}", r, j);
                }
            }
        }
    }
}
