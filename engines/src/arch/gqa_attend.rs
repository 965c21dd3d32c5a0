//! A segment's GQA attention: every query head of every row over the keys its row sees, the rows in blocks and
//! the query heads of one kv head together, so each task walks its kv head's key and value rows once for all its
//! queries (`kernels::Scores`). Each query's output is bitwise what it gets attending alone.
//!
//! The keys may come in parts (DeepSeek's compressed rows, then its raw window): a query's keys are its indices of
//! the first part, then of the next, one softmax over all of them.

use std::ops::Range;

use super::gqa_dims::Dims;
use crate::kernels::{ask_rows, softmax_parts, Scores, LANES};

/// Queries attending together in one task (rows of a block times the query heads of a kv head): enough that a key
/// row read from memory serves many queries, few enough that their scores (queries x context) stay in L2.
const QUERIES: usize = 32;

/// Multiply-adds below which a segment's attention runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// Multiply-adds from which a decode step's heads are attended on several cores when each core gets a kv head
/// of its own (a decode step of SmolLM2's 3 kv heads over 128 positions: 15 µs a layer on two cores against 21-29
/// on one).
const ONE_ROW_PARALLEL_MIN_WORK: usize = 1 << 14;

/// Multiply-adds from which a decode step is split across cores finer than by kv head (`attend_one_row`): below
/// it the three hand-offs of that split cost more than cores left idle by heads that do not divide among them
/// (SmolLM2's 3 kv heads on two cores over 256 positions: 29-31 µs a layer by head, 43-59 in three passes).
/// From here on the split wins: over 512 positions 88-91 µs a layer by head, 68-69 split; over 1024, 168-172 and
/// 115-137 (30 layers' caches, from DRAM); the GGUF engine's decode at 1024 positions, median of five runs, 78.2
/// tok/s by head and 85.6 split.
const ONE_ROW_SPLIT_MIN_WORK: usize = 1 << 18;

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

/// One sequence of key and value rows a segment's queries attend over.
pub trait KeyPart<'a>: Sync {
    /// The ascending indices row `i` of the segment attends over.
    fn visible(&self, row: usize) -> Range<usize>;
    /// The key and value rows of kv head `g` at index `p`.
    fn kv(&self, g: usize, p: usize) -> (&'a [f32], &'a [f32]);
}

/// A reference to a part is that part: so a caller can pass parts of different types as `&dyn KeyPart`, while
/// `attend_rows` passes its one part by type and gets its closures inlined (a call per key index otherwise).
impl<'a, T: KeyPart<'a> + ?Sized> KeyPart<'a> for &T {
    fn visible(&self, row: usize) -> Range<usize> {
        (**self).visible(row)
    }
    #[inline(always)]
    fn kv(&self, g: usize, p: usize) -> (&'a [f32], &'a [f32]) {
        (**self).kv(g, p)
    }
}

/// A `KeyPart` from two closures: `visible(i)` and `kv(g, p)`.
pub struct Keys<V, K> {
    pub visible: V,
    pub kv: K,
}

impl<'a, V, K> KeyPart<'a> for Keys<V, K>
where
    V: Fn(usize) -> Range<usize> + Sync,
    K: Fn(usize, usize) -> (&'a [f32], &'a [f32]) + Sync,
{
    fn visible(&self, row: usize) -> Range<usize> {
        (self.visible)(row)
    }
    #[inline(always)]
    fn kv(&self, g: usize, p: usize) -> (&'a [f32], &'a [f32]) {
        (self.kv)(g, p)
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
    attend_rows_in_parts(q, shape, &[Keys { visible, kv }], att);
}

/// `attend_rows` over keys in parts: row `i`'s query heads attend over `parts[0]`'s indices visible to it, then
/// `parts[1]`'s, and so on, as one key sequence in that order.
pub fn attend_rows_in_parts<'a, P: KeyPart<'a>>(q: &[f32], shape: Heads, parts: &[P], att: &mut [f32]) {
    let Heads { width: hd, heads, group, scale } = shape;
    let qd = heads * hd;
    let rows = q.len() / qd.max(1);
    // a decode step over a short window is a few microseconds of work: below that, waking threads costs more
    let work: usize =
        parts.iter().flat_map(|part| (0..rows).map(|i| part.visible(i).len())).sum::<usize>() * heads * hd;
    let kv_heads = heads / group.max(1);
    // one row: a task per kv head (one hand-off) while the context is short and there is a head for every core;
    // the three passes of `attend_one_row` keep every core busy on a long one, at three hand-offs
    let per_head = rows == 1 && kv_heads >= rayon::current_num_threads() && work < ONE_ROW_SPLIT_MIN_WORK;
    if rows == 1 && work >= PARALLEL_MIN_WORK && !per_head {
        return attend_one_row(q, shape, parts, att);
    }
    let parallel_min = if per_head { ONE_ROW_PARALLEL_MIN_WORK } else { PARALLEL_MIN_WORK };
    let per = rows_per_task(group);
    let blocks = rows.div_ceil(per);
    // a segment of a few rows (a decode step's verification batch) gives each kv head one task, its rows' only
    // reader: where the heads lie side by side in a cached row, that task reads a slice of each row at the row's
    // stride, which the hardware prefetchers do not follow, so it asks for its key and value rows before each pass
    let ask_first = rows > 1 && blocks == 1 && kv_heads > 1 && heads_side_by_side(parts, kv_heads, hd);
    // rows listed where several tasks read them or they are asked for first; a task that is its rows' only reader
    // (a decode step's) asks the part itself, in its own task, rather than wait on a serial listing
    let list_rows = blocks > 1 || ask_first;
    let listed: Vec<Option<Listed<'a>>> =
        parts.iter().map(|part| list_rows.then(|| Listed::of(part, rows, kv_heads))).collect();
    let task = |task: usize| {
        let (block, g) = (task / kv_heads, task % kv_heads);
        let rows = block * per..((block + 1) * per).min(rows);
        // queries in (row, head of the group) order
        let queries: Vec<&[f32]> =
            rows.clone().flat_map(|i| (0..group).map(move |j| &q[i * qd + (g * group + j) * hd..][..hd])).collect();
        if ask_first {
            ask_rows(listed.iter().flatten().flat_map(|list| list.keys[g].iter().copied()));
        }
        let mut scores: Vec<Scores> = parts
            .iter()
            .zip(&listed)
            .map(|(part, list)| {
                let ranges: Vec<Range<usize>> =
                    rows.clone().flat_map(|i| std::iter::repeat_n(part.visible(i), group)).collect();
                match list {
                    Some(list) => Scores::dots(&queries, &ranges, |p| list.key(g, p)),
                    None => Scores::dots(&queries, &ranges, |p| part.kv(g, p).0),
                }
            })
            .collect();
        softmax_parts(&mut scores, scale);
        let mut out = vec![0.0; queries.len() * hd];
        if ask_first {
            ask_rows(listed.iter().flatten().flat_map(|list| list.values[g].iter().copied()));
        }
        for ((part, list), sc) in parts.iter().zip(&listed).zip(&scores) {
            match list {
                Some(list) => sc.add_weighted(|p| list.value(g, p), &mut out),
                None => sc.add_weighted(|p| part.kv(g, p).1, &mut out),
            }
        }
        out
    };
    let outs: Vec<Vec<f32>> = if work < parallel_min {
        (0..blocks * kv_heads).map(task).collect()
    } else {
        crate::decode_team::map(&(0..blocks * kv_heads).collect::<Vec<_>>(), |&t| task(t))
    };
    for (task, out) in outs.iter().enumerate() {
        let (block, g) = (task / kv_heads, task % kv_heads);
        for (n, o) in out.chunks_exact(hd).enumerate() {
            let (i, j) = (block * per + n / group, n % group);
            att[i * qd + (g * group + j) * hd..][..hd].copy_from_slice(o);
        }
    }
}

/// One part's key and value rows of every kv head, over every index some row of the segment sees, each asked of
/// the part once. A segment's tasks are (block of rows, kv head) pairs, and every task of a head reads the same
/// rows: asked per task, a 128-row chunk over 4096 positions asked `kv` 262 144 times a layer where listing takes
/// 16 384. The lists hold the part's own slices, so the kernels read the same rows in the same order: the same bits.
/// A segment of one block of rows (one task a kv head) lists nothing unless its rows are asked for first.
struct Listed<'a> {
    /// The first index listed.
    lo: usize,
    /// `[kv head][index - lo]`.
    keys: Vec<Vec<&'a [f32]>>,
    values: Vec<Vec<&'a [f32]>>,
}

impl<'a> Listed<'a> {
    /// The span `Scores` reads over any block of these rows: from the lowest start to the highest end of their
    /// ranges, an empty range's start included (a task's scores span it too).
    fn of<P: KeyPart<'a>>(part: &P, rows: usize, kv_heads: usize) -> Self {
        let seen = (0..rows).map(|i| part.visible(i)).map(|r| r.start..r.end.max(r.start));
        let (lo, hi) = seen.fold((usize::MAX, 0), |(lo, hi), r| (lo.min(r.start), hi.max(r.end)));
        let span = lo.min(hi)..hi;
        let (keys, values) = (0..kv_heads).map(|g| span.clone().map(|p| part.kv(g, p)).unzip()).unzip();
        Listed { lo: span.start, keys, values }
    }

    fn key(&self, g: usize, p: usize) -> &'a [f32] {
        self.keys[g][p - self.lo]
    }

    fn value(&self, g: usize, p: usize) -> &'a [f32] {
        self.values[g][p - self.lo]
    }
}

/// Keys one task of a decode step scores.
const KEY_SPLIT: usize = 256;

/// A decode step's attention (one row) over a long context, in three parallel passes: scores over blocks of keys of
/// every kv head, the softmax per kv head, then the weighted sums by runs of output columns, one run a core. One
/// task per kv head would leave a core idle whenever there are fewer kv heads than cores, or not a multiple of
/// them, each reading its head's whole key and value sequence alone. Where each kv head is scored on its own, a
/// block's keys are asked for (`ask_rows`) before they are scored: at SmolLM2's shapes over 2048 positions (30
/// layers' caches, from DRAM) a decode row took 8.3-8.8 ms without and 7.9-8.0 with, the GGUF engine's decode at
/// 2048 positions 66.9-85.2 tok/s without and 89.3-93.1 with (two alternations). Asking for a pass-3 task's value
/// columns the same way was slower (9.6-10.0 ms). Where a kernel folds several kv heads at once
/// (`Scores::heads_at_once`), pass 3 takes runs of kv heads instead of (head, columns) pairs: a run reads its
/// heads' share of each value row at once, where a (head, columns) task read two lines of each 768-byte row at its
/// stride, which one core read at 7-8 GB/s against 27 for whole rows. The same decode row: 7.6-8.0 ms by (head,
/// columns), 7.2-7.3 by runs; over 512 positions 1.39-1.52 against 1.29-1.31 (three alternations). Pass 1 on those
/// shapes scores every kv head a key row at a time too (`Scores::dots_of_heads`): over 2048 positions 7.2-7.3 →
/// 6.1-6.2 ms, over 512 1.11-1.16 → 1.07-1.13 (three alternations). Where the kv heads are stored one after another
/// (`HeadMajorCache`), pass 3 takes even runs of 16-column chunks instead, one a core, a run crossing heads
/// (`Scores::add_weighted_units`): the same decode row over a head-by-head cache took 5.2 ms by runs of whole heads
/// (two and one), 4.6-4.7 by even runs (two alternations). Where neither kernel takes the shape (every shape on
/// AVX2), pass 3 takes even runs of 16-column chunks too, a run crossing heads folded head by head (`column_runs`),
/// so a core reads the heads it takes whole a whole row at a time: SmolLM2's shapes over 2048 positions of a
/// head-by-head cache on an AVX2 EPYC (the bench's 30 layers) 6.35-7.75 ms against 6.81-8.13 by (head, 32 columns)
/// tasks, five alternations. Every output is bitwise what that path gives: each score is `dot`, and each column is
/// folded over the same values in the same order.
fn attend_one_row<'a, P: KeyPart<'a>>(q: &[f32], shape: Heads, parts: &[P], att: &mut [f32]) {
    let Heads { width: hd, heads, group, scale } = shape;
    let kv_heads = heads / group.max(1);
    let queries = |g: usize| -> Vec<&[f32]> { (0..group).map(|j| &q[(g * group + j) * hd..][..hd]).collect() };
    // pass 1: (part, block of keys), every kv head of a block in one task (`Scores::dots_of_heads`): a cached row
    // holds the kv heads' keys side by side, and a task reading one head's share of each row (a third of its
    // lines, with three kv heads) is no faster than one reading them all; an empty part is one empty block
    let blocks: Vec<(usize, Range<usize>)> = parts
        .iter()
        .enumerate()
        .flat_map(|(k, part)| {
            let r = part.visible(0);
            let starts: Vec<usize> = if r.is_empty() { vec![r.start] } else { r.clone().step_by(KEY_SPLIT).collect() };
            starts.into_iter().map(move |a| (k, a..(a + KEY_SPLIT).min(r.end).max(a)))
        })
        .collect();
    let every_query: Vec<&[f32]> = (0..kv_heads).flat_map(queries).collect();
    let heads_at_once = Scores::scores_heads_at_once(kv_heads, group, hd);
    let pieces: Vec<Vec<Scores>> = crate::decode_team::map(&blocks, |(k, b)| {
        // the block's keys asked for before scoring: a kv head scored on its own reads a slice of every row, at
        // the row's stride, which the hardware prefetchers do not run ahead of. Where every head is scored a row
        // at a time (`Scores::heads_at_once`) the kernel asks for each row a few rows ahead itself, and the block's
        // asks up front only cost their gathering (SmolLM2's decode at 2048 positions: 122.0-128.5 tok/s with
        // them, 126.1-133.6 without, six alternations)
        if !heads_at_once {
            ask_rows(b.clone().flat_map(|p| (0..kv_heads).map(move |g| parts[*k].kv(g, p).0)));
        }
        Scores::dots_of_heads(&every_query, group, b.clone(), |g, p| parts[*k].kv(g, p).0)
    });
    // each (kv head, part)'s blocks joined, in order
    let mut by_head: Vec<Vec<Scores>> = (0..kv_heads).map(|_| Vec::with_capacity(blocks.len())).collect();
    for block in pieces {
        for (g, sc) in block.into_iter().enumerate() {
            by_head[g].push(sc);
        }
    }
    let mut scores: Vec<Vec<Scores>> = by_head
        .iter()
        .map(|head| {
            let mut joined = Vec::with_capacity(parts.len());
            let mut at = 0;
            while at < blocks.len() {
                let n = blocks[at..].iter().take_while(|(k, _)| *k == blocks[at].0).count();
                joined.push(Scores::joined(&head[at..at + n]));
                at += n;
            }
            joined
        })
        .collect();
    drop(by_head);
    // pass 2
    crate::decode_team::for_each_mut(&mut scores, |sc| softmax_parts(sc, scale));
    // pass 3, where the kv heads' values are not side by side (a cache stored head by head), a kernel folds a run of
    // output columns at once and each core's even share of the heads' columns fits one run: one run a core, a run
    // crossing heads where the kv heads do not divide among the cores. Where they are side by side, a core taking
    // part of a head would read part of each row at its stride, slower than the uneven runs of whole heads below
    // (a decode row of SmolLM2's shapes over 2048 positions: 6.7 ms against 6.3)
    let threads = rayon::current_num_threads();
    let units = Scores::units_at_once(group, hd).filter(|_| !heads_side_by_side(parts, kv_heads, hd));
    if let Some(most) = units {
        let chunks = hd / LANES;
        let total = kv_heads * chunks;
        let per = total.div_ceil(threads);
        if per <= most {
            let runs: Vec<Range<usize>> = (0..total).step_by(per.max(1)).map(|u| u..(u + per).min(total)).collect();
            let outs: Vec<Vec<f32>> = crate::decode_team::map(&runs, |units| {
                let mut out = vec![0.0; heads * hd];
                for (k, part) in parts.iter().enumerate() {
                    let sc: Vec<&Scores> = scores.iter().map(|head| &head[k]).collect();
                    Scores::add_weighted_units(&sc, units.clone(), |g, p| part.kv(g, p).1, &mut out);
                }
                out
            });
            for (units, out) in runs.iter().zip(&outs) {
                for u in units.clone() {
                    let (g, c) = (u / chunks, u % chunks);
                    for j in 0..group {
                        let at = (g * group + j) * hd + c * LANES;
                        att[at..at + LANES].copy_from_slice(&out[at..at + LANES]);
                    }
                }
            }
            return;
        }
    }
    // pass 3, where a kernel folds several kv heads at once: runs of consecutive kv heads, about one run a core
    // (at most what the kernel takes), each run reading its heads' share of a value row at once
    if let Some(most) = Scores::heads_at_once(group, hd) {
        let run = kv_heads.div_ceil(threads).clamp(1, most);
        let runs: Vec<Range<usize>> = (0..kv_heads).step_by(run).map(|g| g..(g + run).min(kv_heads)).collect();
        let outs: Vec<Vec<f32>> = crate::decode_team::map(&runs, |heads| {
            let mut out = vec![0.0; heads.len() * group * hd];
            for (k, part) in parts.iter().enumerate() {
                let sc: Vec<&Scores> = heads.clone().map(|g| &scores[g][k]).collect();
                let mut rows: Vec<&mut [f32]> = out.chunks_exact_mut(group * hd).collect();
                Scores::add_weighted_heads(&sc, |g, p| part.kv(heads.start + g, p).1, &mut rows);
            }
            out
        });
        for (heads, out) in runs.iter().zip(&outs) {
            att[heads.start * group * hd..heads.end * group * hd].copy_from_slice(out);
        }
        return;
    }
    // pass 3 otherwise: each core an even run of the kv heads' 16-column chunks counted over the heads in order (the
    // columns past a head's last whole chunk go with its last chunk), a run crossing heads folded head by head. A
    // head a run takes whole is read a whole row at a time, block by block (`add_weighted_columns`), where a task of
    // part of a head reads part of each row at the row's stride: one core reads whole rows of a head-by-head cache
    // at 1.6 times the rate (docs/engines.md, *The weighted sums' runs on AVX2*)
    let runs = column_runs(kv_heads, hd, threads);
    let outs: Vec<Vec<Vec<f32>>> = crate::decode_team::map(&runs, |run| {
        run.iter()
            .map(|(g, cols)| {
                let mut out = vec![0.0; group * hd];
                for (part, sc) in parts.iter().zip(&scores[*g]) {
                    sc.add_weighted_columns(|p| part.kv(*g, p).1, &mut out, cols.clone());
                }
                out
            })
            .collect()
    });
    for ((g, cols), out) in runs.iter().flatten().zip(outs.iter().flatten()) {
        for j in 0..group {
            att[(g * group + j) * hd + cols.start..][..cols.len()]
                .copy_from_slice(&out[j * hd + cols.start..][..cols.len()]);
        }
    }
}

/// The output columns of `kv_heads` heads of `width` cut into `cores` even runs of 16-column chunks counted over the
/// heads in order (a head's columns past its last whole chunk go with that chunk; a head narrower than a chunk is
/// one): each run as its (kv head, columns) pieces, in order. Every column of every head is in exactly one piece.
fn column_runs(kv_heads: usize, width: usize, cores: usize) -> Vec<Vec<(usize, Range<usize>)>> {
    let per_head = (width / LANES).max(1);
    let total = kv_heads * per_head;
    let per = total.div_ceil(cores.max(1)).max(1);
    let unit_cols = |c: usize| c * LANES..if c + 1 == per_head { width } else { (c + 1) * LANES };
    (0..total)
        .step_by(per)
        .map(|u| {
            let run = u..(u + per).min(total);
            (run.start / per_head..=(run.end - 1) / per_head)
                .map(|g| {
                    let (first, last) = (run.start.max(g * per_head), run.end.min((g + 1) * per_head) - 1);
                    (g, unit_cols(first - g * per_head).start..unit_cols(last - g * per_head).end)
                })
                .collect()
        })
        .collect()
}

/// Whether a position's kv heads lie side by side in one row (head `g + 1`'s values right after head `g`'s), judged
/// at the first position a part holds; `true` with a single kv head or no position at all.
fn heads_side_by_side<'a, P: KeyPart<'a>>(parts: &[P], kv_heads: usize, hd: usize) -> bool {
    let Some((part, p)) = parts.iter().find_map(|part| part.visible(0).next().map(|p| (part, p))) else {
        return true;
    };
    (1..kv_heads).all(|g| part.kv(g, p).1.as_ptr() == part.kv(g - 1, p).1.as_ptr().wrapping_add(hd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attend;
    use crate::rng::SplitMix64;

    /// Every (row, head) output of `attend_rows` is bitwise `attend` of that query alone over its row's range and
    /// its kv head's rows: across row blocks (more rows than one task takes), every head of a group, sliding
    /// windows, a segment small enough to stay on the calling thread, and single rows (decode steps) split over
    /// key blocks and output columns; each with the kv heads of a position side by side and stored head by head.
    #[test]
    fn every_query_gets_what_it_gets_alone() {
        let mut r = SplitMix64::new(7);
        for (rows, heads, group, hd, window, pos0) in [
            (40, 4, 2, 32, usize::MAX, 5),
            (3, 6, 3, 16, usize::MAX, 0),
            (37, 8, 8, 24, 9, 11),
            (1, 2, 1, 64, 4, 30),
            // decode steps long enough to split over key blocks and output columns: three kv heads and five (runs
            // of columns crossing heads where stored head by head), a width with a tail past its last whole chunk
            // and a window that starts past 0, a width under one chunk
            (1, 9, 3, 64, usize::MAX, 2047),
            (1, 10, 2, 32, usize::MAX, 1500),
            (1, 4, 2, 72, 700, 900),
            (1, 8, 8, 8, usize::MAX, 2100),
            // a width no fold kernel takes on any CPU, so pass 3 goes by runs of columns crossing heads there too,
            // with a tail past the last whole chunk
            (1, 6, 2, 40, usize::MAX, 2000),
        ] {
            let shape = Heads { width: hd, heads, group, scale: 0.3 };
            let (qd, kvd) = (heads * hd, heads / group * hd);
            let positions = pos0 + rows;
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let (q, k, vals) = (v(rows * qd), v(positions * kvd), v(positions * kvd));
            let visible = |i: usize| (pos0 + i + 1).saturating_sub(window)..pos0 + i + 1;
            // the kv heads of a position side by side in one row, or stored head by head (each head's rows in
            // one run, as `HeadMajorCache` keeps them)
            for head_major in [false, true] {
                let at = |g: usize, p: usize| if head_major { (g * positions + p) * hd } else { p * kvd + g * hd };
                let kv = |g: usize, p: usize| (&k[at(g, p)..][..hd], &vals[at(g, p)..][..hd]);
                let mut att = vec![f32::NAN; rows * qd];
                attend_rows(&q, shape, visible, kv, &mut att);
                for i in 0..rows {
                    for h in 0..heads {
                        let mut want = vec![0.0; hd];
                        let qh = &q[i * qd + h * hd..][..hd];
                        attend(qh, visible(i).map(|p| kv(h / group, p)), 0.3, &mut Vec::new(), &mut want);
                        let got = &att[i * qd + h * hd..][..hd];
                        assert!(
                            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{rows} rows x {heads} heads (group {group}, head major {head_major}): row {i} head {h}"
                        );
                    }
                }
            }
        }
    }

    /// Pass 3's runs cover every column of every kv head once, in order, each run a core's even share of the
    /// 16-column chunks (within one chunk), crossing heads where the share ends inside a head: SmolLM2's shape on two
    /// cores is a whole head and half of the next each.
    #[test]
    fn column_runs_cover_every_column_once_in_even_shares() {
        assert_eq!(column_runs(3, 64, 2), vec![vec![(0, 0..64), (1, 0..32)], vec![(1, 32..64), (2, 0..64)]]);
        assert_eq!(column_runs(3, 40, 2), vec![vec![(0, 0..40), (1, 0..16)], vec![(1, 16..40), (2, 0..40)]]);
        assert_eq!(column_runs(1, 8, 2), vec![vec![(0, 0..8)]]);
        for kv_heads in 1..7 {
            for width in [1, 8, 16, 24, 40, 64, 72, 128] {
                for cores in 1..9 {
                    let runs = column_runs(kv_heads, width, cores);
                    let pieces: Vec<(usize, Range<usize>)> = runs.iter().flatten().cloned().collect();
                    let mut next = (0, 0);
                    for (g, cols) in &pieces {
                        assert_eq!((*g, cols.start), next, "{kv_heads} x {width} on {cores}: {runs:?}");
                        assert!(cols.start < cols.end, "{kv_heads} x {width} on {cores}: an empty piece");
                        next = if cols.end == width { (g + 1, 0) } else { (*g, cols.end) };
                    }
                    assert_eq!(next, (kv_heads, 0), "{kv_heads} x {width} on {cores}: {runs:?}");
                    // a piece's chunks: the chunk starts it holds (a head's tail past its last whole chunk is no
                    // chunk of its own)
                    let per_head = (width / LANES).max(1);
                    let chunks = |run: &Vec<(usize, Range<usize>)>| -> usize {
                        run.iter().map(|(_, c)| c.end.div_ceil(LANES).min(per_head) - c.start / LANES).sum()
                    };
                    let sizes: Vec<usize> = runs.iter().map(chunks).collect();
                    // every run the same share but the last, which holds what is left
                    let most = sizes[0];
                    assert!(runs.len() <= cores, "{kv_heads} x {width} on {cores}: {} runs", runs.len());
                    assert!(
                        sizes[..sizes.len() - 1].iter().all(|s| *s == most) && sizes[sizes.len() - 1] <= most,
                        "{kv_heads} x {width} on {cores}: {sizes:?}"
                    );
                }
            }
        }
    }

    /// Rows that see no key at all, their empty range starting below or above the others' keys: each gets what it
    /// gets alone (the rows' key lists span every index a task's rows name, empty ranges' starts included).
    #[test]
    fn rows_that_see_nothing_beside_rows_that_see_keys() {
        let mut r = SplitMix64::new(11);
        let (rows, heads, group, hd, positions) = (20, 4, 2, 16, 40);
        let shape = Heads { width: hd, heads, group, scale: 0.3 };
        let (qd, kvd) = (heads * hd, heads / group * hd);
        let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
        let (q, k, vals) = (v(rows * qd), v(positions * kvd), v(positions * kvd));
        let kv = |g: usize, p: usize| (&k[p * kvd + g * hd..][..hd], &vals[p * kvd + g * hd..][..hd]);
        for visible in [
            |i: usize| if i.is_multiple_of(5) { 1..1 } else { 6..10 + i },
            |i: usize| if i < 3 { 35..35 } else { 2..i },
        ] {
            let mut att = vec![f32::NAN; rows * qd];
            attend_rows(&q, shape, visible, kv, &mut att);
            for i in 0..rows {
                for h in 0..heads {
                    let mut want = vec![0.0; hd];
                    attend(
                        &q[i * qd + h * hd..][..hd],
                        visible(i).map(|p| kv(h / group, p)),
                        0.3,
                        &mut Vec::new(),
                        &mut want,
                    );
                    let got = &att[i * qd + h * hd..][..hd];
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "row {i} head {h}");
                }
            }
        }
    }

    /// `attend_rows_in_parts` over two key sequences (rows of a compressed sequence, one per 4 positions, then a
    /// raw window) is bitwise `attend` of each query alone over its keys of the first part followed by those of the
    /// second: across row blocks, rows that see no compressed row yet, widths with and without a tail past the last
    /// whole chunk, and a segment small enough to stay on the calling thread.
    #[test]
    fn parts_are_one_key_sequence() {
        let mut r = SplitMix64::new(11);
        for (rows, heads, group, hd, window, pos0) in [
            (45, 8, 2, 32, 64, 500),
            (6, 4, 2, 24, 3, 0),
            (33, 6, 3, 16, 200, 40),
            (1, 2, 1, 40, 8, 90),
            // decode steps split over key blocks and output columns: both parts long, then an empty raw part
            (1, 8, 2, 40, 300, 3000),
            (1, 8, 2, 40, 0, 3000),
        ] {
            let shape = Heads { width: hd, heads, group, scale: 0.25 };
            let (qd, kvd) = (heads * hd, heads / group * hd);
            let positions = pos0 + rows;
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let (q, comp, k, vals) = (v(rows * qd), v(positions / 4 * kvd), v(positions * kvd), v(positions * kvd));
            let compressed = Keys {
                visible: |i: usize| 0..(pos0 + i + 1) / 4,
                kv: |g: usize, b: usize| {
                    let c = &comp[b * kvd + g * hd..][..hd];
                    (c, c)
                },
            };
            let raw = Keys {
                visible: |i: usize| (pos0 + i + 1).saturating_sub(window)..pos0 + i + 1,
                kv: |g: usize, p: usize| (&k[p * kvd + g * hd..][..hd], &vals[p * kvd + g * hd..][..hd]),
            };
            let mut att = vec![f32::NAN; rows * qd];
            let parts: [&dyn KeyPart; 2] = [&compressed, &raw];
            attend_rows_in_parts(&q, shape, &parts, &mut att);
            for i in 0..rows {
                for h in 0..heads {
                    let g = h / group;
                    let keys =
                        compressed.visible(i).map(|b| compressed.kv(g, b)).chain(raw.visible(i).map(|p| raw.kv(g, p)));
                    let mut want = vec![0.0; hd];
                    attend(&q[i * qd + h * hd..][..hd], keys, 0.25, &mut Vec::new(), &mut want);
                    let got = &att[i * qd + h * hd..][..hd];
                    assert!(
                        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{rows} rows x {heads} heads (group {group}, width {hd}): row {i} head {h}"
                    );
                }
            }
        }
    }
}
