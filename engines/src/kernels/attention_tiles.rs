//! Attention's weighted sums in register tiles: `Q` queries' sums over `C` chunks of the same values. AVX-512 where
//! the CPU has it, else AVX2 with FMA, else a portable loop doing the same operations on the same lanes (the same bits, only slower);
//! a test holds the two to each other.

use super::matmul::LANES;

/// `acc[q][at·16 .. (at + C)·16] += Σⱼ p[q][j] · v[j][..]`, value by value in order, one fused multiply-add per
/// element (`acc[q]` is query `q`'s whole output row, `p[q]` its weights of the values `v`). `Q · C ≤ 16`.
#[inline]
pub(super) fn fold<const Q: usize, const C: usize>(p: [&[f32]; Q], v: &[&[f32]], at: usize, acc: [&mut [f32]; Q]) {
    let end = (at + C) * LANES;
    assert!(p.iter().all(|w| w.len() >= v.len()), "attention fold: fewer weights than values");
    assert!(v.iter().all(|r| r.len() >= end) && acc.iter().all(|a| a.len() >= end), "attention fold: short row");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; weights, value rows and outputs are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::attention_avx512::weighted::<Q, C>(p, v, at, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; weights, value rows and outputs are long enough (asserted above)
        #[allow(unsafe_code)]
        return unsafe { super::attention_avx2::weighted::<Q, C>(p, v, at, acc) };
    }
    fold_portable::<Q, C>(p, v, at, acc)
}

/// The most kv heads `fold_heads` takes at once for `group` queries a head over `chunks` chunks (the head's
/// width), or `None` where it takes none: no AVX-512, or a shape it is not built for. Its sums are registers held
/// over every value, so the heads' sums together stay within thirty-six (some spill: still one pass).
pub(super) fn heads_at_once(group: usize, chunks: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return match (group, chunks) {
            (2, 4) => Some(4),
            (3, 4) => Some(3),
            (4, 4) | (2, 8) => Some(2),
            (3, 8) | (4, 8) => Some(1),
            _ => None,
        };
    }
    let _ = (group, chunks);
    None
}

/// Calls the macro `$m` with every (kv heads, queries a head, chunks) shape `heads_at_once` takes, for the callers
/// that compile a kernel per shape.
macro_rules! heads_shapes {
    ($m:ident) => {
        $m!(
            (1, 2, 4),
            (2, 2, 4),
            (3, 2, 4),
            (4, 2, 4),
            (1, 3, 4),
            (2, 3, 4),
            (3, 3, 4),
            (1, 4, 4),
            (2, 4, 4),
            (1, 2, 8),
            (2, 2, 8),
            (1, 3, 8),
            (1, 4, 8)
        )
    };
}
pub(super) use heads_shapes;

/// `fold` of `G` kv heads at once, each the whole head width of `C` chunks: `acc[g][q] += Σⱼ p[g][q][j] · v[j][g]`,
/// value by value in order, so a cached row holding the heads side by side is read once. Only for the shapes
/// `heads_at_once` names (it asserts that).
pub(super) fn fold_heads<const G: usize, const Q: usize, const C: usize>(
    p: [[&[f32]; Q]; G],
    v: &[[&[f32]; G]],
    acc: [[&mut [f32]; Q]; G],
) {
    let end = C * LANES;
    assert!(heads_at_once(Q, C).is_some_and(|most| G <= most), "attention fold: {G} heads of {Q} x {C} at once");
    assert!(p.iter().flatten().all(|w| w.len() >= v.len()), "attention fold: fewer weights than values");
    assert!(
        v.iter().flatten().all(|r| r.len() >= end) && acc.iter().flatten().all(|a| a.len() >= end),
        "attention fold: short row"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (`heads_at_once`, asserted); weights, value rows and outputs are long enough
    #[allow(unsafe_code)]
    unsafe {
        super::attention_avx512::weighted_heads::<G, Q, C>(p, v, acc)
    };
}

/// The most chunks of sixteen columns `fold_units` takes at once for `queries` a head, or `None` where it takes
/// none (no AVX-512, a count of queries it is not built for): its `queries x units` sums stay in registers over
/// every value (twenty-four at most).
pub(super) fn units_at_once(queries: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return match queries {
            2 | 3 => Some(8),
            4 => Some(6),
            _ => None,
        };
    }
    let _ = queries;
    None
}

/// Calls the macro `$m` with every (units, queries a head) shape `units_at_once` takes, for the callers that
/// compile a kernel per shape.
macro_rules! units_shapes {
    ($m:ident) => {
        $m!(
            (1, 2),
            (2, 2),
            (3, 2),
            (4, 2),
            (5, 2),
            (6, 2),
            (7, 2),
            (8, 2),
            (1, 3),
            (2, 3),
            (3, 3),
            (4, 3),
            (5, 3),
            (6, 3),
            (7, 3),
            (8, 3),
            (1, 4),
            (2, 4),
            (3, 4),
            (4, 4),
            (5, 4),
            (6, 4)
        )
    };
}
pub(super) use units_shapes;

/// `fold` of `U` chunks of sixteen columns anywhere in the value rows, each with its own `Q` queries' weights:
/// `acc[u][q] += Σⱼ w[u][q][j] · value(head[u], j)[at[u]..at[u] + 16]`, value by value in order over `rows` rows. A
/// run of columns crossing heads of a cached row is read once, start to end; `value` is called once a row for each
/// head the units name (consecutive units of one head share the call). Only for the shapes `units_at_once` names
/// (it asserts that).
pub(super) fn fold_units<'a, const U: usize, const Q: usize>(
    w: [[&[f32]; Q]; U],
    value: impl Fn(usize, usize) -> &'a [f32],
    units: [(usize, usize); U],
    rows: usize,
    acc: [[&mut [f32]; Q]; U],
) {
    assert!(units_at_once(Q).is_some_and(|most| U <= most), "attention fold: {U} units of {Q} queries at once");
    assert!(w.iter().flatten().all(|w| w.len() >= rows), "attention fold: fewer weights than values");
    assert!(acc.iter().flatten().all(|a| a.len() >= LANES), "attention fold: short output");
    let row = |j: usize| -> [*const f32; U] {
        let mut chunks = [std::ptr::null(); U];
        let mut head: Option<(usize, &[f32])> = None;
        for (chunk, &(g, at)) in chunks.iter_mut().zip(&units) {
            let slice = match head {
                Some((h, slice)) if h == g => slice,
                _ => value(g, j),
            };
            head = Some((g, slice));
            // the bounds check a safe slice makes: the kernel reads sixteen f32s from here
            *chunk = slice[at..at + LANES].as_ptr();
        }
        chunks
    };
    let w = w.map(|u| u.map(<[f32]>::as_ptr));
    let acc = acc.map(|u| u.map(<[f32]>::as_mut_ptr));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (`units_at_once`, asserted); weights and outputs are long enough (asserted), each
    // value chunk is a checked slice of sixteen, and the outputs are distinct `&mut` slices
    #[allow(unsafe_code)]
    unsafe {
        super::attention_avx512::weighted_units::<U, Q>(w, rows, row, acc)
    };
}

/// The portable `fold`.
pub(super) fn fold_portable<const Q: usize, const C: usize>(
    p: [&[f32]; Q],
    v: &[&[f32]],
    at: usize,
    acc: [&mut [f32]; Q],
) {
    let span = at * LANES..(at + C) * LANES;
    for (w, out) in p.iter().zip(acc) {
        let out = &mut out[span.clone()];
        for (wj, row) in w.iter().zip(v) {
            for (o, x) in out.iter_mut().zip(&row[span.clone()]) {
                *o = wj.mul_add(*x, *o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::{random, split};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The fold the CPU runs (AVX-512 where it has it) gives the portable loop's bits, for one chunk and for
        /// two chunks at an offset: a machine without AVX-512 computes the same sums.
        #[test]
        fn simd_folds_match_the_portable_loop(chunks in 1usize..6, keys in 0usize..40, seed in any::<u64>()) {
            let w = chunks * LANES;
            let rows = random(keys * w, seed);
            let values: Vec<&[f32]> = rows.chunks_exact(w).collect();
            let weights = random(4 * keys, seed ^ 1);
            let p: [&[f32]; 4] = std::array::from_fn(|i| &weights[i * keys..(i + 1) * keys]);
            let start = random(4 * w, seed ^ 2);
            let (mut simd, mut portable) = (start.clone(), start);
            fold::<4, 1>(p, &values, 0, split(&mut simd, w));
            fold_portable::<4, 1>(p, &values, 0, split(&mut portable, w));
            prop_assert_eq!(&simd, &portable);
            if chunks >= 2 {
                fold::<2, 2>([p[0], p[1]], &values, chunks - 2, split(&mut simd, w));
                fold_portable::<2, 2>([p[0], p[1]], &values, chunks - 2, split(&mut portable, w));
                prop_assert_eq!(&simd, &portable);
            }
        }

        /// The AVX2 fold on its own (a machine with AVX-512 runs that instead, but has AVX2 too), for every shape
        /// the attention kernel picks: the portable loop's bits.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx2_folds_match_the_portable_loop(keys in 0usize..40, seed in any::<u64>()) {
            if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
                return Ok(());
            }
            let w = 9 * LANES;
            let rows = random(keys * w, seed);
            let values: Vec<&[f32]> = rows.chunks_exact(w).collect();
            let weights = random(16 * keys, seed ^ 1);
            let p: Vec<&[f32]> = weights.chunks_exact(keys.max(1)).take(16).collect();
            let p: Vec<&[f32]> = if keys == 0 { vec![&[]; 16] } else { p };
            let start = random(16 * w, seed ^ 2);
            macro_rules! check {
                ($(($q:literal, $c:literal)),*) => {$(
                    let (mut simd, mut portable) = (start.clone(), start.clone());
                    let pq: [&[f32]; $q] = std::array::from_fn(|i| p[i]);
                    // SAFETY: the CPU has AVX2 and FMA (checked above); rows hold 9 chunks, weights `keys`
                    #[allow(unsafe_code)]
                    unsafe { crate::kernels::attention_avx2::weighted::<$q, $c>(pq, &values, 1, split(&mut simd, w)) };
                    fold_portable::<$q, $c>(pq, &values, 1, split(&mut portable, w));
                    prop_assert_eq!(&simd, &portable, "{} x {}", $q, $c);
                )*};
            }
            check!((1, 8), (2, 8), (1, 4), (2, 4), (3, 4), (4, 4), (1, 2), (2, 2), (3, 2), (4, 2), (6, 2), (8, 2),
                (1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (8, 1), (16, 1));
        }
    }
}
