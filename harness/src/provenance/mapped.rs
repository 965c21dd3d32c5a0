//! A state dump read through a memory map: the header is parsed, every array is checked against it, and rows are
//! read straight from the mapped bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::borrow::Cow;

use kvproof_engines::dump::{DumpMeta, Writer};
use kvproof_engines::dump_file::{decode_writer, read_header, FileHeader, TensorEntry};
use kvproof_engines::state_diff::{DumpSource, RowData, TensorRows};
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

use super::ProvenanceError;

/// Byte range and checked shape of one array in the file.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

pub struct MappedDump {
    pub path: PathBuf,
    pub header: FileHeader,
    map: memmap2::Mmap,
    spans: HashMap<String, Span>,
}

impl std::fmt::Debug for MappedDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedDump").field("path", &self.path).finish()
    }
}

impl MappedDump {
    pub fn open(path: &Path) -> Result<Self, ProvenanceError> {
        let bad = |message: String| ProvenanceError::BadDump { path: path.into(), message };
        let file = std::fs::File::open(path).map_err(|source| ProvenanceError::Io { path: path.into(), source })?;
        // Safety: read-only private map of a dump file; kvproof never rewrites a dump it is reading, and a file
        // truncated underneath us by another process is outside what we defend against.
        #[allow(unsafe_code)]
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ProvenanceError::Io { path: path.into(), source })?;
        let header = read_header(&map).map_err(bad)?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
        let base = 8 + header_len;
        let mut spans = HashMap::new();
        let mut expect = |name: String, dtype: Dtype, shape: Vec<usize>| -> Result<(), ProvenanceError> {
            let info = metadata.info(&name).ok_or_else(|| bad(format!("tensor `{name}` is missing")))?;
            if info.dtype != dtype || info.shape != shape {
                return Err(bad(format!(
                    "tensor `{name}`: {:?} {:?}, the header says {:?} {:?}",
                    info.dtype, info.shape, dtype, shape
                )));
            }
            let (start, end) = (base + info.data_offsets.0, base + info.data_offsets.1);
            if end > map.len() {
                return Err(bad(format!("tensor `{name}` runs past the end of the file (truncated?)")));
            }
            spans.insert(name, Span { start, end });
            Ok(())
        };
        for e in &header.tensors {
            if e.rows == 0 {
                continue;
            }
            expect(e.key("rows"), Dtype::F32, vec![e.rows, e.width])?;
            expect(e.key("positions"), Dtype::I64, vec![e.rows])?;
            expect(e.key("writers"), Dtype::I64, vec![e.rows, 4])?;
        }
        let ids = metadata.info("record.ids").ok_or_else(|| bad("tensor `record.ids` is missing".into()))?;
        let n_ids = ids.shape.first().copied().unwrap_or(0);
        expect("record.ids".into(), Dtype::I64, vec![n_ids])?;
        Ok(MappedDump { path: path.into(), header, map, spans })
    }

    fn bytes(&self, name: &str) -> &[u8] {
        self.spans.get(name).map(|s| &self.map[s.start..s.end]).unwrap_or(&[])
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
        let w = e.width * 4;
        all.get(i * w..(i + 1) * w).unwrap_or(&[])
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

    pub fn writers(&self, e: &TensorEntry) -> Result<Vec<Option<Writer>>, ProvenanceError> {
        if e.rows == 0 {
            return Ok(Vec::new());
        }
        self.i64s(&e.key("writers")).chunks_exact(4).map(decode_writer).collect::<Result<Vec<_>, _>>().map_err(|m| {
            ProvenanceError::BadDump { path: self.path.clone(), message: format!("{}: {m}", e.key("writers")) }
        })
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
        let writers = self.writers(e).map_err(|err| err.to_string())?;
        let data = if e.rows == 0 { &[][..] } else { self.bytes(&e.key("rows")) };
        Ok(TensorRows {
            layer: e.layer,
            name: &e.name,
            kind: e.kind,
            width: e.width,
            positions: Cow::Owned(self.positions(e)),
            writers: Cow::Owned(writers),
            data: RowData::Le(data),
        })
    }
}
