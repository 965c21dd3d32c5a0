//! A full cache: position t at row t, `capacity` rows.

use super::{RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};

#[derive(Debug, Clone)]
pub struct FullCache {
    pub rows: Rows,
}

impl FullCache {
    pub fn new(capacity: usize, width: usize) -> Self {
        FullCache { rows: Rows::new(capacity, width) }
    }

    pub fn capacity(&self) -> usize {
        self.rows.len()
    }

    pub fn get(&self, pos: usize) -> &[f32] {
        self.rows.row(pos)
    }

    pub fn put(&mut self, pos: usize, values: &[f32], meta: RowMeta) {
        self.rows.write(pos, values, meta);
    }

    /// Change to `capacity` rows, keeping the first `keep` (position t stays at row t).
    pub fn grow(&mut self, capacity: usize, keep: usize) {
        self.rows.grow(capacity, keep);
    }

    pub fn dump(&self, layer: usize, name: &str) -> DumpTensor {
        self.rows.dump(layer, name, CacheKind::Full)
    }
}
