//! y = x · Wᵀ with `W` stored `[out, in]` (the checkpoint layout).

use rayon::prelude::*;

use super::Reduction;

const LANES: usize = 8;

/// The fixed-order dot product every kernel uses: 8 lane accumulators, then a fixed pairwise sum, then the tail.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (ca, ta) = a.as_chunks::<LANES>();
    let (cb, tb) = b.as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for (x, y) in ca.iter().zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// Rows of `x` against rows of `w` into `y` (row stride `y_stride`, column offset `col0`), invariant order.
///
/// Register blocking (several rows x several weights per pass) measured slower here than this plain loop over a
/// cache-sized weight tile, so the tile is the only blocking.
fn block_invariant(x: &[f32], w: &[f32], in_dim: usize, y: &mut [f32], y_stride: usize, col0: usize) {
    for (r, xr) in x.chunks_exact(in_dim).enumerate() {
        let yr = &mut y[r * y_stride + col0..];
        for (c, wr) in w.chunks_exact(in_dim).enumerate() {
            yr[c] = dot(xr, wr);
        }
    }
}

/// A dot product split into `parts` partial sums over contiguous slices, added last-to-first: a different
/// rounding for every `parts`, as a shape-dependent GPU tiling would give.
#[inline]
fn dot_tiled(a: &[f32], b: &[f32], parts: usize) -> f32 {
    let parts = parts.clamp(1, a.len().max(1));
    let step = a.len().div_ceil(parts);
    let mut partial: Vec<f32> =
        a.chunks(step).zip(b.chunks(step)).map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum()).collect();
    partial.reverse();
    partial.into_iter().sum()
}

/// Work below this many multiply-adds stays on the calling thread (rayon overhead dominates).
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// Output columns per tile: a tile of weights stays in cache while every input row passes over it.
const TILE: usize = 16;

/// `y[r, o] = dot(x[r, :], w[o, :])` for `rows` rows, with the invariant reduction.
pub fn matmul(x: &[f32], rows: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32]) {
    matmul_with(Reduction::Invariant, x, rows, w, out_dim, in_dim, y)
}

/// `matmul` with an explicit reduction order.
pub fn matmul_with(red: Reduction, x: &[f32], rows: usize, w: &[f32], out_dim: usize, in_dim: usize, y: &mut [f32]) {
    assert_eq!(x.len(), rows * in_dim, "matmul: x is not rows x in");
    assert_eq!(w.len(), out_dim * in_dim, "matmul: w is not out x in");
    assert_eq!(y.len(), rows * out_dim, "matmul: y is not rows x out");
    if let Reduction::Tiled(parts) = red {
        // the deliberately shape-dependent path: plain loops, no blocking needed
        for (xr, yr) in x.chunks_exact(in_dim).zip(y.chunks_exact_mut(out_dim)) {
            for (o, wr) in w.chunks_exact(in_dim).enumerate() {
                yr[o] = dot_tiled(xr, wr, parts);
            }
        }
        return;
    }
    let work = rows * out_dim * in_dim;
    if work < PARALLEL_MIN_WORK {
        for (t, wt) in w.chunks(TILE * in_dim).enumerate() {
            block_invariant(x, wt, in_dim, y, out_dim, t * TILE);
        }
        return;
    }
    if rows >= 2 * rayon::current_num_threads() {
        // Many rows: split rows across threads; each thread walks weight tiles over its rows.
        let rows_per = rows.div_ceil(rayon::current_num_threads() * 4).max(4);
        x.par_chunks(rows_per * in_dim).zip(y.par_chunks_mut(rows_per * out_dim)).for_each(|(xb, yb)| {
            for (t, wt) in w.chunks(TILE * in_dim).enumerate() {
                block_invariant(xb, wt, in_dim, yb, out_dim, t * TILE);
            }
        });
    } else {
        // Few rows (decode): split output tiles across threads, then scatter.
        let tiles: Vec<Vec<f32>> = w
            .par_chunks(TILE * in_dim)
            .map(|wt| {
                let n = wt.len() / in_dim;
                let mut out = vec![0.0; rows * n];
                block_invariant(x, wt, in_dim, &mut out, n, 0);
                out
            })
            .collect();
        for (t, tile) in tiles.iter().enumerate() {
            let n = tile.len() / rows.max(1);
            for r in 0..rows {
                y[r * out_dim + t * TILE..r * out_dim + t * TILE + n].copy_from_slice(&tile[r * n..(r + 1) * n]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.uniform(1.0)).collect()
    }

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

    #[test]
    fn tiled_reduction_changes_bits() {
        let a = random(4096, 5);
        let b = random(4096, 6);
        let parts: Vec<u32> = [1, 2, 3, 5, 8, 16].iter().map(|&p| dot_tiled(&a, &b, p).to_bits()).collect();
        let distinct: std::collections::BTreeSet<_> = parts.iter().collect();
        assert!(distinct.len() > 1, "different tilings must round differently on some shapes");
    }
}
