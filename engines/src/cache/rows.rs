//! A block of fixed-width rows with per-row provenance: the storage under every cache kind.

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
    pub data: Vec<f32>,
    pub meta: Vec<RowMeta>,
}

impl Rows {
    pub fn new(n: usize, width: usize) -> Self {
        Rows { width, data: vec![0.0; n * width], meta: vec![RowMeta::EMPTY; n] }
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

    pub fn dump(&self, layer: usize, name: &str, kind: CacheKind) -> DumpTensor {
        self.clone().into_dump(layer, name, kind)
    }

    /// `dump`, moving the rows in instead of copying them (rows built only to be dumped).
    pub fn into_dump(self, layer: usize, name: &str, kind: CacheKind) -> DumpTensor {
        DumpTensor {
            layer,
            name: name.to_string(),
            kind,
            width: self.width,
            positions: self.meta.iter().map(|m| m.pos).collect(),
            writers: self.meta.iter().map(|m| m.writer).collect(),
            data: self.data,
        }
    }
}
