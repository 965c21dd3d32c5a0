//! glm53's `Tiled` matmul on AVX2 (no AVX-512): `matmul_avx512::tiled` with eight x rows in the lanes of a ymm
//! register instead of sixteen, against six weight rows at a time (six part sums and six totals in registers).
//! The x rows left after whole passes of eight (a short segment's MoE expert sees ~11 rows: three left; decode
//! one) take the lanes the other way: eight weight rows, transposed per block, against each x row broadcast, so
//! no lane runs empty.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::{part_len, place_lanes, place_tail, tail_rows_left, tiled_steps, AskSpread, Rows, TiledWeights};

/// X rows a `tiled` pass holds side by side: one per lane.
const TILED_LANES: usize = 8;
/// Weight rows a pass takes at once: six part sums, six totals, the x lanes and a broadcast weight fit sixteen
/// registers.
const WIDE: usize = 6;
/// X rows left after the passes of eight that run over weight lanes instead: up to six, where by instruction count
/// transposing each block of eight weight rows (a few shuffles per element) plus full lanes costs less than an
/// x-lane pass with two or more of its eight lanes empty (measured: three left 30-40% faster, five left even).
const TAIL_ROWS: usize = 6;
/// Weight rows the walk takes a step at a time (`tiled_steps`): four passes of six, three blocks of eight.
const STEP: usize = 24;

/// The `Tiled` matmul, `y[r, o] = dot_tiled(x[r], w[o], parts)`: the lanes over eight x rows (copied transposed
/// once per call), the last one to six x rows over eight weight rows (`tail_rows`; the weights' `TailBlocks` copy
/// where the caller built one, as on AVX-512), each lane in `dot_tiled`'s
/// order (the parts last to first, within a part `k` ascending, each step a multiply then an add, every sum from
/// -0.0), so the bits are the portable path's.
///
/// # Safety
/// The CPU has AVX2; `x` is `rows x in_dim`, `weights` are `cols` weight rows of `in_dim` (a copy in blocks of
/// eight), `y` is `rows x cols`, and `in_dim > 0`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tiled(
    x: &[f32],
    rows: usize,
    weights: TiledWeights,
    cols: usize,
    in_dim: usize,
    parts: usize,
    y: &mut [f32],
) {
    assert!(in_dim > 0 && x.len() == rows * in_dim && weights.hold(cols, in_dim) && y.len() == rows * cols);
    let step = part_len(in_dim, parts);
    let tail = tail_rows_left(rows, TILED_LANES, TAIL_ROWS);
    let pass = |passes: Rows, o: usize, left: usize, xt: &[f32], r0: usize, lanes: usize, y: &mut [f32]| {
        // weight rows `o..o + C` against the x lanes, row-major (elements 1 apart) or a copy's (eight); the first
        // pass over a step asks for the same rows of the next step
        macro_rules! pass {
            ($c:expr) => {{
                let ask = if r0 == 0 { passes.ahead(o, $c, STEP, cols, in_dim) } else { &[] };
                match passes {
                    Rows::RowMajor(_) => lane_sums::<$c, 1>(passes, o, xt, in_dim, step, ask),
                    Rows::Blocked { .. } => lane_sums::<$c, TILED_LANES>(passes, o, xt, in_dim, step, ask),
                }
            }};
        }
        // SAFETY (each arm): the CPU has AVX2; weight rows o..o + C exist, `xt` holds `in_dim` rows of lanes
        unsafe {
            match left {
                WIDE.. => place_lanes(pass!(WIDE), y, cols, r0, lanes, o),
                _ => place_lanes(pass!(1), y, cols, r0, lanes, o),
            }
        }
    };
    let tail_block = |x: &[f32], lanes: &[f32], ask: &[f32], w: std::ops::Range<usize>, y: &mut [f32]| {
        // SAFETY: the CPU has AVX2; `x` is `tail` rows and `y` `tail` rows of `cols`, `lanes` one block
        unsafe { tail_rows(x, tail, lanes, ask, in_dim, step, y, cols, w) };
    };
    tiled_steps::<TILED_LANES>(x, rows, tail, weights, in_dim, cols, STEP, y, pass, tail_block);
}

/// `tiled`'s last `rows` (1..=6) x rows against weight rows `w` (at most eight, from a multiple of eight): every x
/// row's element `k` broadcast against row `k` of `lanes` (the block transposed, `in_dim` rows of eight lanes,
/// lanes past the last weight row zero and never stored; a copy's block as it is), in `dot_tiled`'s order per
/// lane, asking for the lines of `ask` as it goes.
///
/// # Safety
/// The CPU has AVX2; `x` is `rows x in_dim` with `1 <= rows <= TAIL_ROWS`, `lanes` holds `in_dim` rows of eight,
/// `y` is `rows x cols`.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn tail_rows(
    x: &[f32],
    rows: usize,
    lanes: &[f32],
    ask: &[f32],
    in_dim: usize,
    step: usize,
    y: &mut [f32],
    cols: usize,
    w: std::ops::Range<usize>,
) {
    let mut place = |sums: &[[f32; TILED_LANES]]| place_tail(sums, y, cols, w.clone());
    // SAFETY (each arm): the CPU has AVX2; `x` holds `C` rows of `in_dim`, `lanes` `in_dim` rows of eight
    unsafe {
        match rows {
            1 => place(&lane_sums::<1, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            2 => place(&lane_sums::<2, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            3 => place(&lane_sums::<3, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            4 => place(&lane_sums::<4, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            5 => place(&lane_sums::<5, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            6 => place(&lane_sums::<6, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask)),
            _ => unreachable!("tail_rows takes 1..=TAIL_ROWS x rows"),
        }
    }
}

/// Rows `at..at + C` of `m` (`in_dim` long, row-major or a copy's), each element `k` broadcast against row `k`
/// of `lanes` (`in_dim` rows of eight lanes: eight x rows or eight weight rows, transposed): `[row][lane]`, each lane
/// `dot_tiled(row, lane's row, parts)`'s steps in its order (the parts last to first, within a part `k` ascending,
/// a multiply then an add, every sum from -0.0). Both ways of `tiled` run through it: weight rows against x lanes,
/// x rows against weight lanes. The lines of `ask` (rows a later pass reads) are asked into L2 along the way, a
/// share per part (`AskSpread`).
///
/// # Safety
/// The CPU has AVX2; `m` holds rows `at..at + C`; `lanes` holds `in_dim` rows of 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lane_sums<const C: usize, const APART: usize>(
    m: Rows,
    at: usize,
    lanes: &[f32],
    in_dim: usize,
    step: usize,
    ask: &[f32],
) -> [[f32; TILED_LANES]; C] {
    // every row's extent checked once here, then read unchecked: with a bound check per read the loop was
    // slower (a 16 x 256 x 256 AVX-512 pass took 45-47 µs against 27-33)
    let (rows, apart) = m.starts::<C>(at, in_dim);
    // the distance a constant of each instance: at a run-time one the address of every broadcast took a multiply,
    // and glm53's bench prefill fell from 51-53% to 41-47% of the peak
    assert_eq!(apart, APART, "tiled: rows {apart} apart in an instance for {APART}");
    assert!(lanes.len() >= in_dim * TILED_LANES, "tiled: transposed rows too short");
    // parts of four are what every preset's full prefill chunk runs (a chunk's rows a quarter of the hidden width),
    // parts of eight the bench preset's warm turn (72 rows of 512): with the length a constant the loop over a part
    // unrolls (docs/engines.md, *A part's length a constant*)
    let total = match (step, ask.is_empty()) {
        (4, true) => part_sums::<C, APART, 4, false>(rows, lanes, in_dim, step, ask),
        (4, false) => part_sums::<C, APART, 4, true>(rows, lanes, in_dim, step, ask),
        (8, true) => part_sums::<C, APART, 8, false>(rows, lanes, in_dim, step, ask),
        (8, false) => part_sums::<C, APART, 8, true>(rows, lanes, in_dim, step, ask),
        (_, true) => part_sums::<C, APART, 0, false>(rows, lanes, in_dim, step, ask),
        (_, false) => part_sums::<C, APART, 0, true>(rows, lanes, in_dim, step, ask),
    };
    total.map(|t| {
        let mut out = [0.0f32; TILED_LANES];
        // SAFETY: `out` is 8 f32s; unaligned store
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), t) };
        out
    })
}

/// `lane_sums`' sums over the parts of `step` (the last part may be shorter), last to first: each whole part `P`
/// long where `P` is not 0, so its loop has a constant trip count, else `step` long as it comes; `ASK` says
/// whether `ask` holds lines to ask for, so a pass with none runs no ask arithmetic per part.
///
/// # Safety
/// The CPU has AVX2; each of `rows` holds `in_dim` elements `APART` apart; `lanes` holds `in_dim` rows of 8 lanes;
/// `P` is 0 or `step`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn part_sums<const C: usize, const APART: usize, const P: usize, const ASK: bool>(
    rows: [*const f32; C],
    lanes: &[f32],
    in_dim: usize,
    step: usize,
    ask: &[f32],
) -> [__m256; C] {
    debug_assert!(P == 0 || P == step);
    let step = if P > 0 { P } else { step };
    // SAFETY: `k < in_dim`, and the caller checked that each row's `in_dim` elements, `APART` apart, exist
    let at_k = |row: *const f32, k: usize| unsafe { _mm256_set1_ps(*row.add(k * APART)) };
    let lane = |k: usize| {
        // SAFETY: `k < in_dim` and `lanes` holds `in_dim` rows of 8 lanes (the caller asserted); unaligned load
        unsafe { _mm256_loadu_ps(lanes.as_ptr().add(k * TILED_LANES)) }
    };
    // Every sum of `dot_tiled` starts from -0.0, and `-0.0 + v` is `v` bit for bit for every product and sum (none
    // is a signalling NaN): so a part starts from its first product and the total from the first part, which
    // saves the adds to -0.0. At 4-element parts (a 128-row chunk's split of 512) that is 4 adds per 4 multiplies
    // where it was 5; adds and multiplies run on their own pipes at the same rate, so the adds were the bound.
    let part = |start: usize, end: usize| -> [__m256; C] {
        let first = lane(start);
        let mut part: [_; C] = std::array::from_fn(|j| _mm256_mul_ps(first, at_k(rows[j], start)));
        for k in start + 1..end {
            let lv = lane(k);
            for (p, row) in part.iter_mut().zip(&rows) {
                *p = _mm256_add_ps(*p, _mm256_mul_ps(lv, at_k(*row, k)));
            }
        }
        part
    };
    let parts = in_dim.div_ceil(step);
    let mut asks = AskSpread::new(ask, parts);
    // the last part first (the one that may be short), then the whole ones below it
    let last = (parts - 1) * step;
    if ASK {
        asks.part(0);
    }
    let mut total = part(last, in_dim);
    for nth in 1..parts {
        if ASK {
            asks.part(nth);
        }
        let start = last - nth * step;
        for (t, p) in total.iter_mut().zip(&part(start, start + step)) {
            *t = _mm256_add_ps(*t, *p);
        }
    }
    total
}

/// `wt[k · stride + lane0 + j] = rows[j · in_dim + k]` for eight rows and every `k` below `in_dim`'s last multiple
/// of eight, in 8 x 8 register transposes (the caller places the last `k`s).
///
/// # Safety
/// The CPU has AVX2; `rows` is `8 x in_dim`; `lane0 + 8 <= stride` and `wt` holds at least `in_dim · stride` f32s.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_rows_into(rows: &[f32], in_dim: usize, wt: &mut [f32], stride: usize, lane0: usize) {
    assert!(rows.len() == 8 * in_dim && lane0 + 8 <= stride && wt.len() >= in_dim * stride);
    for k0 in (0..in_dim / 8 * 8).step_by(8) {
        // SAFETY: rows `0..8` hold `k0..k0 + 8` (`k0 + 8 <= in_dim`); `wt` rows `k0..k0 + 8` hold lanes
        // `lane0..lane0 + 8` (asserted); unaligned
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(rows.as_ptr().add(j * in_dim + k0)));
            for (i, column) in transpose8(r).iter().enumerate() {
                _mm256_storeu_ps(wt.as_mut_ptr().add((k0 + i) * stride + lane0), *column);
            }
        }
    }
}

/// The 8 x 8 transpose of eight rows: `out[i][j] = r[j][i]`.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // pairs of rows interleaved, then quads, then the 128-bit halves swapped into place
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t: [0] = lo(r0, r1), [1] = hi(r0, r1), [2] = lo(r2, r3), [3] = hi(r2, r3), then r4..r7 alike
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    // s[c]: columns c (low half) and c + 4 (high half) of rows 0..4; s[c + 4] the same of rows 4..8
    std::array::from_fn(|i| {
        let (lo, hi) = (s[i % 4], s[i % 4 + 4]);
        if i < 4 {
            _mm256_permute2f128_ps::<0x20>(lo, hi)
        } else {
            _mm256_permute2f128_ps::<0x31>(lo, hi)
        }
    })
}
