//! Attention's register tiles: an `R x K` tile of scores (queries x keys) and `Q` queries' weighted sums over `C`
//! chunks of the same values. AVX-512 where the CPU has it, else portable loops doing the same operations on the
//! same lanes (the same bits, only slower); a test holds the two to each other.

use super::dot;
use super::matmul::LANES;

/// `out[r][j] = dot(qᵣ, keys[j])` over the first `chunks · 16` elements of the rows (the tree included, the tail
/// not), in `R x K` tiles (`R · K = 16`); `keys.len()` is a multiple of `K`.
#[inline]
pub(super) fn dots<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
) {
    let n = chunks * LANES;
    assert!(keys.len().is_multiple_of(K), "attention tile: keys are not whole tiles");
    assert!(q.iter().chain(keys).all(|r| r.len() >= n), "attention tile: a row is shorter than its chunks");
    assert!(out.iter().all(|o| o.len() >= keys.len()), "attention tile: fewer scores than keys");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; rows and score rows are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::attention_avx512::dots::<R, K>(q, keys, chunks, out) };
    }
    dots_portable::<R, K>(q, keys, chunks, out)
}

/// The portable `dots`: `dot` on each pair, cut to the whole chunks.
pub(super) fn dots_portable<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
) {
    let n = chunks * LANES;
    for (qr, o) in q.iter().zip(out) {
        for (s, k) in o.iter_mut().zip(keys) {
            *s = dot(&qr[..n], &k[..n]);
        }
    }
}

/// `acc[q][at·16 .. (at + C)·16] += Σⱼ p[q][j] · v[j][..]`, value by value in order, one fused multiply-add per
/// element (`acc[q]` is query `q`'s whole output row, `p[q]` its weights of the values `v`). `Q · C ≤ 16`.
#[inline]
pub(super) fn fold<const Q: usize, const C: usize>(p: [&[f32]; Q], v: &[&[f32]], at: usize, acc: [&mut [f32]; Q]) {
    let end = (at + C) * LANES;
    assert!(p.iter().all(|w| w.len() >= v.len()), "attention fold: fewer weights than values");
    assert!(v.iter().all(|r| r.len() >= end) && acc.iter().all(|a| a.len() >= end), "attention fold: short row");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; weights, value rows and outputs are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::attention_avx512::weighted::<Q, C>(p, v, at, acc) };
    }
    fold_portable::<Q, C>(p, v, at, acc)
}

/// The portable `fold`.
pub(super) fn fold_portable<const Q: usize, const C: usize>(
    p: [&[f32]; Q],
    v: &[&[f32]],
    at: usize,
    acc: [&mut [f32]; Q],
) {
    let span = at * LANES..(at + C) * LANES;
    for (w, out) in p.iter().zip(acc) {
        let out = &mut out[span.clone()];
        for (wj, row) in w.iter().zip(v) {
            for (o, x) in out.iter_mut().zip(&row[span.clone()]) {
                *o = wj.mul_add(*x, *o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    fn rows(x: &[f32], width: usize) -> Vec<&[f32]> {
        (0..16).map(|i| &x[i * width..(i + 1) * width]).collect()
    }

    fn split(x: &mut [f32], width: usize) -> [&mut [f32]; 4] {
        let mut it = x.chunks_exact_mut(width);
        std::array::from_fn(|_| it.next().expect("four rows"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The tiles the CPU runs (AVX-512 where it has it) give the portable loops' bits, for every tile shape
        /// attention uses: a machine without AVX-512 computes the same scores and sums.
        #[test]
        fn simd_tiles_match_the_portable_loops(chunks in 0usize..6, keys in 0usize..40, seed in any::<u64>()) {
            let width = chunks * LANES;
            let mut r = SplitMix64::new(seed);
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let (a, b) = (v(16 * width.max(1)), v(16 * width.max(1)));
            let (qs, ks) = (rows(&a, width), rows(&b, width));
            let q4: [&[f32]; 4] = std::array::from_fn(|i| qs[i]);
            let (mut simd, mut portable) = (vec![0.0f32; 64], vec![0.0f32; 64]);
            dots::<4, 4>(q4, &ks, chunks, split(&mut simd, 16));
            dots_portable::<4, 4>(q4, &ks, chunks, split(&mut portable, 16));
            prop_assert_eq!(&simd, &portable);
            dots::<2, 8>([qs[0], qs[1]], &ks, chunks, { let [a, b, ..] = split(&mut simd, 16); [a, b] });
            dots_portable::<2, 8>([qs[0], qs[1]], &ks, chunks, { let [a, b, ..] = split(&mut portable, 16); [a, b] });
            prop_assert_eq!(&simd, &portable);
            dots::<1, 16>([qs[3]], &ks, chunks, { let [a, ..] = split(&mut simd, 16); [a] });
            dots_portable::<1, 16>([qs[3]], &ks, chunks, { let [a, ..] = split(&mut portable, 16); [a] });
            prop_assert_eq!(&simd, &portable);

            let values: Vec<Vec<f32>> = (0..keys).map(|_| v(width.max(LANES))).collect();
            let values: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
            let weights = v(4 * keys);
            let p: [&[f32]; 4] = std::array::from_fn(|i| &weights[i * keys..(i + 1) * keys]);
            let start = v(4 * width.max(LANES));
            let (mut simd, mut portable) = (start.clone(), start.clone());
            let w = width.max(LANES);
            fold::<4, 1>(p, &values, 0, split(&mut simd, w));
            fold_portable::<4, 1>(p, &values, 0, split(&mut portable, w));
            prop_assert_eq!(&simd, &portable);
            if chunks >= 2 {
                fold::<2, 2>([p[0], p[1]], &values, chunks - 2, { let [a, b, ..] = split(&mut simd, w); [a, b] });
                fold_portable::<2, 2>([p[0], p[1]], &values, chunks - 2, { let [a, b, ..] = split(&mut portable, w); [a, b] });
                prop_assert_eq!(&simd, &portable);
            }
        }
    }
}
