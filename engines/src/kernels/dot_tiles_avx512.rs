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
/// are prefetched into L2, an equal share per tile, one per chunk step (a single row's spread over its keys; a
/// burst stalls the loads of the tile).
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
        if R == 1 {
            // One row against the keys (a decode matvec, one query's scores): each key read start to end, one
            // after the other. A tile's keys are consecutive rows of a matrix, so that is one sequential stream,
            // which the hardware prefetches far ahead; chunk by chunk across the keys it was sixteen streams of one
            // short row each (32 lines at 512 wide), and one core read a decode matvec at 13-15 GB/s against 19-27
            // this way. Each key's lanes are still one chain of fused steps, `c` ascending: the same bits.
            for (j, p) in kp.iter().enumerate() {
                // this tile's asks, spread over its keys as they were over its chunks
                for _ in 0..chunks.div_ceil(K) {
                    ask(ahead, &mut asked, upto);
                }
                let mut a = acc[j];
                for c in 0..chunks {
                    a = _mm512_fmadd_ps(load(qp[0], c), load(*p, c), a);
                }
                acc[j] = a;
            }
        } else {
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
