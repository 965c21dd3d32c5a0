//! The AVX-512 `acc_tile`: one zmm register per (x row, w row) accumulator, one `vfmadd` per 16-lane chunk —
//! lane for lane the portable loop's `f32::mul_add` (a fused multiply-add rounds once, however it is computed).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::matmul::{
    part_len, place_lanes, place_tail, tail_rows_left, tiled_steps, AskSpread, Lanes, Rows, TiledWeights, LANES,
};

/// `acc[r][c][l] = Σ_k x[r][k][l] · w[c][k][l]`, each step fused, `k` ascending. Compiled on its own with the
/// shapes as constants, every accumulator lives in a register (the 4 x 4 step is 8 loads and 16 `vfmadd`, no
/// spills).
///
/// # Safety
/// The CPU has AVX-512F, and every row of `x` and `w` holds at least `n` chunks.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn acc_tile<const R: usize, const C: usize>(
    x: [&[Lanes]; R],
    w: [&[Lanes]; C],
    n: usize,
) -> [[Lanes; C]; R] {
    let xp = x.map(|r| r.as_ptr().cast::<f32>());
    let wp = w.map(|r| r.as_ptr().cast::<f32>());
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for k in 0..n {
        // SAFETY: `k < n` and every row holds `n` chunks of `LANES` f32s; unaligned loads
        let wv: [__m512; C] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(wp[c].add(k * LANES)) });
        for (a, p) in acc.iter_mut().zip(&xp) {
            // SAFETY: as above
            let xv = unsafe { _mm512_loadu_ps(p.add(k * LANES)) };
            for (ac, wc) in a.iter_mut().zip(&wv) {
                *ac = _mm512_fmadd_ps(xv, *wc, *ac);
            }
        }
    }
    acc.map(|a| {
        a.map(|v| {
            let mut out = [0.0f32; LANES];
            // SAFETY: `out` is 16 f32s; unaligned store
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
            out
        })
    })
}

/// X rows a `tiled` pass holds side by side: one per lane.
const TILED_LANES: usize = 16;
/// X rows left after the passes of sixteen that run over weight lanes instead (`tail_rows`): up to ten. Measured on
/// a 2-core AVX-512 EPYC (one thread, 256 x 256 weights in cache), an x-lane pass costs the same for 1 to 16 rows
/// (24-34 µs); over weight lanes, transposes included, 1 row took 11-17, 4 rows 16-19, 10 rows 23-29, 12 about
/// even, 14 more.
const TAIL_ROWS: usize = 10;
/// The same bound when the tail reads the weights' `TailBlocks` copy (no transposes): up to fifteen, every row
/// count short of a whole pass. Measured as above: 11 to 15 rows over weight lanes took 17-22 µs against 30-53 for
/// an x-lane pass in cache, and about even from DRAM (44-49 µs either way).
const TAIL_ROWS_FROM_COPY: usize = 15;

/// The `Tiled` matmul, `y[r, o] = dot_tiled(x[r], w[o], parts)`, with the lanes over sixteen x rows (copied
/// transposed once per call, so a lane reads its row's element `k` where the others read theirs) against eight
/// weight rows at a time (then one); the last one to ten x rows (fifteen from a copy) over sixteen weight rows
/// (`tail_rows`), so a short segment's MoE expert (~11 rows) or decode's one row runs no lane empty. The weights
/// are walked sixteen rows at a time, every pass and the tail over each (`tiled_steps`). Where the caller built the weights' `TailBlocks` copy at load, the tail reads it, and the passes too when the
/// tail does or there is one pass (`TiledWeights::passes`). Each lane keeps `dot_tiled`'s order: the parts last to
/// first, within a part `k` ascending, each step a multiply then an add (two roundings, as the portable loop),
/// every sum from -0.0. So the bits are the portable path's.
///
/// # Safety
/// The CPU has AVX-512F; `x` is `rows x in_dim`, `weights` are `cols` weight rows of `in_dim` (a copy in blocks
/// of sixteen), `y` is `rows x cols`, and `in_dim > 0`.
#[target_feature(enable = "avx512f")]
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
    let most = if weights.copy.is_some() { TAIL_ROWS_FROM_COPY } else { TAIL_ROWS };
    let tail = tail_rows_left(rows, TILED_LANES, most);
    let pass = |passes: Rows, o: usize, left: usize, xt: &[f32], r0: usize, lanes: usize, y: &mut [f32]| {
        // weight rows `o..o + C` against the x lanes, row-major (elements 1 apart) or a copy's (sixteen); eight at
        // a time: eight part sums and eight totals stay in registers, where sixteen of each spilled to the stack
        // (one thread, 128 x 512 x 512 at 128 parts: 40-49% of the core's peak with sixteen, 69-80% with eight).
        // The first pass over a step asks for the same rows of the next step (the walk's steps are sixteen rows)
        macro_rules! pass {
            ($c:expr) => {{
                let ask = if r0 == 0 { passes.ahead(o, $c, TILED_LANES, cols, in_dim) } else { &[] };
                match passes {
                    Rows::RowMajor(_) => lane_sums::<$c, 1>(passes, o, xt, in_dim, step, ask),
                    Rows::Blocked { .. } => lane_sums::<$c, TILED_LANES>(passes, o, xt, in_dim, step, ask),
                }
            }};
        }
        // SAFETY (each arm): the CPU has AVX-512F; weight rows o..o + C exist, `xt` holds `in_dim` rows of lanes
        unsafe {
            match left {
                8.. => place_lanes(pass!(8), y, cols, r0, lanes, o),
                _ => place_lanes(pass!(1), y, cols, r0, lanes, o),
            }
        }
    };
    let tail_block = |x: &[f32], lanes: &[f32], ask: &[f32], w: std::ops::Range<usize>, y: &mut [f32]| {
        // SAFETY: the CPU has AVX-512F; `x` is `tail` rows and `y` `tail` rows of `cols`, `lanes` one block
        unsafe { tail_rows(x, tail, lanes, ask, in_dim, step, y, cols, w) };
    };
    tiled_steps::<TILED_LANES>(x, rows, tail, weights, in_dim, cols, TILED_LANES, y, pass, tail_block);
}

/// `tiled`'s last `rows` (1..=10, or 1..=15 from a copy) x rows against weight rows `w` (at most sixteen, from a
/// multiple of sixteen): every x row's element `k` broadcast against row `k` of `lanes` (the block transposed,
/// `in_dim` rows of sixteen lanes, lanes past the last weight row zero and never stored; a copy's block as it is),
/// in `dot_tiled`'s order per lane, asking for the lines of `ask` as it goes.
///
/// # Safety
/// The CPU has AVX-512F; `x` is `rows x in_dim` with `1 <= rows <= TAIL_ROWS_FROM_COPY`, `lanes` holds `in_dim`
/// rows of sixteen, `y` is `rows x cols`.
#[target_feature(enable = "avx512f")]
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
    macro_rules! rows_through {
        ($($c:literal)*) => {
            match rows {
                // SAFETY (each arm): the CPU has AVX-512F; `x` holds `C` rows of `in_dim`, `lanes` `in_dim` rows
                // of sixteen
                $($c => place(&unsafe { lane_sums::<$c, 1>(Rows::RowMajor(x), 0, lanes, in_dim, step, ask) }),)*
                _ => unreachable!("tail_rows takes 1..=TAIL_ROWS_FROM_COPY x rows"),
            }
        };
    }
    rows_through!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}

/// Rows `at..at + C` of `m` (`in_dim` long, row-major or a copy's), each element `k` broadcast against row `k`
/// of `lanes` (`in_dim` rows of sixteen lanes: sixteen x rows or sixteen weight rows, transposed): `[row][lane]`,
/// each lane `dot_tiled(row, lane's row, parts)`'s steps in its order (the parts last to first, within a part `k`
/// ascending, a multiply then an add, every sum from -0.0). Both ways of `tiled` run through it: weight rows
/// against x lanes, x rows against weight lanes. The lines of `ask` (rows a later pass reads) are asked into L2
/// along the way, a share per part (`AskSpread`).
///
/// # Safety
/// The CPU has AVX-512F; `m` holds rows `at..at + C`; `lanes` holds `in_dim` rows of 16 lanes.
#[target_feature(enable = "avx512f")]
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
    // SAFETY: `k < in_dim`, and `starts` checked that each row's `in_dim` elements, `APART` apart, exist
    let at_k = |row: *const f32, k: usize| unsafe { *row.add(k * APART) };
    assert!(lanes.len() >= in_dim * TILED_LANES, "tiled: transposed rows too short");
    // Every sum of `dot_tiled` starts from -0.0, and `-0.0 + v` is `v` bit for bit for every product and sum (none
    // is a signalling NaN): so a part starts from its first product and the total from the first part, which
    // saves the adds to -0.0. At 4-element parts (a 128-row chunk's split of 512) that is 4 adds per 4 multiplies
    // where it was 5; adds and multiplies run on their own pipes at the same rate, so the adds were the bound.
    let mut total = [_mm512_set1_ps(-0.0); C];
    let mut asks = AskSpread::new(ask, in_dim.div_ceil(step));
    for (nth, start) in (0..in_dim).step_by(step).rev().enumerate() {
        let end = (start + step).min(in_dim);
        asks.part(nth);
        let lane = |k: usize| {
            // SAFETY: `k < in_dim` and `lanes` holds `in_dim` rows of 16 lanes (asserted); unaligned load
            unsafe { _mm512_loadu_ps(lanes.as_ptr().add(k * TILED_LANES)) }
        };
        let first = lane(start);
        let mut part: [_; C] = std::array::from_fn(|j| _mm512_mul_ps(first, _mm512_set1_ps(at_k(rows[j], start))));
        for k in start + 1..end {
            let lv = lane(k);
            for (p, row) in part.iter_mut().zip(&rows) {
                *p = _mm512_add_ps(*p, _mm512_mul_ps(lv, _mm512_set1_ps(at_k(*row, k))));
            }
        }
        if nth == 0 {
            total = part;
        } else {
            for (t, p) in total.iter_mut().zip(&part) {
                *t = _mm512_add_ps(*t, *p);
            }
        }
    }
    total.map(|t| {
        let mut out = [0.0f32; TILED_LANES];
        // SAFETY: `out` is 16 f32s; unaligned store
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), t) };
        out
    })
}
