//! The state-dump file: safetensors, so Python reads it with `safetensors.numpy.load_file` (docs/dump-format.md).
//!
//! Per cached tensor of layer L named N: `layers.L.N.rows` (f32, rows x width), `layers.L.N.positions` (i64, the
//! absolute position each row holds, -1 empty) and `layers.L.N.writers` (i64, rows x 4: request, kind, a, b).
//! The record's ids are `record.ids` (i64). Everything else is one JSON document under the metadata key
//! `kvproof` (one key, so the header — and the whole file — is byte-stable).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};

use crate::dump::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};
use crate::error::EngineError;
use crate::safetensors_layout::Layout;

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

/// One row of a `writers` tensor: (request, kind, a, b).
pub fn decode_writer(v: &[i64]) -> Result<Option<Writer>, String> {
    let &[request, kind, a, b] = v else {
        return Err(format!("a writer row of {} values (4 expected)", v.len()));
    };
    let request = request as u64;
    let kind = match kind {
        WRITER_NONE => return Ok(None),
        WRITER_PREFILL => WriterKind::Prefill { chunk: a as u32, chunk_rows: b as u32 },
        WRITER_DECODE => WriterKind::Decode { step: a as u32 },
        WRITER_COPIED => WriterKind::Copied { from_slot: a as u32 },
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

/// A dump's header and the layout of its arrays, every array checked against the header: present, of the dtype
/// and shape the header's rows and width give (computed with checked arithmetic), inside the file.
#[derive(Debug, Clone)]
pub struct CheckedDump {
    pub header: FileHeader,
    pub layout: Layout,
}

impl CheckedDump {
    /// The byte range of array `name` (checked to lie inside the file when the dump was read).
    pub fn span(&self, name: &str) -> Option<std::ops::Range<usize>> {
        self.layout.tensor(name).map(|t| t.bytes.clone())
    }
}

/// Parse the header of a dump held in `bytes`.
pub fn read_header(bytes: &[u8]) -> Result<FileHeader, String> {
    Ok(read_checked(bytes)?.header)
}

fn expect_array(layout: &Layout, name: &str, dtype: Dtype, shape: &[usize]) -> Result<(), String> {
    let t = layout.tensor(name).ok_or_else(|| format!("tensor `{name}` is missing"))?;
    if t.dtype != dtype || t.shape != shape {
        return Err(format!("tensor `{name}`: {:?} {:?}, the header says {dtype:?} {shape:?}", t.dtype, t.shape));
    }
    Ok(())
}

/// Read a dump's header and check every array it names against the file, before anything is sized by it.
pub fn read_checked(bytes: &[u8]) -> Result<CheckedDump, String> {
    let layout = Layout::parse(bytes).map_err(|e| format!("not a safetensors file (truncated or corrupt): {e}"))?;
    let json = layout.metadata().get("kvproof").ok_or("not a kvproof state dump: no `kvproof` metadata key")?;
    let header: FileHeader = serde_json::from_str(json).map_err(|e| format!("metadata `kvproof`: {e}"))?;
    if header.format != FORMAT {
        return Err(format!("format `{}`, expected `{FORMAT}`", header.format));
    }
    let mut seen = std::collections::HashSet::new();
    for e in &header.tensors {
        if !seen.insert((e.layer, e.name.as_str())) {
            return Err(format!("metadata `kvproof`: tensor `layers.{}.{}` is listed twice", e.layer, e.name));
        }
        if e.rows == 0 {
            continue;
        }
        if e.rows.checked_mul(e.width).and_then(|n| n.checked_mul(4)).is_none() {
            return Err(format!(
                "metadata `kvproof`: tensor `{}`: {} rows of width {} overflow",
                e.key("rows"),
                e.rows,
                e.width
            ));
        }
        expect_array(&layout, &e.key("rows"), Dtype::F32, &[e.rows, e.width])?;
        expect_array(&layout, &e.key("positions"), Dtype::I64, &[e.rows])?;
        expect_array(&layout, &e.key("writers"), Dtype::I64, &[e.rows, 4])?;
    }
    let ids = layout.tensor("record.ids").ok_or("tensor `record.ids` is missing")?;
    let n_ids = ids.shape.first().copied().unwrap_or(0);
    expect_array(&layout, "record.ids", Dtype::I64, &[n_ids])?;
    Ok(CheckedDump { header, layout })
}

/// Array `name` of a checked dump, as little-endian chunks of `N` bytes (its dtype and size already checked).
fn values<'a, const N: usize>(dump: &CheckedDump, bytes: &'a [u8], name: &str) -> impl Iterator<Item = [u8; N]> + 'a {
    let span = dump.span(name).unwrap_or(0..0);
    bytes[span].chunks_exact(N).map(|b| {
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        a
    })
}

/// Decode a whole dump from its bytes. Every array is checked against the header first, so nothing is allocated
/// beyond what the file really holds.
pub fn from_bytes(bytes: &[u8]) -> Result<StateDump, String> {
    let checked = read_checked(bytes)?;
    let mut tensors = Vec::with_capacity(checked.header.tensors.len());
    for e in &checked.header.tensors {
        let data = values::<4>(&checked, bytes, &e.key("rows")).map(f32::from_le_bytes).collect();
        let positions = values::<8>(&checked, bytes, &e.key("positions")).map(i64::from_le_bytes).collect();
        let raw: Vec<i64> = values::<8>(&checked, bytes, &e.key("writers")).map(i64::from_le_bytes).collect();
        let writers = raw
            .chunks_exact(4)
            .map(decode_writer)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| format!("tensor `{}`: {m}", e.key("writers")))?;
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
    let ids = values::<8>(&checked, bytes, "record.ids")
        .map(i64::from_le_bytes)
        .map(|v| u32::try_from(v).map_err(|_| format!("tensor `record.ids`: id {v} out of range")))
        .collect::<Result<Vec<_>, _>>()?;
    let header = checked.header;
    Ok(StateDump {
        meta: header.meta,
        record: RecordDump { ids, tainted: header.record_tainted, capacity: header.record_capacity },
        tensors,
    })
}

/// `bytes` with its `kvproof` metadata document rewritten by `edit` and the data left as it was: how tests and
/// fuzz seeds make a dump whose header claims what its data does not hold. `None` if `bytes` is no dump.
pub fn rewrite_metadata(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Option<Vec<u8>> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let data = bytes.get(8usize.checked_add(n)?..)?;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).ok()?;
    let doc = header.get_mut("__metadata__")?.get_mut("kvproof")?;
    let mut meta: serde_json::Value = serde_json::from_str(doc.as_str()?).ok()?;
    edit(&mut meta);
    *doc = serde_json::Value::String(meta.to_string());
    let mut text = header.to_string().into_bytes();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    Some(out)
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
    fn claimed_sizes_are_checked_against_the_data_before_anything_is_allocated() {
        let bytes = to_bytes(&sample_dump()).expect("encode");
        let claim = |edit: &dyn Fn(&mut serde_json::Value)| {
            from_bytes(&rewrite_metadata(&bytes, edit).expect("a dump")).expect_err("a false claim")
        };
        // rows x width x 4 overflows
        let e = claim(&|m| m["tensors"][0]["rows"] = (1u64 << 62).into());
        assert!(e.contains("layers.0.k.rows") && e.contains("overflow"), "{e}");
        let e = claim(&|m| m["tensors"][0]["width"] = (1u64 << 62).into());
        assert!(e.contains("layers.0.k.rows") && e.contains("overflow"), "{e}");
        // a claim the arrays do not back
        let e = claim(&|m| m["tensors"][0]["rows"] = 1_000_000_000_000u64.into());
        assert!(e.contains("tensor `layers.0.k.rows`") && e.contains("the header says F32 [1000000000000, 32]"), "{e}");
        let e = claim(&|m| m["tensors"][1] = m["tensors"][0].clone());
        assert!(e.contains("listed twice"), "{e}");
    }

    #[test]
    fn safetensors_offsets_near_the_end_of_the_address_space_are_an_error() {
        let big = u64::MAX - 15;
        let header = format!(r#"{{"x":{{"dtype":"U8","shape":[{big}],"data_offsets":[0,{big}]}}}}   "#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        let e = from_bytes(&bytes).expect_err("offsets past the end");
        assert!(e.contains("tensor `x`"), "{e}");
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
        let dir = crate::scratch_dir::ScratchDir::new(&format!("dumpfile-{}", std::process::id()));
        let path = dir.join("cut.safetensors");
        std::fs::write(&path, &bytes[..bytes.len() - 9]).expect("write");
        let err = read_file(&path).expect_err("cut").to_string();
        assert!(err.contains("cut.safetensors"), "{err}");
    }
}
