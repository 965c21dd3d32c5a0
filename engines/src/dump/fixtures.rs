//! Tiny hand-built dumps for tests of the row matcher and the checks built on it (here and in the harness).
//! Not part of the dump format: every tensor is named "k", one float wide, and written by request 1's first
//! prefill chunk; the meta is an 8-position inkling slot.

use super::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};

/// Request `request`'s first prefill chunk, of 4 rows.
pub fn writer(request: u64) -> Option<Writer> {
    Some(Writer { request, kind: WriterKind::Prefill { chunk: 0, chunk_rows: 4 } })
}

/// Tensor "k" of `layer`: one float a row, `values[i]` at row `i` holding `positions[i]` (-1: empty, no writer).
pub fn tensor(layer: usize, kind: CacheKind, positions: &[i64], values: &[f32]) -> DumpTensor {
    DumpTensor {
        layer,
        name: "k".into(),
        kind,
        width: 1,
        data: values.to_vec(),
        positions: positions.to_vec(),
        writers: positions.iter().map(|&p| if p >= 0 { writer(1) } else { None }).collect(),
    }
}

/// A state covering `len` positions, its record holding `record` (not tainted).
pub fn dump(len: usize, record: &[u32], tensors: Vec<DumpTensor>) -> StateDump {
    StateDump {
        meta: DumpMeta {
            arch: "inkling".into(),
            preset: None,
            model_hash: String::new(),
            fault: None,
            slot: 0,
            len,
            capacity: 8,
        },
        record: RecordDump { ids: record.to_vec(), tainted: false, capacity: 8 },
        tensors,
    }
}
