//! A segment's GQA attention: every query head of every row over the keys its row sees, the rows in blocks and
//! the query heads of one kv head together, so each task walks its kv head's key and value rows once for all its
//! queries (`kernels::attend_many`). Each query's output is bitwise what it gets attending alone.

use std::ops::Range;

use rayon::prelude::*;

use super::gqa_dims::Dims;
use crate::kernels::attend_many;

/// Queries attending together in one task (rows of a block times the query heads of a kv head): enough that a key
/// row read from memory serves many queries, few enough that their scores (queries x context) stay in L2.
const QUERIES: usize = 32;

/// Multiply-adds below which a segment's attention runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// Rows of a segment per task when `group` query heads share a kv head.
pub fn rows_per_task(group: usize) -> usize {
    (QUERIES / group.max(1)).max(1)
}

/// The query heads of a segment's rows: how wide each is, how many share one kv head, how scores are scaled.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Width of one query (and key) row.
    pub width: usize,
    pub heads: usize,
    /// Query heads per kv head (`heads` when every head reads the same rows, as an MLA latent).
    pub group: usize,
    pub scale: f32,
}

impl From<&Dims> for Heads {
    fn from(d: &Dims) -> Heads {
        Heads { width: d.hd, heads: d.qd / d.hd.max(1), group: d.group, scale: d.scale }
    }
}

/// `att[i, head] = attend(q[i, head], keys of row i)` for every row `i` of the segment and every query head.
///
/// `q` and `att` are `[rows, heads · width]`; `visible(i)` is the ascending range of positions row `i` attends
/// over; `kv(g, p)` is the key and value row of kv head `g` at position `p`.
pub fn attend_rows<'a>(
    q: &[f32],
    shape: Heads,
    visible: impl Fn(usize) -> Range<usize> + Sync,
    kv: impl Fn(usize, usize) -> (&'a [f32], &'a [f32]) + Sync,
    att: &mut [f32],
) {
    let Heads { width: hd, heads, group, scale } = shape;
    let qd = heads * hd;
    let rows = q.len() / qd.max(1);
    let kv_heads = heads / group.max(1);
    let per = rows_per_task(group);
    let blocks = rows.div_ceil(per);
    let task = |task: usize| {
        let (block, g) = (task / kv_heads, task % kv_heads);
        let rows = block * per..((block + 1) * per).min(rows);
        // queries in (row, head of the group) order
        let queries: Vec<&[f32]> =
            rows.clone().flat_map(|i| (0..group).map(move |j| &q[i * qd + (g * group + j) * hd..][..hd])).collect();
        let ranges: Vec<Range<usize>> = rows.flat_map(|i| std::iter::repeat_n(visible(i), group)).collect();
        let mut out = vec![0.0; queries.len() * hd];
        attend_many(&queries, &ranges, |p| kv(g, p), scale, &mut out);
        out
    };
    // a decode step over a short window is a few microseconds of work: below that, waking threads costs more
    let work: usize = (0..rows).map(|i| visible(i).len()).sum::<usize>() * heads * hd;
    let outs: Vec<Vec<f32>> = if work < PARALLEL_MIN_WORK {
        (0..blocks * kv_heads).map(task).collect()
    } else {
        (0..blocks * kv_heads).into_par_iter().map(task).collect()
    };
    for (task, out) in outs.iter().enumerate() {
        let (block, g) = (task / kv_heads, task % kv_heads);
        for (n, o) in out.chunks_exact(hd).enumerate() {
            let (i, j) = (block * per + n / group, n % group);
            att[i * qd + (g * group + j) * hd..][..hd].copy_from_slice(o);
        }
    }
}
