//! `dot`'s order with the lanes across outputs: weights packed lane-major in panels of 64 output rows, so one
//! broadcast x element feeds four 16-output registers (the shared operand broadcast, as a BLAS microkernel
//! multiplies) while every output is still summed exactly as `kernels::dot` sums it.
//!
//! `dot` keeps 16 lane sums per output, lane `l` summing elements `k ≡ l (mod 16)` in ascending order, each step
//! fused, then adds the lanes in a fixed tree and fuses the tail in. A register of this layout holds lane `l` of 16
//! outputs: a *lane pass* walks lane `l` of every 16-element chunk, each step `acc = fma(x[r][16c + l],
//! w[o][16c + l], acc)` for 16 outputs at once, which is `dot`'s lane-`l` chain for each of them. Sixteen passes
//! leave the 16 lane sums of each output in 16 registers side by side, and the tree is then vertical adds, lane
//! against lane, where `dot`'s is shuffles inside a register. So the bits are `dot`'s (the tests compare them with
//! `matmul`), and the weights can be stored either way.
//!
//! Per step the tile of `R` x rows by 64 outputs loads four weight vectors and `R` scalars for `4R` multiply-adds,
//! and the lane trees cost 15 vertical adds per 16 outputs per row. The row-major kernels' tile (`dot_tiles`)
//! loads as many vectors per multiply-add but ends every 16 outputs in a tree of 31 shuffles, on the port that
//! also runs one of the two FMA streams on Intel's cores, where those tiles top out near two thirds of the peak
//! (docs/engines.md, *Kernels and the benchmark*). This module is measured by the benchmark's `panel matmul` line
//! beside `matmul`; the engines do not store their weights this way yet.

use rayon::prelude::*;

use super::matmul::LANES;
use crate::decode_team::SendPtr;

/// Output rows in one panel: four 16-lane registers.
pub const PANEL: usize = 64;

/// A weight matrix `[out, in]` packed for the lane passes: per panel of 64 output rows (the last one padded with
/// zero rows, whose results are dropped), lane `l` of chunk `c` for the 64 rows (`[l][c][64]`), then each tail
/// element for the 64 rows (`[t][64]`).
pub struct Panels {
    pub out_dim: usize,
    pub in_dim: usize,
    data: Vec<f32>,
}

impl Panels {
    /// `w` (`out_dim` rows of `in_dim`, row-major) packed into panels.
    pub fn pack(w: &[f32], out_dim: usize, in_dim: usize) -> Panels {
        assert_eq!(w.len(), out_dim * in_dim, "panels: w is not out x in");
        let chunks = in_dim / LANES;
        let panels = out_dim.div_ceil(PANEL);
        let mut data = vec![0.0f32; panels * PANEL * in_dim];
        for (p, panel) in data.chunks_exact_mut((PANEL * in_dim).max(1)).enumerate().take(panels) {
            for j in 0..PANEL.min(out_dim - p * PANEL) {
                let row = &w[(p * PANEL + j) * in_dim..][..in_dim];
                for (k, &v) in row.iter().enumerate() {
                    panel[lane_major_slot(k, chunks) * PANEL + j] = v;
                }
            }
        }
        Panels { out_dim, in_dim, data }
    }

    /// Panel `p`: `PANEL * in_dim` floats.
    pub(super) fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * PANEL * self.in_dim..][..PANEL * self.in_dim]
    }
}

/// X rows one tile multiplies against a panel: 6 x 4 accumulators, four weight registers and a broadcast fit the
/// 32 AVX-512 registers.
pub(super) const TILE_ROWS: usize = 6;

/// X rows one task multiplies against its panel: eight tiles, so a long prefill gives the threads many tasks to
/// balance while each task still reads its panel from cache for 48 rows. (Halving it where the threads got under
/// four tasks each was no faster on a 2-core Zen 4 EPYC: 45 x 576 x 1536 at 124-126 GFLOP/s against 128-155.)
const TASK_ROWS: usize = 8 * TILE_ROWS;

/// `y[r, o] = dot(x[r, :], w[o, :])` for `rows` rows, from the panels: bitwise `matmul`'s. The tasks are (panel,
/// up to 48 rows), panel by panel, so the tasks a thread takes in a row mostly share their panel; each writes its
/// own block of `y`.
pub fn matmul_panels(x: &[f32], rows: usize, w: &Panels, y: &mut [f32]) {
    let (out_dim, in_dim) = (w.out_dim, w.in_dim);
    assert_eq!(x.len(), rows * in_dim, "matmul_panels: x is not rows x in");
    assert_eq!(y.len(), rows * out_dim, "matmul_panels: y is not rows x out");
    super::work::count(2 * rows * out_dim * in_dim, 4 * out_dim * in_dim);
    if rows == 0 || out_dim == 0 {
        return;
    }
    let lane_major = lane_major_rows(x, rows, in_dim);
    let panels = out_dim.div_ceil(PANEL);
    let groups = rows.div_ceil(TASK_ROWS);
    let y_at = SendPtr(y.as_mut_ptr());
    (0..panels * groups).into_par_iter().for_each(|t| {
        let (p, g) = (t / groups, t % groups);
        let panel = w.panel(p);
        let cols = PANEL.min(out_dim - p * PANEL);
        for r0 in (g * TASK_ROWS..((g + 1) * TASK_ROWS).min(rows)).step_by(TILE_ROWS) {
            let n = TILE_ROWS.min(rows - r0);
            let mut tile = [[0.0f32; PANEL]; TILE_ROWS];
            panel_tile(&lane_major[r0 * in_dim..(r0 + n) * in_dim], n, panel, in_dim, &mut tile[..n]);
            for (r, sums) in tile[..n].iter().enumerate() {
                let at = &y_at;
                // SAFETY: `(r0 + r) * out_dim + p * PANEL + cols <= y.len()`; task `(p, g)` alone writes rows
                // `g * TASK_ROWS..` of columns `p * PANEL..` (the tasks' blocks are disjoint), and `y` stays
                // borrowed mutably until every task has finished
                #[allow(unsafe_code)]
                unsafe {
                    std::ptr::copy_nonoverlapping(sums.as_ptr(), at.0.add((r0 + r) * out_dim + p * PANEL), cols)
                };
            }
        }
    });
}

/// Where element `k` of a row of `chunks` whole chunks goes lane-major: lane `k % 16` of chunk `k / 16` at `[l][c]`,
/// a tail element where it was.
fn lane_major_slot(k: usize, chunks: usize) -> usize {
    if k < chunks * LANES {
        (k % LANES) * chunks + k / LANES
    } else {
        k
    }
}

/// Each x row with its chunks' elements lane-major (`[l][c]`), then its tail as it was: a lane pass then reads its
/// broadcasts in order.
fn lane_major_rows(x: &[f32], rows: usize, in_dim: usize) -> Vec<f32> {
    let chunks = in_dim / LANES;
    let mut out = vec![0.0f32; rows * in_dim];
    let n = in_dim.max(1);
    out.par_chunks_mut(n).zip(x.par_chunks(n)).take(rows).for_each(|(dst, src)| {
        for (k, &v) in src.iter().enumerate() {
            dst[lane_major_slot(k, chunks)] = v;
        }
    });
    out
}

/// The sums of `n` lane-major x rows against one panel: AVX-512 where the CPU has it, else the portable passes
/// (the same operations on the same values).
fn panel_tile(x: &[f32], n: usize, panel: &[f32], in_dim: usize, out: &mut [[f32; PANEL]]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; `x` holds `n` rows of `in_dim`, `panel` `PANEL * in_dim` floats, `out` `n`
        // rows, `n <= TILE_ROWS`
        #[allow(unsafe_code)]
        unsafe {
            super::panels_avx512::panel_tile(x, n, panel, in_dim, out)
        };
        return;
    }
    panel_tile_portable(x, n, panel, in_dim, out)
}

/// The portable lane passes: lane `l`'s sums for every output of the panel, each step fused, the chunks in order;
/// then `dot`'s tree (`finish`) lane against lane, then the tail fused in.
pub(super) fn panel_tile_portable(x: &[f32], n: usize, panel: &[f32], in_dim: usize, out: &mut [[f32; PANEL]]) {
    let chunks = in_dim / LANES;
    for (r, sums) in out.iter_mut().enumerate().take(n) {
        let xr = &x[r * in_dim..(r + 1) * in_dim];
        let mut lanes = [[0.0f32; PANEL]; LANES];
        for (l, acc) in lanes.iter_mut().enumerate() {
            for c in 0..chunks {
                let xv = xr[l * chunks + c];
                let wv = &panel[(l * chunks + c) * PANEL..][..PANEL];
                for (a, wj) in acc.iter_mut().zip(wv) {
                    *a = xv.mul_add(*wj, *a);
                }
            }
        }
        for (j, s) in sums.iter_mut().enumerate() {
            let h: [f32; 8] = std::array::from_fn(|l| lanes[l][j] + lanes[l + 8][j]);
            let mut v = ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
            for t in chunks * LANES..in_dim {
                v = xr[t].mul_add(panel[t * PANEL + j], v);
            }
            *s = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::random;
    use proptest::prelude::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// The panels' sums against `matmul`'s, bit for bit, and the portable passes against the SIMD ones.
    fn check(rows: usize, out_dim: usize, in_dim: usize, seed: u64) {
        let x = random(rows * in_dim, seed);
        let w = random(out_dim * in_dim, seed + 1);
        let mut want = vec![0.0; rows * out_dim];
        crate::kernels::matmul(&x, rows, &w, out_dim, in_dim, &mut want);
        let panels = Panels::pack(&w, out_dim, in_dim);
        let mut got = vec![f32::NAN; rows * out_dim];
        matmul_panels(&x, rows, &panels, &mut got);
        assert_eq!(bits(&got), bits(&want), "{rows} x {out_dim} x {in_dim}: panels against matmul");
        // the portable passes on one tile of the first panel
        let lm = lane_major_rows(&x, rows, in_dim);
        let n = rows.min(TILE_ROWS);
        let (mut simd, mut portable) = ([[0.0; PANEL]; TILE_ROWS], [[0.0; PANEL]; TILE_ROWS]);
        panel_tile(&lm[..n * in_dim], n, panels.panel(0), in_dim, &mut simd[..n]);
        panel_tile_portable(&lm[..n * in_dim], n, panels.panel(0), in_dim, &mut portable[..n]);
        assert_eq!(
            bits(simd.as_flattened()),
            bits(portable.as_flattened()),
            "{rows} x {out_dim} x {in_dim}: portable passes"
        );
    }

    #[test]
    fn panels_keep_dots_bits_at_the_shapes_the_models_run() {
        for (rows, out_dim, in_dim) in [(256, 1024, 1024), (45, 576, 576), (1, 64, 64), (7, 1536, 576), (13, 100, 40)] {
            check(rows, out_dim, in_dim, 3);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn panels_keep_dots_bits(rows in 1usize..20, out_dim in 1usize..200, in_dim in 0usize..100, seed in 0u64..1000) {
            check(rows, out_dim, in_dim, seed);
        }
    }
}
