//! Weights stored as GGUF blocks (Q4_1, Q8_0, or plain F32), multiplied without expanding the matrix. Q4_1 and
//! Q8_0 weights meet the activations quantized to 8-bit blocks in integer dot products (`qdot`, as llama.cpp
//! does); F32 weights go through the invariant f32 kernel. Either way `y[r, o]` depends only on `x[r, :]` and
//! `w[o, :]`, in an order fixed in source: a row's result is bitwise the same alone, in any batch, and in decode.
//! Parallelism goes over groups of output rows only.
//!
//! Block layouts (little-endian): Q4_1 holds 32 weights in 20 bytes — scale `d` (f16), minimum `m` (f16), then
//! 16 bytes whose low nibbles are weights 0..16 and high nibbles weights 16..32, each `q * d + m`. Q8_0 holds 32
//! weights in 34 bytes — scale `d` (f16) then 32 signed bytes, each `q * d`.

use std::sync::Arc;

use rayon::prelude::*;

use super::interleaved;
use super::qdot::{dot_tile, QActs};

/// Weights in one block of Q4_1 or Q8_0.
pub const QK: usize = 32;

/// A quantized matrix's storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QType {
    F32,
    Q4_1,
    Q8_0,
}

impl QType {
    /// Bytes of one row of `n` weights (`n` a multiple of the block size for the block types).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            QType::F32 => n * 4,
            QType::Q4_1 => n / QK * 20,
            QType::Q8_0 => n / QK * 34,
        }
    }

    /// Weights per block.
    pub fn block(self) -> usize {
        match self {
            QType::F32 => 1,
            QType::Q4_1 | QType::Q8_0 => QK,
        }
    }
}

/// IEEE half to single precision (exact: every f16 is an f32).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: m · 2^-24
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[inline]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Dequantize one row's bytes (`out.len()` weights) of type `ty` into `out`.
pub fn dequantize_row(ty: QType, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), ty.row_bytes(out.len()));
    match ty {
        QType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        QType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(20)) {
                let (d, m) = (half(b, 0), half(b, 2));
                let qs = &b[4..20];
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    lo[j] = f32::from(qs[j] & 0x0f) * d + m;
                    hi[j] = f32::from(qs[j] >> 4) * d + m;
                }
            }
        }
        QType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(34)) {
                let d = half(b, 0);
                for (v, &q) in o.iter_mut().zip(&b[2..34]) {
                    *v = f32::from(q as i8) * d;
                }
            }
        }
    }
}

/// Where a matrix's bytes live: its own buffer, or a range of a shared one (a memory-mapped file).
#[derive(Clone)]
pub enum QBytes {
    Owned(Arc<[u8]>),
    Shared { src: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize },
}

impl std::fmt::Debug for QBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QBytes({} bytes)", self.as_slice().len())
    }
}

impl QBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            QBytes::Owned(b) => b,
            QBytes::Shared { src, start, len } => &(**src).as_ref()[*start..*start + *len],
        }
    }
}

/// A weight matrix `W[out, in]` in GGUF blocks, row by row.
#[derive(Debug, Clone)]
pub struct QMatrix {
    pub ty: QType,
    pub out_dim: usize,
    pub in_dim: usize,
    weights: Weights,
}

/// How a matrix's weights are held: quantized blocks as laid out in the file; on a CPU with the VNNI or the AVX2
/// kernel, quantized blocks with four rows interleaved (`interleaved`: the same bytes in an order one pass reads
/// four rows from, rewritten once at load); f32 rows decoded once into their own line-aligned block (the f32
/// kernel reads them in place, 64 bytes at a time, with no copy per call).
#[derive(Debug, Clone)]
enum Weights {
    Blocks(QBytes),
    Interleaved(Arc<[u8]>),
    F32(Arc<Vec<f32>>),
}

impl Weights {
    fn of(ty: QType, out_dim: usize, bytes: QBytes) -> Weights {
        match ty {
            QType::F32 => Self::f32_of(bytes.as_slice()),
            // rewritten into memory of its own (a memory-mapped file's pages are read once, here)
            _ if Self::interleaves(ty, out_dim) => Self::of_vec(ty, out_dim, bytes.as_slice().to_vec()),
            _ => Weights::Blocks(bytes),
        }
    }

    /// `of` for bytes the matrix may rewrite in place.
    fn of_vec(ty: QType, out_dim: usize, bytes: Vec<u8>) -> Weights {
        match ty {
            QType::F32 => Self::f32_of(&bytes),
            _ if Self::interleaves(ty, out_dim) => {
                let row_bytes = bytes.len() / out_dim;
                Weights::Interleaved(interleaved::interleave(ty, bytes, row_bytes).into())
            }
            _ => Weights::Blocks(QBytes::Owned(bytes.into())),
        }
    }

    fn f32_of(bytes: &[u8]) -> Weights {
        let values = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        Weights::F32(Arc::new(values.collect()))
    }

    /// Whether a block matrix of `out_dim` rows is held interleaved: a kernel for the layout is there to read it
    /// (VNNI, or AVX2), and there is at least one whole group of four rows (rows past the last whole group stay in
    /// the file's layout).
    fn interleaves(ty: QType, out_dim: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if ty != QType::F32 && out_dim >= interleaved::ROWS {
            return super::qdot_avx512::available() || super::qdot_x4_avx2::available();
        }
        let _ = (ty, out_dim);
        false
    }

    /// Bytes the weights take in their format (what a pass over them reads).
    fn len_bytes(&self) -> usize {
        match self {
            Weights::Blocks(b) => b.as_slice().len(),
            Weights::Interleaved(b) => b.len(),
            Weights::F32(v) => 4 * v.len(),
        }
    }
}

impl QMatrix {
    /// `bytes` must hold exactly `out_dim` rows of `in_dim` weights of type `ty`.
    pub fn new(ty: QType, out_dim: usize, in_dim: usize, bytes: QBytes) -> Result<Self, String> {
        Self::check_size(ty, out_dim, in_dim, bytes.as_slice().len())?;
        Ok(QMatrix { ty, out_dim, in_dim, weights: Weights::of(ty, out_dim, bytes) })
    }

    /// `new` for bytes the matrix takes over (rewritten in place where it holds them interleaved, with no copy).
    pub fn from_vec(ty: QType, out_dim: usize, in_dim: usize, bytes: Vec<u8>) -> Result<Self, String> {
        Self::check_size(ty, out_dim, in_dim, bytes.len())?;
        Ok(QMatrix { ty, out_dim, in_dim, weights: Weights::of_vec(ty, out_dim, bytes) })
    }

    /// Whether `len` bytes are exactly `out_dim` rows of `in_dim` weights of type `ty`.
    fn check_size(ty: QType, out_dim: usize, in_dim: usize, len: usize) -> Result<(), String> {
        if !in_dim.is_multiple_of(ty.block()) {
            return Err(format!("rows of {in_dim} weights are not whole {ty:?} blocks"));
        }
        let want = out_dim.checked_mul(ty.row_bytes(in_dim)).ok_or("size overflows")?;
        if len != want {
            return Err(format!("{len} bytes for {out_dim} x {in_dim} {ty:?} weights, expected {want}"));
        }
        Ok(())
    }

    /// A matrix quantized from f32 rows (tests and synthetic models): Q8_0 and Q4_1 rounded to nearest.
    pub fn quantize(ty: QType, w: &[f32], out_dim: usize, in_dim: usize) -> Self {
        assert_eq!(w.len(), out_dim * in_dim);
        let mut out = Vec::with_capacity(out_dim * ty.row_bytes(in_dim));
        match ty {
            QType::F32 => w.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            QType::Q8_0 => {
                for b in w.chunks_exact(QK) {
                    let amax = b.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let d = f16_round(amax / 127.0);
                    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(b.iter().map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
                }
            }
            QType::Q4_1 => {
                for b in w.chunks_exact(QK) {
                    let lo = b.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                    let hi = b.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                    let (d, m) = (f16_round((hi - lo) / 15.0), f16_round(lo));
                    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                    out.extend_from_slice(&f32_to_f16(m).to_le_bytes());
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| ((v - m) * id).round().clamp(0.0, 15.0) as u8;
                    for j in 0..16 {
                        out.push(q(b[j]) | (q(b[j + 16]) << 4));
                    }
                }
            }
        }
        QMatrix { ty, out_dim, in_dim, weights: Weights::of_vec(ty, out_dim, out) }
    }

    /// The matrix's bytes in its format, row after row.
    pub fn raw_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.weights {
            Weights::Blocks(b) => b.as_slice().into(),
            Weights::Interleaved(b) => {
                let rb = self.row_bytes();
                (0..self.out_dim).flat_map(|o| interleaved::row(self.ty, b, rb, o)).collect::<Vec<u8>>().into()
            }
            Weights::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into(),
        }
    }

    /// The quantized blocks in the file's layout (every type but F32, when not interleaved).
    fn blocks(&self) -> &[u8] {
        match &self.weights {
            Weights::Blocks(b) => b.as_slice(),
            Weights::Interleaved(_) | Weights::F32(_) => panic!("no blocks in the file's layout"),
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.in_dim)
    }

    /// Row `o` dequantized into `out` (`in_dim` long): an embedding lookup.
    pub fn row(&self, o: usize, out: &mut [f32]) {
        self.rows(o, out);
    }

    /// Every row dequantized (tests only: the engine never expands a whole matrix).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0.0; self.out_dim * self.in_dim];
        for (o, r) in w.chunks_exact_mut(self.in_dim).enumerate() {
            self.row(o, r);
        }
        w
    }

    /// Rows `o0..o0 + n` dequantized into `out` (`n` rows of `in_dim`).
    fn rows(&self, o0: usize, out: &mut [f32]) {
        let n = out.len() / self.in_dim.max(1);
        match &self.weights {
            Weights::F32(v) => out.copy_from_slice(&v[o0 * self.in_dim..(o0 + n) * self.in_dim]),
            Weights::Blocks(b) => {
                let rb = self.row_bytes();
                let bytes = &b.as_slice()[o0 * rb..(o0 + n) * rb];
                for (r, b) in out.chunks_exact_mut(self.in_dim).zip(bytes.chunks_exact(rb)) {
                    dequantize_row(self.ty, b, r);
                }
            }
            Weights::Interleaved(b) => {
                let rb = self.row_bytes();
                for (i, r) in out.chunks_exact_mut(self.in_dim).enumerate() {
                    dequantize_row(self.ty, &interleaved::row(self.ty, b, rb, o0 + i), r);
                }
            }
        }
    }
}

/// Round to the nearest f16 value (for `quantize`).
fn f16_round(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// Single to half precision, rounding to nearest even (normal range; tiny values flush to zero, huge saturate).
fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    if exp >= 0x1f {
        return sign | 0x7bff;
    }
    let man = bits & 0x7f_ffff;
    let mut h = ((exp as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h.min(0x7bff) as u16
}

/// Weight rows one task multiplies at a time.
const GROUP: usize = 32;

/// Rows below which F32 weights are split by output columns, every matrix of a call in one hand-off (as
/// `matmul_with` splits fewer than four rows by its decode step's work).
const FEW_ROWS: usize = 4;

/// `y[r, o]` = `x[r, :]` against `w[o, :]` for every row of `x` (`rows x in`) and of `w`, parallel over groups of
/// output rows. Q4_1 and Q8_0 weights meet `x` quantized to 8-bit blocks (`qdot`: llama.cpp's integer dot, in a
/// fixed order); F32 weights take the f32 kernel, `dot(x[r, :], w[o, :])`.
pub fn qmatmul(x: &[f32], rows: usize, w: &QMatrix, y: &mut [f32]) {
    qmatmul_each(x, rows, &mut [(w, y)]);
}

/// `qmatmul` of one input against several matrices (a layer's q, k and v; its gate and up): the input is
/// quantized once and every matrix's groups of rows share one parallel pass, so a decode step waits on one
/// hand-off instead of one per matrix. Each `y` is bitwise what `qmatmul` alone gives.
pub fn qmatmul_each(x: &[f32], rows: usize, outs: &mut [(&QMatrix, &mut [f32])]) {
    for (w, y) in outs.iter() {
        assert_eq!(x.len(), rows * w.in_dim, "qmatmul: x is not rows x in");
        assert_eq!(y.len(), rows * w.out_dim, "qmatmul: y is not rows x out");
        super::work::count(2 * rows * w.out_dim * w.in_dim, w.weights.len_bytes());
    }
    let f32s = outs.iter().filter(|(w, _)| matches!(w.weights, Weights::F32(_))).count();
    if f32s == outs.len() {
        return f32_matmuls(x, rows, outs);
    }
    if f32s > 0 {
        for (w, y) in outs.iter_mut() {
            match &w.weights {
                Weights::F32(_) => f32_matmuls(x, rows, &mut [(*w, &mut **y)]),
                Weights::Blocks(_) | Weights::Interleaved(_) => blocks_matmul(x, rows, &mut [(*w, &mut **y)]),
            }
        }
        return;
    }
    blocks_matmul(x, rows, outs);
}

/// `qmatmul_each` for matrices in blocks (Q4_1, Q8_0) of one input width.
fn blocks_matmul(x: &[f32], rows: usize, outs: &mut [(&QMatrix, &mut [f32])]) {
    let Some(in_dim) = outs.first().map(|(w, _)| w.in_dim) else { return };
    let xq = QActs::quantize(x, rows, in_dim);
    if rows == 1 {
        // decode: each group writes its own slice of its matrix's one output row
        let mut tasks: Vec<(&QMatrix, usize, &mut [f32])> = outs
            .iter_mut()
            .flat_map(|(w, y)| {
                let w: &QMatrix = w;
                y.chunks_mut(GROUP).enumerate().map(move |(g, yg)| (w, g * GROUP, yg))
            })
            .collect();
        crate::decode_team::for_each_mut(&mut tasks, |(w, o0, yg)| group(w, &xq, *o0, yg));
        return;
    }
    let ws: Vec<&QMatrix> = outs.iter().map(|(w, _)| *w).collect();
    let tasks: Vec<(usize, usize)> =
        ws.iter().enumerate().flat_map(|(m, w)| (0..w.out_dim.div_ceil(GROUP)).map(move |g| (m, g * GROUP))).collect();
    let mut parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(m, o0)| {
            let mut part = vec![0.0f32; rows * GROUP.min(ws[m].out_dim - o0)];
            group(ws[m], &xq, o0, &mut part);
            part
        })
        .collect();
    for (w, y) in outs.iter_mut() {
        let rest = parts.split_off(w.out_dim.div_ceil(GROUP));
        scatter(&parts, rows, w.out_dim, y);
        parts = rest;
    }
}

/// Weight rows `o0..o0 + n` of `w` against every row of `xq` into `part` (`rows x n`, row-major): interleaved
/// weights on their kernel (`interleaved_group`), then any rows in the file's layout (`file_group`).
fn group(w: &QMatrix, xq: &QActs, o0: usize, part: &mut [f32]) {
    let (ty, rb, rows) = (w.ty, w.row_bytes(), xq.rows);
    #[cfg(target_arch = "x86_64")]
    if let Weights::Interleaved(b) = &w.weights {
        let n = part.len() / rows;
        // rows of whole groups of four, then the matrix's last rows (fewer than four, in the file's layout)
        let whole = (w.out_dim / interleaved::ROWS * interleaved::ROWS).saturating_sub(o0).min(n);
        interleaved_group(ty, &b[o0 * rb..], rb, xq, whole, part);
        if whole < n {
            let mut tail = vec![0.0f32; rows * (n - whole)];
            file_group(ty, &b[(o0 + whole) * rb..], rb, xq, &mut tail);
            for (pr, tr) in part.chunks_exact_mut(n).zip(tail.chunks_exact(n - whole)) {
                pr[whole..].copy_from_slice(tr);
            }
        }
        return;
    }
    file_group(ty, &w.blocks()[o0 * rb..], rb, xq, part)
}

/// Weight rows in the file's layout (`bytes`, from the group's first row on) against every row of `xq` into
/// `part` (`rows x n`). On the VNNI kernel see `vnni_group`; else 4 activation rows x 2 weight rows at a time,
/// then the rows left over (all of decode) one at a time against 4 weight rows — each element the same bits
/// either way.
fn file_group(ty: QType, bytes: &[u8], rb: usize, xq: &QActs, part: &mut [f32]) {
    let rows = xq.rows;
    #[cfg(target_arch = "x86_64")]
    if super::qdot_avx512::available() {
        return vnni_group(ty, bytes, rb, xq, part);
    }
    let n = part.len() / rows;
    let quads = rows / 4 * 4;
    let wrow = |o: usize| &bytes[o * rb..(o + 1) * rb];
    for r in (0..quads).step_by(4) {
        let xs: [_; 4] = std::array::from_fn(|i| xq.row(r + i));
        let mut put = |o: usize, col: [f32; 4]| {
            for (i, v) in col.into_iter().enumerate() {
                part[(r + i) * n + o] = v;
            }
        };
        let mut o = 0;
        while o + 2 <= n {
            let [a, b] = dot_tile(ty, [wrow(o), wrow(o + 1)], xs);
            put(o, a);
            put(o + 1, b);
            o += 2;
        }
        if o < n {
            put(o, dot_tile(ty, [wrow(o)], xs)[0]);
        }
    }
    for r in quads..rows {
        let xr = [xq.row(r)];
        let pr = &mut part[r * n..(r + 1) * n];
        let mut o = 0;
        while o + 4 <= n {
            let t = dot_tile(ty, [wrow(o), wrow(o + 1), wrow(o + 2), wrow(o + 3)], xr);
            pr[o..o + 4].copy_from_slice(&t.map(|c| c[0]));
            o += 4;
        }
        for (o, v) in pr.iter_mut().enumerate().skip(o) {
            *v = dot_tile(ty, [wrow(o)], xr)[0][0];
        }
    }
}

/// One group's results (`part`, `rows x n`, from weight rows `bytes[0..n * rb]`) on the VNNI kernel: 8 activation
/// rows at a time (then 4, then 1) against 4 weight rows at a time (then 2, then 1) — every element the same bits
/// in any tile.
#[cfg(target_arch = "x86_64")]
fn vnni_group(ty: QType, bytes: &[u8], rb: usize, xq: &QActs, part: &mut [f32]) {
    let rows = xq.rows;
    let mut r = 0;
    while r < rows {
        r += match rows - r {
            8.. => vnni_rows::<8>(ty, bytes, rb, xq, r, part),
            4.. => vnni_rows::<4>(ty, bytes, rb, xq, r, part),
            _ => vnni_rows::<1>(ty, bytes, rb, xq, r, part),
        };
    }
}

/// The first `whole` columns (a multiple of four) of one group's results (`part`, `rows x n`) from interleaved
/// weights (`bytes`: from the group's first row on), four weight rows at a time: on the VNNI kernel against 8
/// activation rows at a time (then 4, then 1); else (interleaved weights exist only where one of the two kernels
/// is `available`) on the AVX2 kernel against 4 (then 2, then 1).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn interleaved_group(ty: QType, bytes: &[u8], rb: usize, xq: &QActs, whole: usize, part: &mut [f32]) {
    let rows = xq.rows;
    let cols = (whole, part.len() / rows);
    let mut r = 0;
    // SAFETY (every tile call): the CPU has the kernel's features (checked here, and weights are interleaved
    // only where a kernel is `available`); `ty` is Q4_1 or Q8_0 (`QMatrix::new`); the kernels assert the rest
    if super::qdot_avx512::available() {
        use super::qdot_x4_avx512::tile;
        while r < rows {
            r += match rows - r {
                8.. => interleaved_rows::<8>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
                4.. => interleaved_rows::<4>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
                _ => interleaved_rows::<1>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
            };
        }
        return;
    }
    assert!(super::qdot_x4_avx2::available(), "interleaved weights without a kernel to read them");
    use super::qdot_x4_avx2::tile;
    while r < rows {
        r += match rows - r {
            4.. => interleaved_rows::<4>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
            2.. => interleaved_rows::<2>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
            _ => interleaved_rows::<1>(bytes, rb, r, cols, part, |g, o| unsafe { tile(ty, g, xq, r, o) }),
        };
    }
}

/// Activation rows `r..r + R` of one group on interleaved weights, each group of four weight rows through
/// `tile` (its bytes, its `R` x 4 results); returns `R`.
#[cfg(target_arch = "x86_64")]
fn interleaved_rows<const R: usize>(
    bytes: &[u8],
    rb: usize,
    r: usize,
    (whole, n): (usize, usize),
    part: &mut [f32],
    mut tile: impl FnMut(&[u8], &mut [[f32; R]; 4]),
) -> usize {
    let step = interleaved::ROWS;
    let mut out = [[0.0f32; R]; 4];
    // `whole` is a multiple of four, as `GROUP` is: every step is a whole group
    for o in (0..whole).step_by(step) {
        tile(&bytes[o * rb..(o + step) * rb], &mut out);
        for (c, col) in out.iter().enumerate() {
            for (i, &v) in col.iter().enumerate() {
                part[(r + i) * n + o + c] = v;
            }
        }
    }
    R
}

/// Activation rows `r..r + R` of one group on the VNNI kernel; returns `R`.
#[cfg(target_arch = "x86_64")]
fn vnni_rows<const R: usize>(ty: QType, bytes: &[u8], rb: usize, xq: &QActs, r: usize, part: &mut [f32]) -> usize {
    use super::qdot_avx512::tile;
    let n = part.len() / xq.rows;
    let wrow = |o: usize| &bytes[o * rb..(o + 1) * rb];
    let mut put = |o: usize, cols: &[[f32; R]]| {
        for (c, col) in cols.iter().enumerate() {
            for (i, &v) in col.iter().enumerate() {
                part[(r + i) * n + o + c] = v;
            }
        }
    };
    let mut out = [[0.0f32; R]; 4];
    let mut o = 0;
    // SAFETY (each call): the CPU has the kernel's features (`available`, checked by `qmatmul`), the weights are
    // Q4_1 or Q8_0 rows of `xq`'s length (`QMatrix::new` checked the bytes), rows `r..r + R` exist
    #[allow(unsafe_code)]
    unsafe {
        while o + 4 <= n {
            tile::<2, R>(ty, &[wrow(o), wrow(o + 1), wrow(o + 2), wrow(o + 3)], xq, r, &mut out);
            put(o, &out);
            o += 4;
        }
        if o + 2 <= n {
            tile::<1, R>(ty, &[wrow(o), wrow(o + 1)], xq, r, &mut out[..2]);
            put(o, &out[..2]);
            o += 2;
        }
        if o < n {
            // a row alone shares its register with itself
            tile::<1, R>(ty, &[wrow(o), wrow(o)], xq, r, &mut out[..2]);
            put(o, &out[..1]);
        }
    }
    R
}

/// Each group's `rows x n` results into its columns of `y`, rows in parallel.
fn scatter(parts: &[Vec<f32>], rows: usize, out_dim: usize, y: &mut [f32]) {
    y.par_chunks_mut(out_dim).with_min_len(16).enumerate().for_each(|(r, yr)| {
        for (g, part) in parts.iter().enumerate() {
            let (o0, n) = (g * GROUP, part.len() / rows);
            yr[o0..o0 + n].copy_from_slice(&part[r * n..(r + 1) * n]);
        }
    });
}

/// `qmatmul_each` of F32 weights (every `w` F32, one input width): `matmul`'s invariant kernel, with its split
/// between the threads. A few rows (a decode step) send every matrix's column blocks to the pool at once, one
/// hand-off for a layer's q, k and v; more rows split each matrix by rows. Groups of 32 output rows, each into a
/// buffer of its own and then placed, were slower: the bench preset's llama decoded 285-357 tok/s that way against
/// 335-487 now (a 2-core Zen 4 EPYC, in huge pages as the engine runs, three alternations of five runs).
fn f32_matmuls(x: &[f32], rows: usize, outs: &mut [(&QMatrix, &mut [f32])]) {
    let Some(in_dim) = outs.first().map(|(w, _)| w.in_dim) else { return };
    let mut jobs: Vec<(&[f32], &[f32], &mut [f32])> = outs
        .iter_mut()
        .map(|(w, y)| match &w.weights {
            Weights::F32(wf) => (x, &wf[..], &mut **y),
            Weights::Blocks(_) | Weights::Interleaved(_) => unreachable!("f32_matmuls: weights in blocks"),
        })
        .collect();
    if rows < FEW_ROWS {
        return super::matmul::column_blocks_side_by_side(in_dim, &mut jobs);
    }
    for (x, w, y) in jobs {
        super::matmul::invariant(x, rows, w, w.len() / in_dim.max(1), in_dim, y, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot;
    use crate::kernels::qdot::dot_reference;
    use crate::kernels::test_rows::random;
    use proptest::prelude::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    const TYPES: [QType; 3] = [QType::F32, QType::Q4_1, QType::Q8_0];

    /// What `qmatmul` promises for one element: the f32 `dot` against the F32 row, the integer block dot
    /// (`qdot::dot_reference`, one scalar at a time) against the quantized activation row otherwise.
    fn reference(ty: QType, xr: &[f32], w: &QMatrix, o: usize) -> f32 {
        if ty == QType::F32 {
            let mut wr = vec![0.0; w.in_dim];
            w.row(o, &mut wr);
            return dot(xr, &wr);
        }
        let xq = QActs::quantize(xr, 1, w.in_dim);
        let rb = w.row_bytes();
        dot_reference(ty, &w.raw_bytes()[o * rb..(o + 1) * rb], xq.row(0))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// A row's output is bitwise the same alone (decode), inside a batch of any size and at any place in it,
        /// and equal to the scalar reference for its storage type.
        #[test]
        fn qmatmul_is_batch_invariant(
            t in 0usize..3, rows in 1usize..40, out_dim in 1usize..100, blocks in 1usize..6,
            pick in any::<prop::sample::Index>(), seed in any::<u64>()
        ) {
            let ty = TYPES[t];
            let in_dim = blocks * QK;
            let x = random(rows * in_dim, seed);
            let w = QMatrix::quantize(ty, &random(out_dim * in_dim, seed ^ 1), out_dim, in_dim);
            let mut y = vec![0.0; rows * out_dim];
            qmatmul(&x, rows, &w, &mut y);
            let r = pick.index(rows);
            let xr = &x[r * in_dim..(r + 1) * in_dim];
            let mut alone = vec![0.0; out_dim];
            qmatmul(xr, 1, &w, &mut alone);
            prop_assert_eq!(bits(&alone), bits(&y[r * out_dim..(r + 1) * out_dim]));
            let want: Vec<f32> = (0..out_dim).map(|o| reference(ty, xr, &w, o)).collect();
            prop_assert_eq!(bits(&alone), bits(&want));
            // a sub-batch that starts at the picked row gives the same bits too
            let sub = rows - r;
            let mut part = vec![0.0; sub * out_dim];
            qmatmul(&x[r * in_dim..], sub, &w, &mut part);
            prop_assert_eq!(bits(&part[..out_dim]), bits(&alone));
        }
    }

    /// One input against several matrices (different heights, every storage type) gives each output bitwise
    /// what `qmatmul` gives it alone, in prefill and in decode.
    #[test]
    fn qmatmul_each_is_qmatmul_per_matrix() {
        let in_dim = 3 * QK;
        let ws: Vec<QMatrix> = [(QType::Q4_1, 70), (QType::Q8_0, 33), (QType::Q4_1, 5), (QType::F32, 9)]
            .iter()
            .enumerate()
            .map(|(i, &(ty, out))| QMatrix::quantize(ty, &random(out * in_dim, 40 + i as u64), out, in_dim))
            .collect();
        for rows in [1, 13] {
            let x = random(rows * in_dim, 3);
            let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; rows * w.out_dim]).collect();
            let mut outs: Vec<(&QMatrix, &mut [f32])> =
                ws.iter().zip(ys.iter_mut()).map(|(w, y)| (w, &mut y[..])).collect();
            qmatmul_each(&x, rows, &mut outs);
            for (w, y) in ws.iter().zip(&ys) {
                let mut alone = vec![0.0; rows * w.out_dim];
                qmatmul(&x, rows, w, &mut alone);
                assert_eq!(bits(y), bits(&alone), "{:?} {} x {}, {rows} rows", w.ty, w.out_dim, in_dim);
            }
            // the quantized ones alone, in one parallel pass
            let mut ys2: Vec<Vec<f32>> = ws[..3].iter().map(|w| vec![0.0; rows * w.out_dim]).collect();
            let mut outs: Vec<(&QMatrix, &mut [f32])> =
                ws.iter().zip(ys2.iter_mut()).map(|(w, y)| (w, &mut y[..])).collect();
            qmatmul_each(&x, rows, &mut outs);
            assert_eq!(
                ys2.iter().map(|y| bits(y)).collect::<Vec<_>>(),
                ys[..3].iter().map(|y| bits(y)).collect::<Vec<_>>()
            );
        }
    }

    /// F32 matrices together (a layer's q, k and v: one hand-off in decode, each split by rows in prefill) give
    /// each element bitwise the f32 `dot` of its rows, at every batch size around the few-row split.
    #[test]
    fn qmatmul_each_of_f32_matrices_is_dot_per_element() {
        let in_dim = 5 * QK;
        let ws: Vec<QMatrix> = [70, 33, 5, 130]
            .iter()
            .enumerate()
            .map(|(i, &out)| QMatrix::quantize(QType::F32, &random(out * in_dim, 60 + i as u64), out, in_dim))
            .collect();
        for rows in [1, 2, 3, FEW_ROWS, 13, 40] {
            let x = random(rows * in_dim, 7);
            let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; rows * w.out_dim]).collect();
            let mut outs: Vec<(&QMatrix, &mut [f32])> =
                ws.iter().zip(ys.iter_mut()).map(|(w, y)| (w, &mut y[..])).collect();
            qmatmul_each(&x, rows, &mut outs);
            for (w, y) in ws.iter().zip(&ys) {
                let want: Vec<f32> = (0..rows)
                    .flat_map(|r| (0..w.out_dim).map(move |o| (r, o)))
                    .map(|(r, o)| reference(QType::F32, &x[r * in_dim..(r + 1) * in_dim], w, o))
                    .collect();
                assert_eq!(bits(y), bits(&want), "{} x {in_dim}, {rows} rows", w.out_dim);
            }
        }
    }

    /// The integer path stays close to the f32 dot against the dequantized weights (8-bit activations: about
    /// 0.4% of each block's largest value per element).
    #[test]
    fn integer_dot_is_close_to_f32() {
        let (out_dim, in_dim) = (16, 256);
        let x = random(3 * in_dim, 11);
        for ty in [QType::Q4_1, QType::Q8_0] {
            let w = QMatrix::quantize(ty, &random(out_dim * in_dim, 12), out_dim, in_dim);
            let wd = w.dequantize();
            let mut y = vec![0.0; 3 * out_dim];
            qmatmul(&x, 3, &w, &mut y);
            for r in 0..3 {
                for o in 0..out_dim {
                    let e = dot(&x[r * in_dim..(r + 1) * in_dim], &wd[o * in_dim..(o + 1) * in_dim]);
                    let got = y[r * out_dim + o];
                    assert!((got - e).abs() <= 0.05, "{ty:?} y[{r}, {o}] = {got}, f32 {e}");
                }
            }
        }
    }

    #[test]
    fn blocks_dequantize_as_laid_out() {
        // Q8_0: d = 0.5, q = 0..32 (as i8, some negative)
        let mut b = f32_to_f16(0.5).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut out = [0.0; 32];
        dequantize_row(QType::Q8_0, &b, &mut out);
        assert!(out.iter().enumerate().all(|(i, &v)| v == (i as f32 - 16.0) * 0.5));
        // Q4_1: d = 2, m = -1; byte j holds weight j (low nibble) and weight j + 16 (high nibble)
        let mut b = f32_to_f16(2.0).to_le_bytes().to_vec();
        b.extend_from_slice(&f32_to_f16(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        dequantize_row(QType::Q4_1, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 2.0 - 1.0);
            assert_eq!(out[j + 16], (15 - j) as f32 * 2.0 - 1.0);
        }
    }

    #[test]
    fn halves_convert_exactly() {
        for (h, f) in [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0), (0, 0.0)] {
            assert_eq!(f16_to_f32(h), f);
        }
        for h in (0x0400u16..0x7c00).step_by(7) {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn quantization_is_close() {
        let w = random(8 * 64, 5);
        for (ty, tol) in [(QType::F32, 0.0), (QType::Q8_0, 0.01), (QType::Q4_1, 0.1)] {
            let q = QMatrix::quantize(ty, &w, 8, 64).dequantize();
            let err = w.iter().zip(&q).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err <= tol, "{ty:?}: {err}");
        }
    }
}
