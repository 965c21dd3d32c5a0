//! `qdot`'s activation quantization on AVX-512, bitwise the blocks `qdot::quantize_block` gives: a block's 32
//! values in two registers, `max|x|` by a vector maximum, each value's `round(x / d)` by one conversion.
//!
//! The scalar steps' edge cases, kept: `f32::max` skips NaN (a vector maximum takes its second operand when either
//! is NaN, so `max(|x|, 0)` counts a NaN as 0); `as i8` saturates and takes NaN to 0 (the products are clamped to
//! [-128, 127] before rounding, which rounds to the same saturated values, and NaN lanes are zeroed).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::quant::QK;

/// Whether this CPU runs `quantize_blocks`.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Consecutive blocks of `x` into `q`, their scales `d` and sums `s` (as `qdot::quantize_blocks`).
///
/// # Safety
/// `available()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let (xc, _) = x.as_chunks::<QK>();
    let (qc, _) = q.as_chunks_mut::<QK>();
    for (((xb, qb), d), s) in xc.iter().zip(qc).zip(d).zip(s) {
        // SAFETY: AVX-512F is enabled here
        (*d, *s) = unsafe { quantize_block(xb, qb) };
    }
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn quantize_block(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    // SAFETY: `x` holds 32 values; unaligned loads
    let halves = unsafe { [_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))] };
    let zero = _mm512_setzero_ps();
    let m = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(halves[0]), zero), _mm512_max_ps(_mm512_abs_ps(halves[1]), zero));
    let amax = _mm512_reduce_max_ps(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (low, high) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
    let mut sum = _mm512_setzero_si512();
    for (h, v) in halves.iter().enumerate() {
        let p = _mm512_mul_ps(*v, _mm512_set1_ps(id));
        let clamped = _mm512_min_ps(_mm512_max_ps(p, low), high);
        let p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(p, p), clamped);
        let i = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
        sum = _mm512_add_epi32(sum, i);
        // SAFETY: `q` holds 32 bytes, this half's 16 at `16 * h`; unaligned store
        unsafe { _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(i)) };
    }
    (d, d * _mm512_reduce_add_epi32(sum) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::qdot::quantize_blocks_portable;
    use crate::kernels::test_rows::random;
    use proptest::prelude::*;

    /// The blocks of `x` both ways, bitwise equal.
    fn check(x: &[f32]) {
        let (n, blocks) = (x.len(), x.len() / QK);
        let (mut q1, mut d1, mut s1) = (vec![0i8; n], vec![0.0f32; blocks], vec![0.0f32; blocks]);
        let (mut q2, mut d2, mut s2) = (vec![0i8; n], vec![0.0f32; blocks], vec![0.0f32; blocks]);
        quantize_blocks_portable(x, &mut q1, &mut d1, &mut s1);
        // SAFETY: the callers check `available()`
        unsafe { quantize_blocks(x, &mut q2, &mut d2, &mut s2) };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(q1, q2, "values of {x:?}");
        assert_eq!(bits(&d1), bits(&d2), "scales of {x:?}");
        assert_eq!(bits(&s1), bits(&s2), "sums of {x:?}");
    }

    /// NaN in the same lane of both halves (a vector maximum of two NaNs is NaN), and a block of NaN alone.
    #[test]
    fn nan_everywhere_a_maximum_can_see_it() {
        if !available() {
            return;
        }
        let mut x: Vec<f32> = random(QK, 3);
        x[5] = f32::NAN;
        x[21] = f32::NAN;
        check(&x);
        check(&[f32::NAN; QK]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every block's values, scale and sum are the portable steps' bits, at any scale and with NaN, ±inf,
        /// ±0 and subnormal values among them.
        #[test]
        fn blocks_are_the_portable_blocks(
            blocks in 1usize..9, seed in any::<u64>(), scale in 0usize..6, specials in prop::collection::vec((0usize..288, 0usize..7), 0..6)
        ) {
            if !available() {
                return Ok(());
            }
            let scale = [0.0, 1e-40, 1e-3, 1.0, 300.0, 3e38][scale];
            let mut x: Vec<f32> = random(blocks * QK, seed).iter().map(|v| v * scale).collect();
            for (at, which) in specials {
                let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-45, f32::MAX][which];
                let n = x.len();
                x[at % n] = special;
            }
            check(&x);
        }
    }
}
