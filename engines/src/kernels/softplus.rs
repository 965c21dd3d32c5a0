//! `softplus(x) = ln(1 + eˣ)` written out so that a loop over a slice vectorizes, as `exp` is: libm's `log1pf` and
//! `expf` are a call per element, and kimi's KDA layers take three such calls for every state row a position
//! decays (`exp(-a · softplus(f))`), which was about 6% of its bench prefill (perf: `__log1pf` and `__expf_fma`).
//!
//! `eˣ` by the crate's `exp`, `ln` of `u = 1 + eˣ` by Cephes' `logf` (range reduction to a mantissa in
//! [√½, √2), a degree-8 polynomial in fused multiply-adds, the exponent's `ln 2` added in two parts), and the
//! rounding of `1 + eˣ` corrected as `log1p` does (`ln(u) − ((u − 1) − eˣ) / u`). Every step is elementwise with
//! fixed operations: a value's result never depends on its neighbours or the vector width. Within 2 ulp of the
//! correctly rounded value (a test pins it); above `LINEAR_FROM` it is `x` itself.

use super::exp::{exp, LN2_HI, LN2_LO};

/// From here on `ln(1 + eˣ)` rounds to `x` in f32 (`e⁻ˣ` is below half an ulp of `x`).
const LINEAR_FROM: f32 = 20.0;
/// √½: mantissas below it are doubled, so the polynomial's argument stays in [−0.30, 0.42).
const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// Cephes' `logf` polynomial for `(ln(1 + x) − x + x²/2) / x³`, highest degree first (Horner's order).
const LOG_POLY: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461_1e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];

/// `ln(u)` for a normal `u >= 1` (all `softplus` asks of it), branch-free.
#[inline(always)]
fn ln_at_least_one(u: f32) -> f32 {
    let bits = u.to_bits();
    // u = m · 2ᵉ with m in [0.5, 1)
    let e = ((bits >> 23) & 0xff) as i32 - 126;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let low = m < SQRT_HALF;
    let (e, x) = if low { (e - 1, m + m - 1.0) } else { (e, m - 1.0) };
    let z = x * x;
    let p = LOG_POLY[1..].iter().fold(LOG_POLY[0], |p, c| p.mul_add(x, *c));
    let ef = e as f32;
    // e · ln 2 in exp's two parts (LN2_LO is negative): the low one here, the high one last
    let y = ef.mul_add(LN2_LO, p * x * z);
    let y = (-0.5f32).mul_add(z, y);
    ef.mul_add(LN2_HI, x + y)
}

/// `ln(1 + eˣ)`, branch-free (selects, no calls), so a loop over a slice vectorizes. NaN stays NaN.
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    // NaN compares false, so it stays NaN here and below
    let below = if x > LINEAR_FROM { LINEAR_FROM } else { x };
    let t = exp(below);
    let u = 1.0 + t;
    // log1p's correction: u − 1 is what of t survived the rounding of 1 + t
    let l = ln_at_least_one(u) - ((u - 1.0) - t) / u;
    if x > LINEAR_FROM || x.is_nan() {
        x
    } else {
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_diff::ulp_distance as ulps;

    fn softplus_f64(x: f32) -> f32 {
        let x = x as f64;
        (if x > 30.0 { x } else { x.exp().ln_1p() }) as f32
    }

    #[test]
    fn ends_and_special_values() {
        assert_eq!(softplus(0.0), std::f32::consts::LN_2);
        assert_eq!(softplus(25.0), 25.0);
        assert_eq!(softplus(f32::INFINITY), f32::INFINITY);
        assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
        assert_eq!(softplus(-100.0), 0.0);
        assert!(softplus(f32::NAN).is_nan());
        // far below 0 it is eˣ itself (no loss to 1 + eˣ rounding to 1)
        assert!(ulps(softplus(-30.0), (-30.0f64).exp() as f32) <= 2);
    }

    #[test]
    fn within_two_ulp_on_a_dense_grid() {
        let mut worst = (0u64, 0.0f32);
        let steps = 400_000;
        for i in 0..=steps {
            let x = -80.0 + 110.0 * i as f32 / steps as f32;
            let d = ulps(softplus(x), softplus_f64(x));
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulp at x = {}", worst.0, worst.1);
    }
}
