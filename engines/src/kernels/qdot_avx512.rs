//! `qdot`'s integer block dots on AVX-512 VNNI, bitwise the same values.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes and sums each group of 4 into a 32-bit lane; from a zero
//! accumulator that is exactly `qdot`'s lane `l` of a block (bytes `4l..4l + 4`). One 512-bit register holds a
//! block of two weight rows side by side (`[row c | row c + 1]`) against one activation block broadcast to both
//! halves, so a single instruction gives 16 lane sums. The float steps after it are `qdot`'s, lane for lane and
//! in block order: `dd = dw · dx`, then `acc += dd · sums` (a multiply, then an add). The minimums' shares
//! (`mins += mw · sx`, Q4_1) go 16 (weight row, activation row) pairs to a register, from the block-major sums.
//! At the end each pair's 8 lanes take `qdot::hsum`'s tree, then `+ mins`.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::qdot::{hsum, QActs, LANES};
use super::quant::{QType, QK};

/// Whether this CPU runs `tile` (AVX-512 F, BW, VL, VNNI and F16C).
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
}

/// `out[c][r]` = weight row `ws[c]` against activation row `r0 + r` of `xq`, for `2P` weight rows (`ws[2p]` and
/// `ws[2p + 1]` share a register; pass a row twice to use one alone) and `R ≤ 8` activation rows.
///
/// # Safety
/// `available()`; `ty` is Q4_1 or Q8_0; every `ws[c]` holds exactly `xq`'s blocks per row in `ty`'s layout;
/// rows `r0..r0 + R` exist in `xq`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
pub unsafe fn tile<const P: usize, const R: usize>(
    ty: QType,
    ws: &[&[u8]],
    xq: &QActs,
    r0: usize,
    out: &mut [[f32; R]],
) {
    // SAFETY: the caller's contract, passed on
    unsafe {
        match ty {
            QType::Q4_1 => tile_of::<P, R, true>(ws, xq, r0, out),
            _ => tile_of::<P, R, false>(ws, xq, r0, out),
        }
    }
}

/// Bytes per block: Q4_1 (`d`, `m`, 16 bytes of nibbles) or Q8_0 (`d`, 32 bytes).
const fn block_bytes(q4: bool) -> usize {
    if q4 {
        20
    } else {
        34
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
#[inline]
unsafe fn tile_of<const P: usize, const R: usize, const Q4: bool>(
    ws: &[&[u8]],
    xq: &QActs,
    r0: usize,
    out: &mut [[f32; R]],
) {
    const { assert!(R >= 1 && R <= 8, "one to eight activation rows") };
    let bytes = block_bytes(Q4);
    let blocks = xq.in_dim / QK;
    assert!(ws.len() == 2 * P && out.len() == 2 * P && r0 + R <= xq.rows, "tile shape");
    for w in ws {
        assert_eq!(w.len(), blocks * bytes, "weight rows of whole blocks, as long as the activations");
    }
    let wp: [[*const u8; 2]; P] = std::array::from_fn(|p| [ws[2 * p].as_ptr(), ws[2 * p + 1].as_ptr()]);
    let xp: [*const i8; R] = std::array::from_fn(|r| xq.q[(r0 + r) * xq.in_dim..].as_ptr());
    let dx: [&[f32]; R] = std::array::from_fn(|r| &xq.d[(r0 + r) * blocks..(r0 + r + 1) * blocks]);
    let sx_rows = xq.s_by_block.chunks_exact(xq.rows);
    let rows_mask: __mmask8 = ((1u16 << R) - 1) as __mmask8;
    let low = _mm512_set1_epi8(0x0f);
    // Q4_1: each 128-bit quarter is one row's 16 nibble bytes; words of the odd quarters shift right by 4
    let shifts = _mm512_setr_epi32(
        0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004, 0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004,
    );
    // lanes 0..8 take element `lo`, lanes 8..16 element `hi` of a 4-float vector
    let spread = |lo: i32, hi: i32| _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
    let (pick_d, pick_m) = (spread(0, 2), spread(1, 3));

    let mut acc = [[_mm512_setzero_ps(); R]; P];
    let mut mins = [_mm512_setzero_ps(); P];
    for (b, sx_block) in sx_rows.enumerate() {
        // SAFETY (every pointer below): `b < blocks`, each weight row holds `blocks` blocks of `bytes`, each
        // activation row `blocks` blocks of 32 values; every load is unaligned
        let xb: [__m512i; R] =
            std::array::from_fn(|r| unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(xp[r].add(b * QK).cast())) });
        // the rows' block sums, [s(r0) .. s(r0 + R) | the same], zero past R
        let sx = if Q4 {
            // SAFETY: rows `r0..r0 + R` of the block's `rows` sums (the mask reads no further)
            let v = unsafe { _mm256_maskz_loadu_ps(rows_mask, sx_block[r0..].as_ptr()) };
            _mm512_broadcast_f32x8(v)
        } else {
            _mm512_setzero_ps()
        };
        // the weights one tile further on (the rows after these, which the next tile reads): decode streams its
        // weights from memory once, and the row-interleaved walk hides the stream from the hardware prefetcher
        let ahead = wp[P - 1][1].wrapping_add(blocks * bytes + b * 2 * P * bytes);
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
        for p in 0..P {
            let [a, c] = wp[p].map(|w| unsafe { w.add(b * bytes) });
            // the two rows' halves as f32: [d_a, m_a, d_b, m_b] (Q8_0: m = 0, the next byte pair is a weight)
            let halves = if Q4 {
                unsafe { _mm_setr_epi32(a.cast::<i32>().read_unaligned(), c.cast::<i32>().read_unaligned(), 0, 0) }
            } else {
                let d = |w: *const u8| i32::from(unsafe { w.cast::<u16>().read_unaligned() });
                _mm_setr_epi32(d(a), d(c), 0, 0)
            };
            let scales = _mm512_castps128_ps512(_mm_cvtph_ps(halves));
            let dw = _mm512_permutexvar_ps(pick_d, scales);
            let (wq, xsign) = if Q4 {
                let both = unsafe {
                    let qa = _mm_loadu_si128(a.add(4).cast());
                    let qc = _mm_loadu_si128(c.add(4).cast());
                    _mm512_castsi256_si512(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(qa), qc))
                };
                // quarters [a, a, c, c], then the odd quarters' high nibbles down: [a lo, a hi | c lo, c hi]
                let dup = _mm512_shuffle_i64x2::<0b01_01_00_00>(both, both);
                (_mm512_and_si512(_mm512_srlv_epi16(dup, shifts), low), 0)
            } else {
                let w = unsafe {
                    let wa = _mm256_loadu_si256(a.add(2).cast());
                    let wc = _mm256_loadu_si256(c.add(2).cast());
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(wa), wc)
                };
                // |w| against x with w's sign (as `qdot`'s AVX2 kernel): the same products; |-128| is 128 unsigned
                (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
            };
            if Q4 {
                mins[p] = _mm512_add_ps(mins[p], _mm512_mul_ps(_mm512_permutexvar_ps(pick_m, scales), sx));
            }
            for r in 0..R {
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(dx[r][b]));
                let x = if Q4 { xb[r] } else { _mm512_mask_sub_epi8(xb[r], xsign, _mm512_setzero_si512(), xb[r]) };
                let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, x);
                acc[p][r] = _mm512_add_ps(acc[p][r], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(sums)));
            }
        }
    }
    for p in 0..P {
        let mut m = [0.0f32; 16];
        // SAFETY: `m` is 16 f32s; unaligned store
        unsafe { _mm512_storeu_ps(m.as_mut_ptr(), mins[p]) };
        for r in 0..R {
            let mut lanes = [0.0f32; 2 * LANES];
            // SAFETY: `lanes` is 16 f32s; unaligned store
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[p][r]) };
            let (a, c) = lanes.split_at(LANES);
            out[2 * p][r] = hsum(a.try_into().expect("8 lanes")) + m[r];
            out[2 * p + 1][r] = hsum(c.try_into().expect("8 lanes")) + m[LANES + r];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::qdot::dot_reference;
    use crate::kernels::test_rows::quantized_tile_inputs;
    use proptest::prelude::*;

    /// Every tile shape the matmul uses, bitwise `qdot::dot_reference` for each element.
    fn check<const P: usize, const R: usize>(ty: QType, bytes: &[u8], rb: usize, xq: &QActs, r0: usize, c0: usize) {
        let ws: Vec<&[u8]> = (0..2 * P).map(|c| &bytes[(c0 + c) * rb..(c0 + c + 1) * rb]).collect();
        let mut out = vec![[0.0f32; R]; 2 * P];
        // SAFETY: `available()` was checked by the caller; the shapes are the contract's
        unsafe { tile::<P, R>(ty, &ws, xq, r0, &mut out) };
        for (c, (w, got)) in ws.iter().zip(&out).enumerate() {
            for (r, v) in got.iter().enumerate() {
                let want = dot_reference(ty, w, xq.row(r0 + r));
                assert_eq!(v.to_bits(), want.to_bits(), "{ty:?} P {P} R {R}: weight row {c}, row {r}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn tiles_match_the_reference(
            q4 in any::<bool>(), blocks in 1usize..30, seed in any::<u64>(), wscale in 0u32..4, xscale in 0u32..4,
            r0 in 0usize..3
        ) {
            if !available() {
                return Ok(());
            }
            let ty = if q4 { QType::Q4_1 } else { QType::Q8_0 };
            let (bytes, xq) = quantized_tile_inputs(ty, 4, blocks, seed, (wscale, xscale));
            let rb = ty.row_bytes(blocks * QK);
            check::<2, 8>(ty, &bytes, rb, &xq, r0, 0);
            check::<1, 8>(ty, &bytes, rb, &xq, r0, 2);
            check::<2, 4>(ty, &bytes, rb, &xq, r0 + 1, 0);
            check::<2, 1>(ty, &bytes, rb, &xq, r0 + 7, 0);
            check::<1, 1>(ty, &bytes, rb, &xq, 10, 1);
        }
    }
}
