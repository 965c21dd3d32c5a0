//! A state dump read through a memory map: the header is parsed, every array is checked against it, and rows are
//! read straight from the mapped bytes.

use std::path::{Path, PathBuf};

use std::borrow::Cow;

use kvproof_engines::dump::DumpMeta;
use kvproof_engines::dump_file::{read_checked, CheckedDump, FileHeader, TensorEntry};
use kvproof_engines::state_diff::{DumpSource, RowData, RowWriters, TensorRows};

use super::ProvenanceError;

/// A dump's bytes: mapped from a file, or held in memory.
enum DumpBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for DumpBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            DumpBytes::Mapped(m) => m,
            DumpBytes::Owned(v) => v,
        }
    }
}

pub struct MappedDump {
    pub path: PathBuf,
    /// The path as errors name it.
    origin: String,
    pub header: FileHeader,
    map: DumpBytes,
    checked: CheckedDump,
}

impl std::fmt::Debug for MappedDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedDump").field("path", &self.path).finish()
    }
}

impl MappedDump {
    pub fn open(path: &Path) -> Result<Self, ProvenanceError> {
        let file = std::fs::File::open(path).map_err(|source| ProvenanceError::Io { path: path.into(), source })?;
        // Safety: read-only private map of a dump file; kvproof never rewrites a dump it is reading, and a file
        // truncated underneath us by another process is outside what we defend against.
        #[allow(unsafe_code)]
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ProvenanceError::Io { path: path.into(), source })?;
        Self::new(path.into(), DumpBytes::Mapped(map))
    }

    /// A dump held in memory; `origin` names it in errors.
    pub fn from_bytes(origin: &str, bytes: Vec<u8>) -> Result<Self, ProvenanceError> {
        Self::new(origin.into(), DumpBytes::Owned(bytes))
    }

    /// Every array the header names is checked against the file here, before anything is sized by it.
    fn new(path: PathBuf, map: DumpBytes) -> Result<Self, ProvenanceError> {
        let checked = read_checked(&map).map_err(|message| ProvenanceError::BadDump { path: path.clone(), message })?;
        Ok(MappedDump { origin: path.display().to_string(), path, header: checked.header.clone(), map, checked })
    }

    fn bytes(&self, name: &str) -> &[u8] {
        self.checked.span(name).and_then(|s| self.map.get(s)).unwrap_or(&[])
    }

    /// Total bytes of the file.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The raw file bytes (for a plain byte comparison).
    pub fn raw(&self) -> &[u8] {
        &self.map
    }

    /// Row `i` of tensor `e` as little-endian f32 bytes.
    pub fn row_bytes(&self, e: &TensorEntry, i: usize) -> &[u8] {
        let all = self.bytes(&e.key("rows"));
        let Some(w) = e.width.checked_mul(4) else { return &[] };
        i.checked_mul(w).and_then(|start| all.get(start..start.checked_add(w)?)).unwrap_or(&[])
    }

    fn i64s(&self, name: &str) -> Vec<i64> {
        self.bytes(name)
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect()
    }

    pub fn positions(&self, e: &TensorEntry) -> Vec<i64> {
        if e.rows == 0 {
            return Vec::new();
        }
        self.i64s(&e.key("positions"))
    }

    pub fn record_ids(&self) -> Vec<i64> {
        self.i64s("record.ids")
    }
}

impl DumpSource for MappedDump {
    fn meta(&self) -> &DumpMeta {
        &self.header.meta
    }

    fn record_ids(&self) -> Cow<'_, [u32]> {
        // ids past u32 cannot have been fed; they compare as unequal to anything a real record holds
        Cow::Owned(self.record_ids().into_iter().map(|v| u32::try_from(v).unwrap_or(u32::MAX)).collect())
    }

    fn record_tainted(&self) -> bool {
        self.header.record_tainted
    }

    fn tensor_count(&self) -> usize {
        self.header.tensors.len()
    }

    fn tensor(&self, i: usize) -> Result<TensorRows<'_>, String> {
        let e = self.header.tensors.get(i).ok_or_else(|| format!("{}: no tensor {i}", self.path.display()))?;
        let array = |name: &str| if e.rows == 0 { &[][..] } else { self.bytes(&e.key(name)) };
        Ok(TensorRows {
            origin: &self.origin,
            layer: e.layer,
            name: &e.name,
            kind: e.kind,
            width: e.width,
            positions: Cow::Owned(self.positions(e)),
            writers: RowWriters::Le(array("writers")),
            data: RowData::Le(array("rows")),
        })
    }
}
