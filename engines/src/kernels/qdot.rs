//! Integer block dot products against Q4_1 and Q8_0 weights, as llama.cpp computes them on the CPU: each
//! activation row is quantized once per matmul to 8-bit blocks of 32 (scale `d = max|x| / 127`, `q = round(x / d)`,
//! and for Q4_1 the block sum `s = d · Σq`, llama.cpp's Q8_1), then every weight block meets it in integers.
//!
//! The order of every operation is fixed by the two rows alone:
//! - per block, 8 integer lane sums, lane `l` over weights `4l..4l + 4` (exact: at most 4 · 127 · 127);
//! - per lane, `acc[l] += (dw · dx) · lane_sum` (a separate multiply and add, never fused);
//! - for Q4_1, the minimum's share `mins += mw · sx` per block, in block order;
//! - at the end `dot`'s fixed horizontal sum of the 8 lanes, then `+ mins`.
//!
//! So `y[r, o]` is the same bits alone, in any batch, in decode and on any path that computes it (the kernels
//! below only share a weight block's decoding between several activation rows).

use rayon::prelude::*;

use super::quant::{f16_to_f32, QType, QK};

/// Integer lanes per block (each sums 4 products).
pub(super) const LANES: usize = 8;

/// Activation rows quantized to 8-bit blocks: `q` (`rows x in_dim`), and per block its scale `d` and `s = d · Σq`.
#[derive(Debug, Clone, Default)]
pub struct QActs {
    pub(super) rows: usize,
    pub(super) in_dim: usize,
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    /// `s` block-major (`blocks x rows`): a tile's rows' sums of one block in one load (`qdot_avx512`).
    pub(super) s_by_block: Vec<f32>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct QRow<'a> {
    q: &'a [i8],
    d: &'a [f32],
    s: &'a [f32],
}

impl QActs {
    /// `x` (`rows x in_dim`, `in_dim` a multiple of 32) quantized row by row, block by block.
    pub fn quantize(x: &[f32], rows: usize, in_dim: usize) -> Self {
        assert_eq!(x.len(), rows * in_dim, "QActs: x is not rows x in");
        assert!(in_dim.is_multiple_of(QK), "QActs: rows of {in_dim} are not whole blocks");
        let blocks = x.len() / QK;
        let mut a = QActs {
            rows,
            in_dim,
            q: vec![0; x.len()],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            s_by_block: vec![0.0; blocks],
        };
        // every block alone, so a prefill's rows split across threads (the blocks' values do not depend on it)
        const BLOCKS_PER_TASK: usize = 256;
        let (n, b) = (BLOCKS_PER_TASK * QK, BLOCKS_PER_TASK);
        if blocks > BLOCKS_PER_TASK {
            let (xs, qs) = (x.par_chunks(n), a.q.par_chunks_mut(n));
            xs.zip(qs)
                .zip(a.d.par_chunks_mut(b))
                .zip(a.s.par_chunks_mut(b))
                .for_each(|(((x, q), d), s)| quantize_blocks(x, q, d, s));
        } else {
            let (xs, qs) = (x.chunks(n), a.q.chunks_mut(n));
            xs.zip(qs)
                .zip(a.d.chunks_mut(b))
                .zip(a.s.chunks_mut(b))
                .for_each(|(((x, q), d), s)| quantize_blocks(x, q, d, s));
        }
        let per_row = in_dim / QK;
        for (i, &s) in a.s.iter().enumerate() {
            a.s_by_block[(i % per_row) * rows + i / per_row] = s;
        }
        a
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> QRow<'_> {
        let nb = self.in_dim / QK;
        QRow {
            q: &self.q[r * self.in_dim..(r + 1) * self.in_dim],
            d: &self.d[r * nb..(r + 1) * nb],
            s: &self.s[r * nb..(r + 1) * nb],
        }
    }
}

/// Consecutive blocks of `x` into `q`, their scales `d` and sums `s`: on AVX-512 a block's values at once (the same
/// bits), else one at a time.
fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::quantize_avx512::available() {
        // SAFETY: the CPU has AVX-512F (checked just above)
        #[allow(unsafe_code)]
        return unsafe { super::quantize_avx512::quantize_blocks(x, q, d, s) };
    }
    quantize_blocks_portable(x, q, d, s)
}

/// `quantize_blocks` one value at a time (any CPU; the AVX-512 steps are tested against it bitwise).
pub(super) fn quantize_blocks_portable(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let (xc, _) = x.as_chunks::<QK>();
    let (qc, _) = q.as_chunks_mut::<QK>();
    for (((xb, qb), d), s) in xc.iter().zip(qc).zip(d).zip(s) {
        (*d, *s) = quantize_block(xb, qb);
    }
}

/// One block of 32 activations to 8 bits: `(d, d · Σq)`. Rounds to nearest, ties to even.
#[inline]
fn quantize_block(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (o, v) in q.iter_mut().zip(x) {
        // |v · id| is at most 127 up to rounding; `as` saturates
        *o = (v * id).round_ties_even() as i8;
        sum += i32::from(*o);
    }
    (d, d * sum as f32)
}

/// The 8 lane sums of one block: lane `l` is `Σ_{k<4} w[4l + k] · x[4l + k]`, exactly.
#[inline(always)]
fn lane_sums(w: &[i8; QK], x: &[i8]) -> [i32; LANES] {
    let x: &[i8; QK] = x.try_into().expect("a block");
    let mut s = [0i32; LANES];
    for l in 0..LANES {
        for k in 0..4 {
            s[l] += i32::from(i16::from(w[4 * l + k]) * i16::from(x[4 * l + k]));
        }
    }
    s
}

/// `dot`'s fixed horizontal sum of the lanes.
#[inline(always)]
pub(super) fn hsum(acc: &[f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// One weight block decoded: its 32 quantized values as `i8` (Q4_1's 0..=15, Q8_0's as stored), the scale and
/// (Q4_1) the minimum.
#[inline(always)]
fn decode_block(ty: QType, b: &[u8], w: &mut [i8; QK]) -> (f32, f32) {
    match ty {
        QType::Q4_1 => {
            let qs = &b[4..20];
            for j in 0..16 {
                w[j] = (qs[j] & 0x0f) as i8;
                w[j + 16] = (qs[j] >> 4) as i8;
            }
            (half(b, 0), half(b, 2))
        }
        QType::Q8_0 => {
            for (o, &q) in w.iter_mut().zip(&b[2..34]) {
                *o = q as i8;
            }
            (half(b, 0), 0.0)
        }
        QType::F32 => unreachable!("F32 weights take the f32 kernel"),
    }
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The dots of `C` weight rows (`ty`'s bytes, Q4_1 or Q8_0) with each of `R` activation rows, `out[c][r]`, every
/// one in the fixed order above: the AVX2 kernel where the CPU has it, else the portable one (the same bits).
/// The tile only shares loads: a weight block's decoding between activation rows, an activation block between
/// weight rows.
pub fn dot_tile<const C: usize, const R: usize>(ty: QType, ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        check_lengths(ty, &ws, &xs);
        // SAFETY: the CPU has AVX2 and F16C (checked just above), and the row lengths `avx2` reads within are
        // checked.
        #[allow(unsafe_code)]
        return unsafe {
            match ty {
                QType::Q4_1 if R == 4 => {
                    let t = avx2::tile_q4_1_x4(ws, std::array::from_fn(|r| xs[r]));
                    std::array::from_fn(|c| std::array::from_fn(|r| t[c][r]))
                }
                // decode: four weight rows against one activation row, their scales converted together
                QType::Q4_1 if C == 4 && R == 1 => {
                    let t = avx2::rows4_q4_1(std::array::from_fn(|c| ws[c]), xs[0]);
                    std::array::from_fn(|c| [t[c]; R])
                }
                QType::Q8_0 if C == 4 && R == 1 => {
                    let t = avx2::rows4_q8_0(std::array::from_fn(|c| ws[c]), xs[0]);
                    std::array::from_fn(|c| [t[c]; R])
                }
                QType::Q4_1 => avx2::tile_q4_1(ws, xs),
                _ => avx2::tile_q8_0(ws, xs),
            }
        };
    }
    dot_tile_portable(ty, ws, xs)
}

/// The lengths the AVX2 kernels rely on: Q4_1 or Q8_0, rows of whole blocks, all of one length.
#[inline(always)]
fn check_lengths<const C: usize, const R: usize>(ty: QType, ws: &[&[u8]; C], xs: &[QRow; R]) {
    assert!(ty == QType::Q4_1 || ty == QType::Q8_0, "{ty:?} weights take the f32 kernel");
    let Some(blocks) = xs.first().map(|x| x.d.len()) else { return };
    for w in ws {
        assert_eq!(w.len(), blocks * ty.row_bytes(QK), "weight and activation rows of equal length");
    }
    for x in xs {
        assert!(x.q.len() == blocks * QK && x.d.len() == blocks && x.s.len() == blocks, "rows of equal length");
    }
}

/// The portable kernel (any CPU; the AVX2 one is tested against it bitwise).
pub fn dot_tile_portable<const C: usize, const R: usize>(ty: QType, ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
    match ty {
        QType::Q4_1 => tile_q4_1(ws, xs),
        QType::Q8_0 => tile_q8_0(ws, xs),
        QType::F32 => unreachable!("F32 weights take the f32 kernel"),
    }
}

// One copy per weight type, so the type's branches fold away inside the block loop.
#[inline(never)]
fn tile_q4_1<const C: usize, const R: usize>(ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
    tile_of(QType::Q4_1, ws, xs)
}

#[inline(never)]
fn tile_q8_0<const C: usize, const R: usize>(ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
    tile_of(QType::Q8_0, ws, xs)
}

#[inline(always)]
fn tile_of<const C: usize, const R: usize>(ty: QType, ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
    let bytes = ty.row_bytes(QK);
    let blocks = xs.first().map_or(0, |x| x.d.len());
    let mut acc = [[[0.0f32; LANES]; R]; C];
    let mut mins = [[0.0f32; R]; C];
    let mut wq = [0i8; QK];
    for b in 0..blocks {
        for c in 0..C {
            let (dw, mw) = decode_block(ty, &ws[c][b * bytes..(b + 1) * bytes], &mut wq);
            for r in 0..R {
                let x = &xs[r];
                let s = lane_sums(&wq, &x.q[b * QK..(b + 1) * QK]);
                let dd = dw * x.d[b];
                for l in 0..LANES {
                    acc[c][r][l] += dd * s[l] as f32;
                }
                if ty == QType::Q4_1 {
                    mins[c][r] += mw * x.s[b];
                }
            }
        }
    }
    std::array::from_fn(|c| std::array::from_fn(|r| hsum(&acc[c][r]) + mins[c][r]))
}

/// The same kernels in AVX2, as llama.cpp's `ggml_vec_dot_q4_1_q8_1` / `_q8_0_q8_0`: a block's 32 byte products
/// summed in adjacent pairs (`maddubs`) and pairs of pairs (`madd`) give exactly the 8 integer lane sums, lane
/// `l` over bytes `4l..4l + 4`; the float steps are the portable kernel's, lane for lane, in the same order.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{hsum, QRow, LANES, QK};

    /// The two halves at the start of `b` (a block's scale and, for Q4_1, minimum), exactly as `f16_to_f32`.
    #[inline(always)]
    unsafe fn halves(b: &[u8]) -> (f32, f32) {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// Block `b`'s 32 activations of `x`.
    #[inline(always)]
    unsafe fn load_x(x: &QRow, b: usize) -> __m256i {
        // SAFETY: `x.q` holds `blocks * 32` values and `b < blocks` (checked by `dot_tile`); unaligned load
        unsafe { _mm256_loadu_si256(x.q.as_ptr().add(b * QK).cast()) }
    }

    /// `acc + (dw · dx) · lane_sums` for 8 lanes, multiply then add.
    #[inline(always)]
    unsafe fn accumulate(acc: __m256, dd: f32, sums: __m256i) -> __m256 {
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sums)))
    }

    #[inline(always)]
    unsafe fn lanes(acc: __m256) -> [f32; LANES] {
        let mut out = [0.0f32; LANES];
        // SAFETY: `out` is 8 f32s; unaligned store
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// Q4_1 weights (unsigned 0..=15) against signed activations.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn tile_q4_1<const C: usize, const R: usize>(ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
        let ones = _mm256_set1_epi16(1);
        let low = _mm256_set1_epi8(0x0f);
        let blocks = xs.first().map_or(0, |x| x.d.len());
        // slices of exactly `blocks` (checked by `dot_tile`), so the loop indexes them without bounds checks
        let (d, s) = (xs.map(|x| &x.d[..blocks]), xs.map(|x| &x.s[..blocks]));
        let ws = ws.map(|w| &w[..blocks * 20]);
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        let mut mins = [[0.0f32; R]; C];
        for b in 0..blocks {
            let xq: [__m256i; R] = std::array::from_fn(|r| {
                // SAFETY: in bounds (see `load_x`)
                unsafe { load_x(&xs[r], b) }
            });
            for c in 0..C {
                // SAFETY: AVX2 and F16C are enabled here
                let (dw, mw, wq) = unsafe { q4_1_block(&ws[c][b * 20..(b + 1) * 20], low) };
                for r in 0..R {
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq[r]), ones);
                    // SAFETY: AVX2 and F16C are enabled here
                    acc[c][r] = unsafe { accumulate(acc[c][r], dw * d[r][b], sums) };
                    mins[c][r] += mw * s[r][b];
                }
            }
        }
        // SAFETY: AVX2 and F16C are enabled here
        std::array::from_fn(|c| std::array::from_fn(|r| hsum(&unsafe { lanes(acc[c][r]) }) + mins[c][r]))
    }

    /// One Q4_1 weight block (20 bytes): its scale, its min, and its 32 nibbles as bytes — the low nibbles are
    /// weights 0..16 (the low 128 bits), the high nibbles weights 16..32.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q4_1_block(wb: &[u8], low: __m256i) -> (f32, f32, __m256i) {
        // SAFETY: F16C is enabled here
        let (dw, mw) = unsafe { halves(wb) };
        // SAFETY: `wb` is 20 bytes (the callers slice it so); its last 16 are read
        let qs = unsafe { _mm_loadu_si128(wb.as_ptr().add(4).cast()) };
        let wq =
            _mm256_and_si256(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(qs), _mm_srli_epi16::<4>(qs)), low);
        (dw, mw, wq)
    }

    /// `tile_q4_1` for four activation rows: their block scales and sums side by side in one register, so each
    /// weight block's `dw · dx` and `mins += mw · sx` are one multiply (and add) for the four rows — the same
    /// operations on each row's values as `tile_q4_1`, lane by lane.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn tile_q4_1_x4<const C: usize>(ws: [&[u8]; C], xs: [QRow; 4]) -> [[f32; 4]; C] {
        let ones = _mm256_set1_epi16(1);
        let low = _mm256_set1_epi8(0x0f);
        let blocks = xs[0].d.len();
        // slices of exactly `blocks` (checked by `dot_tile`), so the loop indexes them without bounds checks
        let (d, s) = (xs.map(|x| &x.d[..blocks]), xs.map(|x| &x.s[..blocks]));
        let ws = ws.map(|w| &w[..blocks * 20]);
        let mut acc = [[_mm256_setzero_ps(); 4]; C];
        let mut mins = [_mm_setzero_ps(); C];
        for b in 0..blocks {
            let xq: [__m256i; 4] = std::array::from_fn(|r| {
                // SAFETY: in bounds (see `load_x`)
                unsafe { load_x(&xs[r], b) }
            });
            let dx = _mm_setr_ps(d[0][b], d[1][b], d[2][b], d[3][b]);
            let sx = _mm_setr_ps(s[0][b], s[1][b], s[2][b], s[3][b]);
            for c in 0..C {
                // SAFETY: AVX2 and F16C are enabled here
                let (dw, mw, wq) = unsafe { q4_1_block(&ws[c][b * 20..(b + 1) * 20], low) };
                let dd = _mm_mul_ps(_mm_set1_ps(dw), dx);
                mins[c] = _mm_add_ps(mins[c], _mm_mul_ps(_mm_set1_ps(mw), sx));
                let dds = [
                    _mm256_broadcastss_ps(dd),
                    _mm256_broadcastss_ps(_mm_permute_ps::<0b01>(dd)),
                    _mm256_broadcastss_ps(_mm_permute_ps::<0b10>(dd)),
                    _mm256_broadcastss_ps(_mm_permute_ps::<0b11>(dd)),
                ];
                for r in 0..4 {
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq[r]), ones);
                    acc[c][r] = _mm256_add_ps(acc[c][r], _mm256_mul_ps(dds[r], _mm256_cvtepi32_ps(sums)));
                }
            }
        }
        std::array::from_fn(|c| {
            let mut m = [0.0f32; 4];
            // SAFETY: `m` is 4 f32s; unaligned store
            unsafe { _mm_storeu_ps(m.as_mut_ptr(), mins[c]) };
            // SAFETY: AVX2 and F16C are enabled here
            std::array::from_fn(|r| hsum(&unsafe { lanes(acc[c][r]) }) + m[r])
        })
    }

    /// The first four bytes of each of the four rows' block at `at` (a block's two halves), as one vector.
    #[inline(always)]
    unsafe fn heads(ws: &[&[u8]; 4], at: usize) -> __m128i {
        // SAFETY: the callers pass `at` with four bytes after it in every row; unaligned reads
        let word = |c: usize| unsafe { ws[c].as_ptr().add(at).cast::<i32>().read_unaligned() };
        _mm_setr_epi32(word(0), word(1), word(2), word(3))
    }

    /// Asks for the bytes at `at` of the four rows after `ws` (the next tile of a decode group: the matrix's rows
    /// are consecutive, so those are `4 x row length` further on). A decode step's matrices are small and cold:
    /// without it each tile waits on memory the hardware prefetcher had no run of addresses to predict (60 layers
    /// of SmolLM2's FFN matrices were read at 9-13 GB/s on two cores, with it at 13.5-17). Past the matrix's last
    /// row the address is only hinted at, never read.
    #[inline(always)]
    unsafe fn prefetch_next_tile(ws: &[&[u8]; 4], at: usize) {
        let next = 4 * ws[0].len();
        for w in ws {
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(at + next).cast());
        }
    }

    /// `tile_q4_1` for four weight rows and one activation row (a decode step): the four blocks' scales and
    /// minimums are converted in one instruction, `dw · dx` for the four rows is one multiply and
    /// `mins += mw · sx` one multiply and one add — each row's values the same operations as in `tile_q4_1`.
    /// The nibbles of a block are loaded once into both halves of a register and the high half shifted.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn rows4_q4_1(ws: [&[u8]; 4], x: QRow) -> [f32; 4] {
        let ones = _mm256_set1_epi16(1);
        let low = _mm256_set1_epi8(0x0f);
        let high_half = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let blocks = x.d.len();
        // slices of exactly `blocks` (checked by `dot_tile`), so the loop indexes them without bounds checks
        let (d, s) = (&x.d[..blocks], &x.s[..blocks]);
        let ws = ws.map(|w| &w[..blocks * 20]);
        // lane 2c of `dm` is row c's scale, lane 2c + 1 its minimum
        let scale_of: [__m256i; 4] = std::array::from_fn(|c| _mm256_set1_epi32(2 * c as i32));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut mins = _mm256_setzero_ps();
        for b in 0..blocks {
            // SAFETY: SSE is part of AVX2
            unsafe { prefetch_next_tile(&ws, b * 20) };
            // SAFETY: in bounds (see `load_x`)
            let xq = unsafe { load_x(&x, b) };
            // SAFETY: each row holds `blocks * 20` bytes and `b < blocks`
            let dm = _mm256_cvtph_ps(unsafe { heads(&ws, b * 20) });
            let dd = _mm256_mul_ps(dm, _mm256_set1_ps(d[b]));
            mins = _mm256_add_ps(mins, _mm256_mul_ps(dm, _mm256_set1_ps(s[b])));
            for c in 0..4 {
                // SAFETY: the block's 16 nibble bytes start 4 bytes into it
                let qs = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(ws[c].as_ptr().add(b * 20 + 4).cast()) });
                let wq = _mm256_and_si256(_mm256_srlv_epi32(qs, high_half), low);
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), ones);
                let ddc = _mm256_permutevar8x32_ps(dd, scale_of[c]);
                acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(ddc, _mm256_cvtepi32_ps(sums)));
            }
        }
        // SAFETY: AVX2 and F16C are enabled here
        let m = unsafe { lanes(mins) };
        // SAFETY: AVX2 and F16C are enabled here
        std::array::from_fn(|c| hsum(&unsafe { lanes(acc[c]) }) + m[2 * c + 1])
    }

    /// `tile_q8_0` for four weight rows and one activation row: the four blocks' scales converted in one
    /// instruction and `dw · dx` for the four rows one multiply — each row's values as in `tile_q8_0`.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn rows4_q8_0(ws: [&[u8]; 4], x: QRow) -> [f32; 4] {
        let ones = _mm256_set1_epi16(1);
        let blocks = x.d.len();
        // slices of exactly `blocks` (checked by `dot_tile`), so the loop indexes them without bounds checks
        let d = &x.d[..blocks];
        let ws = ws.map(|w| &w[..blocks * 34]);
        // lane 2c of the converted heads is row c's scale (lane 2c + 1 is its first two weights read as a half:
        // unused, and finite or not it never meets a used lane)
        let scale_of: [__m256i; 4] = std::array::from_fn(|c| _mm256_set1_epi32(2 * c as i32));
        let mut acc = [_mm256_setzero_ps(); 4];
        for (b, &dx) in d.iter().enumerate() {
            // SAFETY: SSE is part of AVX2
            unsafe { prefetch_next_tile(&ws, b * 34) };
            // SAFETY: in bounds (see `load_x`)
            let xq = unsafe { load_x(&x, b) };
            // SAFETY: each row holds `blocks * 34` bytes and `b < blocks`
            let dd = _mm256_mul_ps(_mm256_cvtph_ps(unsafe { heads(&ws, b * 34) }), _mm256_set1_ps(dx));
            for c in 0..4 {
                // SAFETY: the block's 32 weights start 2 bytes into it
                let wq = unsafe { _mm256_loadu_si256(ws[c].as_ptr().add(b * 34 + 2).cast()) };
                let aw = _mm256_sign_epi8(wq, wq);
                // |w| ≤ 128 and |x| ≤ 127: a pair's sum stays below i16's saturation
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq)), ones);
                let ddc = _mm256_permutevar8x32_ps(dd, scale_of[c]);
                acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(ddc, _mm256_cvtepi32_ps(sums)));
            }
        }
        // SAFETY: AVX2 and F16C are enabled here
        std::array::from_fn(|c| hsum(&unsafe { lanes(acc[c]) }))
    }

    /// Q8_0 weights (signed) against signed activations: `|w| · (x with w's sign)`, as llama.cpp does.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn tile_q8_0<const C: usize, const R: usize>(ws: [&[u8]; C], xs: [QRow; R]) -> [[f32; R]; C] {
        let ones = _mm256_set1_epi16(1);
        let blocks = xs.first().map_or(0, |x| x.d.len());
        // slices of exactly `blocks` (checked by `dot_tile`), so the loop indexes them without bounds checks
        let d = xs.map(|x| &x.d[..blocks]);
        let ws = ws.map(|w| &w[..blocks * 34]);
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        for b in 0..blocks {
            let xq: [__m256i; R] = std::array::from_fn(|r| {
                // SAFETY: in bounds (see `load_x`)
                unsafe { load_x(&xs[r], b) }
            });
            for c in 0..C {
                let wb = &ws[c][b * 34..(b + 1) * 34];
                // SAFETY: F16C is enabled here
                let dw = unsafe { halves(wb) }.0;
                // SAFETY: `wb` is 34 bytes; its last 32 are read
                let wq = unsafe { _mm256_loadu_si256(wb.as_ptr().add(2).cast()) };
                let aw = _mm256_sign_epi8(wq, wq);
                for r in 0..R {
                    // |w| ≤ 128 and |x| ≤ 127: a pair's sum stays below i16's saturation
                    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq[r], wq)), ones);
                    // SAFETY: AVX2 and F16C are enabled here
                    acc[c][r] = unsafe { accumulate(acc[c][r], dw * d[r][b], sums) };
                }
            }
        }
        // SAFETY: AVX2 and F16C are enabled here
        std::array::from_fn(|c| std::array::from_fn(|r| hsum(&unsafe { lanes(acc[c][r]) })))
    }
}

/// One element of `dot_tile` spelled out one scalar at a time (the reference the tests hold the kernels to).
#[cfg(test)]
pub fn dot_reference(ty: QType, w: &[u8], x: QRow) -> f32 {
    let bytes = ty.row_bytes(QK);
    let mut acc = [0.0f32; LANES];
    let mut mins = 0.0f32;
    for (b, wb) in w.chunks_exact(bytes).enumerate() {
        let (dw, mw) = match ty {
            QType::Q4_1 => (half(wb, 0), half(wb, 2)),
            _ => (half(wb, 0), 0.0),
        };
        let weight = |j: usize| -> i32 {
            match ty {
                QType::Q4_1 if j < 16 => i32::from(wb[4 + j] & 0x0f),
                QType::Q4_1 => i32::from(wb[4 + j - 16] >> 4),
                _ => i32::from(wb[2 + j] as i8),
            }
        };
        for (l, a) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4).map(|j| weight(j) * i32::from(x.q[b * QK + j])).sum();
            *a += (dw * x.d[b]) * s as f32;
        }
        if ty == QType::Q4_1 {
            mins += mw * x.s[b];
        }
    }
    hsum(&acc) + mins
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::QMatrix;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.uniform(scale)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every kernel — AVX2 where the CPU has it, portable, one activation row or four — gives each element
        /// bitwise the scalar reference's value, for both weight types and any scale of weights and activations
        /// (zero blocks included).
        #[test]
        fn kernels_match_the_reference(
            q4 in any::<bool>(), blocks in 1usize..40, seed in any::<u64>(), wscale in 0u32..4, xscale in 0u32..4
        ) {
            let ty = if q4 { QType::Q4_1 } else { QType::Q8_0 };
            let in_dim = blocks * QK;
            let scale = |s: u32| [0.0, 1e-3, 1.0, 300.0][s as usize];
            let w = QMatrix::quantize(ty, &random(4 * in_dim, seed, scale(wscale)), 4, in_dim);
            let mut bytes = w.raw_bytes().to_vec();
            if ty == QType::Q8_0 {
                // -128, which llama.cpp never writes but a file may hold: |w| = 128 still fits the kernel
                bytes[2 + (seed % 32) as usize] = 0x80;
            }
            let ws: [&[u8]; 4] = std::array::from_fn(|c| &bytes[c * w.row_bytes()..(c + 1) * w.row_bytes()]);
            let x = random(4 * in_dim, seed ^ 5, scale(xscale));
            let xq = QActs::quantize(&x, 4, in_dim);
            let xs: [QRow; 4] = std::array::from_fn(|i| xq.row(i));
            let want: [[u32; 4]; 4] =
                std::array::from_fn(|c| std::array::from_fn(|r| dot_reference(ty, ws[c], xs[r]).to_bits()));
            let bits = |t: &[[f32; 4]]| t.iter().map(|c| c.map(f32::to_bits)).collect::<Vec<_>>();
            // 2 weight rows x 4 activation rows, 4 x 1 and 1 x 1: every kernel shape the matmul uses
            prop_assert_eq!(bits(&dot_tile(ty, [ws[0], ws[1]], xs)), want[..2].to_vec());
            prop_assert_eq!(bits(&dot_tile_portable(ty, [ws[2], ws[3]], xs)), want[2..].to_vec());
            for (r, &x) in xs.iter().enumerate() {
                let column: [u32; 4] = std::array::from_fn(|c| want[c][r]);
                prop_assert_eq!(dot_tile(ty, ws, [x]).map(|c| c[0].to_bits()), column);
                prop_assert_eq!(dot_tile_portable(ty, ws, [x]).map(|c| c[0].to_bits()), column);
                prop_assert_eq!(dot_tile(ty, [ws[r]], [x])[0][0].to_bits(), want[r][r]);
            }
        }
    }

    #[test]
    fn activations_quantize_as_llama_cpp_does() {
        // d = max|x| / 127, q = round(x / d) with ties to even, s = d · Σq
        let mut x = [0.0f32; QK];
        x[..5].copy_from_slice(&[-127.0, 63.5, 62.5, 1.25, -0.5]);
        let a = QActs::quantize(&x, 1, QK);
        let r = a.row(0);
        assert_eq!(r.d[0], 1.0);
        assert_eq!(&r.q[..6], &[-127, 64, 62, 1, 0, 0]);
        assert_eq!(r.s[0], (-127 + 64 + 62 + 1) as f32);
        let zero = QActs::quantize(&[0.0; QK], 1, QK);
        assert!(zero.row(0).q.iter().all(|&q| q == 0) && zero.row(0).d[0] == 0.0);
    }
}
