//! The prefill chunk plan: which rows each prefill chunk writes.
//!
//! A chunk's row count picks the kernels' tiling (see `forward`), so a row's bits depend on the chunk that wrote
//! it. Chunk boundaries therefore sit on a position-fixed grid — every multiple of `grid` — whatever the prompt's
//! length: a prefix is always produced by the same chunks, and a warm slot resumed at a grid boundary holds
//! exactly the rows a cold run of the current prompt writes. Only the last chunk (the remainder) is partial, which
//! is why reuse is rounded down to the grid.
//!
//! A prompt's segments (what the engine loop feeds and records as one step) are these chunks, except that a
//! remainder following a full chunk is fed together with it (`segments`): a remainder of a few rows does too
//! little arithmetic to hide its read of every layer's weights, so the pair goes through the model layer by
//! layer, and the remainder reads each layer's weights from cache just after the full chunk read them. Each
//! chunk of the pair keeps its own rows, tiling and writer (`split` recovers them), so no row's bits change.
//!
//! The `variable-chunks` fault restores seed 004's original chunker, which sized chunks from the total prompt
//! length (`n = ceil(L / grid); step = ceil(L / n)`): two prompts of different lengths then cut the same prefix
//! into chunks of different row counts.

/// Chunks `[start, end)` covering positions `from..to` of a prompt of `to` ids, in order.
pub fn plan(from: usize, to: usize, grid: usize, variable: bool) -> Vec<(usize, usize)> {
    let grid = grid.max(1);
    let step = if variable { to.div_ceil(to.div_ceil(grid).max(1)).max(1) } else { grid };
    let mut out = Vec::with_capacity((to.saturating_sub(from)).div_ceil(step));
    let mut start = from;
    while start < to {
        let end = ((start / step + 1) * step).min(to);
        out.push((start, end));
        start = end;
    }
    out
}

/// The segments feeding positions `from..to`: the chunks of `plan`, with a partial last chunk joined to a full
/// grid chunk before it. Only a full chunk (which starts on the grid) takes a remainder, so `split` finds the
/// pair again from the segment alone; the `variable-chunks` fault's shorter chunks are never joined.
pub fn segments(from: usize, to: usize, grid: usize, variable: bool) -> Vec<(usize, usize)> {
    let grid = grid.max(1);
    let mut out = plan(from, to, grid, variable);
    if let [.., (a, b), (c, d)] = out[..] {
        if b - a == grid && d - c < grid {
            out.truncate(out.len() - 2);
            out.push((a, d));
        }
    }
    out
}

/// The chunks of one segment of `segments`: the segment itself, or the full chunk and remainder it joins.
pub fn split(start: usize, end: usize, grid: usize) -> Vec<(usize, usize)> {
    let grid = grid.max(1);
    if end - start > grid {
        vec![(start, start + grid), (start + grid, end)]
    } else {
        vec![(start, end)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grid_boundaries_and_a_remainder() {
        assert_eq!(plan(0, 40, 16, false), vec![(0, 16), (16, 32), (32, 40)]);
        assert_eq!(plan(16, 40, 16, false), vec![(16, 32), (32, 40)]);
        assert_eq!(plan(0, 32, 16, false), vec![(0, 16), (16, 32)]);
        assert_eq!(plan(5, 5, 16, false), vec![]);
    }

    #[test]
    fn the_original_chunker_depends_on_the_prompt_length() {
        // 40 ids: 3 chunks of 14 (the last 12); 50 ids: 4 chunks of 13 (the last 11)
        assert_eq!(plan(0, 40, 16, true), vec![(0, 14), (14, 28), (28, 40)]);
        assert_eq!(plan(0, 50, 16, true), vec![(0, 13), (13, 26), (26, 39), (39, 50)]);
    }

    #[test]
    fn a_remainder_rides_with_the_full_chunk_before_it() {
        assert_eq!(segments(0, 40, 16, false), vec![(0, 16), (16, 40)]);
        assert_eq!(segments(16, 40, 16, false), vec![(16, 40)]);
        assert_eq!(split(16, 40, 16), vec![(16, 32), (32, 40)]);
        // nothing to join: all full, a lone remainder, or a partial first chunk (reuse off the grid)
        assert_eq!(segments(0, 32, 16, false), vec![(0, 16), (16, 32)]);
        assert_eq!(segments(32, 40, 16, false), vec![(32, 40)]);
        assert_eq!(segments(10, 20, 16, false), vec![(10, 16), (16, 20)]);
        // the original chunker's chunks are shorter than the grid and stay as they are
        assert_eq!(segments(0, 50, 16, true), plan(0, 50, 16, true));
    }

    proptest! {
        /// Splitting every segment gives back the chunk plan, whatever the start, end, grid or chunker.
        #[test]
        fn split_segments_are_the_plan(grid in 1usize..20, from in 0usize..100, extra in 0usize..200, variable: bool) {
            let to = from + extra;
            let split_back: Vec<_> =
                segments(from, to, grid, variable).into_iter().flat_map(|(a, b)| split(a, b, grid)).collect();
            prop_assert_eq!(split_back, plan(from, to, grid, variable));
        }

        /// Grid chunks never depend on the prompt length: every full chunk of a prefix is the same in any longer
        /// prompt, and resuming at a grid boundary gives the cold plan's tail.
        #[test]
        fn grid_plan_is_a_function_of_position(grid in 1usize..20, a in 0usize..200, extra in 0usize..200, k in 0usize..10) {
            let b = a + extra;
            let pa = plan(0, a, grid, false);
            let pb = plan(0, b, grid, false);
            for chunk in pa.iter().filter(|(s, e)| e - s == grid) {
                prop_assert!(pb.contains(chunk));
            }
            let r = (k * grid).min(b / grid * grid);
            let tail = plan(r, b, grid, false);
            prop_assert_eq!(&tail[..], &pb[pb.len() - tail.len()..]);
            prop_assert!(pb.iter().all(|(s, e)| s < e && e - s <= grid));
        }
    }
}
