//! `qdot`'s integer block dots on AVX2 for four weight rows interleaved (`interleaved`): the layout the VNNI
//! kernel reads, on machines without AVX-512. Bitwise the same values as the portable kernel and `qdot`'s AVX2
//! kernels on the file's layout.
//!
//! What the layout saves here: a block of the four rows is one run of bytes, so its four scales (and Q4_1's
//! minimums) are one load and one conversion instead of a gather of four rows' halves, and two rows' nibbles
//! are one 256-bit load, unpacked together (measurements: docs/engines.md, *Four rows interleaved*).
//! - Q4_1: rows `2p` and `2p + 1` share a register, a row per 128-bit half. Their low nibbles meet the
//!   activation block's first 16 bytes (broadcast to both halves), giving lanes 0..4 of each row; the high
//!   nibbles meet its last 16 bytes, giving lanes 4..8. `maddubs` then `madd` by ones give the exact lane sums.
//! - Q8_0: the layout stores `q + 128`; `maddubs` would saturate on it (255 · 127 · 2 > i16), so the bias is
//!   undone (`xor 0x80`) and the signs moved onto the activations (`|q| · sign(q) x`), as `qdot`'s AVX2 kernel.
//!
//! The float steps are `qdot`'s, lane for lane and in block order: `dd = dw · dx`, `acc += dd · sums` (a
//! multiply, then an add), Q4_1's `mins += mw · sx`; at the end each row's 8 lanes take `qdot::hsum`'s tree, then
//! `+ mins`.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::interleaved::{ahead, group_block_bytes, rows_of};
use super::qdot::{hsum, QActs, LANES};
use super::quant::{QType, QK};

/// Whether this CPU runs the kernel (AVX2 and F16C).
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// `out[c][r]` = weight row `c` of one interleaved group (`group`: its bytes) against activation row `r0 + r` of
/// `xq`, for `R ≤ 4` activation rows. One activation row (decode) takes the four weight rows in one pass; more
/// take two rows at a time, so the accumulators stay in the 16 registers.
///
/// # Safety
/// `available()`; `ty` is Q4_1 or Q8_0.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn tile<const R: usize>(ty: QType, group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; R]; 4]) {
    const { assert!(R >= 1 && R <= 4, "one to four activation rows") };
    let blocks = xq.in_dim / QK;
    assert!(r0 + R <= xq.rows, "activation rows");
    assert_eq!(group.len(), blocks * group_block_bytes(ty), "a group of four rows as long as the activations");
    // SAFETY: the caller's contract and the lengths asserted above
    unsafe {
        match ty {
            QType::Q4_1 if R == 1 => q4_1::<2, R>(group, 0, xq, r0, out),
            QType::Q4_1 => {
                q4_1::<1, R>(group, 0, xq, r0, out);
                q4_1::<1, R>(group, 1, xq, r0, out);
            }
            QType::Q8_0 if R == 1 => q8_0::<4, R>(group, 0, xq, r0, out),
            QType::Q8_0 => {
                q8_0::<2, R>(group, 0, xq, r0, out);
                q8_0::<2, R>(group, 2, xq, r0, out);
            }
            QType::F32 => unreachable!("F32 weights take the f32 kernel"),
        }
    }
}

/// A vector of 8 lanes, lane `j` taking `at(j)`.
#[target_feature(enable = "avx2")]
fn lanes(at: impl Fn(usize) -> usize) -> __m256i {
    let v: [i32; 8] = std::array::from_fn(|j| at(j) as i32);
    // SAFETY: 8 i32s, unaligned load
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// The 8 lanes of `v`.
#[target_feature(enable = "avx2")]
fn stored(v: __m256) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: 8 f32s; unaligned store
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// Q4_1, pairs `p0..p0 + P` of the group (rows `2p0..2(p0 + P)`) against `R` activation rows; `P · R ≤ 2` pairs
/// of accumulators (`acc_lo` and `acc_hi` per pair and activation row) and one register of minimums.
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4_1<const P: usize, const R: usize>(
    group: &[u8],
    p0: usize,
    xq: &QActs,
    r0: usize,
    out: &mut [[f32; R]; 4],
) {
    // (a runtime check: `tile` instantiates every pairing, and calls only these)
    assert!(P * R <= 4 && (P == 1 || R == 1), "the accumulators and the minimums' lanes fit");
    let blocks = xq.in_dim / QK;
    let (xp, dx) = rows_of::<R>(xq, r0);
    let sums_of_row = &xq.s[r0 * blocks..(r0 + 1) * blocks];
    let w = group.as_ptr();
    let (low, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    // the block's halves convert to lanes `d₀ d₁ d₂ d₃ m₀ m₁ m₂ m₃`; pair p's scales: row 2p's in lanes 0..4,
    // row 2p + 1's in lanes 4..8
    let spread_d: [__m256i; P] = std::array::from_fn(|i| lanes(|j| 2 * (p0 + i) + j / 4));
    // with several activation rows, minimums lane 2i + k: row 2p0 + k's against activation row r0 + i; with one,
    // the converted halves' own lanes 4 + k (row k's minimum) against that row's sum
    let min_lane = |k: usize, i: usize| if R == 1 { 4 + 2 * p0 + k } else { 2 * i + k };
    let (spread_m, spread_s) = (lanes(|j| 4 + 2 * p0 + j % 2), lanes(|j| j / 2));
    let have = _mm_setr_epi32(-1, if R > 1 { -1 } else { 0 }, if R > 2 { -1 } else { 0 }, if R > 3 { -1 } else { 0 });
    let mut acc_lo = [[_mm256_setzero_ps(); R]; P];
    let mut acc_hi = [[_mm256_setzero_ps(); R]; P];
    let mut mins = _mm256_setzero_ps();
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, 80 bytes (asserted by `tile`); activation
        // rows of `blocks` blocks of 32; the sums `blocks x rows`, masked to the rows that exist; unaligned loads
        unsafe {
            let blk = w.add(b * 80);
            ahead(blk, 80);
            let dm = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
            let (mw, sx) = if R == 1 {
                (dm, _mm256_set1_ps(*sums_of_row.get_unchecked(b)))
            } else {
                let s = _mm_maskload_ps(xq.s_by_block.as_ptr().add(b * xq.rows + r0), have);
                (_mm256_permutevar8x32_ps(dm, spread_m), _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), spread_s))
            };
            mins = _mm256_add_ps(mins, _mm256_mul_ps(mw, sx));
            let x: [(__m256i, __m256i); R] = std::array::from_fn(|r| {
                let at = xp[r].add(b * QK);
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(at.cast())),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(at.add(16).cast())),
                )
            });
            for i in 0..P {
                let d = _mm256_permutevar8x32_ps(dm, spread_d[i]);
                let q = _mm256_loadu_si256(blk.add(16 + 32 * (p0 + i)).cast());
                let lo = _mm256_and_si256(q, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
                for (r, &(xlo, xhi)) in x.iter().enumerate() {
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(*dx[r].get_unchecked(b)));
                    let slo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xlo), ones);
                    let shi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xhi), ones);
                    acc_lo[i][r] = _mm256_add_ps(acc_lo[i][r], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(slo)));
                    acc_hi[i][r] = _mm256_add_ps(acc_hi[i][r], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(shi)));
                }
            }
        }
    }
    let m = stored(mins);
    for i in 0..P {
        for r in 0..R {
            let (lo, hi) = (stored(acc_lo[i][r]), stored(acc_hi[i][r]));
            for k in 0..2 {
                let row: [f32; LANES] = std::array::from_fn(|l| if l < 4 { lo[4 * k + l] } else { hi[4 * k + l - 4] });
                out[2 * (p0 + i) + k][r] = hsum(&row) + m[min_lane(2 * i + k, r)];
            }
        }
    }
}

/// Q8_0, rows `c0..c0 + C` of the group against `R` activation rows (`C · R ≤ 8` accumulators of 8 lanes).
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_0<const C: usize, const R: usize>(
    group: &[u8],
    c0: usize,
    xq: &QActs,
    r0: usize,
    out: &mut [[f32; R]; 4],
) {
    // (a runtime check: `tile` instantiates every pairing, and calls only these)
    assert!(C * R <= 8, "the accumulators fit the registers");
    let blocks = xq.in_dim / QK;
    let (xp, dx) = rows_of::<R>(xq, r0);
    let w = group.as_ptr();
    let (bias, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
    // the four scales in both halves; row c's in every lane (an in-half permute)
    let spread: [__m256i; C] = std::array::from_fn(|k| _mm256_set1_epi32((c0 + k) as i32));
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, 136 bytes (asserted by `tile`); activation
        // rows of `blocks` blocks of 32; unaligned loads
        unsafe {
            let blk = w.add(b * 136);
            ahead(blk, 136);
            let d = _mm_cvtph_ps(_mm_loadl_epi64(blk.cast()));
            let d = _mm256_set_m128(d, d);
            let x: [__m256i; R] = std::array::from_fn(|r| _mm256_loadu_si256(xp[r].add(b * QK).cast()));
            let dd: [__m256; R] = std::array::from_fn(|r| _mm256_mul_ps(d, _mm256_set1_ps(*dx[r].get_unchecked(b))));
            for k in 0..C {
                let q = _mm256_xor_si256(_mm256_loadu_si256(blk.add(8 + 32 * (c0 + k)).cast()), bias);
                let aw = _mm256_sign_epi8(q, q);
                for r in 0..R {
                    // |q| ≤ 128 and |x| ≤ 127: a pair's sum stays below i16's saturation
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[r], q)), ones);
                    let ddc = _mm256_permutevar_ps(dd[r], spread[k]);
                    acc[k][r] = _mm256_add_ps(acc[k][r], _mm256_mul_ps(ddc, _mm256_cvtepi32_ps(sums)));
                }
            }
        }
    }
    for k in 0..C {
        for r in 0..R {
            out[c0 + k][r] = hsum(&stored(acc[k][r]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::interleaved::interleave;
    use crate::kernels::test_rows::{check_interleaved_group, quantized_tile_inputs};
    use proptest::prelude::*;

    /// Every tile height the matmul uses on group `g` of `inter`, bitwise `qdot::dot_reference` on the file's rows.
    fn check<const R: usize>(ty: QType, file: &[u8], inter: &[u8], rb: usize, g: usize, xq: &QActs, r0: usize) {
        // SAFETY: `available()` was checked by the caller; the shapes are the contract's
        check_interleaved_group::<R>(ty, (file, inter, rb), g, xq, r0, |group, out| unsafe {
            tile(ty, group, xq, r0, out)
        });
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
            let (file, xq) = quantized_tile_inputs(ty, 8, blocks, seed, (wscale, xscale));
            let rb = ty.row_bytes(blocks * QK);
            let inter = interleave(ty, file.clone(), rb);
            check::<1>(ty, &file, &inter, rb, 0, &xq, r0);
            check::<2>(ty, &file, &inter, rb, 1, &xq, r0 + 1);
            check::<3>(ty, &file, &inter, rb, 0, &xq, 8);
            check::<4>(ty, &file, &inter, rb, 1, &xq, r0);
            // the last activation row: the sums' masked load ends at the last block's last row
            check::<1>(ty, &file, &inter, rb, 1, &xq, 10);
            check::<2>(ty, &file, &inter, rb, 0, &xq, 9);
        }
    }
}
