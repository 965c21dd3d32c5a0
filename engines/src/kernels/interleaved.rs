//! Quantized weights with four rows interleaved block by block, the layout the VNNI kernel (`qdot_x4_avx512`)
//! reads: one pass over the bytes walks four rows at once, front to back, and each block of the four rows is one
//! run of bytes — its scales side by side (one load, one conversion) and its weights in one 512-bit register.
//!
//! A group of four rows takes exactly the bytes its rows took in the file, so a matrix is interleaved group by
//! group in place; the last rows past a multiple of four stay as they were. Per block of a group (`g`: rows
//! `4g..4g + 4`):
//! - Q4_1, 80 bytes: `d₀ d₁ d₂ d₃` (f16), `m₀ m₁ m₂ m₃` (f16), then each row's 16 nibble bytes, row after row.
//! - Q8_0, 136 bytes: `d₀ d₁ d₂ d₃` (f16), then each row's 32 weights, row after row, each stored `q + 128` as an
//!   unsigned byte (`q ^ 0x80`), so the kernel multiplies unsigned weights by signed activations directly.

#[cfg(target_arch = "x86_64")]
use super::qdot::QActs;
use super::quant::{QType, QK};

/// Rows per interleaved group.
pub const ROWS: usize = 4;

/// Bytes one block of a group takes (the four rows' blocks together).
pub const fn group_block_bytes(ty: QType) -> usize {
    match ty {
        QType::Q4_1 => 4 * 20,
        QType::Q8_0 => 4 * 34,
        QType::F32 => 0,
    }
}

/// The bytes of one group's four rows (`4 x row_bytes`, as in the file) rewritten in place as the group's
/// interleaved blocks. `scratch` holds a copy of the rows while they are rewritten.
fn interleave_group(ty: QType, group: &mut [u8], scratch: &mut Vec<u8>) {
    let (rb, bb) = (group.len() / ROWS, ty.row_bytes(QK));
    scratch.clear();
    scratch.extend_from_slice(group);
    let block = |c: usize, b: usize| &scratch[c * rb + b * bb..c * rb + (b + 1) * bb];
    for (b, out) in group.chunks_exact_mut(ROWS * bb).enumerate() {
        match ty {
            QType::Q4_1 => {
                for c in 0..ROWS {
                    let src = block(c, b);
                    out[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                    out[8 + 2 * c..8 + 2 * c + 2].copy_from_slice(&src[2..4]);
                    out[16 + 16 * c..32 + 16 * c].copy_from_slice(&src[4..20]);
                }
            }
            QType::Q8_0 => {
                for c in 0..ROWS {
                    let src = block(c, b);
                    out[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                    for (o, &q) in out[8 + 32 * c..40 + 32 * c].iter_mut().zip(&src[2..34]) {
                        *o = q ^ 0x80;
                    }
                }
            }
            QType::F32 => unreachable!("F32 rows are not interleaved"),
        }
    }
}

/// Block `b` of row `c` of a group (`group`: its interleaved bytes) in the file's layout, into `out`.
fn block_of(ty: QType, group: &[u8], c: usize, b: usize, out: &mut [u8]) {
    let g = &group[b * group_block_bytes(ty)..(b + 1) * group_block_bytes(ty)];
    match ty {
        QType::Q4_1 => {
            out[0..2].copy_from_slice(&g[2 * c..2 * c + 2]);
            out[2..4].copy_from_slice(&g[8 + 2 * c..8 + 2 * c + 2]);
            out[4..20].copy_from_slice(&g[16 + 16 * c..32 + 16 * c]);
        }
        QType::Q8_0 => {
            out[0..2].copy_from_slice(&g[2 * c..2 * c + 2]);
            for (o, &q) in out[2..34].iter_mut().zip(&g[8 + 32 * c..40 + 32 * c]) {
                *o = q ^ 0x80;
            }
        }
        QType::F32 => unreachable!("F32 rows are not interleaved"),
    }
}

/// A matrix's rows (`row_bytes` each, as in the file) interleaved four by four; the rows past the last whole
/// group as they were.
pub fn interleave(ty: QType, mut rows: Vec<u8>, row_bytes: usize) -> Vec<u8> {
    let mut scratch = Vec::with_capacity(ROWS * row_bytes);
    for group in rows.chunks_exact_mut(ROWS * row_bytes) {
        interleave_group(ty, group, &mut scratch);
    }
    rows
}

/// Row `o` in the file's layout (`row_bytes` long) from the interleaved bytes.
pub fn row(ty: QType, interleaved: &[u8], row_bytes: usize, o: usize) -> Vec<u8> {
    if (o / ROWS + 1) * ROWS * row_bytes > interleaved.len() {
        // past the last whole group: as in the file
        return interleaved[o * row_bytes..(o + 1) * row_bytes].to_vec();
    }
    let bb = ty.row_bytes(QK);
    let group = &interleaved[o / ROWS * ROWS * row_bytes..(o / ROWS + 1) * ROWS * row_bytes];
    let mut out = vec![0u8; row_bytes];
    for (b, block) in out.chunks_exact_mut(bb).enumerate() {
        block_of(ty, group, o % ROWS, b, block);
    }
    out
}

/// Pointers to rows `r0..r0 + R` of `xq`'s quantized values, and their block scales (for the kernels).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn rows_of<const R: usize>(xq: &QActs, r0: usize) -> ([*const i8; R], [&[f32]; R]) {
    let blocks = xq.in_dim / QK;
    let xp = std::array::from_fn(|r| xq.q[(r0 + r) * xq.in_dim..].as_ptr());
    let dx = std::array::from_fn(|r| &xq.d[(r0 + r) * blocks..(r0 + r + 1) * blocks]);
    (xp, dx)
}

/// Bytes ahead of the block being read that are asked for: decode reads each weight once, in tasks of a few
/// kilobytes spread over the threads, too short a stream for the hardware prefetcher to get ahead of.
/// (Without it SmolLM2's decode ran ~16% slower on a 2-core AVX-512 VM, 2 to 16 KiB ahead within the noise of
/// each other; on the AVX2 kernel SmolLM2's 30 layers of matrices took 3.5-4.0 ms without against 2.7-3.8 with,
/// three alternations.)
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 8192;

/// Ask for the lines `AHEAD` bytes past the block at `blk` (`len` bytes): a later block of the group, or of the
/// groups after it (a prefetch of an address past the matrix is harmless and never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
pub(super) fn ahead(blk: *const u8, len: usize) {
    let at = blk.wrapping_add(AHEAD);
    // SAFETY: prefetching reads no memory the program can observe and does not fault
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        if len > 64 {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.wrapping_add(64).cast());
        }
        if len > 128 {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.wrapping_add(128).cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::random;
    use crate::kernels::QMatrix;

    #[test]
    fn every_row_comes_back_as_it_was() {
        for ty in [QType::Q4_1, QType::Q8_0] {
            let (out_dim, in_dim) = (11, 3 * QK);
            let file = QMatrix::quantize(ty, &random(out_dim * in_dim, 7), out_dim, in_dim).raw_bytes().to_vec();
            let rb = ty.row_bytes(in_dim);
            let inter = interleave(ty, file.clone(), rb);
            assert_eq!(inter.len(), file.len());
            assert_ne!(inter, file, "{ty:?}: the layout changed");
            for o in 0..out_dim {
                assert_eq!(row(ty, &inter, rb, o), &file[o * rb..(o + 1) * rb], "{ty:?} row {o}");
            }
        }
    }
}
