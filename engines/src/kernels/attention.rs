//! Scaled dot-product attention for one query head over keys given in ascending position order.

use super::matmul::dot4;
use super::{dot, softmax_in_place};

/// Output elements per accumulator of the weighted sums (a YMM register). Eight, not sixteen: a 32-wide head
/// then still keeps four independent accumulator chains over the keys (sixteen lanes left it two passes of one
/// latency-bound chain each), and a 64-wide head's eight YMM chains are as fast as four ZMM ones.
const LANES: usize = 8;
type Lanes = [f32; LANES];

/// `out = softmax(q·kᵢ · scale) · vᵢ` over the (key, value) rows yielded, in the order yielded.
///
/// Callers yield keys in ascending absolute position, so the reduction order depends only on which positions are
/// visible — never on where the rows are stored (ring, scratch, full cache). Each score is `dot(q, kᵢ) * scale`
/// (four keys at a time, same bits) and each output element folds `pᵢ·vᵢ` into a sum starting at 0.0 in key order,
/// one fused multiply-add per key; the sums are only interleaved across output elements, which keeps each in a
/// register over all the keys.
pub fn attend<'a>(
    q: &[f32],
    kv: impl Iterator<Item = (&'a [f32], &'a [f32])> + Clone,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    push_dots(q, kv.clone().map(|(k, _)| k), scores);
    scores.iter_mut().for_each(|s| *s *= scale);
    softmax_in_place(scores);
    weighted_sum(scores, kv.map(|(_, v)| v), out);
}

/// Appends `dot(q, k)` for every key yielded, in order, four keys at a time (`dot4`, the same bits as `dot`).
pub fn push_dots<'a>(q: &[f32], keys: impl Iterator<Item = &'a [f32]>, scores: &mut Vec<f32>) {
    let (mut group, mut n, before): ([&[f32]; 4], usize, usize) = ([&[]; 4], 0, scores.len());
    for k in keys {
        group[n] = k;
        n += 1;
        if n == 4 {
            scores.extend(dot4(q, group));
            n = 0;
        }
    }
    scores.extend(group[..n].iter().map(|k| dot(q, k)));
    super::work::count(2 * (scores.len() - before) * q.len(), 0);
}

/// `out = Σᵢ pᵢ · vᵢ` over the values yielded, each output element summed from 0.0 in value order with one fused
/// multiply-add per value; the sums are only interleaved across output elements, which keeps each in a register
/// over all the values.
pub fn weighted_sum<'a>(p: &[f32], values: impl Iterator<Item = &'a [f32]> + Clone, out: &mut [f32]) {
    super::work::count(2 * p.len() * out.len(), 0);
    let (chunks, tail) = out.as_chunks_mut::<LANES>();
    let mut c = 0;
    while c < chunks.len() {
        let dst = &mut chunks[c..];
        let step = match dst.len() {
            16.. => put(dst, weighted::<16>(p, values.clone(), c)),
            8..=15 => put(dst, weighted::<8>(p, values.clone(), c)),
            4..=7 => put(dst, weighted::<4>(p, values.clone(), c)),
            _ => put(dst, weighted::<1>(p, values.clone(), c)),
        };
        c += step;
    }
    if !tail.is_empty() {
        let at = chunks.len() * LANES;
        tail.iter_mut().for_each(|o| *o = 0.0);
        for (p, v) in p.iter().zip(values) {
            for (o, x) in tail.iter_mut().zip(&v[at..]) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// Writes `sums` to the front of `dst`; returns how many chunks that was.
fn put<const N: usize>(dst: &mut [Lanes], sums: [Lanes; N]) -> usize {
    dst[..N].copy_from_slice(&sums);
    N
}

/// `acc[l] = p · v[l] + acc[l]` for every lane, fused (one rounding, the same bits in hardware or software).
#[inline(always)]
fn scale_acc(acc: &mut Lanes, p: f32, v: &Lanes) {
    for l in 0..LANES {
        acc[l] = p.mul_add(v[l], acc[l]);
    }
}

/// The weighted sums over all values of `N` lane chunks of the output starting at chunk `at`, each chunk summed in
/// value order from 0.0. `inline(never)` for the same reason as the matmul micro-kernels: compiled alone with `N`
/// a constant, each accumulator is one YMM register (16 of them still fit the 32 of AVX-512, so a 128-wide latent
/// row is walked once).
#[inline(never)]
fn weighted<'a, const N: usize>(p: &[f32], values: impl Iterator<Item = &'a [f32]>, at: usize) -> [Lanes; N] {
    let mut acc = [[0.0f32; LANES]; N];
    for (&pt, v) in p.iter().zip(values) {
        let v = &v.as_chunks::<LANES>().0[at..at + N];
        for (a, v) in acc.iter_mut().zip(v) {
            scale_acc(a, pt, v);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    /// The reference: every score through `dot`, every output element summed over the values in order.
    fn attend_reference(q: &[f32], kv: &[(&[f32], &[f32])], scale: f32, out: &mut [f32]) {
        let mut scores: Vec<f32> = kv.iter().map(|(k, _)| dot(q, k) * scale).collect();
        softmax_in_place(&mut scores);
        out.iter_mut().for_each(|o| *o = 0.0);
        for (p, (_, v)) in scores.iter().zip(kv) {
            for (o, x) in out.iter_mut().zip(v.iter()) {
                *o = p.mul_add(*x, *o);
            }
        }
    }

    fn attend_bits(hd: usize, keys: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
        let mut r = SplitMix64::new(seed);
        let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
        let (q, ks, vs) = (v(hd), v(keys * hd), v(keys * hd));
        let kv: Vec<(&[f32], &[f32])> = ks.chunks_exact(hd).zip(vs.chunks_exact(hd)).collect();
        let mut want = vec![0.0; hd];
        attend_reference(&q, &kv, 0.3, &mut want);
        let mut got = vec![f32::NAN; hd];
        attend(&q, kv.iter().copied(), 0.3, &mut Vec::new(), &mut got);
        (got.iter().map(|x| x.to_bits()).collect(), want.iter().map(|x| x.to_bits()).collect())
    }

    /// Every step width of the weighted sums (16, 8, 4 and 1 chunks, and the tail) at least once, whatever the
    /// proptest below happens to draw.
    #[test]
    fn every_weighted_sum_width_matches_reference() {
        for hd in [8, 32, 64, 128, 136, 160, 200, 256, 263] {
            let (got, want) = attend_bits(hd, 9, hd as u64);
            assert_eq!(got, want, "head width {hd}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Bitwise the reference for any head width (multiples of 8 or not, wider than one 8-chunk block) and any
        /// number of keys (a multiple of 4 or not, none included).
        #[test]
        fn attend_matches_reference(hd in 1usize..150, keys in 0usize..23, seed in any::<u64>()) {
            let (got, want) = attend_bits(hd, keys, seed);
            prop_assert_eq!(got, want);
        }
    }
}
