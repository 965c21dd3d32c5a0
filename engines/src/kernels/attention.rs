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
    let mut group: [&[f32]; 4] = [&[]; 4];
    let mut n = 0;
    for (k, _) in kv.clone() {
        group[n] = k;
        n += 1;
        if n == 4 {
            scores.extend(dot4(q, group).map(|s| s * scale));
            n = 0;
        }
    }
    scores.extend(group[..n].iter().map(|k| dot(q, k) * scale));
    softmax_in_place(scores);
    // q·k and p·v: two multiply-adds per key and head element
    super::work::count(4 * scores.len() * q.len(), 0);

    let (chunks, tail) = out.as_chunks_mut::<LANES>();
    let mut c = 0;
    while c < chunks.len() {
        let values = kv.clone().map(|(_, v)| v);
        let step = match chunks.len() - c {
            8.. => 8,
            4..=7 => 4,
            _ => 1,
        };
        let dst = &mut chunks[c..c + step];
        match step {
            8 => dst.copy_from_slice(&weighted_8(scores, values, c)),
            4 => dst.copy_from_slice(&weighted_4(scores, values, c)),
            _ => dst.copy_from_slice(&weighted_1(scores, values, c)),
        }
        c += step;
    }
    if !tail.is_empty() {
        let at = chunks.len() * LANES;
        tail.iter_mut().for_each(|o| *o = 0.0);
        for (p, (_, v)) in scores.iter().zip(kv) {
            for (o, x) in tail.iter_mut().zip(&v[at..]) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// `acc[l] = p · v[l] + acc[l]` for every lane, fused (one rounding, the same bits in hardware or software).
#[inline(always)]
fn scale_acc(acc: &mut Lanes, p: f32, v: &Lanes) {
    for l in 0..LANES {
        acc[l] = p.mul_add(v[l], acc[l]);
    }
}

// The weighted sums over all values of 8, 4 or 1 lane chunks of the output starting at chunk `at`, each chunk
// summed in value order from 0.0. `inline(never)` and spelled out per width for the same reason as the matmul
// micro-kernels: compiled alone, each accumulator is one YMM register.

#[inline(never)]
fn weighted_8<'a>(p: &[f32], values: impl Iterator<Item = &'a [f32]>, at: usize) -> [Lanes; 8] {
    let z = [0.0f32; LANES];
    let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5, mut a6, mut a7) = (z, z, z, z, z, z, z, z);
    for (&pt, v) in p.iter().zip(values) {
        let v = &v.as_chunks::<LANES>().0[at..at + 8];
        scale_acc(&mut a0, pt, &v[0]);
        scale_acc(&mut a1, pt, &v[1]);
        scale_acc(&mut a2, pt, &v[2]);
        scale_acc(&mut a3, pt, &v[3]);
        scale_acc(&mut a4, pt, &v[4]);
        scale_acc(&mut a5, pt, &v[5]);
        scale_acc(&mut a6, pt, &v[6]);
        scale_acc(&mut a7, pt, &v[7]);
    }
    [a0, a1, a2, a3, a4, a5, a6, a7]
}

#[inline(never)]
fn weighted_4<'a>(p: &[f32], values: impl Iterator<Item = &'a [f32]>, at: usize) -> [Lanes; 4] {
    let z = [0.0f32; LANES];
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    for (&pt, v) in p.iter().zip(values) {
        let v = &v.as_chunks::<LANES>().0[at..at + 4];
        scale_acc(&mut a0, pt, &v[0]);
        scale_acc(&mut a1, pt, &v[1]);
        scale_acc(&mut a2, pt, &v[2]);
        scale_acc(&mut a3, pt, &v[3]);
    }
    [a0, a1, a2, a3]
}

#[inline(never)]
fn weighted_1<'a>(p: &[f32], values: impl Iterator<Item = &'a [f32]>, at: usize) -> [Lanes; 1] {
    let mut a0 = [0.0f32; LANES];
    for (&pt, v) in p.iter().zip(values) {
        scale_acc(&mut a0, pt, &v.as_chunks::<LANES>().0[at]);
    }
    [a0]
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Bitwise the reference for any head width (multiples of 8 or not, wider than one 8-chunk block) and any
        /// number of keys (a multiple of 4 or not, none included).
        #[test]
        fn attend_matches_reference(hd in 1usize..150, keys in 0usize..23, seed in any::<u64>()) {
            let mut r = SplitMix64::new(seed);
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let (q, ks, vs) = (v(hd), v(keys * hd), v(keys * hd));
            let kv: Vec<(&[f32], &[f32])> = ks.chunks_exact(hd).zip(vs.chunks_exact(hd)).collect();
            let mut want = vec![0.0; hd];
            attend_reference(&q, &kv, 0.3, &mut want);
            let mut got = vec![f32::NAN; hd];
            attend(&q, kv.iter().copied(), 0.3, &mut Vec::new(), &mut got);
            prop_assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
