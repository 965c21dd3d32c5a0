//! `dot` over a tile of row pairs on AVX-512, bitwise the portable `dot`: each pair's 16 lane sums in a zmm
//! register (one `vfmadd` per chunk), then sixteen fixed lane trees side by side as four levels of shuffles and
//! adds, so a result costs about two shuffles instead of a horizontal sum of its own. The matmul's blocks and
//! attention's scores are both tiles of such dots.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::dot_tiles::ask;
use super::matmul::LANES;

/// `out[r][j] = dot(qᵣ, keys[j])` over the first `chunks` chunks of each row (`finish`'s tree included, the tail
/// not), in `R x K` tiles with `R · K = 16`: lane `l` of pair (r, j) is `Σ_c qᵣ[c][l] · kⱼ[c][l]`, each step fused,
/// `c` ascending; then lane `l` plus lane `l + 8`, then `((h₀ + h₄) + (h₁ + h₅)) + ((h₂ + h₆) + (h₃ + h₇))` — the
/// same additions on the same values as `finish`. `keys.len()` is a multiple of `K`. The 64-byte lines of `ahead`
/// are prefetched into L2, an equal share per tile, one per chunk step (a burst stalls the loads of the tile).
///
/// A single row goes to `dots_streamed` where that walk reads its tiles as runs side by side (a decode matvec);
/// a few tiles of long keys (the row left over after a matmul's blocks of four rows, over a tile in L1) stay
/// here, their sixteen keys' chains side by side. The streamed walk would take them one key at a time, each fused
/// step waiting on the one before: such a pass over a 256 x 256 matrix took 4.5 µs, against about 2.5 here
/// (one thread, the weights in the last-level cache: 9 rows 22.4 → 20.1 µs, 11 rows 21.6 → 19.9, 13 rows 24.4 →
/// 22.6, medians of 300 alternations).
///
/// # Safety
/// The CPU has AVX-512F; every row of `q` and `keys` holds at least `chunks · 16` f32s and every `out[r]` at least
/// `keys.len()`.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn dots<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
    ahead: &[f32],
) {
    const { assert!(R * K == 16, "a tile is sixteen pairs") };
    let tiles = keys.len() / K;
    if R == 1 && runs_side_by_side(tiles, chunks, SEGMENTS) {
        // SAFETY: the caller's contract, for the one row
        return unsafe { dots_streamed::<R, K>(q, keys, chunks, out, ahead) };
    }
    let lines = ahead.len().div_ceil(LANES);
    let mut asked = 0;
    let qp = q.map(<[f32]>::as_ptr);
    let op = out.map(|o| o.as_mut_ptr());
    // SAFETY (every load below): `c < chunks` and every row holds `chunks` chunks of `LANES` f32s; unaligned loads
    let load = |p: *const f32, c: usize| unsafe { _mm512_loadu_ps(p.add(c * LANES)) };
    for (b, tile) in keys.chunks_exact(K).enumerate() {
        let kp: [*const f32; K] = std::array::from_fn(|j| tile[j].as_ptr());
        // this tile's share of the lines ahead, up to line `(b + 1) · lines / tiles`: one per chunk, the rest after
        let upto = (b + 1) * lines / tiles;
        let mut acc = [_mm512_setzero_ps(); 16];
        // several rows (R x K = 2 x 8 or 4 x 4): the keys' chunks stay in registers, each row's is loaded once
        for c in 0..chunks {
            ask(ahead, &mut asked, upto);
            let kv: [__m512; K] = std::array::from_fn(|j| load(kp[j], c));
            for (r, p) in qp.iter().enumerate() {
                let qv = load(*p, c);
                for (j, kv) in kv.iter().enumerate() {
                    acc[r * K + j] = _mm512_fmadd_ps(qv, *kv, acc[r * K + j]);
                }
            }
        }
        while asked < upto {
            ask(ahead, &mut asked, upto);
        }
        let mut s = [0.0f32; 16];
        // SAFETY: `s` is 16 f32s; each `out[r]` holds `keys.len()` scores, this tile's at `b · K..(b + 1) · K`
        unsafe {
            _mm512_storeu_ps(s.as_mut_ptr(), lane_trees(acc));
            for (r, o) in op.iter().enumerate() {
                std::ptr::copy_nonoverlapping(s.as_ptr().add(r * K), o.add(b * K), K);
            }
        }
    }
}

/// Far-apart runs of tiles a single row walks side by side: four sequential streams a core. One stream (each
/// key read start to end, then the next) left the memory system idle whenever it could give more: in a stretch
/// where the limit's xor read 49 GB/s, a 1 x 4096 x 65536 matvec read 51 GB/s as one stream a thread, 53 as two
/// and 59-61 as four, eight no faster (56); where the xor read about 35, 33, 31, 34 and 34.
const SEGMENTS: usize = 4;
/// Runs read side by side when several rows share each key's read: two. Against four, alternating in one process,
/// two to four rows of 512 x 512 matrices from memory on two threads read 28.8-31.3 GB/s (four: 29.9-30.2) at two
/// rows, 24.8-27.4 (24.0-25.1) at three and 25.2-27.4 (24.0-25.1) at four; in cache a core's four rows went from
/// 31.6 to 35.0 GB/s.
const SEGMENTS_OF_ROWS: usize = 2;
/// Chunks a key has at least for its tiles to be read as [`SEGMENTS`] runs (rows of 1 KiB): weight rows. One
/// query's attention scores read short keys at a stride (one kv head's slice of each cached row), where more
/// streams gained nothing (a decode row's attention at SmolLM2's shapes, one thread: 16.0-16.1 ms one stream,
/// 16.5 as four).
const SEGMENTED_CHUNKS: usize = 16;

/// Whether `tiles` tiles of keys `chunks` long are read as `runs` runs side by side (`Walk::all`); otherwise they
/// go one at a time, each key's chunks one chain of fused steps after the other's.
fn runs_side_by_side(tiles: usize, chunks: usize, runs: usize) -> bool {
    tiles >= runs && chunks >= SEGMENTED_CHUNKS
}

/// `dots::<R, K>` with each key read start to end, one after the other, a sequential stream the hardware prefetches
/// far ahead, and every row's lanes of a key summed on that one read. `dots`' own tiles take a chunk of each of
/// `K` keys at a time: `K` short streams, which left one core reading a decode matvec at 13-15 GB/s against 19-27
/// this way, and a 512 x 512 matrix at two rows at 15 GB/s against 22 at one. So a single row (a decode matvec,
/// one query's scores) always comes here, and a few rows of a matrix in memory (a speculative decode's
/// verification batch, a mixture's expert with two to four rows) where `block_invariant` asks. The tiles are cut
/// into [`SEGMENTS`] runs for one row, [`SEGMENTS_OF_ROWS`] for several, and tile `b` of every run is read side by
/// side, key by key: that many streams, far apart. Each pair's lanes are still one chain of fused steps, `c`
/// ascending, and each tile's pairs the same lane trees in the same places (`r · K + j`): the bits of `dots` in any
/// grouping.
///
/// # Safety
/// As `dots`: AVX-512F; every row holds `chunks · 16` f32s, every `out[r]` at least `keys.len()`, which is a
/// multiple of `K`.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn dots_streamed<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
    ahead: &[f32],
) {
    const { assert!(R * K == 16, "a tile is sixteen pairs") };
    let tiles = keys.len() / K;
    let mut walk = Walk { q, keys, chunks, out, ahead, lines: ahead.len().div_ceil(LANES), asked: 0, tiles, done: 0 };
    // SAFETY: the caller's contract
    unsafe {
        match R {
            1 => walk.all::<K, SEGMENTS>(),
            _ => walk.all::<K, SEGMENTS_OF_ROWS>(),
        }
    }
    while walk.asked < walk.lines {
        ask(ahead, &mut walk.asked, walk.lines);
    }
}

/// `R` rows' walk over their keys' tiles (of `16 / R` keys), and its lines of `ahead` asked so far.
struct Walk<'a, const R: usize> {
    q: [&'a [f32]; R],
    keys: &'a [&'a [f32]],
    chunks: usize,
    out: [&'a mut [f32]; R],
    ahead: &'a [f32],
    lines: usize,
    asked: usize,
    tiles: usize,
    done: usize,
}

impl<const R: usize> Walk<'_, R> {
    /// Every tile, cut into `S` runs read side by side where the keys are long enough (the tiles left over one
    /// at a time).
    ///
    /// # Safety
    /// As `side_by_side`, for every tile of `keys`.
    #[target_feature(enable = "avx512f")]
    unsafe fn all<const K: usize, const S: usize>(&mut self) {
        let tiles = self.tiles;
        let run = if runs_side_by_side(tiles, self.chunks, S) { tiles / S } else { 0 };
        for b in 0..run {
            // SAFETY: the caller's contract; the tiles are inside `keys`
            unsafe { self.side_by_side::<K, S>(std::array::from_fn(|s| s * run + b)) };
        }
        for b in S * run..tiles {
            // SAFETY: as above
            unsafe { self.side_by_side::<K, 1>([b]) };
        }
    }

    /// Tiles `at` (of `K` keys each), their keys `j` side by side, `j` ascending, each key's chunk loaded once for
    /// all `R` rows; the asks spread over the keys, up to the share of the tiles done.
    ///
    /// # Safety
    /// AVX-512F; `R · K = 16`; every row holds `chunks · 16` f32s; every tile of `at` lies inside `keys`, and each
    /// `out[r]` holds its scores.
    #[target_feature(enable = "avx512f")]
    unsafe fn side_by_side<const K: usize, const S: usize>(&mut self, at: [usize; S]) {
        self.done += S;
        let upto = self.done * self.lines / self.tiles;
        let chunks = self.chunks;
        let q = self.q.map(<[f32]>::as_ptr);
        // SAFETY (every load below): `c < chunks` and every row holds `chunks` chunks of `LANES` f32s; unaligned
        let load = |p: *const f32, c: usize| unsafe { _mm512_loadu_ps(p.add(c * LANES)) };
        // [pair r · K + j][tile]: each pair's lane sums in its tile
        let mut sums = [[_mm512_setzero_ps(); S]; 16];
        for j in 0..K {
            for _ in 0..S * chunks.div_ceil(16) {
                ask(self.ahead, &mut self.asked, upto);
            }
            let kp: [*const f32; S] = std::array::from_fn(|s| self.keys[K * at[s] + j].as_ptr());
            let mut acc = [[_mm512_setzero_ps(); S]; R];
            for c in 0..chunks {
                let kv: [__m512; S] = kp.map(|p| load(p, c));
                for (row, p) in acc.iter_mut().zip(q) {
                    let qv = load(p, c);
                    for (a, k) in row.iter_mut().zip(kv) {
                        *a = _mm512_fmadd_ps(qv, k, *a);
                    }
                }
            }
            for (r, row) in acc.into_iter().enumerate() {
                sums[r * K + j] = row;
            }
        }
        while self.asked < upto {
            ask(self.ahead, &mut self.asked, upto);
        }
        for (s, &b) in at.iter().enumerate() {
            let trees = lane_trees(sums.map(|k| k[s]));
            if R == 1 {
                // SAFETY: `out[0]` holds the scores of every key; this tile's at `16 b..16 b + 16`
                unsafe { _mm512_storeu_ps(self.out[0].as_mut_ptr().add(16 * b), trees) };
                continue;
            }
            let mut t = [0.0f32; 16];
            // SAFETY: `t` holds 16 f32s
            unsafe { _mm512_storeu_ps(t.as_mut_ptr(), trees) };
            for (o, pairs) in self.out.iter_mut().zip(t.chunks_exact(K)) {
                o[K * b..K * (b + 1)].copy_from_slice(pairs);
            }
        }
    }
}

/// Sixteen lane trees at once: lane `i` of the result is `finish`'s tree over the lanes of `a[i]`.
#[target_feature(enable = "avx512f")]
#[inline]
fn lane_trees(a: [__m512; 16]) -> __m512 {
    // level 1, `h[l] = a[l] + a[l + 8]`: sums i and i + 1 share a register, [hᵢ | hᵢ₊₁]
    let h: [__m512; 8] = std::array::from_fn(|p| {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
    });
    // level 2, `g[l] = h[l] + h[l + 4]`: four sums a register, one 128-bit block each, sums 4p..4p+4 in order
    let g: [__m512; 4] = std::array::from_fn(|p| {
        let (x, y) = (h[2 * p], h[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
    });
    // level 3, `f₀ = g₀ + g₁`, `f₁ = g₂ + g₃`: block b of f[p] holds sums 8p + b and 8p + 4 + b as [f₀, f₁, f₀, f₁]
    let f: [__m512; 2] = std::array::from_fn(|p| {
        let (x, y) = (g[2 * p], g[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0x88>(x, y), _mm512_shuffle_ps::<0xDD>(x, y))
    });
    // level 4, `s = f₀ + f₁`: lane 4b + i holds sum b + 4i
    let s = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(f[0], f[1]), _mm512_shuffle_ps::<0xDD>(f[0], f[1]));
    // back in order: sum m sits in lane 4 (m % 4) + m / 4
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, s)
}

/// How many key rows ahead `dots_heads` asks for a row's slices: between a row's loads sit a row's worth of
/// multiply-adds and, every sixteen rows, the lane trees, so the loads alone keep too few lines in flight. A decode
/// row's scores at SmolLM2's shapes over 2048 positions from DRAM, two threads on two dies (sixteen alternations):
/// 15.7-17.2 GB/s of k and v without asking, 16.5-18.0 four rows ahead; eight rows ahead was no better than four.
const ROWS_AHEAD: usize = 4;

/// The scores of `G` kv heads' queries (`Q` a head, `C` chunks wide: no tail) over the same keys, a cached row at a
/// time: `out[g][q][j] = dot(q[g][q], keys[j][g])` for whole tiles of sixteen keys. Each step takes every head's
/// slice of key row `j`, so rows holding the heads side by side are read once, start to end, and asks for row
/// `j + ROWS_AHEAD`'s slices. A pair's lanes are one chain of fused steps, `c` ascending, and sixteen keys' sums go
/// through `lane_trees`: the bits of `dots`.
///
/// # Safety
/// The CPU has AVX-512F; every query and key slice holds at least `C · 16` f32s; `keys.len()` is a multiple of 16
/// and every `out[g][q]` holds at least `keys.len()` scores.
#[target_feature(enable = "avx512f")]
#[inline(never)]
pub(super) unsafe fn dots_heads<const G: usize, const Q: usize, const C: usize>(
    q: [[&[f32]; Q]; G],
    keys: &[[&[f32]; G]],
    out: [[&mut [f32]; Q]; G],
) {
    let qp = q.map(|h| h.map(<[f32]>::as_ptr));
    let op = out.map(|h| h.map(|o| o.as_mut_ptr()));
    // SAFETY (every load below): `c < C` and every query and key slice holds `C` chunks; unaligned loads
    let load = |p: *const f32, c: usize| unsafe { _mm512_loadu_ps(p.add(c * LANES)) };
    // [head][query][key of the tile]: each pair's lane sums, until the tile's lane trees
    let mut sums = [[[_mm512_setzero_ps(); 16]; Q]; G];
    for (t, tile) in keys.chunks_exact(16).enumerate() {
        for (j, row) in tile.iter().enumerate() {
            if let Some(ahead) = keys.get(16 * t + j + ROWS_AHEAD) {
                for key in ahead {
                    for c in 0..C {
                        // SAFETY: `c < C` and every key slice holds `C` chunks; a prefetch reads nothing the
                        // program observes
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(key.as_ptr().add(c * LANES).cast()) };
                    }
                }
            }
            for ((head, key), queries) in sums.iter_mut().zip(row).zip(&qp) {
                let kv: [__m512; C] = std::array::from_fn(|c| load(key.as_ptr(), c));
                for (pair, query) in head.iter_mut().zip(queries) {
                    let mut a = _mm512_setzero_ps();
                    for (c, k) in kv.iter().enumerate() {
                        a = _mm512_fmadd_ps(load(*query, c), *k, a);
                    }
                    pair[j] = a;
                }
            }
        }
        for (head, outs) in sums.iter().zip(&op) {
            for (pairs, o) in head.iter().zip(outs) {
                // SAFETY: `out[g][q]` holds a score for every key; this tile's at `16 t..16 t + 16`
                unsafe { _mm512_storeu_ps(o.add(16 * t), lane_trees(*pairs)) };
            }
        }
    }
}
