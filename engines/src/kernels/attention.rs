//! Scaled dot-product attention over keys given in ascending position order: one query (`attend`), or several
//! that share their keys (`attend_many`: the heads of a GQA group, the rows of a prefill block), which walks every
//! key and value row once for all of them. Both give each query the same bits.
//!
//! Each score is `dot(q, k) · scale` (bitwise `dot`, in register tiles of sixteen), the scores of a query go
//! through `softmax_in_place`, and each output element folds `pⱼ · vⱼ` into a sum starting at 0.0, one fused
//! multiply-add per key in key order. Callers yield keys in ascending absolute position, so the order depends only
//! on which positions are visible, never on where the rows are stored (ring, scratch, full cache) nor on which
//! other queries attend alongside.

use std::ops::Range;

use super::attention_tiles::fold;
use super::dot_tiles::{dots, dots_three, three_in_one_pass};
use super::matmul::{dot4, LANES};
use super::{dot, softmax_scaled};

/// Value rows a single-query weighted sum gathers before folding them (a stack array of row slices).
const VALUE_BLOCK: usize = 64;
/// Key or value rows every query takes before the next ones are read: 16 KiB of 64-wide rows, in L1.
const KEY_BLOCK: usize = 64;

/// `out = softmax(q·kⱼ · scale) · vⱼ` over the (key, value) rows yielded, in the order yielded.
pub fn attend<'a>(
    q: &[f32],
    kv: impl Iterator<Item = (&'a [f32], &'a [f32])> + Clone,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    push_dots(q, kv.clone().map(|(k, _)| k), scores);
    softmax_scaled(scores, scale);
    weighted_sum(scores, kv.map(|(_, v)| v), out);
}

/// `attend` for several queries of one width at once: query `r` attends over key indices `ranges[r]` (ascending),
/// the rows of index `j` being `kv(j)`; its output goes to `out[r · width..(r + 1) · width]`. Each query's output
/// is bitwise what `attend` gives it alone. The indices all ranges share are walked once for every query, in
/// tiles that load a key or value row once for several queries; the rest query by query.
pub fn attend_many<'a>(
    queries: &[&[f32]],
    ranges: &[Range<usize>],
    kv: impl Fn(usize) -> (&'a [f32], &'a [f32]),
    scale: f32,
    out: &mut [f32],
) {
    let mut scores = Scores::dots(queries, ranges, |j| kv(j).0);
    scores.softmax(scale);
    scores.weighted(|j| kv(j).1, out);
}

/// The scores of several queries over ranges of one key sequence (query `r` over indices `ranges[r]`), then their
/// softmax and weighted sums: `attend_many` in steps, for attention whose score has more than one part (an MLA
/// latent part plus a rope part).
#[derive(Debug, Clone)]
pub struct Scores {
    ranges: Vec<Range<usize>>,
    /// The lowest index any query sees; row `r` holds the scores of indices `lo..lo + n`.
    lo: usize,
    n: usize,
    /// Query `r`'s score of index `lo + j` at `s[r · n + j]` (only its own indices are meaningful).
    s: Vec<f32>,
}

impl Scores {
    /// `dot(qᵣ, key(j))` for every query `r` and index `j` of its range, each bitwise `dot`: the indices all ranges
    /// share in register tiles that load a key once for several queries, the rest query by query. Three queries
    /// over one range (a kv head's GQA group of three in a decode step) take `dots_three`'s one pass.
    pub fn dots<'a>(queries: &[&[f32]], ranges: &[Range<usize>], key: impl Fn(usize) -> &'a [f32]) -> Scores {
        assert_eq!(ranges.len(), queries.len(), "attention scores: one range per query");
        let width = queries.first().map_or(0, |q| q.len());
        assert!(queries.iter().all(|q| q.len() == width), "attention scores: queries of different widths");
        let ranges: Vec<Range<usize>> = ranges.iter().map(|r| r.start..r.end.max(r.start)).collect();
        if ranges.len() == 3 && ranges.iter().all(|r| *r == ranges[0]) && takes_dots_three(width, &ranges[0]) {
            // a decode step's GQA group of three: the three-row tile reads each key once for all of them
            let keys: Vec<&[f32]> = ranges[0].clone().map(key).collect();
            return Scores::dots_three_of_heads(queries, ranges[0].clone(), &[keys])
                .pop()
                .expect("one kv head's scores");
        }
        let lo = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.end).max().unwrap_or(lo);
        let keys: Vec<&[f32]> = (lo..hi).map(key).collect();
        assert!(keys.iter().all(|k| k.len() == width), "attention scores: a key is not as wide as the queries");
        let pairs: usize = ranges.iter().map(|r| r.len()).sum();
        super::work::count(2 * pairs * width, 0);
        super::work::count_cache(keys.len(), width);
        let mut sc = Scores { lo, n: hi - lo, s: spare_buffer(queries.len() * (hi - lo)), ranges };
        let (start, end) = sc.shared();
        for (r, q) in queries.iter().enumerate() {
            let mine = sc.own(r);
            let row = &mut sc.s[r * sc.n..(r + 1) * sc.n];
            for part in [mine.start..start.min(mine.end), end.clamp(mine.start, mine.end)..mine.end] {
                dots_into(q, &keys[part.clone()], &mut row[part]);
            }
        }
        common_dots(queries, &keys[start..end], start, sc.n, &mut sc.s);
        sc
    }

    /// `dots` for the queries of several kv heads that all see the indices `range`: `queries` holds `group` queries
    /// per kv head, in head order, and `key(g, p)` is kv head `g`'s key at index `p`; one `Scores` per kv head,
    /// bitwise `dots` of its queries. With three queries a head on AVX2 (a decode step of a model with GQA groups of
    /// three) the heads take each pair of indices in turn (`dots_three`): their keys lie side by side in a cached
    /// row, so the rows are read in address order. Where `heads_at_once` takes the shape (AVX-512) every head's
    /// queries meet a key row's heads at once, for the same reason.
    pub fn dots_of_heads<'a>(
        queries: &[&[f32]],
        group: usize,
        range: Range<usize>,
        key: impl Fn(usize, usize) -> &'a [f32],
    ) -> Vec<Scores> {
        let heads = queries.len() / group.max(1);
        assert_eq!(heads * group, queries.len(), "attention scores: queries are not whole groups");
        let width = queries.first().map_or(0, |q| q.len());
        if Scores::scores_heads_at_once(heads, group, width) && !range.is_empty() {
            return Scores::dots_of_heads_at_once(queries, group, range, key);
        }
        if group != 3 || !takes_dots_three(width, &range) {
            let ranges = vec![range.clone(); group];
            return (0..heads)
                .map(|g| Scores::dots(&queries[g * group..(g + 1) * group], &ranges, |p| key(g, p)))
                .collect();
        }
        let keys: Vec<Vec<&[f32]>> = (0..heads).map(|g| range.clone().map(|p| key(g, p)).collect()).collect();
        Scores::dots_three_of_heads(queries, range, &keys)
    }

    /// `dots_of_heads` where `heads_at_once` takes the shape: every head's queries against a cached row's heads at
    /// once (`dot_tiles::dots_heads`), so rows holding the heads side by side are read once, start to end; the keys
    /// past the last tile of sixteen by `dot`. Each score is `dot`'s bits.
    fn dots_of_heads_at_once<'a>(
        queries: &[&[f32]],
        group: usize,
        range: Range<usize>,
        key: impl Fn(usize, usize) -> &'a [f32],
    ) -> Vec<Scores> {
        let heads = queries.len() / group;
        let width = queries[0].len();
        assert!(queries.iter().all(|q| q.len() == width), "attention scores: queries of different widths");
        let n = range.len();
        let whole = n / 16 * 16;
        super::work::count(2 * queries.len() * n * width, 0);
        super::work::count_cache(heads * n, width);
        let mut out: Vec<Scores> = (0..heads)
            .map(|_| Scores { ranges: vec![range.clone(); group], lo: range.start, n, s: spare_buffer(group * n) })
            .collect();
        // every shape `heads_at_once` names, each compiled with its registers fixed
        macro_rules! shapes {
            ($(($g:literal, $q:literal, $c:literal)),*) => {
                match (heads, group, width / LANES) {
                    $(($g, $q, $c) => {
                        let q: [[&[f32]; $q]; $g] =
                            std::array::from_fn(|g| std::array::from_fn(|j| queries[g * group + j]));
                        let keys: Vec<[&[f32]; $g]> =
                            range.clone().take(whole).map(|p| std::array::from_fn(|g| key(g, p))).collect();
                        assert!(
                            keys.iter().flatten().all(|k| k.len() == width),
                            "attention scores: a key is not as wide as the queries"
                        );
                        let mut outs = out.iter_mut();
                        let o: [[&mut [f32]; $q]; $g] = std::array::from_fn(|_| {
                            let mut rows = outs.next().expect("scores per head").s.chunks_exact_mut(n);
                            std::array::from_fn(|_| &mut rows.next().expect("a row per query")[..whole])
                        });
                        super::dot_tiles::dots_heads::<$g, $q, $c>(q, &keys, o);
                    })*
                    _ => unreachable!("heads_at_once names no such shape"),
                }
            };
        }
        super::attention_tiles::heads_shapes!(shapes);
        for (g, sc) in out.iter_mut().enumerate() {
            for (j, row) in sc.s.chunks_exact_mut(n).enumerate() {
                let q = queries[g * group + j];
                for (x, p) in row[whole..].iter_mut().zip(range.start + whole..range.end) {
                    let k = key(g, p);
                    assert_eq!(k.len(), width, "attention scores: a key is not as wide as the queries");
                    *x = dot(q, k);
                }
            }
        }
        out
    }

    /// `dots_of_heads` on `dots_three` (only where `takes_dots_three`): three queries per kv head, `keys[g]` kv
    /// head `g`'s keys over `range`. Not generic over the key lookup, so `dots` can call it.
    fn dots_three_of_heads(queries: &[&[f32]], range: Range<usize>, keys: &[Vec<&[f32]>]) -> Vec<Scores> {
        let (group, heads) = (3, keys.len());
        assert_eq!(queries.len(), heads * group, "attention scores: three queries per kv head");
        let width = queries.first().map_or(0, |q| q.len());
        let chunks = width / LANES;
        assert!(queries.iter().all(|q| q.len() == width), "attention scores: queries of different widths");
        let n = range.len();
        assert!(
            keys.iter().flatten().all(|k| k.len() == width),
            "attention scores: a key is not as wide as the queries"
        );
        super::work::count(2 * queries.len() * n * width, 0);
        super::work::count_cache(heads * n, width);
        let mut out: Vec<Scores> = (0..heads)
            .map(|_| Scores { ranges: vec![range.clone(); group], lo: range.start, n, s: spare_buffer(group * n) })
            .collect();
        let whole = n / 2 * 2;
        {
            let q: Vec<[&[f32]; 3]> = queries.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect();
            let k: Vec<&[&[f32]]> = keys.iter().map(|k| &k[..whole]).collect();
            let mut o: Vec<[&mut [f32]; 3]> = out
                .iter_mut()
                .map(|sc| {
                    let mut rows = sc.s.chunks_exact_mut(n);
                    std::array::from_fn(|_| &mut rows.next().expect("3 score rows")[..whole])
                })
                .collect();
            dots_three(&q, &k, chunks, &mut o);
        }
        for ((sc, kh), qh) in out.iter_mut().zip(keys).zip(queries.chunks_exact(3)) {
            for (row, q) in sc.s.chunks_exact_mut(n).zip(qh) {
                finish_row(row, q, kh, whole, chunks);
            }
        }
        out
    }

    /// The scores of consecutive blocks of indices (piece `k`: every query over the same block, the blocks in
    /// order, each starting where the one before ends) as one `Scores` of every query over all of them: so the
    /// blocks of a long key sequence can be scored side by side, each score still `dot`'s.
    pub fn joined(pieces: &[Scores]) -> Scores {
        let queries = pieces.first().map_or(0, |p| p.ranges.len());
        assert!(pieces.iter().all(|p| p.ranges.len() == queries), "joined scores: different numbers of queries");
        assert!(
            pieces.iter().all(|p| p.ranges.iter().all(|r| *r == (p.lo..p.lo + p.n)))
                && pieces.windows(2).all(|w| w[0].lo + w[0].n == w[1].lo),
            "joined scores: pieces are not consecutive blocks every query sees whole"
        );
        let lo = pieces.first().map_or(0, |p| p.lo);
        let n: usize = pieces.iter().map(|p| p.n).sum();
        let mut s = spare_buffer(queries * n);
        for (r, row) in s.chunks_exact_mut(n.max(1)).enumerate().take(queries) {
            let mut at = 0;
            for p in pieces {
                row[at..at + p.n].copy_from_slice(&p.s[r * p.n..(r + 1) * p.n]);
                at += p.n;
            }
        }
        Scores { ranges: vec![lo..lo + n; queries], lo, n, s }
    }

    /// The indices every query sees, relative to `lo` (empty when the ranges do not all overlap).
    fn shared(&self) -> (usize, usize) {
        let start = self.ranges.iter().map(|r| r.start).max().unwrap_or(self.lo) - self.lo;
        let end = self.ranges.iter().map(|r| r.end).min().unwrap_or(self.lo) - self.lo;
        (start, end.max(start))
    }

    /// Query `r`'s indices, relative to `lo`.
    fn own(&self, r: usize) -> Range<usize> {
        self.ranges[r].start - self.lo..self.ranges[r].end - self.lo
    }

    /// Query `r`'s scores, in index order.
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        let mine = self.own(r);
        &mut self.s[r * self.n..(r + 1) * self.n][mine]
    }

    /// Adds `other`'s scores (the same queries and ranges) to these, pair by pair.
    pub fn add(&mut self, other: &Scores) {
        assert!(self.ranges == other.ranges, "attention scores: adding scores of other ranges");
        self.s.iter_mut().zip(&other.s).for_each(|(a, b)| *a += b);
    }

    /// Each query's scores times `scale`, then through `softmax_in_place`: the weights of its values.
    pub fn softmax(&mut self, scale: f32) {
        for r in 0..self.ranges.len() {
            let p = self.row_mut(r);
            softmax_scaled(p, scale);
        }
    }

    /// `out[r] = Σⱼ wᵣⱼ · value(j)` over query `r`'s indices, each output element summed from 0.0 in index order
    /// with one fused multiply-add per value (`out` is queries x width); the shared indices fold several queries
    /// per loaded value row.
    pub fn weighted<'a>(&self, value: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
        out.fill(0.0);
        self.add_weighted(value, out);
    }

    /// `weighted`, continuing the sums already in `out` instead of starting them at 0.0: the values of a later
    /// part of a key sequence that `softmax_parts` weighed together with the earlier ones.
    pub fn add_weighted<'a>(&self, value: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
        let width = out.len() / self.ranges.len().max(1);
        self.add_weighted_columns(value, out, 0..width);
    }

    /// How many kv heads `add_weighted_heads` folds at once for `group` queries a head of `width`, or `None` where
    /// it would fold head by head (no AVX-512, a shape without a kernel).
    pub fn heads_at_once(group: usize, width: usize) -> Option<usize> {
        if width == 0 || !width.is_multiple_of(LANES) {
            return None;
        }
        super::attention_tiles::heads_at_once(group, width / LANES)
    }

    /// Whether `dots_of_heads` scores `heads` kv heads of `group` queries of `width` a key row at a time (every
    /// head's queries against a row's heads at once) over a non-empty range, rather than head by head.
    pub fn scores_heads_at_once(heads: usize, group: usize, width: usize) -> bool {
        Scores::heads_at_once(group, width).is_some_and(|most| heads <= most)
    }

    /// `add_weighted` of several kv heads at once: `heads[g]` weighs kv head `g`'s values `value(g, j)` into
    /// `out[g]` (its queries x width). Where every query of every head sees the same indices and the shape is one
    /// `heads_at_once` takes, each value row's heads are read together, one pass over rows that hold them side by
    /// side (a head at a time reads a slice of each row at the row's stride, which memory serves at a third of the
    /// speed); else head by head. Each head's sums are `add_weighted`'s bits either way.
    pub fn add_weighted_heads<'a>(
        heads: &[&Scores],
        value: impl Fn(usize, usize) -> &'a [f32],
        out: &mut [&mut [f32]],
    ) {
        assert_eq!(heads.len(), out.len(), "attention sums: one output per head");
        let group = heads.first().map_or(0, |h| h.ranges.len());
        let width = out.first().map_or(0, |o| o.len() / group.max(1));
        // a shape the kernel takes has two or more queries a head, so `ranges[0]` exists below
        let fits = Scores::heads_at_once(group, width).is_some_and(|most| heads.len() <= most);
        let same =
            fits && heads.iter().all(|h| {
                let r0 = &heads[0].ranges[0];
                h.ranges.len() == group && h.ranges.iter().all(|r| r == r0) && h.lo == r0.start && h.n == r0.len()
            }) && out.iter().all(|o| o.len() == group * width);
        if !same || heads[0].n == 0 {
            for ((h, o), g) in heads.iter().zip(out.iter_mut()).zip(0..) {
                h.add_weighted(|j| value(g, j), o);
            }
            return;
        }
        let (lo, n) = (heads[0].lo, heads[0].n);
        let pairs = heads.len() * group * n;
        super::work::count(2 * pairs * width, 0);
        super::work::count_cache(heads.len() * n, width);
        // every shape `heads_at_once` names, each compiled with its registers fixed
        macro_rules! shapes {
            ($(($g:literal, $q:literal, $c:literal)),*) => {
                match (heads.len(), group, width / LANES) {
                    $(($g, $q, $c) => {
                        let p: [[&[f32]; $q]; $g] =
                            std::array::from_fn(|g| std::array::from_fn(|q| &heads[g].s[q * n..(q + 1) * n]));
                        let v: Vec<[&[f32]; $g]> = (lo..lo + n).map(|j| std::array::from_fn(|g| value(g, j))).collect();
                        let mut outs = out.iter_mut();
                        let acc: [[&mut [f32]; $q]; $g] = std::array::from_fn(|_| {
                            let mut rows = outs.next().expect("an output per head").chunks_exact_mut(width);
                            std::array::from_fn(|_| rows.next().expect("a row per query"))
                        });
                        super::attention_tiles::fold_heads::<$g, $q, $c>(p, &v, acc);
                    })*
                    _ => unreachable!("heads_at_once names no such shape"),
                }
            };
        }
        super::attention_tiles::heads_shapes!(shapes);
    }

    /// How many chunks of sixteen output columns `add_weighted_units` folds at once for `group` queries a head of
    /// `width`, or `None` where it has no kernel for the shape (no AVX-512, a width that is not whole chunks).
    pub fn units_at_once(group: usize, width: usize) -> Option<usize> {
        if width == 0 || !width.is_multiple_of(LANES) {
            return None;
        }
        super::attention_tiles::units_at_once(group)
    }

    /// `add_weighted_heads` for a run of output columns only: the chunks of sixteen columns `units` counted over
    /// the heads in order (unit `u` is chunk `u % chunks` of head `u / chunks`, `chunks` the head's width over
    /// sixteen), the other columns of `out` left as they are. `out` is every head's queries x width, head by head.
    /// Tasks taking different runs together give `add_weighted`'s bits, and a run may cross heads, so every core
    /// can take an even share of a cached row's columns however many kv heads there are. Where every query of the
    /// heads the run touches sees the same indices and `units_at_once` takes the run, the run's share of each value
    /// row is read at once; else head by head (`add_weighted_columns`).
    pub fn add_weighted_units<'a>(
        heads: &[&Scores],
        units: Range<usize>,
        value: impl Fn(usize, usize) -> &'a [f32],
        out: &mut [f32],
    ) {
        let group = heads.first().map_or(0, |h| h.ranges.len());
        let width = out.len() / (heads.len() * group).max(1);
        assert_eq!(out.len(), heads.len() * group * width, "attention sums: out is not heads x queries x width");
        assert!(width.is_multiple_of(LANES), "attention sums: a {width}-wide head is not whole chunks");
        let chunks = width / LANES;
        assert!(units.end <= heads.len() * chunks, "attention sums: units {units:?} past {} heads", heads.len());
        if units.is_empty() {
            return;
        }
        let touched = &heads[units.start / chunks..=(units.end - 1) / chunks];
        let r0 = &touched[0].ranges[0];
        let same = touched.iter().all(|h| {
            h.ranges.len() == group && h.ranges.iter().all(|r| r == r0) && h.lo == r0.start && h.n == r0.len()
        });
        let fits = Scores::units_at_once(group, width).is_some_and(|most| units.len() <= most);
        if !same || !fits || r0.is_empty() {
            for g in units.start / chunks..=(units.end - 1) / chunks {
                let cols = units.start.max(g * chunks) - g * chunks..units.end.min((g + 1) * chunks) - g * chunks;
                let o = &mut out[g * group * width..(g + 1) * group * width];
                heads[g].add_weighted_columns(|j| value(g, j), o, cols.start * LANES..cols.end * LANES);
            }
            return;
        }
        let (lo, n) = (r0.start, r0.len());
        super::work::count(2 * group * n * units.len() * LANES, 0);
        super::work::count_cache(n, units.len() * LANES);
        let (first, count) = (units.start, units.len());
        // unit u of the run is chunk (first + u) of the heads' columns; query q's sums of it are the `(first + u)`th
        // chunk of that head's query q row
        let head_of = |u: usize| (first + u) / chunks;
        let at = |u: usize| (first + u) % chunks * LANES;
        let mut slots: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(LANES).map(Some).collect();
        let mut take = |u: usize, q: usize| -> &mut [f32] {
            let (g, c) = (head_of(u), (first + u) % chunks);
            slots[(g * group + q) * chunks + c].take().expect("each unit's query chunk taken once")
        };
        // every shape `units_at_once` names, each compiled with its registers fixed
        macro_rules! shapes {
            ($(($u:literal, $q:literal)),*) => {
                match (count, group) {
                    $(($u, $q) => {
                        let w: [[&[f32]; $q]; $u] =
                            std::array::from_fn(|u| std::array::from_fn(|q| &heads[head_of(u)].s[q * n..(q + 1) * n]));
                        let acc: [[&mut [f32]; $q]; $u] = std::array::from_fn(|u| std::array::from_fn(|q| take(u, q)));
                        let units: [(usize, usize); $u] = std::array::from_fn(|u| (head_of(u), at(u)));
                        super::attention_tiles::fold_units::<$u, $q>(w, |g, j| value(g, lo + j), units, n, acc);
                    })*
                    _ => unreachable!("units_at_once names no such shape"),
                }
            };
        }
        super::attention_tiles::units_shapes!(shapes);
    }

    /// `add_weighted` for the output columns `cols` only (the other columns of `out` are left as they are):
    /// `cols.start` is a multiple of 16, and `cols.end` too unless it is the row's end. Each column's sums are
    /// independent of the others', so tasks taking different columns together give `add_weighted`'s bits.
    pub fn add_weighted_columns<'a>(&self, value: impl Fn(usize) -> &'a [f32], out: &mut [f32], cols: Range<usize>) {
        let queries = self.ranges.len();
        if queries == 0 {
            return;
        }
        assert!(out.len().is_multiple_of(queries), "attention sums: out is not queries x width");
        let width = out.len() / queries;
        let whole = width / LANES;
        assert!(
            cols.start.is_multiple_of(LANES)
                && cols.start <= cols.end
                && cols.end <= width
                && (cols.end.is_multiple_of(LANES) || cols.end == width),
            "attention sums: columns {cols:?} are not whole chunks of a {width}-wide row"
        );
        let values: Vec<&[f32]> = (self.lo..self.lo + self.n).map(value).collect();
        assert!(values.iter().all(|v| v.len() >= width), "attention sums: a value row is narrower than out");
        let pairs: usize = self.ranges.iter().map(|r| r.len()).sum();
        super::work::count(2 * pairs * cols.len(), 0);
        super::work::count_cache(values.len(), cols.len());
        let (start, end) = self.shared();
        let n = self.n;
        let weights = |r: usize, part: Range<usize>| &self.s[r * n..(r + 1) * n][part];
        // each query's sums in index order: its own leading indices, the shared ones, its own trailing ones
        let chunks = cols.start / LANES..(cols.end / LANES).min(whole);
        for r in 0..queries {
            let part = self.own(r).start..start.min(self.own(r).end);
            let o = &mut out[r * width..(r + 1) * width];
            fold_rows(&[weights(r, part.clone())], &values[part], o, chunks.clone());
        }
        let shared: Vec<&[f32]> = (0..queries).map(|r| weights(r, start..end)).collect();
        fold_rows(&shared, &values[start..end], out, chunks.clone());
        for r in 0..queries {
            let mine = self.own(r);
            let part = end.clamp(mine.start, mine.end)..mine.end;
            let o = &mut out[r * width..(r + 1) * width];
            fold_rows(&[weights(r, part.clone())], &values[part], o, chunks.clone());
        }
        // the elements past the last whole chunk, each folded over the query's indices in order
        if cols.end == width && !width.is_multiple_of(LANES) {
            for r in 0..queries {
                let mine = self.own(r);
                let o = &mut out[r * width + whole * LANES..(r + 1) * width];
                for (p, v) in weights(r, mine.clone()).iter().zip(&values[mine]) {
                    for (o, x) in o.iter_mut().zip(&v[whole * LANES..]) {
                        *o = p.mul_add(*x, *o);
                    }
                }
            }
        }
    }
}

/// Each query's scores over several parts of one key order (its indices in `parts[0]`, then in `parts[1]`, ...)
/// times `scale`, through one `softmax_in_place`: the weights of attention whose keys come from more than one
/// sequence (compressed rows, then raw ones). With one part it is `Scores::softmax`. The parts hold the same
/// queries.
pub fn softmax_parts(parts: &mut [Scores], scale: f32) {
    if let [only] = parts {
        only.softmax(scale);
        return;
    }
    let queries = parts.first().map_or(0, |p| p.ranges.len());
    assert!(parts.iter().all(|p| p.ranges.len() == queries), "attention parts: different numbers of queries");
    let mut joint = Vec::new();
    for r in 0..queries {
        joint.clear();
        for part in parts.iter_mut() {
            joint.extend_from_slice(part.row_mut(r));
        }
        softmax_scaled(&mut joint, scale);
        let mut at = 0;
        for part in parts.iter_mut() {
            let row = part.row_mut(r);
            row.copy_from_slice(&joint[at..at + row.len()]);
            at += row.len();
        }
    }
}

impl Drop for Scores {
    fn drop(&mut self) {
        let s = std::mem::take(&mut self.s);
        SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARE_BUFFERS {
                spare.push(s);
            }
        });
    }
}

/// Score buffers a thread keeps for its next `Scores`: a block's scores are hundreds of KiB, which the system
/// allocator maps afresh, and the kernel faults in page by page, on every allocation of that size.
const SPARE_BUFFERS: usize = 4;

thread_local! {
    static SPARE: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `len` scores, a spare one of this thread's when it has one. Only the part past what the spare held
/// is zeroed: every score a query reads (its own indices) is written first, so what a reused buffer held is never
/// seen, and zeroing all of it had taken 1-2% of a long prefill. The library's tests fill the whole buffer with
/// NaN instead, so a read of an index that was not written poisons the result that their bitwise checks compare.
fn spare_buffer(len: usize) -> Vec<f32> {
    let mut s = SPARE.with(|spare| spare.borrow_mut().pop()).unwrap_or_default();
    if cfg!(test) {
        s.clear();
        s.resize(len, f32::NAN);
    } else {
        s.truncate(len);
        s.resize(len, 0.0);
    }
    s
}

/// Whether three queries of `width` over `range` take `dots_three` (one pass over the keys for all three).
fn takes_dots_three(width: usize, range: &Range<usize>) -> bool {
    width >= LANES && !range.is_empty() && three_in_one_pass()
}

/// The scores of the shared indices (`keys`, starting at index `at` of each query's score row of `n`), a block of
/// keys at a time (it stays in L1 while every query takes it): on AVX-512, with a width of whole chunks, sixteen
/// queries at a time in the lanes of a register (`lane_dots_avx512`); the rest four queries at a time against four
/// keys, then a pair against eight, then one against sixteen.
fn common_dots(queries: &[&[f32]], keys: &[&[f32]], at: usize, n: usize, s: &mut [f32]) {
    let mut first = 0;
    #[cfg(target_arch = "x86_64")]
    if queries.first().is_some_and(|q| !q.is_empty() && q.len().is_multiple_of(LANES))
        && std::arch::is_x86_feature_detected!("avx512f")
    {
        // sixteen queries at a time in the lanes of a register, a vertical tree per score
        while queries.len() - first >= LANES {
            let rows = &mut s[first * n..(first + LANES) * n];
            // SAFETY: the CPU has AVX-512F
            #[allow(unsafe_code)]
            unsafe {
                super::lane_dots_avx512::score_rows(&queries[first..first + LANES], keys, at, n, rows)
            };
            first += LANES;
        }
    }
    let (queries, s) = (&queries[first..], &mut s[first * n..]);
    for (b, block) in keys.chunks(KEY_BLOCK).enumerate() {
        let at = at + b * KEY_BLOCK;
        let mut r = 0;
        while queries.len() - r >= 4 {
            tile_dots::<4, 4>(&queries[r..r + 4], block, at, n, &mut s[r * n..(r + 4) * n]);
            r += 4;
        }
        if queries.len() - r >= 2 {
            tile_dots::<2, 8>(&queries[r..r + 2], block, at, n, &mut s[r * n..(r + 2) * n]);
            r += 2;
        }
        if r < queries.len() {
            dots_into(queries[r], block, &mut s[r * n + at..r * n + at + block.len()]);
        }
    }
}

/// `R` queries' scores of `keys` in `R x K` tiles, the keys left over one by one; query `r`'s score of key `j` goes
/// to `s[r · n + at + j]`.
fn tile_dots<const R: usize, const K: usize>(queries: &[&[f32]], keys: &[&[f32]], at: usize, n: usize, s: &mut [f32]) {
    let q: [&[f32]; R] = std::array::from_fn(|r| queries[r]);
    let chunks = q[0].len() / LANES;
    let whole = if chunks > 0 { keys.len() / K * K } else { 0 };
    let mut rows = s.chunks_exact_mut(n);
    let out: [&mut [f32]; R] = std::array::from_fn(|_| &mut rows.next().expect("R score rows")[at..at + keys.len()]);
    let mut out = out;
    dots::<R, K>(q, &keys[..whole], chunks, out.each_mut().map(|o| &mut o[..whole]), &[]);
    for (o, qr) in out.iter_mut().zip(&q) {
        finish_row(o, qr, keys, whole, chunks);
    }
}

/// A score row past its SIMD tiles (which scored `keys[..whole]` over `chunks` whole chunks): the elements past the
/// last whole chunk fused onto those scores, then the keys from `whole` on scored by `dot`.
fn finish_row(row: &mut [f32], q: &[f32], keys: &[&[f32]], whole: usize, chunks: usize) {
    if chunks * LANES < q.len() {
        for (x, k) in row[..whole].iter_mut().zip(keys) {
            *x = with_tail(*x, q, k, chunks);
        }
    }
    for (x, k) in row[whole..].iter_mut().zip(&keys[whole..]) {
        *x = dot(q, k);
    }
}

/// `finish`'s tail: the elements past the last whole chunk fused in order after the tree.
#[inline]
fn with_tail(mut sum: f32, q: &[f32], k: &[f32], chunks: usize) -> f32 {
    for (x, y) in q[chunks * LANES..].iter().zip(&k[chunks * LANES..]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

/// `out[j] = dot(q, keys[j])`: sixteen keys a tile, then four, then one by one.
fn dots_into(q: &[f32], keys: &[&[f32]], out: &mut [f32]) {
    let chunks = q.len() / LANES;
    let whole = if chunks > 0 { keys.len() / 16 * 16 } else { 0 };
    dots::<1, 16>([q], &keys[..whole], chunks, [&mut out[..whole]], &[]);
    if chunks * LANES < q.len() {
        for (x, kr) in out[..whole].iter_mut().zip(keys) {
            *x = with_tail(*x, q, kr, chunks);
        }
    }
    let mut o = whole;
    let mut fours = keys[whole..].chunks_exact(4);
    for f in fours.by_ref() {
        out[o..o + 4].copy_from_slice(&dot4(q, [f[0], f[1], f[2], f[3]]));
        o += 4;
    }
    for (k, x) in fours.remainder().iter().zip(&mut out[o..]) {
        *x = dot(q, k);
    }
}

/// Appends `dot(q, k)` for every key yielded, in order (bitwise `dot`).
pub fn push_dots<'a>(q: &[f32], keys: impl Iterator<Item = &'a [f32]>, scores: &mut Vec<f32>) {
    let before = scores.len();
    let (mut block, mut n): ([&[f32]; 16], usize) = ([&[]; 16], 0);
    for k in keys {
        assert_eq!(k.len(), q.len(), "push_dots: a key is not as wide as the query");
        block[n] = k;
        n += 1;
        if n == 16 {
            let at = scores.len();
            scores.resize(at + 16, 0.0);
            dots_into(q, &block, &mut scores[at..]);
            n = 0;
        }
    }
    let at = scores.len();
    scores.resize(at + n, 0.0);
    dots_into(q, &block[..n], &mut scores[at..]);
    super::work::count(2 * (scores.len() - before) * q.len(), 0);
    super::work::count_cache(scores.len() - before, q.len());
}

/// `out = Σⱼ pⱼ · vⱼ` over the values yielded, each output element summed from 0.0 in value order with one fused
/// multiply-add per value.
pub fn weighted_sum<'a>(p: &[f32], values: impl Iterator<Item = &'a [f32]> + Clone, out: &mut [f32]) {
    super::work::count(2 * p.len() * out.len(), 0);
    super::work::count_cache(p.len(), out.len());
    out.fill(0.0);
    let chunks = out.len() / LANES;
    let (mut block, mut n, mut done): ([&[f32]; VALUE_BLOCK], usize, usize) = ([&[]; VALUE_BLOCK], 0, 0);
    for v in values.clone().take(p.len()) {
        block[n] = v;
        n += 1;
        if n == VALUE_BLOCK {
            fold_rows(&[&p[done..done + n]], &block, out, 0..chunks);
            done += n;
            n = 0;
        }
    }
    fold_rows(&[&p[done..done + n]], &block[..n], out, 0..chunks);
    let at = chunks * LANES;
    if at < out.len() {
        for (p, v) in p.iter().zip(values) {
            for (o, x) in out[at..].iter_mut().zip(&v[at..]) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// Folds `values` (weights `p[r]` for query `r`) into the whole chunks of each query's output row (`out`, rows of
/// `out.len() / p.len()`): a block of values at a time (it stays in L1 while every query takes it), up to eight
/// chunks a pass, as many queries at once as sixteen registers hold.
fn fold_rows(p: &[&[f32]], values: &[&[f32]], out: &mut [f32], chunks: Range<usize>) {
    if p.is_empty() || values.is_empty() {
        return;
    }
    let width = out.len() / p.len();
    for (b, block) in values.chunks(KEY_BLOCK).enumerate() {
        let first = b * KEY_BLOCK;
        let mut at = chunks.start;
        while at < chunks.end {
            let c = match chunks.end - at {
                8.. => 8,
                4..=7 => 4,
                2 | 3 => 2,
                _ => 1,
            };
            let mut r = 0;
            while r < p.len() {
                let fit = (16 / c).min(p.len() - r);
                // three or six queries (a decode step's GQA group of three) at once, else the largest power of two
                // that fits: each value row loaded once for the most sums, whose chains hide the FMA latency
                let q = if fit == 3 || fit == 6 { fit } else { 1 << (usize::BITS - 1 - fit.leading_zeros()) };
                let rows = &mut out[r * width..(r + q) * width];
                let mut w: [&[f32]; 16] = [&[]; 16];
                for (wi, pr) in w.iter_mut().zip(&p[r..r + q]) {
                    *wi = &pr[first..first + block.len()];
                }
                let w = &w[..q];
                // every shape the loop above picks, each compiled with its registers fixed
                macro_rules! shapes {
                    ($(($nq:literal, $nc:literal)),*) => {
                        match (q, c) {
                            $(($nq, $nc) => fold_n::<$nq, $nc>(w, block, at, rows),)*
                            _ => unreachable!("fold shape {q} x {c}"),
                        }
                    };
                }
                shapes!(
                    (1, 8),
                    (2, 8),
                    (1, 4),
                    (2, 4),
                    (3, 4),
                    (4, 4),
                    (1, 2),
                    (2, 2),
                    (3, 2),
                    (4, 2),
                    (6, 2),
                    (8, 2),
                    (1, 1),
                    (2, 1),
                    (3, 1),
                    (4, 1),
                    (6, 1),
                    (8, 1),
                    (16, 1)
                );
                r += q;
            }
            at += c;
        }
    }
}

/// `fold` for `Q` queries whose output rows are `rows` (`Q` rows of equal width).
#[inline]
fn fold_n<const Q: usize, const C: usize>(p: &[&[f32]], values: &[&[f32]], at: usize, rows: &mut [f32]) {
    let width = rows.len() / Q;
    let mut it = rows.chunks_exact_mut(width);
    let acc: [&mut [f32]; Q] = std::array::from_fn(|_| it.next().expect("Q rows"));
    fold::<Q, C>(std::array::from_fn(|q| p[q]), values, at, acc);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    /// The reference: every score through `dot`, every output element summed over the values in order.
    fn attend_reference(q: &[f32], kv: &[(&[f32], &[f32])], scale: f32, out: &mut [f32]) {
        let mut scores: Vec<f32> = kv.iter().map(|(k, _)| dot(q, k) * scale).collect();
        crate::kernels::softmax_in_place(&mut scores);
        out.iter_mut().for_each(|o| *o = 0.0);
        for (p, (_, v)) in scores.iter().zip(kv) {
            for (o, x) in out.iter_mut().zip(v.iter()) {
                *o = p.mul_add(*x, *o);
            }
        }
    }

    fn attend_bits(hd: usize, keys: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
        let mut r = SplitMix64::new(seed);
        let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
        let (q, ks, vs) = (v(hd), v(keys * hd), v(keys * hd));
        let kv: Vec<(&[f32], &[f32])> = ks.chunks_exact(hd).zip(vs.chunks_exact(hd)).collect();
        let mut want = vec![0.0; hd];
        attend_reference(&q, &kv, 0.3, &mut want);
        let mut got = vec![f32::NAN; hd];
        attend(&q, kv.iter().copied(), 0.3, &mut Vec::new(), &mut got);
        (got.iter().map(|x| x.to_bits()).collect(), want.iter().map(|x| x.to_bits()).collect())
    }

    /// Every step width of the weighted sums (16, 8, 4 and 1 chunks, and the tail) at least once, whatever the
    /// proptest below happens to draw.
    /// Random queries (one per range), keys and values of width `hd`: every query's `attend_many` output is
    /// bitwise what `attend` gives it alone over its own range.
    fn assert_attend_many_is_attend_per_query(
        hd: usize,
        keys: usize,
        ranges: &[Range<usize>],
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let mut r = SplitMix64::new(seed);
        let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
        let (qs, ks, vs) = (v(ranges.len() * hd), v(keys * hd), v(keys * hd));
        let queries: Vec<&[f32]> = qs.chunks_exact(hd).collect();
        let row = |j: usize| (&ks[j * hd..(j + 1) * hd], &vs[j * hd..(j + 1) * hd]);
        let mut got = vec![f32::NAN; queries.len() * hd];
        attend_many(&queries, ranges, row, 0.3, &mut got);
        for (i, (q, range)) in queries.iter().zip(ranges).enumerate() {
            let mut want = vec![f32::NAN; hd];
            attend(q, range.clone().map(row), 0.3, &mut Vec::new(), &mut want);
            prop_assert_eq!(
                got[i * hd..(i + 1) * hd].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "query {} over {:?}",
                i,
                range
            );
        }
        Ok(())
    }

    #[test]
    fn every_weighted_sum_width_matches_reference() {
        for hd in [8, 32, 64, 128, 136, 160, 200, 256, 263] {
            let (got, want) = attend_bits(hd, 9, hd as u64);
            assert_eq!(got, want, "head width {hd}");
        }
    }

    /// Softmaxed scores of kv heads' queries, their value rows and the sums `add_weighted` gives them.
    struct HeadsFixture {
        /// One per kv head: its queries over `keys` indices (a ragged group's last query sees one index fewer).
        scores: Vec<Scores>,
        /// Kv head `g`'s value row `j` at `at(g, j)`.
        vals: Vec<f32>,
        /// Every head's queries x width, where the sums start.
        start: Vec<f32>,
        /// `start` with every head's `add_weighted` over its values.
        summed: Vec<f32>,
    }

    /// A `HeadsFixture` of `heads` kv heads of `group` queries `width` wide, rows laid out by `at`.
    fn heads_fixture(
        (heads, group, width): (usize, usize, usize),
        keys: usize,
        ragged: bool,
        at: impl Fn(usize, usize) -> usize,
        seed: u64,
    ) -> HeadsFixture {
        let mut r = SplitMix64::new(seed);
        let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
        let (q, k, vals, start) =
            (v(heads * group * width), v(heads * keys * width), v(heads * keys * width), v(heads * group * width));
        let ranges: Vec<Range<usize>> =
            (0..group).map(|j| 0..if ragged && j + 1 == group { keys.saturating_sub(1) } else { keys }).collect();
        let scores: Vec<Scores> = (0..heads)
            .map(|g| {
                let qs: Vec<&[f32]> = (0..group).map(|j| &q[(g * group + j) * width..][..width]).collect();
                let mut sc = Scores::dots(&qs, &ranges, |j| &k[at(g, j)..][..width]);
                sc.softmax(0.3);
                sc
            })
            .collect();
        let mut summed = start.clone();
        for (g, (sc, o)) in scores.iter().zip(summed.chunks_exact_mut(group * width)).enumerate() {
            sc.add_weighted(|j| &vals[at(g, j)..][..width], o);
        }
        HeadsFixture { scores, vals, start, summed }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// `add_weighted_heads` gives every head `add_weighted`'s bits, continuing the sums already in its output:
        /// for every shape its kernel takes (heads read together), for more heads than it takes at once, for a
        /// width with a tail and for queries of one head over different indices (each head on its own).
        #[test]
        fn heads_at_once_are_each_head_alone(
            shape in prop::sample::select(vec![
                (1, 2, 64), (2, 2, 64), (3, 2, 64), (4, 2, 64), (1, 3, 64), (2, 3, 64), (3, 3, 64), (1, 4, 64),
                (2, 4, 64), (1, 2, 128), (2, 2, 128), (1, 3, 128), (1, 4, 128), (5, 2, 64), (2, 3, 72),
            ]),
            keys in 0usize..90, ragged in any::<bool>(), seed in any::<u64>()
        ) {
            let (heads, group, width) = shape;
            let at = |g: usize, j: usize| (g * keys + j) * width;
            let HeadsFixture { scores, vals, start, summed } = heads_fixture((heads, group, width), keys, ragged, at, seed);
            let value = |g: usize, j: usize| &vals[at(g, j)..][..width];
            let mut got = start;
            let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(group * width).collect();
            let refs: Vec<&Scores> = scores.iter().collect();
            Scores::add_weighted_heads(&refs, value, &mut outs);
            prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), summed.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// `add_weighted_units` gives the columns of its run `add_weighted`'s bits, continuing the sums already in
        /// the output, and leaves every other column as it was: runs inside one head and across heads, from one
        /// chunk up to more than its kernel takes at once, for two to four queries a head (the kernel's shapes) and
        /// one and five (head by head), heads stored one after another and side by side, and a ragged group (its
        /// last query sees one index fewer: head by head).
        #[test]
        fn units_are_each_head_alone(
            heads in 1usize..5,
            group in 1usize..6,
            chunks in 1usize..9,
            first in 0usize..64,
            len in prop_oneof![Just(0usize), 1usize..12],
            keys in 0usize..50,
            side_by_side in any::<bool>(),
            ragged in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let width = chunks * LANES;
            let total = heads * chunks;
            let first = first % total;
            let units = first..(first + len).min(total);
            let at = |g: usize, j: usize| if side_by_side { (j * heads + g) * width } else { (g * keys + j) * width };
            let HeadsFixture { scores, vals, start, summed } = heads_fixture((heads, group, width), keys, ragged, at, seed);
            let value = |g: usize, j: usize| &vals[at(g, j)..][..width];
            let mut got = start.clone();
            let refs: Vec<&Scores> = scores.iter().collect();
            Scores::add_weighted_units(&refs, units.clone(), value, &mut got);
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (c, ((summed, before), now)) in
                summed.chunks_exact(LANES).zip(start.chunks_exact(LANES)).zip(got.chunks_exact(LANES)).enumerate()
            {
                // output chunk c is chunk c % chunks of a query row of head c / (group · chunks)
                let unit = c / (group * chunks) * chunks + c % chunks;
                let want = if units.contains(&unit) { summed } else { before };
                prop_assert_eq!(bits(now), bits(want), "output chunk {} (unit {}) of run {:?}", c, unit, units);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every score `push_dots` appends is bitwise `dot` of the query and that key, however many keys (whole
        /// blocks of sixteen, fours and single keys after them) and whatever the width (under one chunk, whole
        /// chunks, a tail after them).
        #[test]
        fn push_dots_is_dot_per_key(hd in 1usize..150, keys in 0usize..70, seed in any::<u64>()) {
            let mut r = SplitMix64::new(seed);
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let (q, ks) = (v(hd), v(keys * hd));
            let mut got = vec![f32::NAN];
            push_dots(&q, ks.chunks_exact(hd), &mut got);
            let want: Vec<u32> = ks.chunks_exact(hd).map(|k| dot(&q, k).to_bits()).collect();
            prop_assert_eq!(got[0].to_bits(), f32::NAN.to_bits(), "push_dots appends, it keeps what is there");
            prop_assert_eq!(got[1..].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// `Scores::dots_of_heads`, and `Scores::dots` of each head alone, give each kv head's queries `dot`'s bits
        /// for every key: heads whose keys lie side by side in one row (as in the cache), groups of three (the path
        /// that takes the heads' keys together, and `dots`' route for three queries over one range) and not, the
        /// shapes whose heads are scored a row at a time (`heads_at_once`) and more heads than those take, widths of
        /// whole chunks, with a tail and under one chunk, keys past the last tile of sixteen, none.
        #[test]
        fn dots_of_heads_is_dots_per_head(
            heads in 1usize..5,
            group in prop_oneof![Just(3usize), 1usize..5],
            hd in prop_oneof![Just(64usize), Just(128), Just(16), 1usize..100],
            keys in 0usize..70,
            start in 0usize..5,
            seed in any::<u64>(),
        ) {
            let mut r = SplitMix64::new(seed);
            let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| r.uniform(1.0)).collect() };
            let kvd = heads * hd;
            let (qs, rows) = (v(heads * group * hd), v((start + keys) * kvd));
            let queries: Vec<&[f32]> = qs.chunks_exact(hd).collect();
            let key = |g: usize, p: usize| &rows[p * kvd + g * hd..][..hd];
            let range = start..start + keys;
            let got = Scores::dots_of_heads(&queries, group, range.clone(), key);
            prop_assert_eq!(got.len(), heads);
            for (g, mut sc) in got.into_iter().enumerate() {
                let mine = &queries[g * group..(g + 1) * group];
                let mut alone = Scores::dots(mine, &vec![range.clone(); group], |p| key(g, p));
                for (j, q) in mine.iter().enumerate() {
                    let want: Vec<u32> = range.clone().map(|p| dot(q, key(g, p)).to_bits()).collect();
                    let row: Vec<u32> = sc.row_mut(j).iter().map(|x| x.to_bits()).collect();
                    prop_assert_eq!(&row, &want, "kv head {} query {}", g, j);
                    let row: Vec<u32> = alone.row_mut(j).iter().map(|x| x.to_bits()).collect();
                    prop_assert_eq!(row, want, "kv head {} query {} alone", g, j);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Bitwise the reference for any head width (multiples of 8 or not, wider than one 8-chunk block) and any
        /// number of keys (a multiple of 4 or not, none included).
        #[test]
        fn attend_matches_reference(hd in 1usize..150, keys in 0usize..23, seed in any::<u64>()) {
            let (got, want) = attend_bits(hd, keys, seed);
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Blocks of sixteen queries and more over a shared run of keys (causal rows, GQA heads), at widths of
        /// whole chunks and not: each query still gets `attend`'s bits.
        #[test]
        fn attend_many_of_many_queries_is_attend_per_query(
            hd in prop_oneof![Just(16usize), Just(64), Just(128), 1usize..100],
            queries in 16usize..40,
            seed in any::<u64>(),
        ) {
            // causal rows from 270 on, two heads a row
            let ranges: Vec<Range<usize>> = (0..queries).map(|i| 0..270 + i / 2).collect();
            assert_attend_many_is_attend_per_query(hd, 300, &ranges, seed)?;
        }

        /// Every query of `attend_many` gets bitwise what `attend` gives it alone over its own range, whatever the
        /// other queries see: ranges that share everything (a GQA group), a causal block, sliding windows, ranges
        /// that do not meet, empty ones; any number of queries (tiles of four, two, one) and any width.
        #[test]
        fn attend_many_is_attend_per_query(
            hd in 1usize..100,
            ranges in proptest::collection::vec((0usize..150, 0usize..150), 1..19),
            seed in any::<u64>(),
        ) {
            // more keys than one block of `KEY_BLOCK`
            let keys = 150;
            let ranges: Vec<Range<usize>> = ranges.iter().map(|&(a, b)| a.min(b)..a.max(b)).collect();
            assert_attend_many_is_attend_per_query(hd, keys, &ranges, seed)?;
        }
    }
}
