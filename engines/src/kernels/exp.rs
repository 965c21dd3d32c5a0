//! `exp` written out so that a loop over a slice vectorizes: libm's `expf` is a call per element, which held the
//! softmax of attention and the SiLU of every FFN to one element at a time.
//!
//! Range reduction `x = n·ln2 + r` with `|r| <= ln2/2` (`n` rounded to nearest even by the 1.5·2²³ trick), a
//! degree-6 polynomial for `eʳ` (Cephes' `expf` coefficients) in fused multiply-adds, and `2ⁿ` built in the
//! exponent bits. Every step is elementwise with fixed operations, so a value's result never depends on its
//! neighbours or the vector width: batch-invariant like the other kernels. Within 2 ulp of the correctly
//! rounded `eˣ` on the normal range (a test pins it); inputs below `MIN_ARG` give 0, above `MAX_ARG` infinity.

/// Below this `eˣ` would be subnormal; it is flushed to 0 (a masked score, `-inf`, gets no weight).
pub(super) const MIN_ARG: f32 = -87.33;
/// Above this `eˣ` is within 0.3% of `f32::MAX`; it gives infinity.
pub(super) const MAX_ARG: f32 = 88.72;
pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two so that `n · LN2_HI` is exact for every `n` in range.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2²³: adding it rounds to an integer held in the low mantissa bits.
pub(super) const ROUND: f32 = 12_582_912.0;
/// The polynomial's coefficients, highest degree first (Horner's order).
pub(super) const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `eˣ`, branch-free (selects, no calls), so a loop over a slice vectorizes.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let clamped = x.clamp(MIN_ARG, MAX_ARG);
    let t = clamped.mul_add(LOG2E, ROUND);
    let k = t - ROUND;
    let r = k.mul_add(-LN2_LO, k.mul_add(-LN2_HI, clamped));
    let p = POLY[1..].iter().fold(POLY[0], |p, c| p.mul_add(r, *c));
    let er = p.mul_add(r * r, r) + 1.0;
    // t's low bits hold n + ROUND's. n is in -126..=128 after the clamp; 2¹²⁸ is not an f32, so a positive n
    // is applied as 2ⁿ⁻¹ · 2.
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let high = n > 0;
    let e = if high { n - 1 } else { n };
    let y = er * f32::from_bits(((e + 127) as u32) << 23);
    let y = if high { y * 2.0 } else { y };
    let y = if x > MAX_ARG { f32::INFINITY } else { y };
    let y = if x < MIN_ARG { 0.0 } else { y };
    // NaN compares false everywhere above; keep it NaN
    if x.is_nan() {
        x
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Distance in units in the last place between two finite floats of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn ends_and_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(MAX_ARG).is_finite());
        assert!(exp(MIN_ARG) > 0.0 && exp(MIN_ARG).is_normal());
    }

    #[test]
    fn within_two_ulp_on_a_dense_grid() {
        let mut worst = (0u32, 0.0f32);
        let steps = 200_000;
        for i in 0..=steps {
            let x = MIN_ARG + (MAX_ARG - MIN_ARG) * i as f32 / steps as f32;
            let want = (x as f64).exp() as f32;
            let d = ulps(exp(x), want);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulp at x = {}", worst.0, worst.1);
    }

    proptest! {
        #[test]
        fn within_two_ulp_anywhere_in_range(x in MIN_ARG..MAX_ARG) {
            let want = (x as f64).exp() as f32;
            prop_assert!(ulps(exp(x), want) <= 2, "x = {x}: {} vs {want}", exp(x));
        }

        #[test]
        fn monotone_between_neighbours(x in MIN_ARG..MAX_ARG - 1.0) {
            let y = x + 1e-3;
            prop_assert!(exp(x) <= exp(y));
        }
    }
}
