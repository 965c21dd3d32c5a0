//! A tile of dot products (`R` rows against `K` rows, `R · K = 16`), each bitwise `dot`: on AVX-512 where the
//! CPU has it, else on AVX2 with FMA, else `dot` itself on each pair. The matmul's blocks and attention's scores are both such tiles.

use super::dot;
use super::matmul::LANES;

/// `out[r][j] = dot(qᵣ, keys[j])` over the first `chunks · 16` elements of the rows (the tree included, the tail
/// not), in `R x K` tiles (`R · K = 16`); `keys.len()` is a multiple of `K`. The lines of `ahead` (rows a later
/// call reads) are asked into L2 along the way, spread over the tiles; they change no result.
#[inline]
pub(super) fn dots<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
    ahead: &[f32],
) {
    assert_tile::<K>(&q, keys, chunks, &out);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; rows and score rows are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::dot_tiles_avx512::dots::<R, K>(q, keys, chunks, out, ahead) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; rows and score rows are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::dot_tiles_avx2::dots::<R, K>(q, keys, chunks, out, ahead) };
    }
    dots_portable::<R, K>(q, keys, chunks, out)
}

/// The shapes a tile of `dots` reads and writes: whole tiles of `K` keys, every row at least `chunks` chunks long,
/// a score for every key in each row of `out`.
fn assert_tile<const K: usize>(q: &[&[f32]], keys: &[&[f32]], chunks: usize, out: &[&mut [f32]]) {
    let n = chunks * LANES;
    assert!(keys.len().is_multiple_of(K), "attention tile: keys are not whole tiles");
    assert!(q.iter().chain(keys).all(|r| r.len() >= n), "attention tile: a row is shorter than its chunks");
    assert!(out.iter().all(|o| o.len() >= keys.len()), "attention tile: fewer scores than keys");
}

/// Whether `dots_streamed` reads each key start to end for several rows (AVX-512); elsewhere it is `dots`.
#[inline]
pub(super) fn streams_rows() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `dots`, each key read start to end for all `R` rows at once (`dot_tiles_avx512::dots_streamed`) where
/// `streams_rows`: for a few rows of a matrix in memory, which `dots`' tiles read as `K` short streams. The same
/// bits as `dots`.
#[inline]
pub(super) fn dots_streamed<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
) {
    #[cfg(target_arch = "x86_64")]
    if streams_rows() {
        assert_tile::<K>(&q, keys, chunks, &out);
        // SAFETY: the CPU has AVX-512F; rows and score rows are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::dot_tiles_avx512::dots_streamed::<R, K>(q, keys, chunks, out, &[]) };
    }
    dots::<R, K>(q, keys, chunks, out, &[])
}

/// `dots` of `G` kv heads' queries (`Q` a head) over the same keys, a cached row's heads at a time
/// (`dot_tiles_avx512::dots_heads`): `out[g][q][j] = dot(q[g][q], keys[j][g])` over `C` whole chunks (the tree
/// included; the rows have no tail). Only for the shapes `attention_tiles::heads_at_once` takes (it asserts that);
/// `keys.len()` is a multiple of 16.
pub(super) fn dots_heads<const G: usize, const Q: usize, const C: usize>(
    q: [[&[f32]; Q]; G],
    keys: &[[&[f32]; G]],
    out: [[&mut [f32]; Q]; G],
) {
    let n = C * LANES;
    assert!(
        super::attention_tiles::heads_at_once(Q, C).is_some_and(|most| G <= most),
        "attention tile: {G} heads of {Q} x {C} at once"
    );
    assert!(keys.len().is_multiple_of(16), "attention tile: keys are not whole tiles");
    assert!(
        q.iter().flatten().chain(keys.iter().flatten()).all(|r| r.len() >= n),
        "attention tile: a row is shorter than its chunks"
    );
    assert!(out.iter().flatten().all(|o| o.len() >= keys.len()), "attention tile: fewer scores than keys");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (`heads_at_once`, asserted); rows and score rows are long enough (asserted)
    #[allow(unsafe_code)]
    unsafe {
        super::dot_tiles_avx512::dots_heads::<G, Q, C>(q, keys, out)
    };
}

/// Whether `dots_three` reads each key once: on AVX2 without AVX-512. Elsewhere three rows take a 2 x 8 tile and a
/// 1 x 16 one (AVX-512 holds a whole pair's lanes in one register: its tiles read a key once per pass already).
#[inline]
pub(super) fn three_in_one_pass() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `dots` for three rows of each kv head (a decode step's GQA groups of three) against that head's keys, an even
/// number of them, the same for every head: `out[h][r][j] = dot(q[h][r], keys[h][j])` over the first
/// `chunks · 16` elements, the heads' keys pair by pair (`dot_tiles_avx2::dots_three`). Only where
/// `three_in_one_pass`: elsewhere callers score each head with `dots`' tiles.
#[inline]
pub(super) fn dots_three(q: &[[&[f32]; 3]], keys: &[&[&[f32]]], chunks: usize, out: &mut [[&mut [f32]; 3]]) {
    let n = chunks * LANES;
    let len = keys.first().map_or(0, |k| k.len());
    assert!(q.len() == keys.len() && out.len() == keys.len(), "attention tile: one key list per head");
    assert!(len.is_multiple_of(2) && keys.iter().all(|k| k.len() == len), "attention tile: keys are not whole pairs");
    assert!(
        q.iter().flatten().chain(keys.iter().copied().flatten()).all(|r| r.len() >= n),
        "attention tile: a row is shorter than its chunks"
    );
    assert!(out.iter().flatten().all(|o| o.len() >= len), "attention tile: fewer scores than keys");
    assert!(three_in_one_pass(), "attention tile: dots_three needs AVX2 without AVX-512 (check three_in_one_pass)");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX2 and FMA (asserted above); rows and score rows are long enough (asserted above)
    #[allow(unsafe_code)]
    unsafe {
        super::dot_tiles_avx2::dots_three(q, keys, chunks, out)
    };
}

/// Prefetches line `asked` of `ahead` into L2 and counts it, unless `upto` lines are asked already: the SIMD
/// tiles' share of the next tile's lines, one per chunk step.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn ask(ahead: &[f32], asked: &mut usize, upto: usize) {
    if *asked < upto {
        // SAFETY: line `asked` starts inside `ahead` (`upto` is at most its line count); a prefetch reads nothing
        // the program observes
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                ahead.as_ptr().add(*asked * LANES).cast(),
            )
        };
        *asked += 1;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::{random, split};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The tiles the CPU runs (AVX-512 or AVX2 where it has them) give the portable `dot`'s bits, for every tile shape:
        /// a machine without AVX-512 computes the same results.
        #[test]
        fn simd_tiles_match_the_portable_dots(chunks in 0usize..6, keys in 1usize..3, seed in any::<u64>()) {
            let width = chunks * LANES;
            let (a, b) = (random(16 * width, seed), random(16 * keys * width, seed ^ 1));
            let qs: Vec<&[f32]> = (0..16).map(|i| &a[i * width..(i + 1) * width]).collect();
            let ks: Vec<&[f32]> = (0..16 * keys).map(|i| &b[i * width..(i + 1) * width]).collect();
            let n = ks.len();
            let (mut simd, mut portable) = (vec![0.0f32; 4 * n], vec![0.0f32; 4 * n]);
            let q4: [&[f32]; 4] = std::array::from_fn(|i| qs[i]);
            dots::<4, 4>(q4, &ks, chunks, split(&mut simd, n), &[]);
            dots_portable::<4, 4>(q4, &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
            dots::<2, 8>([qs[0], qs[1]], &ks, chunks, split(&mut simd, n), &[]);
            dots_portable::<2, 8>([qs[0], qs[1]], &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
            dots::<1, 16>([qs[3]], &ks, chunks, split(&mut simd, n), &[]);
            dots_portable::<1, 16>([qs[3]], &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
        }

        /// One row against many tiles of keys (a decode matvec: the AVX-512 kernel reads far-apart runs of tiles
        /// side by side when the keys are long, and the tiles left over one by one; short keys, and fewer than four
        /// tiles of long ones, through the tile loop), with lines to prefetch along the way: the portable bits for
        /// every key.
        #[test]
        fn one_row_against_many_tiles_matches_the_portable_dots(
            chunks in prop_oneof![0usize..4, 16usize..19], tiles in 1usize..14, lines in 0usize..40, seed in any::<u64>()
        ) {
            let width = chunks * LANES;
            let (q, b) = (random(width, seed), random(16 * tiles * width, seed ^ 1));
            let ahead = random(lines * LANES, seed ^ 2);
            let ks: Vec<&[f32]> = (0..16 * tiles).map(|i| &b[i * width..(i + 1) * width]).collect();
            let (mut simd, mut portable) = (vec![0.0f32; ks.len()], vec![0.0f32; ks.len()]);
            dots::<1, 16>([&q], &ks, chunks, [&mut simd], &ahead);
            dots_portable::<1, 16>([&q], &ks, chunks, [&mut portable]);
            prop_assert_eq!(simd.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }

        /// Two and four rows read with each key once for all of them (`dots_streamed`: far-apart runs of tiles side
        /// by side when the keys are long, the tiles left over one by one, short keys one tile at a time): the
        /// portable bits for every pair, in every row's own place.
        #[test]
        fn few_rows_streamed_match_the_portable_dots(
            chunks in prop_oneof![0usize..4, 16usize..19], tiles in 1usize..14, seed in any::<u64>()
        ) {
            let width = chunks * LANES;
            let (a, b) = (random(4 * width, seed), random(16 * tiles * width, seed ^ 1));
            let qs: Vec<&[f32]> = (0..4).map(|i| &a[i * width..(i + 1) * width]).collect();
            let ks: Vec<&[f32]> = (0..16 * tiles).map(|i| &b[i * width..(i + 1) * width]).collect();
            let n = ks.len();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (mut simd, mut portable) = (vec![0.0f32; 4 * n], vec![0.0f32; 4 * n]);
            let q4: [&[f32]; 4] = std::array::from_fn(|i| qs[i]);
            dots_streamed::<4, 4>(q4, &ks, chunks, split(&mut simd, n));
            dots_portable::<4, 4>(q4, &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(bits(&simd), bits(&portable));
            let (mut simd, mut portable) = (vec![0.0f32; 2 * n], vec![0.0f32; 2 * n]);
            dots_streamed::<2, 8>([qs[2], qs[1]], &ks, chunks, split(&mut simd, n));
            dots_portable::<2, 8>([qs[2], qs[1]], &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(bits(&simd), bits(&portable));
        }

        /// The AVX2 tiles on their own (a machine with AVX-512 runs those instead, but has AVX2 too), with lines to
        /// prefetch along the way: the portable bits for every tile shape.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx2_tiles_match_the_portable_dots(chunks in 0usize..6, keys in 1usize..3, seed in any::<u64>()) {
            if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
                return Ok(());
            }
            let width = chunks * LANES;
            let (a, b) = (random(16 * width, seed), random(16 * keys * width, seed ^ 1));
            let qs: Vec<&[f32]> = (0..16).map(|i| &a[i * width..(i + 1) * width]).collect();
            let ks: Vec<&[f32]> = (0..16 * keys).map(|i| &b[i * width..(i + 1) * width]).collect();
            let n = ks.len();
            let (mut simd, mut portable) = (vec![0.0f32; 4 * n], vec![0.0f32; 4 * n]);
            let q4: [&[f32]; 4] = std::array::from_fn(|i| qs[i]);
            // SAFETY (each call): the CPU has AVX2 and FMA (checked above); rows hold `chunks` chunks, score rows `n`
            #[allow(unsafe_code)]
            unsafe { crate::kernels::dot_tiles_avx2::dots::<4, 4>(q4, &ks, chunks, split(&mut simd, n), &b) };
            dots_portable::<4, 4>(q4, &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
            #[allow(unsafe_code)]
            unsafe { crate::kernels::dot_tiles_avx2::dots::<2, 8>([qs[0], qs[1]], &ks, chunks, split(&mut simd, n), &a) };
            dots_portable::<2, 8>([qs[0], qs[1]], &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
            #[allow(unsafe_code)]
            unsafe { crate::kernels::dot_tiles_avx2::dots::<1, 16>([qs[3]], &ks, chunks, split(&mut simd, n), &[]) };
            dots_portable::<1, 16>([qs[3]], &ks, chunks, split(&mut portable, n));
            prop_assert_eq!(&simd, &portable);
        }
    }
}
