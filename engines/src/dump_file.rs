//! The state-dump file: safetensors, so Python reads it with `safetensors.numpy.load_file` (docs/dump-format.md).
//!
//! Per cached tensor of layer L named N: `layers.L.N.rows` (f32, rows x width), `layers.L.N.positions` (i64, the
//! absolute position each row holds, -1 empty) and `layers.L.N.writers` (i64, rows x 4: request, kind, a, b).
//! The record's ids are `record.ids` (i64). Everything else is one JSON document under the metadata key
//! `kvproof` (one key, so the header — and the whole file — is byte-stable).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use crate::dump::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};
use crate::error::EngineError;

/// Writer kind codes in the `writers` tensors.
pub const WRITER_NONE: i64 = 0;
pub const WRITER_PREFILL: i64 = 1;
pub const WRITER_DECODE: i64 = 2;
pub const WRITER_COPIED: i64 = 3;

/// The JSON document stored under the `kvproof` metadata key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileHeader {
    pub format: String,
    pub kvproof_version: String,
    pub meta: DumpMeta,
    pub record_tainted: bool,
    pub record_capacity: usize,
    /// The cached tensors in order: (layer, name, kind, width, rows).
    pub tensors: Vec<TensorEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub layer: usize,
    pub name: String,
    pub kind: CacheKind,
    pub width: usize,
    pub rows: usize,
}

impl TensorEntry {
    pub fn key(&self, part: &str) -> String {
        format!("layers.{}.{}.{part}", self.layer, self.name)
    }
}

pub const FORMAT: &str = "kvproof-state-dump/1";

fn encode_writer(w: Option<Writer>) -> [i64; 4] {
    match w {
        None => [-1, WRITER_NONE, 0, 0],
        Some(Writer { request, kind }) => {
            let r = request as i64;
            match kind {
                WriterKind::Prefill { chunk, chunk_rows } => [r, WRITER_PREFILL, chunk as i64, chunk_rows as i64],
                WriterKind::Decode { step } => [r, WRITER_DECODE, step as i64, 0],
                WriterKind::Copied { from_slot } => [r, WRITER_COPIED, from_slot as i64, 0],
            }
        }
    }
}

pub fn decode_writer(v: &[i64]) -> Result<Option<Writer>, String> {
    let request = v[0] as u64;
    let kind = match v[1] {
        WRITER_NONE => return Ok(None),
        WRITER_PREFILL => WriterKind::Prefill { chunk: v[2] as u32, chunk_rows: v[3] as u32 },
        WRITER_DECODE => WriterKind::Decode { step: v[2] as u32 },
        WRITER_COPIED => WriterKind::Copied { from_slot: v[2] as u32 },
        other => return Err(format!("unknown writer kind {other}")),
    };
    Ok(Some(Writer { request, kind }))
}

fn le_bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le_bytes_i64(v: impl Iterator<Item = i64>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

/// The dump's safetensors bytes.
pub fn to_bytes(dump: &StateDump) -> Result<Vec<u8>, String> {
    let entries: Vec<TensorEntry> = dump
        .tensors
        .iter()
        .map(|t| TensorEntry { layer: t.layer, name: t.name.clone(), kind: t.kind, width: t.width, rows: t.rows() })
        .collect();
    let header = FileHeader {
        format: FORMAT.into(),
        kvproof_version: crate::VERSION.into(),
        meta: dump.meta.clone(),
        record_tainted: dump.record.tainted,
        record_capacity: dump.record.capacity,
        tensors: entries.clone(),
    };
    let mut buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (t, e) in dump.tensors.iter().zip(&entries) {
        if e.rows == 0 {
            continue;
        }
        buffers.push((e.key("rows"), Dtype::F32, vec![e.rows, e.width], le_bytes_f32(&t.data)));
        buffers.push((e.key("positions"), Dtype::I64, vec![e.rows], le_bytes_i64(t.positions.iter().copied())));
        let writers = t.writers.iter().flat_map(|w| encode_writer(*w));
        buffers.push((e.key("writers"), Dtype::I64, vec![e.rows, 4], le_bytes_i64(writers)));
    }
    let ids = dump.record.ids.iter().map(|&i| i as i64);
    buffers.push(("record.ids".into(), Dtype::I64, vec![dump.record.ids.len()], le_bytes_i64(ids)));
    let views = buffers
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.clone(), v)).map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let json = serde_json::to_string(&header).map_err(|e| e.to_string())?;
    let meta = Some(HashMap::from([("kvproof".to_string(), json)]));
    safetensors::tensor::serialize(views, &meta).map_err(|e| e.to_string())
}

/// Write `dump` to `path`; returns the bytes written.
pub fn write_file(dump: &StateDump, path: &Path) -> Result<u64, EngineError> {
    let bytes = to_bytes(dump).map_err(|message| EngineError::Weights { path: path.into(), message })?;
    std::fs::write(path, &bytes).map_err(|source| EngineError::Io { path: path.into(), source })?;
    Ok(bytes.len() as u64)
}

/// Parse the header of a dump held in `bytes`.
pub fn read_header(bytes: &[u8]) -> Result<FileHeader, String> {
    let (_, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|e| format!("not a safetensors file (truncated or corrupt): {e}"))?;
    let json = metadata
        .metadata()
        .as_ref()
        .and_then(|m| m.get("kvproof"))
        .ok_or("not a kvproof state dump: no `kvproof` metadata key")?;
    let header: FileHeader = serde_json::from_str(json).map_err(|e| format!("metadata `kvproof`: {e}"))?;
    if header.format != FORMAT {
        return Err(format!("format `{}`, expected `{FORMAT}`", header.format));
    }
    Ok(header)
}

fn f32s(st: &SafeTensors, name: &str, n: usize) -> Result<Vec<f32>, String> {
    let t = st.tensor(name).map_err(|e| format!("tensor `{name}`: {e}"))?;
    if t.dtype() != Dtype::F32 || t.data().len() != n * 4 {
        return Err(format!("tensor `{name}`: {:?} {:?}, expected F32 with {n} values", t.dtype(), t.shape()));
    }
    Ok(t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

fn i64s(st: &SafeTensors, name: &str, n: usize) -> Result<Vec<i64>, String> {
    let t = st.tensor(name).map_err(|e| format!("tensor `{name}`: {e}"))?;
    if t.dtype() != Dtype::I64 || t.data().len() != n * 8 {
        return Err(format!("tensor `{name}`: {:?} {:?}, expected I64 with {n} values", t.dtype(), t.shape()));
    }
    Ok(t.data().chunks_exact(8).map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])).collect())
}

/// Decode a whole dump from its bytes.
pub fn from_bytes(bytes: &[u8]) -> Result<StateDump, String> {
    let header = read_header(bytes)?;
    let st =
        SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file (truncated or corrupt): {e}"))?;
    let mut tensors = Vec::with_capacity(header.tensors.len());
    for e in &header.tensors {
        let (data, positions, writers) = if e.rows == 0 {
            (Vec::new(), Vec::new(), Vec::new())
        } else {
            let data = f32s(&st, &e.key("rows"), e.rows * e.width)?;
            let positions = i64s(&st, &e.key("positions"), e.rows)?;
            let raw = i64s(&st, &e.key("writers"), e.rows * 4)?;
            let writers = raw
                .chunks_exact(4)
                .map(decode_writer)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| format!("tensor `{}`: {m}", e.key("writers")))?;
            (data, positions, writers)
        };
        tensors.push(DumpTensor {
            layer: e.layer,
            name: e.name.clone(),
            kind: e.kind,
            width: e.width,
            data,
            positions,
            writers,
        });
    }
    let n_ids =
        st.tensor("record.ids").map_err(|e| format!("tensor `record.ids`: {e}"))?.shape().first().copied().unwrap_or(0);
    let ids = i64s(&st, "record.ids", n_ids)?
        .into_iter()
        .map(|v| u32::try_from(v).map_err(|_| format!("tensor `record.ids`: id {v} out of range")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(StateDump {
        meta: header.meta,
        record: RecordDump { ids, tainted: header.record_tainted, capacity: header.record_capacity },
        tensors,
    })
}

/// Read a dump file; errors name the file and what is wrong with it.
pub fn read_file(path: &Path) -> Result<StateDump, EngineError> {
    let bytes = std::fs::read(path).map_err(|source| EngineError::Io { path: path.into(), source })?;
    from_bytes(&bytes).map_err(|message| EngineError::Weights { path: path.into(), message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Preset;
    use crate::engine::{NoObserver, Request};

    fn sample_dump() -> StateDump {
        let mut e = crate::bundled::open_preset("inkling", Preset::Tiny, 0, None).expect("engine");
        let prompt: Vec<u32> = (0..30).map(|i| 65 + i % 20).collect();
        e.generate(&Request { id: 4, prompt, max_tokens: 5, ignore_eos: true, ..Default::default() }, &mut NoObserver)
            .expect("generate");
        e.dump(0).expect("dump")
    }

    #[test]
    fn round_trips_and_is_byte_stable() {
        let d = sample_dump();
        let a = to_bytes(&d).expect("encode");
        assert_eq!(a, to_bytes(&d).expect("encode again"));
        assert_eq!(from_bytes(&a).expect("decode"), d);
    }

    #[test]
    fn truncated_and_corrupt_files_are_explained() {
        let bytes = to_bytes(&sample_dump()).expect("encode");
        let err = from_bytes(&bytes[..bytes.len() / 2]).expect_err("truncated");
        assert!(err.contains("truncated or corrupt"), "{err}");
        let err = from_bytes(&bytes[..5]).expect_err("tiny");
        assert!(err.contains("not a safetensors file"), "{err}");
        let mut bad = bytes.clone();
        bad[10] = b'#';
        assert!(from_bytes(&bad).is_err());
        let dir = std::env::temp_dir().join(format!("kvproof-dumpfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("cut.safetensors");
        std::fs::write(&path, &bytes[..bytes.len() - 9]).expect("write");
        let err = read_file(&path).expect_err("cut").to_string();
        assert!(err.contains("cut.safetensors"), "{err}");
    }
}
