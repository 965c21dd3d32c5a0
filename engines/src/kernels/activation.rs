//! Elementwise activations and softmax, on the vectorizable `exp`.

use super::exp::exp;

/// Lanes of the softmax's sum: a fixed split, so the sum's order depends only on the length.
const LANES: usize = 16;

/// SiLU: x · sigmoid(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// Softmax in place. The sum of the exponentials runs in 16 fixed lanes (element `i` into lane `i % 16`, in index
/// order), then a fixed pairwise sum of the lanes: the order depends only on the length, never on the values or
/// the batch around them. On AVX-512 in 512-bit registers, with the same bits.
pub fn softmax_in_place(x: &mut [f32]) {
    softmax_scaled(x, 1.0);
}

/// Every element times `scale`, then `softmax_in_place`, in one pass fewer (attention's scaled scores): the bits
/// of the two steps, on AVX-512 where the CPU has it.
pub fn softmax_scaled(x: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if scale > 0.0 && scale.is_finite() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; the scale is positive and finite, as the kernel requires
        #[allow(unsafe_code)]
        return unsafe { super::softmax_avx512::softmax_scaled(x, scale) };
    }
    softmax_scaled_portable(x, scale);
}

/// The portable `softmax_scaled`: the two steps as written.
fn softmax_scaled_portable(x: &mut [f32], scale: f32) {
    if scale != 1.0 {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    let max = lane_max(x);
    if !max.is_finite() {
        // every score masked: a uniform distribution is as good as any and avoids NaN
        let n = x.len().max(1) as f32;
        x.iter_mut().for_each(|v| *v = 1.0 / n);
        return;
    }
    let mut acc = [0.0f32; LANES];
    let (chunks, tail) = x.as_chunks_mut::<LANES>();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - max);
            *a += *v;
        }
    }
    for (a, v) in acc.iter_mut().zip(tail.iter_mut()) {
        *v = exp(*v - max);
        *a += *v;
    }
    let inv = 1.0 / pairwise(acc);
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The largest element (exact whatever the order; split in lanes so it vectorizes). NaN-free inputs assumed, as
/// everywhere in the kernels; a NaN is skipped.
fn lane_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let (chunks, tail) = x.as_chunks::<LANES>();
    for c in chunks {
        for (a, v) in m.iter_mut().zip(c) {
            *a = a.max(*v);
        }
    }
    for (a, v) in m.iter_mut().zip(tail) {
        *a = a.max(*v);
    }
    m.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// `((a₀ + a₈) + (a₄ + a₁₂)) + …`: lane `l` plus lane `l + 8`, then a fixed tree over those eight.
#[inline]
pub(super) fn pairwise(a: [f32; LANES]) -> f32 {
    let h: [f32; 8] = std::array::from_fn(|l| a[l] + a[l + 8]);
    ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A distribution (sums to 1 within rounding), each weight within 1e-6 relative of the f64 softmax.
        #[test]
        fn softmax_matches_f64(xs in proptest::collection::vec(-30.0f32..30.0, 1..100)) {
            let mut got = xs.clone();
            softmax_in_place(&mut got);
            let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let e: Vec<f64> = xs.iter().map(|&v| (v as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (g, w) in got.iter().zip(&e) {
                let w = w / sum;
                prop_assert!((*g as f64 - w).abs() <= 1e-6 * w.max(1e-30) + 1e-12, "{g} vs {w}");
            }
        }

        /// The same values give the same bits wherever they sit in a longer buffer (no dependence on the batch).
        #[test]
        fn softmax_is_position_independent(xs in proptest::collection::vec(-10.0f32..10.0, 1..40), pad in 0usize..20) {
            let mut alone = xs.clone();
            softmax_in_place(&mut alone);
            let mut buf = vec![0.0f32; pad];
            buf.extend(&xs);
            softmax_in_place(&mut buf[pad..]);
            prop_assert_eq!(
                alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                buf[pad..].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The kernel the CPU runs (AVX-512 where it has it) gives the portable steps' bits, at every length (whole
        /// chunks and tails), scale, and with masked, huge and tiny scores among the values.
        #[test]
        fn softmax_scaled_matches_the_portable_steps(
            xs in proptest::collection::vec(prop_oneof![
                8 => -40.0f32..40.0,
                1 => Just(f32::NEG_INFINITY),
                1 => -1e30f32..1e30,
                1 => -1e-30f32..1e-30,
            ], 0..70),
            scale in prop_oneof![Just(1.0f32), 1e-3f32..4.0, Just(0.125)],
        ) {
            let (mut fast, mut portable) = (xs.clone(), xs.clone());
            softmax_scaled(&mut fast, scale);
            softmax_scaled_portable(&mut portable, scale);
            prop_assert_eq!(
                fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn masked_scores_get_no_weight_and_all_masked_is_uniform() {
        let mut x = [0.0, f32::NEG_INFINITY, 1.0];
        softmax_in_place(&mut x);
        assert_eq!(x[1], 0.0);
        assert!((x[0] + x[2] - 1.0).abs() < 1e-6);
        let mut all = [f32::NEG_INFINITY; 3];
        softmax_in_place(&mut all);
        assert_eq!(all, [1.0 / 3.0; 3]);
    }

    #[test]
    fn silu_at_its_landmarks() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!(silu(-200.0).abs() < 1e-30);
        assert_eq!(silu(200.0), 200.0);
    }
}
