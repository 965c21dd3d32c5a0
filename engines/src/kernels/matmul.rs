//! y = x · Wᵀ with `W` stored `[out, in]` (the checkpoint layout).

use rayon::prelude::*;

use super::tail_blocks::TailBlocks;
use super::Reduction;

/// The f32 lanes every invariant dot product and weighted sum keeps: its fixed split of a row.
pub const LANES: usize = 16;

/// One lane group: the 16 partial sums `dot` keeps, one per lane.
pub(super) type Lanes = [f32; LANES];

/// `acc[l] = a[l] · b[l] + acc[l]` for every lane, fused (one rounding): the same bits whether it runs as one
/// AVX-512 `vfmadd`, two AVX2 ones, or `f32::mul_add` in software.
#[inline(always)]
fn mul_acc(acc: &mut Lanes, a: &Lanes, b: &Lanes) {
    for l in 0..LANES {
        acc[l] = a[l].mul_add(b[l], acc[l]);
    }
}

/// The fixed horizontal sum of the lanes (lane `l` plus lane `l + 8`, then a fixed pairwise sum of those 8), then
/// the tail elements in order, each fused into the sum.
#[inline(always)]
fn finish(acc: &Lanes, a_tail: &[f32], b_tail: &[f32]) -> f32 {
    let h: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let mut s = ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
    for (x, y) in a_tail.iter().zip(b_tail) {
        s = x.mul_add(*y, s);
    }
    s
}

/// The fixed-order dot product every kernel uses: 16 fused lane accumulators, then a fixed horizontal sum, then
/// the tail.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (ca, ta) = a.as_chunks::<LANES>();
    let (cb, tb) = b.as_chunks::<LANES>();
    let n = ca.len().min(cb.len());
    let [[acc]] = acc_tile([&ca[..n]], [&cb[..n]]);
    finish(&acc, ta, tb)
}

/// `dot(a, b[j])` for four rows `b[j]` as long as `a` at once: the same bits, four independent chains.
pub(super) fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    debug_assert!(b.iter().all(|r| r.len() == a.len()));
    let (ca, ta) = a.as_chunks::<LANES>();
    let bs = b.map(|r| r.as_chunks::<LANES>());
    let [acc] = acc_tile([ca], bs.map(|v| v.0));
    std::array::from_fn(|j| finish(&acc[j], ta, bs[j].1))
}

/// `dot`'s lane accumulators for every (x row, w row) pair of an `R x C` tile (rows in lane chunks, the w rows
/// at least as long as the x rows): each loaded chunk feeds several accumulators, and each pair still gets its
/// own 16 lanes updated in ascending chunk order — bitwise `dot`'s. AVX-512 where the CPU has it, else the
/// portable loop (the same operations on the same lanes).
#[inline]
fn acc_tile<const R: usize, const C: usize>(x: [&[Lanes]; R], w: [&[Lanes]; C]) -> [[Lanes; C]; R] {
    let n = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == n) && w.iter().all(|r| r.len() >= n), "acc_tile: rows shorter than x");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; every row holds at least `n` chunks (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::matmul_avx512::acc_tile(x, w, n) };
    }
    acc_tile_portable(x, w)
}

/// The portable `acc_tile`. `inline(never)` on purpose: inlined into the tile loop, LLVM's SLP vectorizer has
/// been seen to group the lanes the wrong way (across accumulators) and run several times slower.
#[inline(never)]
pub(super) fn acc_tile_portable<const R: usize, const C: usize>(x: [&[Lanes]; R], w: [&[Lanes]; C]) -> [[Lanes; C]; R] {
    let n = x.first().map_or(0, |r| r.len());
    let w = w.map(|r| &r[..n]);
    let mut acc = [[[0.0f32; LANES]; C]; R];
    for k in 0..n {
        for (a, xr) in acc.iter_mut().zip(&x) {
            for (ac, wr) in a.iter_mut().zip(&w) {
                mul_acc(ac, &xr[k], &wr[k]);
            }
        }
    }
    acc
}

/// `y[r * y_stride + c] = dot(x[r, :], w[c, :])` for every row of `x` and of `w`, invariant order.
///
/// The weight rows are walked in cache-sized tiles; over each tile go blocks of four x rows in 4 x 4 tiles
/// (`dots`: every element `dot`'s bits), then up to 3 rows left over (two in 2 x 8 tiles, one in 1 x 16 tiles, as
/// a single row in decode). While a tile's passes compute, the next tile's weights are asked for, a share per
/// pass: a short segment (a few rows per expert) otherwise waits for every tile's bytes from memory in turn. The
/// last tile asks for the first tile of `then`, the weights the caller multiplies next (empty if none): an
/// expert's gate, up and down, then the next expert's gate.
pub(super) fn block_invariant(x: &[f32], w: &[f32], in_dim: usize, y: &mut [f32], y_stride: usize, then: &[f32]) {
    let rows = x.len() / in_dim;
    let cols = w.len() / in_dim;
    if cols == 0 {
        return;
    }
    let chunks = in_dim / LANES;
    let xrow = |r: usize| &x[r * in_dim..(r + 1) * in_dim];
    let mut wrows: Vec<&[f32]> = w.chunks_exact(in_dim).collect();
    // whole tiles of weight rows: past the last weight row, repeat it (the extra results are dropped)
    let last = wrows[cols - 1];
    wrows.resize(cols.next_multiple_of(16), last);
    let mut scratch = vec![0.0f32; 4 * 16];
    if (2..=4).contains(&rows) && super::dot_tiles::streams_rows() {
        return few_rows_streamed(x, in_dim, &wrows, cols, y, y_stride, &mut scratch);
    }
    let quads = rows / 4;
    let pair = rows % 4 >= 2;
    let single = rows % 2 == 1;
    let passes = quads + usize::from(pair) + usize::from(single);
    // a single row reuses no weights: all of them in one walk (whose tiles the kernel reads far apart, side by side)
    let tile = if rows == 1 { cols.next_multiple_of(16) } else { (TILE_BYTES / (in_dim * 4)).max(16) & !15 };
    for t0 in (0..cols).step_by(tile) {
        let t1 = (t0 + tile).min(cols);
        let ws = &wrows[t0..t1.next_multiple_of(16)];
        // the next tile's bytes, a share per pass over this one; after the last, the next matrix's first tile
        let next = if t1 < cols {
            &w[t1 * in_dim..((t1 + tile) * in_dim).min(w.len())]
        } else {
            &then[..(tile * in_dim).min(then.len())]
        };
        // (a single row, as in decode, has too little compute to hide the next tile behind: the hardware streams
        // it; two to four rows are one pass, whose next tile waited for memory without the asks: a 4-row matmul of
        // 256 x 256 weights from memory took longer than a 5-row one)
        let share = if rows > 1 { next.len().div_ceil(passes).next_multiple_of(LANES) } else { 0 };
        let ahead = |p: usize| &next[(p * share).min(next.len())..((p + 1) * share).min(next.len())];
        for q in 0..quads {
            let r = 4 * q;
            let out = out_rows::<4>(y, r, y_stride, t0..t1);
            let x4 = [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)];
            dots_rows::<4, 4>(x4, ws, chunks, out, &mut scratch, Some(ahead(q)));
        }
        let mut r = 4 * quads;
        if pair {
            let out = out_rows::<2>(y, r, y_stride, t0..t1);
            dots_rows::<2, 8>([xrow(r), xrow(r + 1)], ws, chunks, out, &mut scratch, Some(ahead(quads)));
            r += 2;
        }
        if single {
            let out = out_rows::<1>(y, r, y_stride, t0..t1);
            dots_rows::<1, 16>([xrow(r)], ws, chunks, out, &mut scratch, Some(ahead(passes - 1)));
        }
    }
}

/// Columns `cols` of the `N` rows of `y` from row `r` on (rows `y_stride` apart).
fn out_rows<const N: usize>(y: &mut [f32], r: usize, y_stride: usize, cols: std::ops::Range<usize>) -> [&mut [f32]; N] {
    let mut it = y[r * y_stride..].chunks_mut(y_stride);
    std::array::from_fn(|_| &mut it.next().expect("y rows")[cols.clone()])
}

/// `block_invariant` for two to four rows of `x` (a decode step's verification batch, a mixture's expert with a few
/// rows), where `dot_tiles::streams_rows`: one pass over all the weight rows, each read start to end for every row
/// at once (`dots_streamed`); three rows go as four, the third repeated into a row that is dropped. Such a matmul
/// waits on its weight bytes: the 16 KiB tiles and two passes (a pair, then one) of the general walk read a
/// 512 x 512 matrix from memory at 15 GB/s a core at two rows and 13 at three, against 22 at one row. Measured
/// on two threads inside a decode step, 256 MiB of such matrices, the two walks alternating three times in one
/// process: 25.0-25.8 GB/s → 28.7-29.6 at two rows, 21.0-21.7 → 23.4-24.5 at three, 24.4-25.0 → 24.5-25.2 at
/// four; glm53's bench decode (verification batches of two rows, mostly) 114.9-117.8 → 122.8-130.3 tok/s. Every
/// element is `dot`'s bits as before. `wrows` are `block_invariant`'s weight rows padded to whole tiles, the first
/// `cols` of them real.
fn few_rows_streamed(
    x: &[f32],
    in_dim: usize,
    wrows: &[&[f32]],
    cols: usize,
    y: &mut [f32],
    y_stride: usize,
    scratch: &mut [f32],
) {
    let rows = x.len() / in_dim;
    let chunks = in_dim / LANES;
    let xrow = |r: usize| &x[r.min(rows - 1) * in_dim..(r.min(rows - 1) + 1) * in_dim];
    if rows == 2 {
        let out = out_rows::<2>(y, 0, y_stride, 0..cols);
        return dots_rows::<2, 8>([xrow(0), xrow(1)], wrows, chunks, out, scratch, None);
    }
    let mut dropped = vec![0.0f32; cols];
    let out: [&mut [f32]; 4] = if rows == 4 {
        out_rows::<4>(y, 0, y_stride, 0..cols)
    } else {
        let [a, b, c] = out_rows::<3>(y, 0, y_stride, 0..cols);
        [a, b, c, &mut dropped]
    };
    dots_rows::<4, 4>(std::array::from_fn(xrow), wrows, chunks, out, scratch, None);
}

/// `out[r][j] = dot(x[r], w[j])` for the weight rows `w` (padded to whole tiles of `K`; `out[r]` holds the
/// real ones), tiles of `R x K` through `dot_tiles::dots` (asking for the lines of `ahead` on the way), or, without
/// `ahead`, through `dot_tiles::dots_streamed`, then `finish`'s tail.
fn dots_rows<const R: usize, const K: usize>(
    x: [&[f32]; R],
    w: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
    scratch: &mut [f32],
    ahead: Option<&[f32]>,
) {
    let n = out[0].len();
    let whole = n / K * K;
    let mut out = out;
    let body = out.each_mut().map(|o| &mut o[..whole]);
    match ahead {
        Some(ahead) => super::dot_tiles::dots::<R, K>(x, &w[..whole], chunks, body, ahead),
        None => super::dot_tiles::dots_streamed::<R, K>(x, &w[..whole], chunks, body),
    }
    if whole < n {
        // the last, partial tile into scratch
        let mut it = scratch.chunks_mut(K);
        let part: [&mut [f32]; R] = std::array::from_fn(|_| it.next().expect("scratch rows"));
        super::dot_tiles::dots::<R, K>(x, &w[whole..whole + K], chunks, part, &[]);
        for (r, o) in out.iter_mut().enumerate() {
            o[whole..].copy_from_slice(&scratch[r * K..r * K + n - whole]);
        }
    }
    let tail = chunks * LANES;
    for (o, xr) in out.iter_mut().zip(&x) {
        if tail < xr.len() {
            for (v, wr) in o.iter_mut().zip(w) {
                for (a, b) in xr[tail..].iter().zip(&wr[tail..]) {
                    *v = a.mul_add(*b, *v);
                }
            }
        }
    }
}

/// The length of each of a `Tiled` reduction's parts of a `len`-long row split into `parts` (clamped to 1..=len):
/// the one split `dot_tiled` and every SIMD `Tiled` kernel must share for the same bits.
pub(super) fn part_len(len: usize, parts: usize) -> usize {
    len.div_ceil(parts.clamp(1, len.max(1))).max(1)
}

/// The x rows a SIMD `Tiled` kernel with `lanes` x rows a pass leaves to its tail (over weight lanes): what is
/// left after the whole passes, when at most `most`; else none (one more pass takes them).
#[cfg(target_arch = "x86_64")]
pub(super) fn tail_rows_left(rows: usize, lanes: usize, most: usize) -> usize {
    match rows % lanes {
        left @ 1.. if left <= most => left,
        _ => 0,
    }
}

/// A dot product split into `parts` partial sums over contiguous slices, added last-to-first: a different
/// rounding for every `parts`, as a shape-dependent GPU tiling would give.
#[inline]
fn dot_tiled(a: &[f32], b: &[f32], parts: usize) -> f32 {
    let step = part_len(a.len(), parts);
    // the partials summed in reverse without collecting them: this runs once per output element
    a.chunks(step).zip(b.chunks(step)).rev().map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>()).sum()
}

/// `dot_tiled` of one row against `N` weight rows at once: each output keeps exactly `dot_tiled`'s order (so the
/// same bits); the `N` independent chains only give the CPU instruction-level parallelism.
#[inline]
fn dot_tiled_n<const N: usize>(a: &[f32], b: [&[f32]; N], parts: usize) -> [f32; N] {
    let step = part_len(a.len(), parts);
    // -0.0 is the exact identity of f32 addition (what `Sum` starts from)
    let mut total = [-0.0f32; N];
    for start in (0..a.len()).step_by(step).rev() {
        let end = (start + step).min(a.len());
        let mut part = [-0.0f32; N];
        for k in start..end {
            for j in 0..N {
                part[j] += a[k] * b[j][k];
            }
        }
        for j in 0..N {
            total[j] += part[j];
        }
    }
    total
}

/// One row of a `Tiled` matmul: eight outputs at a time, then the rest one by one.
fn tiled_row(xr: &[f32], w: &[f32], in_dim: usize, parts: usize, yr: &mut [f32]) {
    const N: usize = 8;
    let mut blocks = w.chunks_exact(N * in_dim);
    let mut o = 0;
    for wb in blocks.by_ref() {
        let b: [&[f32]; N] = std::array::from_fn(|j| &wb[j * in_dim..(j + 1) * in_dim]);
        yr[o..o + N].copy_from_slice(&dot_tiled_n(xr, b, parts));
        o += N;
    }
    for wr in blocks.remainder().chunks_exact(in_dim) {
        yr[o] = dot_tiled(xr, wr, parts);
        o += 1;
    }
}

/// Bytes of weight rows every pass of x row blocks walks over before the next ones (at least 16 rows): in L1
/// beside a block of x rows, and small enough that only the first tile of a matrix waits for memory.
const TILE_BYTES: usize = 16 << 10;
/// Rows a task of a row-split matmul takes at least: every such task reads all the weights, which four blocks of
/// four rows use enough to pay for (fewer rows per task, and the columns are split instead).
const ROWS_PER_TASK: usize = 16;

/// `Tiled` matmuls below this many multiply-adds stay on the calling thread (rayon overhead dominates).
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// Multiply-adds per parallel task of the invariant matmul: below two tasks' worth it stays on the calling thread
/// (at the blocked kernel's speed that is ~10 µs, about what waking a rayon worker costs on a busy machine).
const TASK_WORK: usize = 1 << 18;
/// Multiply-adds per parallel task when fewer than four x rows (decode) meet the weights: such a matmul waits on
/// its weight bytes, not its arithmetic, and one core alone reads about half of what both do, so tasks of 128 KiB
/// of weights keep both cores reading even for a model's smallest (512 x 512) matrices.
const DECODE_TASK_WORK: usize = 1 << 15;

/// Copies the outputs of tasks that each took `per` weight rows (block `t`: `rows x n`, weight rows
/// `t · per..t · per + n`) into their columns of `y` (`rows x out_dim`).
fn place_column_blocks(blocks: &[Vec<f32>], rows: usize, per: usize, y: &mut [f32], out_dim: usize) {
    for (t, block) in blocks.iter().enumerate() {
        let n = block.len() / rows.max(1);
        if n == 0 {
            continue;
        }
        for (yr, br) in y.chunks_exact_mut(out_dim).zip(block.chunks_exact(n)) {
            yr[t * per..t * per + n].copy_from_slice(br);
        }
    }
}

/// `lanes[k · L + j] = block[j · in_dim + k]` for the `n` (at most `L`) rows of `block`, zero for `j >= n`: the
/// rows of `block` copied transposed into `in_dim` rows of `L` lanes, so a lane reads its own row's element `k` where
/// the others read theirs. Each whole group of eight rows goes through 8 x 8 register transposes where the CPU has
/// AVX2 (copied element by element, the compiler scattered them); the rest (a partial group, `in_dim`'s last `k`s)
/// one by one. The `Tiled` kernels' x rows (`tiled_steps`) and their tails' weight rows go through it.
#[cfg(target_arch = "x86_64")]
pub(super) fn transpose_rows<const L: usize>(block: &[f32], n: usize, in_dim: usize, lanes: &mut [f32]) {
    assert!(n <= L && block.len() == n * in_dim && lanes.len() >= in_dim * L, "tiled: transpose shapes");
    let eights = if std::arch::is_x86_feature_detected!("avx2") { n / 8 } else { 0 };
    for g in 0..eights {
        // SAFETY: the CPU has AVX2 (checked); rows `8g..8g + 8` of `block` exist, `8g + 8 <= L`, and `lanes` holds
        // `in_dim` rows of `L`
        #[allow(unsafe_code)]
        unsafe {
            super::matmul_avx2::transpose_rows_into(
                &block[g * 8 * in_dim..(g + 1) * 8 * in_dim],
                in_dim,
                lanes,
                L,
                g * 8,
            )
        };
    }
    let whole = in_dim / 8 * 8;
    for k in 0..in_dim {
        let from = if k < whole { eights * 8 } else { 0 };
        for j in from..L {
            lanes[k * L + j] = if j < n { block[j * in_dim + k] } else { 0.0 };
        }
    }
}

/// The walk of the SIMD `Tiled` kernels (`matmul_avx512::tiled`, `matmul_avx2::tiled`) over `y = x · wᵀ`, whose last
/// `tail` x rows run over weight lanes: the weight rows `step` at a time (whole blocks of a `TailBlocks` copy), and for
/// each step every x-lane pass against them, then the tail's x rows. So a step's weights come from memory once and
/// from the core's own caches for every further x row (a step of 16 rows of 512 is 32 KiB); a walk of all the
/// weights per pass read them once a pass, from L2 at best (a matrix of 512 x 512 is 1 MiB, 2 with its copy).
/// The passes' x rows are copied transposed up front, `L` to a pass (`transpose_rows`; lanes past the last x row
/// are zeros and never stored). `pass(rows, o, left, xt, r0, lanes, y)` computes the sums of weight rows from `o` on
/// (`left` of them in the step; read from `rows`: the copy or the row-major weights, `TiledWeights::passes`) against
/// the pass of x rows `r0..r0 + lanes`, places them in `y` (the passes' rows of `y`) and returns how many weight
/// rows it took. `tail(x, lanes, ask, weight rows, y)` does the same for the tail's x rows against a block of `L`
/// weight rows (`weight_lanes`) and the tail's rows of `y`. Whoever reads a step first asks for the next step's
/// weights as it goes (`Rows::ahead`, `AskSpread`): the first pass of x rows, or where no pass runs, the tail.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn tiled_steps<const L: usize>(
    x: &[f32],
    rows: usize,
    tail: usize,
    weights: TiledWeights,
    in_dim: usize,
    cols: usize,
    step: usize,
    y: &mut [f32],
    mut pass: impl FnMut(Rows, usize, usize, &[f32], usize, usize, &mut [f32]) -> usize,
    mut tail_block: impl FnMut(&[f32], &[f32], &[f32], std::ops::Range<usize>, &mut [f32]),
) {
    assert!(step > 0 && step.is_multiple_of(L) && tail <= rows && x.len() >= rows * in_dim, "tiled: walk shapes");
    let lane_rows = rows - tail;
    let (x_lanes, x_tail) = x.split_at(lane_rows * in_dim);
    let (y_lanes, y_tail) = y.split_at_mut(lane_rows * cols);
    let passes = weights.passes(tail > 0, lane_rows <= L);
    let tail_weights = weights.tail();
    let mut wt = match tail_weights {
        Rows::RowMajor(_) if tail > 0 => vec![0.0f32; in_dim * L],
        _ => Vec::new(),
    };
    let mut xt = vec![0.0f32; lane_rows.div_ceil(L) * in_dim * L];
    for (g, lanes) in xt.chunks_exact_mut(in_dim * L).enumerate() {
        let n = (lane_rows - g * L).min(L);
        transpose_rows::<L>(&x_lanes[g * L * in_dim..(g * L + n) * in_dim], n, in_dim, lanes);
    }
    for o in (0..cols).step_by(step) {
        let end = (o + step).min(cols);
        for (g, lanes) in xt.chunks_exact(in_dim * L).enumerate() {
            let mut at = o;
            while at < end {
                at += pass(passes, at, end - at, lanes, g * L, (lane_rows - g * L).min(L), y_lanes);
            }
        }
        if tail > 0 {
            for b in (o..end).step_by(L) {
                let n = (end - b).min(L);
                // where no pass reads the step, its tail asks for the next one
                let ask = if lane_rows == 0 { tail_weights.ahead(b, L, step, cols, in_dim) } else { &[] };
                tail_block(x_tail, weight_lanes::<L>(tail_weights, b, n, in_dim, &mut wt), ask, b..b + n, y_tail);
            }
        }
    }
}

/// The lanes a `Tiled` kernel's tail reads for weight rows `o..o + n` (`n <= L`, `o` a multiple of `L`): the copy's
/// block as it is, or the row-major rows transposed into `buf` (`in_dim · L` f32s; lanes past the last row zero).
#[cfg(target_arch = "x86_64")]
pub(super) fn weight_lanes<'a, const L: usize>(
    weights: Rows<'a>,
    o: usize,
    n: usize,
    in_dim: usize,
    buf: &'a mut [f32],
) -> &'a [f32] {
    let block = in_dim * L;
    match weights {
        Rows::Blocked { blocks, lanes } => {
            assert_eq!(lanes, L, "tiled: a copy in blocks of {lanes} for a kernel of {L} lanes");
            &blocks[o / L * block..(o / L + 1) * block]
        }
        Rows::RowMajor(w) => {
            transpose_rows::<L>(&w[o * in_dim..(o + n) * in_dim], n, in_dim, buf);
            buf
        }
    }
}

/// Where a `Tiled` kernel's `lane_sums` reads the rows it broadcasts (weight rows against x lanes, or the tail's x
/// rows against weight lanes): a row-major matrix, or a `TailBlocks` copy of the weights (row `r` is lane `r % L`
/// of block `r / L`, its elements `L` apart), so a pass can read the copy alone and leave the row-major weights
/// out of the cache.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub(super) enum Rows<'a> {
    RowMajor(&'a [f32]),
    Blocked { blocks: &'a [f32], lanes: usize },
}

#[cfg(target_arch = "x86_64")]
impl<'a> Rows<'a> {
    /// Whether these are `rows` rows of `in_dim` (a copy: at least its whole blocks).
    pub(super) fn hold(self, rows: usize, in_dim: usize) -> bool {
        match self {
            Rows::RowMajor(m) => m.len() == rows * in_dim,
            Rows::Blocked { blocks, lanes } => lanes > 0 && blocks.len() >= rows.div_ceil(lanes) * in_dim * lanes,
        }
    }

    /// What a pass (or a tail block) over rows `o..o + c` asks for as it goes: rows `o + step..o + step + c`, the
    /// same rows one walk step on (`tiled_steps`), none past row `cols` (a copy: past its last block). Row `r`'s f32s
    /// start at `r · in_dim` in both layouts (a copy's block of `L` rows is `L · in_dim` f32s), so the range is the
    /// same; the readers of one step ask for the whole next step between them.
    pub(super) fn ahead(self, o: usize, c: usize, step: usize, cols: usize, in_dim: usize) -> &'a [f32] {
        let (m, end) = match self {
            Rows::RowMajor(m) => (m, cols),
            Rows::Blocked { blocks, lanes } => (blocks, cols.next_multiple_of(lanes.max(1))),
        };
        let at = |r: usize| (r.min(end) * in_dim).min(m.len());
        &m[at(o + step)..at(o + step + c)]
    }

    /// Pointers to element 0 of rows `at..at + C` and the distance between a row's elements, every row's `in_dim`
    /// elements checked to lie inside the slice (so `lane_sums` reads them unchecked).
    pub(super) fn starts<const C: usize>(self, at: usize, in_dim: usize) -> ([*const f32; C], usize) {
        assert!(in_dim > 0, "tiled: empty rows");
        match self {
            Rows::RowMajor(m) => {
                assert!((at + C) * in_dim <= m.len(), "tiled: rows {at}..{} past the matrix", at + C);
                (std::array::from_fn(|j| m[(at + j) * in_dim..].as_ptr()), 1)
            }
            Rows::Blocked { blocks, lanes } => {
                let block = in_dim * lanes;
                assert!((at + C).div_ceil(lanes) * block <= blocks.len(), "tiled: rows {at}..{} past the copy", at + C);
                // row r's last element, (in_dim - 1) · lanes past its first, ends inside its block
                (std::array::from_fn(|j| blocks[(at + j) / lanes * block + (at + j) % lanes..].as_ptr()), lanes)
            }
        }
    }
}

/// The lines of `ask` (weight rows a later pass reads) asked into L2 by a `Tiled` kernel's `lane_sums` a share per
/// part as it goes, all of them by its `parts`-th part, none twice. The walk asked for a copy's next step in one burst
/// as each step started; spread over the first pass of x rows, each part asking a line or two, a 37-row expert (512
/// x 512 from memory, one thread) took 208 µs against 275, and row-major weights got the asks they had none of; over
/// the tail blocks where no pass runs, 11 rows took 62-68 µs against 123-126 (docs/engines.md, *A `Tiled` pass asks
/// for the next step's weights as it goes*).
#[cfg(target_arch = "x86_64")]
pub(super) struct AskSpread<'a> {
    ask: &'a [f32],
    lines: usize,
    per_part: usize,
    asked: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> AskSpread<'a> {
    pub(super) fn new(ask: &'a [f32], parts: usize) -> Self {
        let lines = ask.len().div_ceil(LANES);
        AskSpread { ask, lines, per_part: lines.div_ceil(parts.max(1)), asked: 0 }
    }

    /// Asks for part `nth`'s share (parts counted from 0 in the order they run).
    #[inline(always)]
    pub(super) fn part(&mut self, nth: usize) {
        let upto = ((nth + 1) * self.per_part).min(self.lines);
        while self.asked < upto {
            super::dot_tiles::ask(self.ask, &mut self.asked, upto);
        }
    }
}

/// Writes the first `lanes` lanes of each of the `C` weight rows' sums (`sums[j][i]`: x row `r0 + i`, weight row
/// `o + j`) into `y` (rows of `cols`); returns `C`, the weight rows placed.
#[cfg(target_arch = "x86_64")]
pub(super) fn place_lanes<const C: usize, const L: usize>(
    sums: [[f32; L]; C],
    y: &mut [f32],
    cols: usize,
    r0: usize,
    lanes: usize,
    o: usize,
) -> usize {
    for (j, lane_sums) in sums.iter().enumerate() {
        for (i, v) in lane_sums[..lanes].iter().enumerate() {
            y[(r0 + i) * cols + o + j] = *v;
        }
    }
    C
}

/// Writes a `Tiled` tail's sums (`sums[r][j]`: tail x row `r`, weight row `w.start + j`) into `y` (the tail's rows,
/// of `cols`), the block's lanes past `w` left out.
#[cfg(target_arch = "x86_64")]
pub(super) fn place_tail<const L: usize>(sums: &[[f32; L]], y: &mut [f32], cols: usize, w: std::ops::Range<usize>) {
    for (r, row_sums) in sums.iter().enumerate() {
        y[r * cols + w.start..r * cols + w.end].copy_from_slice(&row_sums[..w.len()]);
    }
}

/// A SIMD `Tiled` matmul (`matmul_avx512::tiled`, `matmul_avx2::tiled`; lanes over x rows, the last few rows
/// over weight rows): x, rows, the weights (row-major, or their `TailBlocks` copy from the task's first row on),
/// cols, in_dim, parts, y.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
type TiledKernel = unsafe fn(&[f32], usize, TiledWeights, usize, usize, usize, &mut [f32]);

/// A `Tiled` kernel's weights: row-major, and their `TailBlocks` copy (from the task's first row on) where the
/// caller built one, which the tail reads instead of transposing.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub(super) struct TiledWeights<'a> {
    pub(super) row_major: &'a [f32],
    pub(super) copy: Option<Rows<'a>>,
}

#[cfg(target_arch = "x86_64")]
impl<'a> TiledWeights<'a> {
    /// What the x-lane passes broadcast: the copy when the tail reads it too or a single pass reads the weights
    /// once (one matrix from memory, not two), the row-major weights when several passes with no tail reread them
    /// from the cache, where broadcasting from the copy ran slower. Measured on a 2-core AVX-512 EPYC, weights from
    /// DRAM: 256 x 256 at 16 / 21 / 40 x rows 48 / 58 / 61 µs from the copy against 58 / 88 / 80 row-major; 512 x
    /// 512 at 128 parts, 64 / 128 rows, 360-374 / 698-704 against 343-360 / 637-645.
    pub(super) fn passes(&self, tail: bool, single_pass: bool) -> Rows<'a> {
        match self.copy {
            Some(copy) if tail || single_pass => copy,
            _ => Rows::RowMajor(self.row_major),
        }
    }

    /// Whether these are `cols` weight rows of `in_dim` (the copy, if any, too).
    pub(super) fn hold(&self, cols: usize, in_dim: usize) -> bool {
        self.row_major.len() == cols * in_dim && self.copy.is_none_or(|c| c.hold(cols, in_dim))
    }

    /// What the tail reads its blocks from.
    pub(super) fn tail(&self) -> Rows<'a> {
        self.copy.unwrap_or(Rows::RowMajor(self.row_major))
    }
}

/// The SIMD `Tiled` kernel this CPU runs and its lanes (AVX-512: 16, AVX2: 8); `None` on the portable path.
#[cfg(target_arch = "x86_64")]
fn simd_tiled() -> Option<(TiledKernel, usize)> {
    if std::arch::is_x86_feature_detected!("avx512f") {
        Some((super::matmul_avx512::tiled, 16))
    } else if std::arch::is_x86_feature_detected!("avx2") {
        Some((super::matmul_avx2::tiled, 8))
    } else {
        None
    }
}

/// The lanes of the SIMD `Tiled` kernel this CPU runs (what a `TailBlocks` copy is blocked by).
pub(super) fn simd_tiled_lanes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    return simd_tiled().map(|(_, lanes)| lanes);
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `y[r, o] = dot(x[r, :], w[o, :])` for `rows` rows, with the invariant reduction.
pub fn matmul(x: &[f32], rows: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32]) {
    matmul_with(Reduction::Invariant, x, rows, w, out_dim, in_dim, y)
}

/// `matmul` with an explicit reduction order.
pub fn matmul_with(red: Reduction, x: &[f32], rows: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32]) {
    matmul_with_tail(red, x, rows, w, None, out_dim, in_dim, y, &[])
}

/// `matmul_with`, where a `Tiled` reduction's tail reads `tail` (`w` copied at load in its layout) instead of
/// transposing `w`'s blocks per call, and its x-lane passes too where that spares reading `w` as well: the same
/// bits either way. An `Invariant` reduction ignores it, and asks for the first lines of `then` (the weights the
/// caller multiplies next, or none) on one thread or when every thread walks all of `w`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with_tail(
    red: Reduction,
    x: &[f32],
    rows: usize,
    w: &[f32],
    tail: Option<&TailBlocks>,
    out_dim: usize,
    in_dim: usize,
    y: &mut [f32],
    then: &[f32],
) {
    assert_eq!(x.len(), rows * in_dim, "matmul: x is not rows x in");
    assert_eq!(w.len(), out_dim * in_dim, "matmul: w is not out x in");
    assert_eq!(y.len(), rows * out_dim, "matmul: y is not rows x out");
    super::work::count(2 * rows * out_dim * in_dim, 4 * out_dim * in_dim);
    if let Reduction::Tiled(parts) = red {
        // the deliberately shape-dependent path: every element in `dot_tiled`'s order
        #[cfg(target_arch = "x86_64")]
        if let Some((kernel, lanes)) = simd_tiled().filter(|_| in_dim > 0) {
            if let Some(t) = tail {
                assert!(
                    (t.lanes, t.out_dim, t.in_dim) == (lanes, out_dim, in_dim),
                    "matmul: tail blocks of {} x {} in {} lanes for a {out_dim} x {in_dim} matrix in {lanes}",
                    t.out_dim,
                    t.in_dim,
                    t.lanes
                );
            }
            // weight rows split among the threads (a short prefill chunk has few x rows), each task's outputs in
            // their own buffer, then placed; every element through the SIMD kernel (the same bits). Tasks start at
            // multiples of 16 weight rows: whole blocks of the tail copy.
            let tasks = if rows * out_dim * in_dim >= PARALLEL_MIN_WORK { rayon::current_num_threads() } else { 1 };
            let per = out_dim.div_ceil(tasks.max(1)).next_multiple_of(16).max(16);
            let outs: Vec<Vec<f32>> = w
                .par_chunks(per * in_dim)
                .enumerate()
                .map(|(t, wb)| {
                    let cols = wb.len() / in_dim;
                    let mut out = vec![0.0; rows * cols];
                    // the copy where there is one: the passes and the tail then read one matrix between them
                    let copy = tail.map(|b| Rows::Blocked { blocks: b.blocks_from(t * per), lanes });
                    let weights = TiledWeights { row_major: wb, copy };
                    // SAFETY: the CPU has the kernel's features (detected above); x is rows x in_dim, the weights
                    // cols x in_dim (a copy in the kernel's lanes, asserted), out rows x cols, in_dim > 0
                    #[allow(unsafe_code)]
                    unsafe {
                        kernel(x, rows, weights, cols, in_dim, parts, &mut out)
                    };
                    out
                })
                .collect();
            place_column_blocks(&outs, rows, per, y, out_dim);
            return;
        }
        // without AVX2: rows in parallel
        let row = |(xr, yr): (&[f32], &mut [f32])| tiled_row(xr, w, in_dim, parts, yr);
        if rows > 1 && rows * out_dim * in_dim >= PARALLEL_MIN_WORK {
            x.par_chunks_exact(in_dim).zip(y.par_chunks_exact_mut(out_dim)).for_each(row);
        } else {
            x.chunks_exact(in_dim).zip(y.chunks_exact_mut(out_dim)).for_each(row);
        }
        return;
    }
    invariant(x, rows, w, out_dim, in_dim, y, then);
}

/// `Reduction::Invariant`'s matmul, split between the threads by rows or by output columns, its work not counted
/// (for callers that count it themselves: `qmatmul` of F32 weights).
pub(super) fn invariant(x: &[f32], rows: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32], then: &[f32]) {
    if in_dim == 0 {
        // every dot product is empty: the fixed sum of zero lanes
        y.fill(0.0);
        return;
    }
    let threads = rayon::current_num_threads();
    let task_work = if rows < 4 { DECODE_TASK_WORK } else { TASK_WORK };
    let tasks = (rows * out_dim * in_dim / task_work).min(4 * threads);
    if threads < 2 || tasks < 2 {
        block_invariant(x, w, in_dim, y, out_dim, then);
    } else if rows >= ROWS_PER_TASK * threads {
        // many rows: whole 4-row blocks per task, each task walks weight tiles over its rows (every task reads all
        // the weights, so each takes enough rows to reuse them)
        let tasks = tasks.min(rows / ROWS_PER_TASK);
        let per = rows.div_ceil(tasks).next_multiple_of(4);
        x.par_chunks(per * in_dim).zip(y.par_chunks_mut(per * out_dim)).for_each(|(xb, yb)| {
            block_invariant(xb, w, in_dim, yb, out_dim, then);
        });
    } else {
        // few rows (decode, a short segment): split the weight rows (output columns) instead, whole tiles of 16
        let per = out_dim.div_ceil(tasks).next_multiple_of(16);
        if rows == 1 {
            let mut tasks: Vec<(&[f32], &mut [f32])> = w.chunks(per * in_dim).zip(y.chunks_mut(per)).collect();
            crate::decode_team::for_each_mut(&mut tasks, |(wb, yb)| block_invariant(x, wb, in_dim, yb, yb.len(), &[]));
        } else {
            column_blocks_side_by_side(in_dim, &mut [(x, w, y)]);
        }
    }
}

/// Several matmuls of one input width in `Reduction::Invariant`'s order, side by side: each job `(x, w, y)` is
/// `y = x · wᵀ` over its own rows. Every matrix is cut into the column blocks `matmul_with` would give it, and all
/// the blocks go to the pool at once (a decode step's team where this thread leads one): a mixture's active experts,
/// a few rows each, then share their reading evenly between the threads instead of one expert a thread. Each `y`
/// is bitwise what `matmul_with(Reduction::Invariant, ..)` gives it alone.
pub fn matmuls_invariant(in_dim: usize, jobs: &mut [(&[f32], &[f32], &mut [f32])]) {
    for (x, w, _) in jobs.iter() {
        let (rows, out_dim) = (x.len() / in_dim.max(1), w.len() / in_dim.max(1));
        super::work::count(2 * rows * out_dim * in_dim, 4 * out_dim * in_dim);
    }
    column_blocks_side_by_side(in_dim, jobs);
}

/// `matmuls_invariant` without counting the work (`matmul_with_tail`'s few-row path, which has counted it): every
/// matrix cut into the column blocks of `DECODE_TASK_WORK` (fewer than four rows) or `TASK_WORK`, at most four a
/// thread, all of them through the team (or rayon outside a step), each block's outputs placed in its job's `y`.
pub(super) fn column_blocks_side_by_side(in_dim: usize, jobs: &mut [(&[f32], &[f32], &mut [f32])]) {
    let threads = rayon::current_num_threads();
    let mut blocks: Vec<(usize, &[f32])> = Vec::new();
    let mut pers = Vec::with_capacity(jobs.len());
    let (xs, ws): (Vec<&[f32]>, Vec<&[f32]>) = jobs.iter().map(|(x, w, _)| (*x, *w)).unzip();
    for (m, (_, _, y)) in jobs.iter_mut().enumerate() {
        let (x, w) = (xs[m], ws[m]);
        let rows = x.len() / in_dim.max(1);
        let out_dim = w.len() / in_dim.max(1);
        assert_eq!(x.len(), rows * in_dim, "matmul: x is not rows x in");
        assert_eq!(w.len(), out_dim * in_dim, "matmul: w is not out x in");
        assert_eq!(y.len(), rows * out_dim, "matmul: y is not rows x out");
        if in_dim == 0 || out_dim == 0 || rows == 0 {
            y.fill(0.0); // every dot product is empty: the fixed sum of zero lanes
            pers.push(1);
            continue;
        }
        let task_work = if rows < 4 { DECODE_TASK_WORK } else { TASK_WORK };
        let tasks = (rows * out_dim * in_dim / task_work).clamp(1, 4 * threads);
        let per = out_dim.div_ceil(tasks).next_multiple_of(16);
        pers.push(per);
        blocks.extend(w.chunks(per * in_dim).map(|wb| (m, wb)));
    }
    let parts: Vec<Vec<f32>> = crate::decode_team::map(&blocks, |&(m, wb)| {
        let x = xs[m];
        let n = wb.len() / in_dim;
        let mut out = vec![0.0; x.len() / in_dim * n];
        block_invariant(x, wb, in_dim, &mut out, n, &[]);
        out
    });
    let mut start = 0;
    for (m, (_, _, y)) in jobs.iter_mut().enumerate() {
        let count = blocks[start..].iter().take_while(|(bm, _)| *bm == m).count();
        if count > 0 {
            place_column_blocks(&parts[start..start + count], xs[m].len() / in_dim, pers[m], y, ws[m].len() / in_dim);
        }
        start += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::random;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// A row's output is bitwise the same alone, inside a batch of any size, and at any place in it.
        #[test]
        fn matmul_is_batch_invariant(
            rows in 1usize..70, out_dim in 1usize..80, in_dim in 1usize..90, pick in any::<prop::sample::Index>(), seed in any::<u64>()
        ) {
            let x = random(rows * in_dim, seed);
            let w = random(out_dim * in_dim, seed ^ 1);
            let mut y = vec![0.0; rows * out_dim];
            matmul(&x, rows, &w, out_dim, in_dim, &mut y);
            let r = pick.index(rows);
            let mut alone = vec![0.0; out_dim];
            matmul(&x[r * in_dim..(r + 1) * in_dim], 1, &w, out_dim, in_dim, &mut alone);
            prop_assert_eq!(
                alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y[r * out_dim..(r + 1) * out_dim].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// The order `dot` promises, spelled out one scalar at a time.
    fn dot_reference(a: &[f32], b: &[f32]) -> f32 {
        let full = a.len() / LANES * LANES;
        let mut acc = [0.0f32; LANES];
        for k in (0..full).step_by(LANES) {
            for l in 0..LANES {
                acc[l] = a[k + l].mul_add(b[k + l], acc[l]);
            }
        }
        let h: Vec<f32> = (0..8).map(|l| acc[l] + acc[l + 8]).collect();
        let mut s = ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
        for k in full..a.len() {
            s = a[k].mul_add(b[k], s);
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn dot_and_dot4_follow_the_fixed_order(n in 0usize..300, seed in any::<u64>()) {
            let a = random(n, seed);
            let b = random(4 * n, seed ^ 3);
            let rows: [&[f32]; 4] = std::array::from_fn(|j| &b[j * n..(j + 1) * n]);
            let four = dot4(&a, rows);
            for (j, r) in rows.iter().enumerate() {
                let want = dot_reference(&a, r).to_bits();
                prop_assert_eq!(dot(&a, r).to_bits(), want);
                prop_assert_eq!(four[j].to_bits(), want);
            }
        }
    }

    /// Every element of the invariant matmul, bitwise, against `dot` on the same two rows.
    fn assert_matches_dot(rows: usize, out_dim: usize, in_dim: usize, seed: u64) {
        let x = random(rows * in_dim, seed);
        let w = random(out_dim * in_dim, seed ^ 9);
        let mut y = vec![f32::NAN; rows * out_dim];
        matmul(&x, rows, &w, out_dim, in_dim, &mut y);
        for r in 0..rows {
            for o in 0..out_dim {
                let e = dot(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim]);
                assert_eq!(y[r * out_dim + o].to_bits(), e.to_bits(), "{rows}x{out_dim}x{in_dim}: y[{r}, {o}]");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The weights a matmul asks for after its own (`then`: a next matrix longer or shorter than a tile, or
        /// none) change no output bit, whatever tiles and passes the rows take.
        #[test]
        fn asking_for_the_next_weights_changes_no_bit(
            rows in 5usize..14, out_dim in 1usize..40, in_dim in prop_oneof![1usize..80, 250usize..300],
            then_rows in 0usize..80, seed in any::<u64>()
        ) {
            let (x, w) = (random(rows * in_dim, seed), random(out_dim * in_dim, seed ^ 9));
            let then = random(then_rows * in_dim, seed ^ 3);
            let (mut alone, mut asking) = (vec![f32::NAN; rows * out_dim], vec![f32::NAN; rows * out_dim]);
            block_invariant(&x, &w, in_dim, &mut alone, out_dim, &[]);
            block_invariant(&x, &w, in_dim, &mut asking, out_dim, &then);
            let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&asking), bits(&alone));
            matmul(&x, rows, &w, out_dim, in_dim, &mut alone);
            prop_assert_eq!(bits(&asking), bits(&alone));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The register-blocked kernel computes every element exactly as `dot` does: widths that are not a multiple
        /// of 16, row counts that are not a multiple of 4 and odd column counts included.
        #[test]
        fn blocked_matmul_is_dot_elementwise(
            rows in 1usize..14, out_dim in 1usize..24, in_dim in 0usize..80, seed in any::<u64>()
        ) {
            assert_matches_dot(rows, out_dim, in_dim, seed);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The tile kernel the CPU runs (AVX-512 where it has it) gives the portable loop's bits, for every tile
        /// shape the matmul uses: a machine without AVX-512 computes the same outputs.
        #[test]
        fn simd_tiles_match_the_portable_loop(chunks in 0usize..40, seed in any::<u64>()) {
            let v = random(8 * chunks * LANES, seed);
            let rows: Vec<&[Lanes]> = v.as_chunks::<LANES>().0.chunks(chunks.max(1)).collect();
            let row = |i: usize| if chunks == 0 { &[][..] } else { rows[i] };
            let x: [&[Lanes]; 4] = std::array::from_fn(row);
            let w: [&[Lanes]; 4] = std::array::from_fn(|j| row(4 + j));
            prop_assert_eq!(acc_tile(x, w), acc_tile_portable(x, w));
            prop_assert_eq!(acc_tile([x[0]], w), acc_tile_portable([x[0]], w));
            prop_assert_eq!(acc_tile([x[1]], [w[2]]), acc_tile_portable([x[1]], [w[2]]));
        }
    }

    #[test]
    fn blocked_matmul_is_dot_on_every_path() {
        // (rows, out, in): serial; one row split over columns; few rows split over columns and scattered, with
        // several weight tiles (odd last tile); many rows split over threads, leftover rows and an odd column
        for (rows, out_dim, in_dim) in [(5, 9, 37), (1, 517, 1031), (11, 45, 2053), (3, 301, 900), (64, 67, 259)] {
            assert_matches_dot(rows, out_dim, in_dim, (rows * 131 + out_dim * 7 + in_dim) as u64);
        }
    }

    #[test]
    fn invariant_across_parallel_paths() {
        // large enough to take both parallel branches
        let (in_dim, out_dim) = (256, 300);
        let x = random(64 * in_dim, 3);
        let w = random(out_dim * in_dim, 4);
        let mut big = vec![0.0; 64 * out_dim];
        matmul(&x, 64, &w, out_dim, in_dim, &mut big);
        for r in [0, 17, 63] {
            let mut one = vec![0.0; out_dim];
            matmul(&x[r * in_dim..(r + 1) * in_dim], 1, &w, out_dim, in_dim, &mut one);
            assert!(one.iter().zip(&big[r * out_dim..(r + 1) * out_dim]).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The `Tiled` matmul computes every element exactly as `dot_tiled` does, whatever the blocking (x rows past
        /// one block of sixteen lanes, weight rows in passes of 16, 8 and 1).
        #[test]
        fn tiled_matmul_is_dot_tiled_elementwise(
            rows in 1usize..40, out_dim in 1usize..40, in_dim in 1usize..300, parts in 1usize..70, seed in any::<u64>()
        ) {
            let x = random(rows * in_dim, seed);
            let w = random(out_dim * in_dim, seed ^ 7);
            let mut y = vec![0.0; rows * out_dim];
            matmul_with(Reduction::Tiled(parts), &x, rows, &w, out_dim, in_dim, &mut y);
            for r in 0..rows {
                for o in 0..out_dim {
                    let e = dot_tiled(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim], parts);
                    prop_assert_eq!(y[r * out_dim + o].to_bits(), e.to_bits());
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The AVX2 `Tiled` kernel on its own (a machine with AVX-512 runs that one instead, but has AVX2 too):
        /// `dot_tiled`'s bits for every element, x rows past a whole pass of lanes included.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx2_tiled_matmul_is_dot_tiled_elementwise(
            rows in 1usize..20, out_dim in 1usize..20, in_dim in 1usize..200, parts in 1usize..70, seed in any::<u64>()
        ) {
            if !std::arch::is_x86_feature_detected!("avx2") {
                return Ok(());
            }
            let x = random(rows * in_dim, seed);
            let w = random(out_dim * in_dim, seed ^ 7);
            let mut y = vec![0.0; rows * out_dim];
            // SAFETY: the CPU has AVX2 (checked above); the shapes match and in_dim > 0
            #[allow(unsafe_code)]
            unsafe {
                let weights = TiledWeights { row_major: &w, copy: None };
                crate::kernels::matmul_avx2::tiled(&x, rows, weights, out_dim, in_dim, parts, &mut y)
            };
            for r in 0..rows {
                for o in 0..out_dim {
                    let e = dot_tiled(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim], parts);
                    prop_assert_eq!(y[r * out_dim + o].to_bits(), e.to_bits());
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// A `Tiled` matmul whose tail reads the weights' `TailBlocks` (built once) gives `dot_tiled`'s bits as the
        /// per-call transposes do: x rows that leave a tail of every length, weight rows past a whole block, and
        /// matrices large enough to split among tasks (each task reading the copy from its own first row). The AVX2
        /// kernel with its own eight-lane copy too.
        #[test]
        fn tiled_matmul_with_tail_blocks_is_dot_tiled_elementwise(
            rows in 1usize..40, out_dim in 1usize..80, in_dim in 1usize..300, parts in 1usize..70, seed in any::<u64>()
        ) {
            let x = random(rows * in_dim, seed);
            let w = random(out_dim * in_dim, seed ^ 7);
            let expect = |r: usize, o: usize| {
                dot_tiled(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim], parts).to_bits()
            };
            let blocks = TailBlocks::of(&w, out_dim, in_dim);
            let mut y = vec![0.0; rows * out_dim];
            matmul_with_tail(Reduction::Tiled(parts), &x, rows, &w, blocks.as_ref(), out_dim, in_dim, &mut y, &[]);
            for r in 0..rows {
                for o in 0..out_dim {
                    prop_assert_eq!(y[r * out_dim + o].to_bits(), expect(r, o), "row {} col {}", r, o);
                }
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let eights = TailBlocks::with_lanes::<8>(&w, out_dim, in_dim);
                let mut y = vec![0.0; rows * out_dim];
                // SAFETY: the CPU has AVX2 (checked); the shapes match, in_dim > 0, the copy is in blocks of eight
                #[allow(unsafe_code)]
                unsafe {
                    let copy = Some(Rows::Blocked { blocks: eights.blocks_from(0), lanes: 8 });
                    let weights = TiledWeights { row_major: &w, copy };
                    crate::kernels::matmul_avx2::tiled(&x, rows, weights, out_dim, in_dim, parts, &mut y)
                };
                for r in 0..rows {
                    for o in 0..out_dim {
                        prop_assert_eq!(y[r * out_dim + o].to_bits(), expect(r, o), "AVX2: row {} col {}", r, o);
                    }
                }
            }
        }
    }

    /// Tail blocks of another matrix's shape are refused, not read past.
    #[test]
    fn tail_blocks_of_another_shape_are_refused() {
        let w = random(32 * 20, 1);
        // without a SIMD `Tiled` kernel there is no copy to pass
        let Some(blocks) = TailBlocks::of(&w, 32, 20) else { return };
        let refused = std::panic::catch_unwind(|| {
            let (x, other) = (random(3 * 40, 2), random(16 * 40, 3));
            let mut y = vec![0.0; 3 * 16];
            matmul_with_tail(Reduction::Tiled(4), &x, 3, &other, Some(&blocks), 16, 40, &mut y, &[]);
        });
        let message = refused.expect_err("a copy of a 32 x 20 matrix passed for a 16 x 40 one");
        let text = message.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        assert!(text.contains("tail blocks of 32 x 20"), "{text}");
    }

    /// The SIMD `Tiled` kernels start each part from its first product and the total from the first part where
    /// `dot_tiled` adds them to -0.0: the same bits for signed zeros, infinities and NaNs too, through the x-lane
    /// passes (sixteen rows) and the tail (the seventeenth).
    #[test]
    fn tiled_kernels_keep_dot_tileds_bits_on_zeros_infinities_and_nans() {
        let special = [-0.0, 0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-45, 3e38, -2.5];
        let pick = |n: usize, salt: usize| -> Vec<f32> {
            (0..n).map(|i| special[(i * 7 + salt * 3 + i / 5) % special.len()]).collect()
        };
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let (rows, out_dim, in_dim) = (17, 17, 12);
        // all -0.0 products (the sum stays -0.0), all +0.0 (it is +0.0), then the mixture
        let cases = [
            (vec![-0.0; rows * in_dim], vec![1.0; out_dim * in_dim]),
            (vec![0.0; rows * in_dim], vec![1.0; out_dim * in_dim]),
            (pick(rows * in_dim, 1), pick(out_dim * in_dim, 2)),
        ];
        for (x, w) in &cases {
            for parts in [1, 3, 5, 12] {
                let mut y = vec![0.0; rows * out_dim];
                matmul_with(Reduction::Tiled(parts), x, rows, w, out_dim, in_dim, &mut y);
                #[cfg(target_arch = "x86_64")]
                let y2 = std::arch::is_x86_feature_detected!("avx2").then(|| {
                    let mut y2 = vec![0.0; rows * out_dim];
                    // SAFETY: the CPU has AVX2 (checked); the shapes match and in_dim > 0
                    #[allow(unsafe_code)]
                    unsafe {
                        crate::kernels::matmul_avx2::tiled(
                            x,
                            rows,
                            TiledWeights { row_major: w, copy: None },
                            out_dim,
                            in_dim,
                            parts,
                            &mut y2,
                        )
                    };
                    y2
                });
                #[cfg(not(target_arch = "x86_64"))]
                let y2: Option<Vec<f32>> = None;
                for r in 0..rows {
                    for o in 0..out_dim {
                        let e = dot_tiled(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim], parts);
                        let at = r * out_dim + o;
                        assert!(same(y[at], e), "row {r} col {o} parts {parts}: {} vs dot_tiled {e}", y[at]);
                        if let Some(y2) = &y2 {
                            assert!(same(y2[at], e), "AVX2: row {r} col {o} parts {parts}: {} vs {e}", y2[at]);
                        }
                    }
                }
            }
        }
    }

    /// Each row's bits of `dot` against every weight row, `out_dim` of them.
    fn dot_bits(x: &[f32], w: &[f32], in_dim: usize) -> Vec<u32> {
        x.chunks_exact(in_dim).flat_map(|xr| w.chunks_exact(in_dim).map(|wr| dot(xr, wr).to_bits())).collect()
    }

    /// Inside a decode step's team (few rows split by columns among the team, two to four of them read a key once
    /// for all) and outside it, a matmul of one to five rows gives every element `dot`'s bits, at shapes large
    /// enough to be split and with a tail past the whole chunks.
    #[test]
    fn few_row_matmuls_keep_dots_bits_inside_a_step_and_outside() {
        for (out_dim, in_dim) in [(300, 520), (70, 37), (1024, 512)] {
            let w = random(out_dim * in_dim, out_dim as u64);
            for rows in 1..=5 {
                let x = random(rows * in_dim, rows as u64);
                let want = dot_bits(&x, &w, in_dim);
                let run = || {
                    let mut y = vec![0.0; rows * out_dim];
                    matmul(&x, rows, &w, out_dim, in_dim, &mut y);
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                assert_eq!(run(), want, "{rows} x {in_dim} x {out_dim} outside a step");
                assert_eq!(crate::decode_team::run(run), want, "{rows} x {in_dim} x {out_dim} inside a step");
            }
        }
    }

    /// Several matmuls side by side (`matmuls_invariant`), each with its own rows (none, one, a few, many) and
    /// matrix: each output is bitwise its own matmul alone, inside a decode step's team and outside.
    #[test]
    fn side_by_side_matmuls_give_each_its_own_bits() {
        let in_dim = 96;
        let shapes = [(0usize, 40usize), (1, 700), (2, 64), (3, 33), (7, 128), (40, 48)];
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(r, o)| random(r * in_dim, (r * 31 + o) as u64)).collect();
        let ws: Vec<Vec<f32>> = shapes.iter().map(|&(r, o)| random(o * in_dim, (r + o * 7) as u64)).collect();
        let want: Vec<Vec<u32>> = xs.iter().zip(&ws).map(|(x, w)| dot_bits(x, w, in_dim)).collect();
        let run = || {
            let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(r, o)| vec![f32::NAN; r * o]).collect();
            let mut jobs: Vec<(&[f32], &[f32], &mut [f32])> = xs
                .iter()
                .zip(&ws)
                .zip(&mut ys)
                .map(|((x, w), y)| (x.as_slice(), w.as_slice(), y.as_mut_slice()))
                .collect();
            matmuls_invariant(in_dim, &mut jobs);
            ys.iter().map(|y| y.iter().map(|v| v.to_bits()).collect()).collect::<Vec<Vec<u32>>>()
        };
        assert_eq!(run(), want, "outside a step");
        assert_eq!(crate::decode_team::run(run), want, "inside a step");
    }

    /// Both SIMD `Tiled` kernels' parts of four and eight (loops with a constant trip count) and their parts of
    /// other lengths, each with the walk's asks for the next step (more weight rows than a step) and without, through
    /// x-lane passes and tails: `dot_tiled`'s bits, a short last part included (30 = 7 x 4 + 2, 37 = 9 x 4 + 1, 61 =
    /// 7 x 8 + 5). Each kernel runs where the CPU has its features (AVX-512 ones run the AVX2 kernel too).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_tiled_parts_of_four_and_of_others_keep_dot_tileds_bits() {
        type Kernel = unsafe fn(&[f32], usize, TiledWeights, usize, usize, usize, &mut [f32]);
        let mut kernels: Vec<(&str, Kernel)> = vec![];
        if std::arch::is_x86_feature_detected!("avx2") {
            kernels.push(("avx2", crate::kernels::matmul_avx2::tiled));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            kernels.push(("avx512", crate::kernels::matmul_avx512::tiled));
        }
        for (name, kernel) in kernels {
            for (in_dim, parts) in [(64, 16), (30, 8), (37, 10), (64, 8), (61, 8), (64, 11), (37, 3)] {
                // AVX-512: 35 rows are two passes and a tail of three, 27 rows two passes (eleven left is past its
                // tail), 19 a pass and a tail; AVX2: passes of eight and tails of up to six
                for (rows, out_dim) in [(35, 40), (27, 17), (19, 53), (8, 24), (3, 7)] {
                    let x = random(rows * in_dim, (in_dim * rows) as u64);
                    let w = random(out_dim * in_dim, out_dim as u64);
                    let mut y = vec![0.0; rows * out_dim];
                    // SAFETY: the CPU has the kernel's features (checked above); the shapes match and in_dim > 0
                    #[allow(unsafe_code)]
                    unsafe {
                        let weights = TiledWeights { row_major: &w, copy: None };
                        kernel(&x, rows, weights, out_dim, in_dim, parts, &mut y)
                    };
                    for (i, got) in y.iter().enumerate() {
                        let (r, o) = (i / out_dim, i % out_dim);
                        let e = dot_tiled(&x[r * in_dim..(r + 1) * in_dim], &w[o * in_dim..(o + 1) * in_dim], parts);
                        assert_eq!(
                            got.to_bits(),
                            e.to_bits(),
                            "{name}: {rows} x {out_dim} x {in_dim} in {parts} parts: [{r}, {o}]"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tiled_reduction_changes_bits() {
        let a = random(4096, 5);
        let b = random(4096, 6);
        let parts: Vec<u32> = [1, 2, 3, 5, 8, 16].iter().map(|&p| dot_tiled(&a, &b, p).to_bits()).collect();
        let distinct: std::collections::BTreeSet<_> = parts.iter().collect();
        assert!(distinct.len() > 1, "different tilings must round differently on some shapes");
    }

    /// The passes over one walk step's rows (or, where no pass runs, the tail's blocks) ask, between them, for
    /// exactly the next step's f32s in either layout, and for nothing past the weights (a copy: past its last block):
    /// AVX-512's steps of sixteen rows (passes of eight, tail blocks of sixteen), AVX2's of 24 (six, eight).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_steps_readers_ask_for_the_next_step_and_nothing_past_the_weights() {
        let (cols, in_dim) = (44usize, 3usize);
        let row_major: Vec<f32> = (0..cols * in_dim).map(|i| i as f32).collect();
        for (step, c, lanes) in [(16, 8, 16), (16, 16, 16), (24, 6, 8), (24, 8, 8)] {
            let blocks: Vec<f32> = (0..cols.next_multiple_of(lanes) * in_dim).map(|i| i as f32).collect();
            let layouts = [
                (Rows::RowMajor(&row_major), row_major.len()),
                (Rows::Blocked { blocks: &blocks, lanes }, blocks.len()),
            ];
            for (rows, len) in layouts {
                for o in (0..cols).step_by(step) {
                    let asked: Vec<f32> = (o..(o + step).min(cols))
                        .step_by(c)
                        .flat_map(|s| rows.ahead(s, c, step, cols, in_dim).iter().copied())
                        .collect();
                    let next = ((o + step) * in_dim).min(len)..((o + 2 * step) * in_dim).min(len);
                    let expect: Vec<f32> = next.map(|i| i as f32).collect();
                    assert_eq!(asked, expect, "{rows:?}: the step from row {o}, {c} rows a reader");
                }
            }
        }
    }

    /// A spread asks for every line of its rows by its last part, a share per part, and none twice.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_spread_asks_every_line_once_by_its_last_part() {
        for (len, parts) in [(0, 5), (1, 1), (16, 128), (100, 3), (8192, 128), (8200, 7), (40, 0)] {
            let f32s = vec![0.0f32; len];
            let mut spread = AskSpread::new(&f32s, parts);
            let mut before = 0;
            for nth in 0..parts.max(1) {
                spread.part(nth);
                assert!(spread.asked >= before && spread.asked - before <= spread.per_part, "{len} f32s, part {nth}");
                before = spread.asked;
            }
            assert_eq!(spread.asked, len.div_ceil(LANES), "{len} f32s over {parts} parts");
        }
    }
}
