//! A full cache stored kv head by kv head: head g's rows of positions 0..capacity one after another, position t at
//! row t of every head.
//!
//! A decode step's attention reads a kv head's keys and values across every position. Stored side by side (one
//! row per position holding every head), a core taking some of the heads reads part of each row at the row's
//! stride, which it reads far slower than whole rows; stored head by head, each head is one sequential run. A decode
//! row of SmolLM2's shapes over 2048 positions (30 layers' caches, from DRAM) took 6.2-6.4 ms side by side and 5.2
//! head by head (4.6-4.7 once its weighted sums took even runs of columns, `gqa_attend::attend_one_row`). Dumps
//! still give one row per position with every head side by side, as `FullCache`'s.

use super::{RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};

#[derive(Debug, Clone)]
pub struct HeadMajorCache {
    /// One block of `capacity` rows per kv head; the metadata of position t is that of row t of every block, and
    /// block 0 holds it.
    heads: Vec<Rows>,
}

impl HeadMajorCache {
    pub fn new(capacity: usize, heads: usize, width: usize) -> Self {
        assert!(heads > 0, "a cache of no kv heads");
        HeadMajorCache { heads: (0..heads).map(|_| Rows::new(capacity, width)).collect() }
    }

    pub fn capacity(&self) -> usize {
        self.heads[0].len()
    }

    /// Kv head `g`'s row of position `pos`.
    #[inline]
    pub fn get(&self, g: usize, pos: usize) -> &[f32] {
        self.heads[g].row(pos)
    }

    /// Position `pos`'s row of every kv head, side by side (`heads x width`).
    pub fn put(&mut self, pos: usize, values: &[f32], meta: RowMeta) {
        let width = self.heads[0].width;
        assert_eq!(values.len(), self.heads.len() * width, "a cache row of {} kv heads", self.heads.len());
        for (head, v) in self.heads.iter_mut().zip(values.chunks_exact(width)) {
            head.write(pos, v, meta);
        }
    }

    /// Mark every position empty.
    pub fn forget(&mut self) {
        self.heads.iter_mut().for_each(Rows::forget);
    }

    /// Change to `capacity` rows a head, keeping the first `keep` positions (position t stays at row t).
    pub fn grow(&mut self, capacity: usize, keep: usize) {
        self.heads.iter_mut().for_each(|head| head.grow(capacity, keep));
    }

    pub fn bytes(&self) -> usize {
        self.heads.iter().map(Rows::bytes).sum()
    }

    /// The cache as `FullCache` dumps it: one row per position, every kv head side by side.
    pub fn dump(&self, layer: usize, name: &str) -> DumpTensor {
        let width = self.heads[0].width;
        let mut data = Vec::with_capacity(self.capacity() * self.heads.len() * width);
        for t in 0..self.capacity() {
            for head in &self.heads {
                data.extend_from_slice(head.row(t));
            }
        }
        let rows = Rows { width: self.heads.len() * width, data: data.into(), meta: self.heads[0].meta.clone() };
        rows.into_dump(layer, name, CacheKind::Full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::FullCache;
    use proptest::prelude::*;

    proptest! {
        /// Whatever is written, grown and forgotten, the cache reads back each head's slice of what was put and dumps
        /// what a `FullCache` given the same calls dumps.
        #[test]
        fn reads_and_dumps_as_a_full_cache(
            heads in 1usize..4,
            width in 1usize..5,
            writes in proptest::collection::vec((0usize..12, any::<u16>()), 0..30),
            grow_to in 12usize..20,
            keep in 0usize..14,
        ) {
            let mut by_head = HeadMajorCache::new(12, heads, width);
            let mut full = FullCache::new(12, heads * width);
            let write = |by_head: &mut HeadMajorCache, full: &mut FullCache, pos: usize, seed: u16| {
                let row: Vec<f32> = (0..heads * width).map(|i| f32::from(seed) + i as f32 * 0.5).collect();
                let meta = RowMeta { pos: pos as i64, writer: None };
                by_head.put(pos, &row, meta);
                full.put(pos, &row, meta);
            };
            for (at, (pos, seed)) in writes.iter().enumerate() {
                write(&mut by_head, &mut full, *pos, *seed);
                if at == writes.len() / 2 {
                    by_head.grow(grow_to, keep);
                    full.grow(grow_to, keep);
                }
            }
            prop_assert_eq!(by_head.capacity(), full.capacity());
            for pos in 0..full.capacity() {
                for g in 0..heads {
                    prop_assert_eq!(by_head.get(g, pos), &full.get(pos)[g * width..(g + 1) * width]);
                }
            }
            let (a, b) = (by_head.dump(3, "k"), full.dump(3, "k"));
            prop_assert_eq!((a.layer, &a.name, a.width, &a.positions), (b.layer, &b.name, b.width, &b.positions));
            prop_assert_eq!(a.data, b.data);
            prop_assert_eq!(a.writers, b.writers);
            by_head.forget();
            prop_assert!(by_head.dump(0, "v").positions.iter().all(|p| *p == -1));
        }
    }
}
