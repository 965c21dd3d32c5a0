//! A weight matrix copied once into the layout the SIMD `Tiled` kernels' tails read: blocks of as many weight rows
//! as the kernel has lanes, each transposed (`in_dim` rows of lanes, lanes past the matrix's last row zero).
//!
//! A `Tiled` matmul whose last few x rows run over weight lanes (`matmul_avx512::tail_rows`,
//! `matmul_avx2::tail_rows`) transposes every block of weight rows on every call. An engine that feeds a matrix a
//! few rows at a time (glm53's MoE experts in a short prefill chunk) builds this copy at load and passes it in
//! (`matmul_with_tail`), so the tail reads the copy instead, and the x-lane passes too where that spares reading
//! the row-major weights as well (`TiledWeights::passes`): the same operations on the same values, so the same
//! bits, at the cost of a second copy of the matrix.

use rayon::prelude::*;

/// The transposed blocks of one `out_dim x in_dim` weight matrix, for the SIMD `Tiled` kernel this CPU runs.
#[derive(Debug, Clone)]
pub struct TailBlocks {
    /// Weight rows per block: the kernel's lanes (16 with AVX-512, 8 with AVX2).
    pub(super) lanes: usize,
    pub(super) out_dim: usize,
    pub(super) in_dim: usize,
    /// Block `b` is `data[b · in_dim · lanes..][..in_dim · lanes]`: `lanes[k · lanes + j] = w[b · lanes + j][k]`.
    data: Vec<f32>,
}

impl TailBlocks {
    /// The copy of `w` (`out_dim x in_dim`, row-major) for this CPU's SIMD `Tiled` kernel; `None` where none runs
    /// (the portable path has no tail) or the matrix is empty.
    pub fn of(w: &[f32], out_dim: usize, in_dim: usize) -> Option<TailBlocks> {
        assert_eq!(w.len(), out_dim * in_dim, "tail blocks: w is not out x in");
        if out_dim == 0 || in_dim == 0 {
            return None;
        }
        match super::matmul::simd_tiled_lanes()? {
            #[cfg(target_arch = "x86_64")]
            16 => Some(Self::with_lanes::<16>(w, out_dim, in_dim)),
            #[cfg(target_arch = "x86_64")]
            8 => Some(Self::with_lanes::<8>(w, out_dim, in_dim)),
            _ => None,
        }
    }

    /// The copy in blocks of `L` weight rows, whatever the CPU (the AVX2 kernel's tests build it on AVX-512
    /// machines too).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn with_lanes<const L: usize>(w: &[f32], out_dim: usize, in_dim: usize) -> TailBlocks {
        assert!(in_dim > 0 && w.len() == out_dim * in_dim, "tail blocks: w is not out x in");
        let mut data = vec![0.0f32; out_dim.div_ceil(L) * in_dim * L];
        data.par_chunks_mut(in_dim * L).enumerate().for_each(|(b, block)| {
            let n = (out_dim - b * L).min(L);
            super::matmul::transpose_rows::<L>(&w[b * L * in_dim..(b * L + n) * in_dim], n, in_dim, block);
        });
        TailBlocks { lanes: L, out_dim, in_dim, data }
    }

    /// The blocks from weight row `row` on (a multiple of the lanes): a task's share of the matrix.
    pub(super) fn blocks_from(&self, row: usize) -> &[f32] {
        assert!(row.is_multiple_of(self.lanes) && row <= self.out_dim, "tail blocks: row {row} starts no block");
        &self.data[row / self.lanes * self.in_dim * self.lanes..]
    }

    /// Bytes the copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }
}
