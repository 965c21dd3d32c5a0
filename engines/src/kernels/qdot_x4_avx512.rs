//! `qdot`'s integer block dots on AVX-512 VNNI for four weight rows interleaved (`interleaved`), bitwise the
//! same values as `qdot_avx512` and the portable kernel.
//!
//! One block of the four rows is one run of bytes: one load brings their four scales (and Q4_1's minimums),
//! one or two 512-bit loads their weights, so a block costs a handful of instructions for all four rows where
//! rows in the file's layout take a gather of two rows per register. Integer lanes are `qdot`'s: lane `l` of a
//! row's block is the exact sum over its bytes `4l..4l + 4`.
//! - Q4_1: the low nibbles of the four rows (one register, a row per 128-bit quarter) meet the activation block's
//!   first 16 bytes broadcast to every quarter, giving lanes 0..4 of each row; the high nibbles meet its last 16
//!   bytes, giving lanes 4..8.
//! - Q8_0: weights are stored `q + 128` (unsigned), so `vpdpbusd` gives `Σ (q + 128) x`; the activation block's
//!   own `Σ 128 x` per lane is subtracted — integer arithmetic, so the lane sums are exactly `Σ q x`.
//!
//! The float steps are `qdot`'s, lane for lane and in block order: `dd = dw · dx`, `acc += dd · sums` (a
//! multiply, then an add), `mins += mw · sx`; at the end each row's 8 lanes take `qdot::hsum`'s tree, `+ mins`.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::interleaved::{ahead, group_block_bytes, rows_of};
use super::qdot::{hsum, QActs, LANES};
use super::quant::{QType, QK};

/// `out[c][r]` = weight row `c` of one interleaved group (`group`: its bytes) against activation row `r0 + r` of
/// `xq`, for `R ≤ 8` activation rows.
///
/// # Safety
/// `qdot_avx512::available()`; `ty` is Q4_1 or Q8_0; rows `r0..r0 + R` exist in `xq`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
pub unsafe fn tile<const R: usize>(ty: QType, group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; R]; 4]) {
    const { assert!(R >= 1 && R <= 8, "one to eight activation rows") };
    let blocks = xq.in_dim / QK;
    assert!(r0 + R <= xq.rows, "activation rows");
    assert_eq!(group.len(), blocks * group_block_bytes(ty), "a group of four rows as long as the activations");
    // SAFETY: the caller's contract and the lengths asserted above
    unsafe {
        match ty {
            QType::Q4_1 => q4_1::<R>(group, xq, r0, out),
            QType::Q8_0 => q8_0::<R>(group, xq, r0, out),
            QType::F32 => unreachable!("F32 weights take the f32 kernel"),
        }
    }
}

/// A vector of 16 lanes, lane `j` taking element `at(j)`.
fn lanes(at: impl Fn(i32) -> i32) -> __m512i {
    let v: [i32; 16] = std::array::from_fn(|j| at(j as i32));
    // SAFETY: 16 i32s, unaligned load
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
unsafe fn q4_1<const R: usize>(group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; R]; 4]) {
    if R == 1 {
        let one: &mut [[f32; 1]; 4] = (out as &mut dyn std::any::Any).downcast_mut().expect("R is 1");
        // SAFETY: the caller's contract
        return unsafe { q4_1_one_row(group, xq, r0, one) };
    }
    let blocks = xq.in_dim / QK;
    let (xp, dx) = rows_of::<R>(xq, r0);
    let w = group.as_ptr();
    let low = _mm512_set1_epi8(0x0f);
    // `dw` lane 4c + l: row c's scale, for its lanes l; `mw · sx` lane 4i + c: row c's minimum, activation row i's sum
    let (spread_d, spread_m, spread_s) = (lanes(|j| j / 4), lanes(|j| 4 + j % 4), lanes(|j| j / 4));
    let mut acc_lo = [_mm512_setzero_ps(); R];
    let mut acc_hi = [_mm512_setzero_ps(); R];
    // mins[k] lane 4i + c: row c's minimums against activation row r0 + 4k + i
    let mut mins = [_mm512_setzero_ps(); 2];
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, `group_block_bytes` long; activation rows
        // of `blocks` blocks of 32; the sums `blocks x rows` (masked to rows that exist); unaligned loads
        unsafe {
            let blk = w.add(b * 80);
            ahead(blk, 80);
            let scales = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())));
            let dw = _mm512_permutexvar_ps(spread_d, scales);
            let mw = _mm512_permutexvar_ps(spread_m, scales);
            let q = _mm512_loadu_si512(blk.add(16).cast());
            let lo = _mm512_and_si512(q, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
            let sums = xq.s_by_block[b * xq.rows + r0..].as_ptr();
            for (k, m) in mins.iter_mut().enumerate().take(R.div_ceil(4)) {
                let have = (R - 4 * k).min(4);
                let sx = _mm_maskz_loadu_ps(((1u8 << have) - 1) & 0x0f, sums.add(4 * k));
                let sx = _mm512_permutexvar_ps(spread_s, _mm512_castps128_ps512(sx));
                *m = _mm512_add_ps(*m, _mm512_mul_ps(mw, sx));
            }
            for r in 0..R {
                let x = xp[r].add(b * QK);
                let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(x.cast()));
                let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(x.add(16).cast()));
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*dx[r].get_unchecked(b)));
                let slo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo);
                let shi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xhi);
                acc_lo[r] = _mm512_add_ps(acc_lo[r], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(slo)));
                acc_hi[r] = _mm512_add_ps(acc_hi[r], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(shi)));
            }
        }
    }
    let mut m = [[0.0f32; 16]; 2];
    for (k, v) in mins.iter().enumerate() {
        // SAFETY: 16 f32s; unaligned store
        unsafe { _mm512_storeu_ps(m[k].as_mut_ptr(), *v) };
    }
    for r in 0..R {
        let (mut lo, mut hi) = ([0.0f32; 16], [0.0f32; 16]);
        // SAFETY: 16 f32s each; unaligned stores
        unsafe {
            _mm512_storeu_ps(lo.as_mut_ptr(), acc_lo[r]);
            _mm512_storeu_ps(hi.as_mut_ptr(), acc_hi[r]);
        }
        for (c, o) in out.iter_mut().enumerate() {
            let row: [f32; LANES] = std::array::from_fn(|l| if l < 4 { lo[4 * c + l] } else { hi[4 * c + l - 4] });
            o[r] = hsum(&row) + m[r / 4][4 * (r % 4) + c];
        }
    }
}

/// `q4_1` for one activation row (decode), the same values with fewer vector instructions a block, on this
/// machine (Zen 4, whose 512-bit instructions take two passes of a 256-bit unit) the bound of a decode matvec whose
/// weights are in cache: the scales' products and the minimums' sums are taken on the 8 lanes of the block's
/// scales as they are loaded (`d0..d3 m0..m3`, one 256-bit register), so the minimums need no permute and the
/// scales' product `dw · dx` one permute (of the products) instead of a 512-bit multiply after it. Each lane still
/// takes `qdot`'s steps in block order: `dd = dw · dx`, `acc += dd · sums`, `mins += mw · sx`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
unsafe fn q4_1_one_row(group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; 1]; 4]) {
    let blocks = xq.in_dim / QK;
    let ([xp], [dx]) = rows_of::<1>(xq, r0);
    let w = group.as_ptr();
    let low = _mm512_set1_epi8(0x0f);
    let spread_d = lanes(|j| j / 4);
    let mut acc_lo = _mm512_setzero_ps();
    let mut acc_hi = _mm512_setzero_ps();
    // lanes 4..8: row c's minimums (lanes 0..4 take the scales' products, unused)
    let mut mins = _mm256_setzero_ps();
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, 80 bytes; the activation row's `blocks`
        // blocks of 32 and its scales and sums; unaligned loads
        unsafe {
            let blk = w.add(b * 80);
            ahead(blk, 80);
            let scales = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
            let dd = _mm512_permutexvar_ps(
                spread_d,
                _mm512_castps256_ps512(_mm256_mul_ps(scales, _mm256_set1_ps(*dx.get_unchecked(b)))),
            );
            let sx = _mm256_set1_ps(*xq.s_by_block.get_unchecked(b * xq.rows + r0));
            mins = _mm256_add_ps(mins, _mm256_mul_ps(scales, sx));
            let q = _mm512_loadu_si512(blk.add(16).cast());
            let lo = _mm512_and_si512(q, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
            let x = xp.add(b * QK);
            let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(x.cast()));
            let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(x.add(16).cast()));
            let slo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo);
            let shi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, xhi);
            acc_lo = _mm512_add_ps(acc_lo, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(slo)));
            acc_hi = _mm512_add_ps(acc_hi, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(shi)));
        }
    }
    // `hsum` of each row's 8 lanes (lo's lanes 4c..4c + 4, then hi's), in its tree, on the registers: the pairs
    // `l + (l + 4)`, then `(0 + 1) + (2 + 3)` of each quarter; then `+ mins`
    let pairs = _mm512_add_ps(acc_lo, acc_hi);
    let halves = _mm512_add_ps(pairs, _mm512_permute_ps::<0b10_11_00_01>(pairs));
    let sums = _mm512_add_ps(halves, _mm512_permute_ps::<0b01_00_11_10>(halves));
    let firsts = _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        sums,
    ));
    let rows = _mm_add_ps(firsts, _mm256_extractf128_ps::<1>(mins));
    // SAFETY: `out` is four f32s in a row ([[f32; 1]; 4]); unaligned store
    unsafe { _mm_storeu_ps(out.as_mut_ptr().cast(), rows) };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
unsafe fn q8_0<const R: usize>(group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; R]; 4]) {
    if R == 1 {
        let one: &mut [[f32; 1]; 4] = (out as &mut dyn std::any::Any).downcast_mut().expect("R is 1");
        // SAFETY: the caller's contract
        return unsafe { q8_0_one_row(group, xq, r0, one) };
    }
    let blocks = xq.in_dim / QK;
    let (xp, dx) = rows_of::<R>(xq, r0);
    let w = group.as_ptr();
    let bias = _mm512_set1_epi8(-128);
    // lanes 0..8 take row 2p's scale, lanes 8..16 row 2p + 1's
    let (spread_01, spread_23) = (lanes(|j| j / 8), lanes(|j| 2 + j / 8));
    let mut acc_01 = [_mm512_setzero_ps(); R];
    let mut acc_23 = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, `group_block_bytes` long; activation rows
        // of `blocks` blocks of 32; unaligned loads
        unsafe {
            let blk = w.add(b * 136);
            ahead(blk, 136);
            let scales = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(blk.cast())));
            let (d01, d23) = (_mm512_permutexvar_ps(spread_01, scales), _mm512_permutexvar_ps(spread_23, scales));
            let w01 = _mm512_loadu_si512(blk.add(8).cast());
            let w23 = _mm512_loadu_si512(blk.add(72).cast());
            for r in 0..R {
                let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(xp[r].add(b * QK).cast()));
                // Σ 128 x per lane, which the biased weights add
                let extra = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x);
                let s01 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, x), extra);
                let s23 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, x), extra);
                let dxr = _mm512_set1_ps(*dx[r].get_unchecked(b));
                acc_01[r] = _mm512_add_ps(acc_01[r], _mm512_mul_ps(_mm512_mul_ps(d01, dxr), _mm512_cvtepi32_ps(s01)));
                acc_23[r] = _mm512_add_ps(acc_23[r], _mm512_mul_ps(_mm512_mul_ps(d23, dxr), _mm512_cvtepi32_ps(s23)));
            }
        }
    }
    for r in 0..R {
        let (mut a, mut c) = ([0.0f32; 16], [0.0f32; 16]);
        // SAFETY: 16 f32s each; unaligned stores
        unsafe {
            _mm512_storeu_ps(a.as_mut_ptr(), acc_01[r]);
            _mm512_storeu_ps(c.as_mut_ptr(), acc_23[r]);
        }
        for (p, lanes16) in [a, c].iter().enumerate() {
            let (first, second) = lanes16.split_at(LANES);
            out[2 * p][r] = hsum(first.try_into().expect("8 lanes"));
            out[2 * p + 1][r] = hsum(second.try_into().expect("8 lanes"));
        }
    }
}

/// `q8_0` for one activation row (decode): the scales' products `dw · dx` are taken on the four scales as loaded
/// and then spread (one 128-bit multiply where the general tile takes two 512-bit ones), the same value in each lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")]
unsafe fn q8_0_one_row(group: &[u8], xq: &QActs, r0: usize, out: &mut [[f32; 1]; 4]) {
    let blocks = xq.in_dim / QK;
    let ([xp], [dx]) = rows_of::<1>(xq, r0);
    let w = group.as_ptr();
    let bias = _mm512_set1_epi8(-128);
    let (spread_01, spread_23) = (lanes(|j| j / 8), lanes(|j| 2 + j / 8));
    let mut acc_01 = _mm512_setzero_ps();
    let mut acc_23 = _mm512_setzero_ps();
    for b in 0..blocks {
        // SAFETY (every load below): block `b < blocks` of the group, 136 bytes; the activation row's `blocks`
        // blocks of 32 and its scales; unaligned loads
        unsafe {
            let blk = w.add(b * 136);
            ahead(blk, 136);
            let dd = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64(blk.cast())), _mm_set1_ps(*dx.get_unchecked(b)));
            let dd = _mm512_castps128_ps512(dd);
            let (d01, d23) = (_mm512_permutexvar_ps(spread_01, dd), _mm512_permutexvar_ps(spread_23, dd));
            let w01 = _mm512_loadu_si512(blk.add(8).cast());
            let w23 = _mm512_loadu_si512(blk.add(72).cast());
            let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(xp.add(b * QK).cast()));
            // Σ 128 x per lane, which the biased weights add
            let extra = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x);
            let s01 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, x), extra);
            let s23 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, x), extra);
            acc_01 = _mm512_add_ps(acc_01, _mm512_mul_ps(d01, _mm512_cvtepi32_ps(s01)));
            acc_23 = _mm512_add_ps(acc_23, _mm512_mul_ps(d23, _mm512_cvtepi32_ps(s23)));
        }
    }
    // `hsum` of each row's 8 lanes in its tree, on the registers: the pairs `l + (l + 4)` (128-bit quarters
    // swapped), then `(0 + 1) + (2 + 3)`; rows 0 and 1 end in lanes 0 and 8 of the first register, 2 and 3 of the
    // second
    let tree = |acc: __m512| {
        let pairs = _mm512_add_ps(acc, _mm512_shuffle_f32x4::<0b10_11_00_01>(acc, acc));
        let halves = _mm512_add_ps(pairs, _mm512_permute_ps::<0b10_11_00_01>(pairs));
        _mm512_add_ps(halves, _mm512_permute_ps::<0b01_00_11_10>(halves))
    };
    let rows = _mm512_permutex2var_ps(
        tree(acc_01),
        _mm512_setr_epi32(0, 8, 16, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        tree(acc_23),
    );
    // SAFETY: `out` is four f32s in a row ([[f32; 1]; 4]); unaligned store
    unsafe { _mm_storeu_ps(out.as_mut_ptr().cast(), _mm512_castps512_ps128(rows)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::interleaved::interleave;
    use crate::kernels::qdot_avx512::available;
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
            check::<8>(ty, &file, &inter, rb, 0, &xq, r0);
            check::<4>(ty, &file, &inter, rb, 1, &xq, r0 + 1);
            check::<1>(ty, &file, &inter, rb, 1, &xq, 10);
            check::<5>(ty, &file, &inter, rb, 0, &xq, r0);
        }
    }
}
