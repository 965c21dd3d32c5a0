//! A block of fixed-width rows with per-row provenance: the storage under every cache kind.

use super::Floats;
use crate::dump::{CacheKind, DumpTensor, Writer};

/// What a row holds: the absolute position (-1: empty) and who wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowMeta {
    pub pos: i64,
    pub writer: Option<Writer>,
}

impl RowMeta {
    pub const EMPTY: RowMeta = RowMeta { pos: -1, writer: None };
}

/// `n` rows of `width` floats.
#[derive(Debug, Clone)]
pub struct Rows {
    pub width: usize,
    pub data: Floats,
    pub meta: Vec<RowMeta>,
}

impl Rows {
    pub fn new(n: usize, width: usize) -> Self {
        Rows { width, data: Floats::zeroed(n * width), meta: vec![RowMeta::EMPTY; n] }
    }

    /// Change to `n` rows, keeping rows `0..keep` (at most `n` and the rows there are): every other row is empty
    /// and zero, as in `Rows::new(n)`. The kept rows stay where they are (a large block is not copied: `Floats`).
    pub fn grow(&mut self, n: usize, keep: usize) {
        let keep = keep.min(n).min(self.len());
        let stale = self.len().min(n);
        self.data[keep * self.width..stale * self.width].fill(0.0);
        self.meta[keep..stale].fill(RowMeta::EMPTY);
        self.data.resize(n * self.width);
        self.meta.resize(n, RowMeta::EMPTY);
    }

    pub fn len(&self) -> usize {
        self.meta.len()
    }

    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    #[inline]
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    pub fn write(&mut self, i: usize, values: &[f32], meta: RowMeta) {
        self.data[i * self.width..(i + 1) * self.width].copy_from_slice(values);
        self.meta[i] = meta;
    }

    /// Mark every row empty (the data stays; nothing may read it without a matching position).
    pub fn forget(&mut self) {
        self.meta.iter_mut().for_each(|m| *m = RowMeta::EMPTY);
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4 + self.meta.len() * std::mem::size_of::<RowMeta>()
    }

    /// The rows as a dump tensor, their values copied once.
    pub fn dump(&self, layer: usize, name: &str, kind: CacheKind) -> DumpTensor {
        self.tensor(layer, name, kind, self.data.to_vec())
    }

    /// `dump`, moving the rows in instead of copying them (rows built only to be dumped, on the heap).
    pub fn into_dump(mut self, layer: usize, name: &str, kind: CacheKind) -> DumpTensor {
        let data = std::mem::replace(&mut self.data, Floats::zeroed(0)).into_vec();
        self.tensor(layer, name, kind, data)
    }

    fn tensor(&self, layer: usize, name: &str, kind: CacheKind, data: Vec<f32>) -> DumpTensor {
        DumpTensor {
            layer,
            name: name.to_string(),
            kind,
            width: self.width,
            positions: self.meta.iter().map(|m| m.pos).collect(),
            writers: self.meta.iter().map(|m| m.writer).collect(),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `grow` as it was written before rows grew in place: a new block, the kept rows copied into it.
    fn grown_by_copy(rows: &Rows, n: usize, keep: usize) -> Rows {
        let mut next = Rows::new(n, rows.width);
        let keep = keep.min(n).min(rows.len());
        next.data[..keep * rows.width].copy_from_slice(&rows.data[..keep * rows.width]);
        next.meta[..keep].copy_from_slice(&rows.meta[..keep]);
        next
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Growing (or shrinking) in place, across heap and mapped sizes, leaves what a new block with the kept
        /// rows copied into it holds: the kept rows, and every other row empty and zero.
        #[test]
        fn grow_equals_a_new_block_with_the_kept_rows(
            width in 1usize..4,
            sizes in proptest::collection::vec((0usize..200_000, 0usize..200_000), 1..5),
        ) {
            let mut rows = Rows::new(0, width);
            for (step, (n, keep)) in sizes.into_iter().enumerate() {
                let expected = grown_by_copy(&rows, n, keep);
                rows.grow(n, keep);
                prop_assert_eq!(rows.len(), n);
                prop_assert!(rows.data[..] == expected.data[..], "data differs after step {step}");
                prop_assert_eq!(&rows.meta, &expected.meta);
                // write rows all through the block, the last one included, so the next step has rows to drop
                for i in (0..n).step_by(997).chain(n.checked_sub(1)) {
                    let v = vec![(step * 1000 + i) as f32; width];
                    rows.write(i, &v, RowMeta { pos: i as i64, writer: None });
                }
            }
        }
    }
}
