//! A sliding-window ring: `window` rows, position t at row t % window.
//!
//! A sliding layer never reads a row older than the window, so only the last `window` rows are kept. Its size does
//! not depend on capacity: growing a slot keeps the ring wholesale (copying a wrapped ring linearly would rotate it).

use super::{RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};

#[derive(Debug, Clone)]
pub struct RingCache {
    pub rows: Rows,
}

impl RingCache {
    pub fn new(window: usize, width: usize) -> Self {
        RingCache { rows: Rows::new(window, width) }
    }

    pub fn window(&self) -> usize {
        self.rows.len()
    }

    /// The ring row for absolute position `pos`.
    pub fn index(&self, pos: usize) -> usize {
        pos % self.window()
    }

    pub fn get(&self, pos: usize) -> &[f32] {
        self.rows.row(self.index(pos))
    }

    pub fn put(&mut self, pos: usize, values: &[f32], meta: RowMeta) {
        let i = self.index(pos);
        self.rows.write(i, values, meta);
    }

    /// The `ring-linear-copy` fault: treat the ring as linear history of positions `len - window .. len` and copy
    /// it to rows `0..window` in that order — the bug a grow-with-copy written for full caches does to a ring.
    pub fn linearize_faulty(&mut self, len: usize) {
        let w = self.window();
        if len <= w {
            return; // never wrapped: a linear copy is the identity
        }
        let old = self.rows.clone();
        for i in 0..w {
            let src = (len - w + i) % w;
            let values = old.row(src).to_vec();
            self.rows.write(i, &values, old.meta[src]);
        }
    }

    pub fn dump(&self, layer: usize, name: &str) -> DumpTensor {
        self.rows.dump(layer, name, CacheKind::Ring)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Writing positions 0..n in order leaves exactly the last `window` positions, each at pos % window.
        #[test]
        fn ring_holds_last_window_positions(window in 1usize..16, n in 0usize..80) {
            let mut r = RingCache::new(window, 1);
            for p in 0..n {
                r.put(p, &[p as f32], RowMeta { pos: p as i64, writer: None });
            }
            for p in n.saturating_sub(window)..n {
                prop_assert_eq!(r.get(p), &[p as f32][..]);
                prop_assert_eq!(r.rows.meta[r.index(p)].pos, p as i64);
            }
        }
    }
}
