//! `dot` over a tile of row pairs on AVX2 with FMA (no AVX-512), bitwise the portable `dot`. A pair's 16 lane sums
//! do not fit one ymm register, but lanes never meet before the tree: lanes 0..8 of every pair are summed in one
//! pass over the chunks and lanes 8..16 in a second, each pass a sub-tile of 2 x 4 pairs whose eight accumulators,
//! row chunks and a key chunk fit the sixteen registers. The second pass reads the lines the first just brought into
//! L1. A single row (decode) takes both halves of four keys in one pass instead: its keys come from memory once.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::dot_tiles::ask;
use super::matmul::LANES;

/// Lanes of a ymm register: half of a chunk.
const HALF: usize = 8;

/// `dot_tiles_avx512::dots` on AVX2: `out[r][j] = dot(qᵣ, keys[j])` over the first `chunks` chunks of each row
/// (`finish`'s tree included, the tail not), `R x K` pairs a tile (`R · K = 16`). Lane `l` of a pair is
/// `Σ_c qᵣ[c][l] · kⱼ[c][l]`, each step fused, `c` ascending; then `h = lanes 0..8 + lanes 8..16`, then
/// `(h₀ + h₄) + (h₁ + h₅)` and `(h₂ + h₆) + (h₃ + h₇)` added: the same additions on the same values as `finish`.
/// `keys.len()` is a multiple of `K`. The 64-byte lines of `ahead` are prefetched into L2, an equal share per tile.
///
/// # Safety
/// The CPU has AVX2 and FMA; every row of `q` and `keys` holds at least `chunks · 16` f32s and every `out[r]` at
/// least `keys.len()`.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) unsafe fn dots<const R: usize, const K: usize>(
    q: [&[f32]; R],
    keys: &[&[f32]],
    chunks: usize,
    out: [&mut [f32]; R],
    ahead: &[f32],
) {
    const { assert!(R * K == 16 && K.is_multiple_of(4), "a tile is sixteen pairs, its keys in fours (one store per four)") };
    let tiles = keys.len() / K;
    let lines = ahead.len().div_ceil(LANES);
    let mut asked = 0;
    let qp = q.map(<[f32]>::as_ptr);
    let op = out.map(|o| o.as_mut_ptr());
    for (b, tile) in keys.chunks_exact(K).enumerate() {
        let kp: [*const f32; K] = std::array::from_fn(|j| tile[j].as_ptr());
        let upto = (b + 1) * lines / tiles;
        // [half][r · K + j]: one pair's lanes 0..8 or 8..16
        let mut acc = [[_mm256_setzero_ps(); 16]; 2];
        if R == 1 {
            // one row against many keys (decode): every key row is read once, from memory, so both halves in one
            // pass (a second pass over the keys would read them again)
            for g in 0..K / 4 {
                let keys: [*const f32; 4] = std::array::from_fn(|j| kp[4 * g + j]);
                // SAFETY: the rows hold `chunks` chunks (the caller's contract)
                let sums = unsafe { pass_whole::<4>(qp[0], keys, chunks, ahead, &mut asked, upto) };
                for (h, half) in acc.iter_mut().enumerate() {
                    half[4 * g..4 * g + 4].copy_from_slice(&sums[h]);
                }
            }
        } else {
            for (h, half) in acc.iter_mut().enumerate() {
                for rg in 0..R / 2 {
                    for kg in 0..K / 4 {
                        let rows = [qp[2 * rg], qp[2 * rg + 1]];
                        let keys: [*const f32; 4] = std::array::from_fn(|j| kp[4 * kg + j]);
                        // SAFETY: as above
                        let sums = unsafe { pass::<2, 4>(rows, keys, chunks, h, ahead, &mut asked, upto) };
                        for (r, s) in sums.iter().enumerate() {
                            let at = (2 * rg + r) * K + 4 * kg;
                            half[at..at + 4].copy_from_slice(s);
                        }
                    }
                }
            }
        }
        while asked < upto {
            ask(ahead, &mut asked, upto);
        }
        for (r, o) in op.iter().enumerate() {
            for j in (0..K).step_by(4) {
                let at = r * K + j;
                let four = tree4(std::array::from_fn(|i| acc[0][at + i]), std::array::from_fn(|i| acc[1][at + i]));
                // SAFETY: `out[r]` holds `keys.len()` scores, this tile's at `b · K..(b + 1) · K` (`K` is a multiple
                // of four); an unaligned store
                unsafe { _mm_storeu_ps(o.add(b * K + j), four) };
            }
        }
    }
}

/// One half (`h`: lanes `8h..8h + 8`) of the lane sums of `RS x KS` pairs over `chunks` chunks: the rows' half
/// chunks stay in registers, each key's is loaded once per chunk. One line of `ahead` is asked per chunk.
///
/// # Safety
/// AVX2 and FMA; every row holds `chunks · 16` f32s.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pass<const RS: usize, const KS: usize>(
    rows: [*const f32; RS],
    keys: [*const f32; KS],
    chunks: usize,
    h: usize,
    ahead: &[f32],
    asked: &mut usize,
    upto: usize,
) -> [[__m256; KS]; RS] {
    let mut acc = [[_mm256_setzero_ps(); KS]; RS];
    for c in 0..chunks {
        ask(ahead, asked, upto);
        let at = c * LANES + h * HALF;
        // SAFETY: `at + 8 <= chunks · 16`, inside every row; unaligned loads
        let xv: [__m256; RS] = std::array::from_fn(|r| unsafe { _mm256_loadu_ps(rows[r].add(at)) });
        for (j, k) in keys.iter().enumerate() {
            let kv = unsafe { _mm256_loadu_ps(k.add(at)) };
            for (a, x) in acc.iter_mut().zip(&xv) {
                a[j] = _mm256_fmadd_ps(*x, kv, a[j]);
            }
        }
    }
    acc
}

/// Both halves of the lane sums of one row against `KS` keys (`[half][key]`) in one pass over the chunks.
///
/// # Safety
/// AVX2 and FMA; every row holds `chunks · 16` f32s.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pass_whole<const KS: usize>(
    row: *const f32,
    keys: [*const f32; KS],
    chunks: usize,
    ahead: &[f32],
    asked: &mut usize,
    upto: usize,
) -> [[__m256; KS]; 2] {
    let mut acc = [[_mm256_setzero_ps(); KS]; 2];
    for c in 0..chunks {
        ask(ahead, asked, upto);
        let at = c * LANES;
        // SAFETY: `at + 16 <= chunks · 16`, inside every row; unaligned loads
        let xv = unsafe { [_mm256_loadu_ps(row.add(at)), _mm256_loadu_ps(row.add(at + HALF))] };
        for (j, k) in keys.iter().enumerate() {
            for (h, (a, x)) in acc.iter_mut().zip(&xv).enumerate() {
                let kv = unsafe { _mm256_loadu_ps(k.add(at + h * HALF)) };
                a[j] = _mm256_fmadd_ps(*x, kv, a[j]);
            }
        }
    }
    acc
}

/// `finish`'s tree over four pairs at once (`lo[p]`, `hi[p]`: pair `p`'s lanes 0..8 and 8..16), their sums in
/// lanes 0..4: `hₗ = lo[l] + hi[l]`, `gᵢ = hᵢ + hᵢ₊₄` in one add of the register's halves, then two horizontal
/// adds give `(g₀ + g₁) + (g₂ + g₃)` for all four — the same additions on the same values, where a tree per pair
/// took a shuffle, three scalar adds and a store for each score.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn tree4(lo: [__m256; 4], hi: [__m256; 4]) -> __m128 {
    let g: [__m128; 4] = std::array::from_fn(|p| {
        let h = _mm256_add_ps(lo[p], hi[p]);
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
    });
    // [g₀ + g₁, g₂ + g₃] of pairs 0 and 1, then of 2 and 3; then each pair's two added
    _mm_hadd_ps(_mm_hadd_ps(g[0], g[1]), _mm_hadd_ps(g[2], g[3]))
}

/// Pairs of keys ahead of the pair being scored whose lines `dots_three` asks for: a decode step reads a long
/// cache once, from DRAM, and the tile's multiply-adds between loads kept too few lines in flight (SmolLM2's 30
/// layers of 2048 cached rows: the scores' pass 127-136 µs a layer without, 98-111 with 4 or 8 pairs ahead, 103-113
/// with 16; the weighted sums' pass did not gain from the same).
const PAIRS_AHEAD: usize = 8;
/// f32s in a 64-byte cache line.
const LINE: usize = 16;

/// Three rows (a decode step's GQA group of three query heads) of each kv head against that head's keys, two keys
/// at a time: `out[h][r][j] = dot(q[h][r], keys[h][j])` over the first `chunks` chunks, bitwise `dots`'. Both
/// halves of a pair's lanes are summed in one pass over the chunks (twelve accumulators), so each key is read
/// once, where a 2 x 8 tile and a 1 x 16 one read it three times; and every head takes its pair of keys before
/// the next pair: the heads' keys lie side by side in a cached row, so the rows are read in address order (read
/// one head's share at a time, a third of each row's lines, they came from memory no faster than whole). Every
/// head has the same even number of keys. The keys `PAIRS_AHEAD` pairs on are asked for as it goes.
///
/// # Safety
/// The CPU has AVX2 and FMA; every row of `q` and `keys` holds at least `chunks · 16` f32s, every `out[h][r]` at
/// least `keys[h].len()`, and `q`, `keys` and `out` are equally long.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) unsafe fn dots_three(q: &[[&[f32]; 3]], keys: &[&[&[f32]]], chunks: usize, out: &mut [[&mut [f32]; 3]]) {
    let pairs = keys.first().map_or(0, |k| k.len() / 2);
    for b in 0..pairs {
        for ((qh, kh), oh) in q.iter().zip(keys).zip(out.iter_mut()) {
            let kp = [kh[2 * b].as_ptr(), kh[2 * b + 1].as_ptr()];
            if let Some(ahead) = kh.get(2 * (b + PAIRS_AHEAD) + 1) {
                for row in [kh[2 * (b + PAIRS_AHEAD)], ahead] {
                    for line in (0..chunks * LANES).step_by(LINE) {
                        // SAFETY: SSE is part of AVX2; `line` is inside the row
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(line).cast()) };
                    }
                }
            }
            // [row][key][half]
            let mut acc = [[[_mm256_setzero_ps(); 2]; 2]; 3];
            for c in 0..chunks {
                for h in 0..2 {
                    let at = c * LANES + h * HALF;
                    // SAFETY: `at + 8 <= chunks · 16`, inside every row (the caller's contract); unaligned loads
                    let kv = unsafe { [_mm256_loadu_ps(kp[0].add(at)), _mm256_loadu_ps(kp[1].add(at))] };
                    for (a, row) in acc.iter_mut().zip(qh) {
                        let x = unsafe { _mm256_loadu_ps(row.as_ptr().add(at)) };
                        for (ak, k) in a.iter_mut().zip(&kv) {
                            ak[h] = _mm256_fmadd_ps(x, *k, ak[h]);
                        }
                    }
                }
            }
            // rows 0 and 1 (two keys each) in one tree, row 2 in another
            let lo = |r: usize, j: usize| acc[r][j][0];
            let hi = |r: usize, j: usize| acc[r][j][1];
            let first = tree4([lo(0, 0), lo(0, 1), lo(1, 0), lo(1, 1)], [hi(0, 0), hi(0, 1), hi(1, 0), hi(1, 1)]);
            let last = tree4([lo(2, 0), lo(2, 1), lo(2, 0), lo(2, 1)], [hi(2, 0), hi(2, 1), hi(2, 0), hi(2, 1)]);
            // SAFETY: `out[h][r]` holds `keys[h].len()` scores, this pair's at `2b..2b + 2`; unaligned 8-byte stores
            unsafe {
                _mm_storel_pd(oh[0].as_mut_ptr().add(2 * b).cast(), _mm_castps_pd(first));
                _mm_storeh_pd(oh[1].as_mut_ptr().add(2 * b).cast(), _mm_castps_pd(first));
                _mm_storel_pd(oh[2].as_mut_ptr().add(2 * b).cast(), _mm_castps_pd(last));
            }
        }
    }
}
