//! `softmax_scaled` on AVX-512, bitwise the portable one: the same `exp` operation by operation (fused where it
//! fuses, selects where it selects) on sixteen elements a register, the same 16 lanes of the sum (element `i`
//! into lane `i % 16`, the tail masked), the same pairwise tree. Compiled for 512-bit registers explicitly: the
//! portable loops vectorize at 256 bits on CPUs that prefer them, and attention's softmax took a quarter of its
//! time there.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::activation::pairwise;
use super::exp::{LN2_HI, LN2_LO, LOG2E, MIN_ARG, POLY, ROUND};

const LANES: usize = 16;

/// `x · scale`, then softmax in place: `activation::softmax_scaled`'s bits. `scale` is positive and finite (the
/// caller checks), so the largest scaled score is the largest score scaled and one pass finds it.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn softmax_scaled(x: &mut [f32], scale: f32) {
    let n = x.len();
    let whole = n / LANES * LANES;
    let tail: __mmask16 = (1u32 << (n - whole)).wrapping_sub(1) as __mmask16;
    let p = x.as_mut_ptr();
    // SAFETY (every access below): chunks at `i < whole` are whole, the tail's loads and stores are masked to
    // `n - whole` elements
    let load = |i: usize| unsafe { _mm512_loadu_ps(p.add(i)) };
    let load_tail = || unsafe { _mm512_maskz_loadu_ps(tail, p.add(whole)) };
    // the largest score, NaN skipped (`vmaxps` returns its second operand when either is NaN)
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    for i in (0..whole).step_by(LANES) {
        m = _mm512_max_ps(load(i), m);
    }
    m = _mm512_mask_max_ps(m, tail, load_tail(), m);
    let max = _mm512_reduce_max_ps(m) * scale;
    if !max.is_finite() {
        // every score masked: a uniform distribution is as good as any and avoids NaN
        let n = n.max(1) as f32;
        x.iter_mut().for_each(|v| *v = 1.0 / n);
        return;
    }
    let (s, mx) = (_mm512_set1_ps(scale), _mm512_set1_ps(max));
    let mut acc = _mm512_setzero_ps();
    for i in (0..whole).step_by(LANES) {
        let e = exp16_at_most_zero(_mm512_sub_ps(_mm512_mul_ps(load(i), s), mx));
        unsafe { _mm512_storeu_ps(p.add(i), e) };
        acc = _mm512_add_ps(acc, e);
    }
    if n > whole {
        let e = exp16_at_most_zero(_mm512_sub_ps(_mm512_mul_ps(load_tail(), s), mx));
        unsafe { _mm512_mask_storeu_ps(p.add(whole), tail, e) };
        acc = _mm512_mask_add_ps(acc, tail, acc, e);
    }
    let mut lanes = [0.0f32; LANES];
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    let inv = _mm512_set1_ps(1.0 / pairwise(lanes));
    for i in (0..whole).step_by(LANES) {
        unsafe { _mm512_storeu_ps(p.add(i), _mm512_mul_ps(load(i), inv)) };
    }
    if n > whole {
        unsafe { _mm512_mask_storeu_ps(p.add(whole), tail, _mm512_mul_ps(load_tail(), inv)) };
    }
}

/// `exp::exp` on sixteen values that are each at most 0 or NaN: its operations in its order, its selects as
/// masks, less the steps that act only above 0 (the clamp to `MAX_ARG`, the 2ⁿ⁻¹ · 2 branch for `n > 0`, the
/// select of infinity) — about a quarter of its operations, and the exp is most of the softmax's work. A softmax's
/// arguments are such values: rounding is monotonic, so a score times the scale, less the largest score times
/// the scale, is never above 0.
#[target_feature(enable = "avx512f")]
#[inline]
fn exp16_at_most_zero(x: __m512) -> __m512 {
    // `vmaxps` returns its second operand for a NaN lane: MIN_ARG, as `exp`'s clamp gives
    let clamped = _mm512_max_ps(x, _mm512_set1_ps(MIN_ARG));
    let round = _mm512_set1_ps(ROUND);
    let t = _mm512_fmadd_ps(clamped, _mm512_set1_ps(LOG2E), round);
    let k = _mm512_sub_ps(t, round);
    let r = _mm512_fmadd_ps(k, _mm512_set1_ps(-LN2_LO), _mm512_fmadd_ps(k, _mm512_set1_ps(-LN2_HI), clamped));
    let mut poly = _mm512_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(*c));
    }
    let er = _mm512_add_ps(_mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
    // n = round(clamped · log2 e) is at most 0 here, so 2ⁿ is built directly
    let n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(ROUND.to_bits() as i32));
    let two_n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127))));
    let y = _mm512_mul_ps(er, two_n);
    let y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(MIN_ARG)), _mm512_setzero_ps());
    _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::exp::exp;

    /// `exp16_at_most_zero` is `exp` bit for bit on every value a softmax hands it: a dense grid from below
    /// `MIN_ARG` up to 0, every 997th negative float's bit pattern (subnormals and the values next to the clamp
    /// among them), and the special values.
    #[test]
    fn exp16_at_most_zero_is_exp() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let below = f32::from_bits(MIN_ARG.to_bits() + 1);
        let above = f32::from_bits(MIN_ARG.to_bits() - 1);
        let specials = [0.0, -0.0, f32::NEG_INFINITY, f32::NAN, -f32::NAN, MIN_ARG, below, above, -100.0, -1e-45];
        let grid = (0..=400_000).map(|i| -95.0 * i as f32 / 400_000.0);
        let patterns = (0x8000_0000u32..=0xff80_0000).step_by(997).map(f32::from_bits);
        let mut xs: Vec<f32> = specials.into_iter().chain(grid).chain(patterns).collect();
        xs.resize(xs.len().next_multiple_of(LANES), 0.0);
        for chunk in xs.chunks_exact(LANES) {
            let mut got = [0.0f32; LANES];
            // SAFETY: the CPU has AVX-512F (checked above); `chunk` and `got` hold 16 f32s
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16_at_most_zero(_mm512_loadu_ps(chunk.as_ptr()))) };
            for (x, g) in chunk.iter().zip(got) {
                assert_eq!(g.to_bits(), exp(*x).to_bits(), "exp16_at_most_zero({x})");
            }
        }
    }
}
