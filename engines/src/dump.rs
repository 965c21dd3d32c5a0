//! A slot's state, row by row, with the writer of every row: what warm/cold comparisons and provenance read.

use serde::{Deserialize, Serialize};

#[doc(hidden)]
pub mod fixtures;

/// What wrote a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WriterKind {
    /// Written by prefill chunk `chunk` (0-based within its request) of `chunk_rows` rows.
    Prefill { chunk: u32, chunk_rows: u32 },
    /// Written by decode step `step` (0-based within its request).
    Decode { step: u32 },
    /// Copied from another slot's row.
    Copied { from_slot: u32 },
}

/// The request that wrote a row, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub request: u64,
    #[serde(flatten)]
    pub kind: WriterKind,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            WriterKind::Prefill { chunk, chunk_rows } => {
                write!(f, "prefill (req {}, chunk {chunk} of {chunk_rows} rows)", self.request)
            }
            WriterKind::Decode { step } => write!(f, "decode (req {}, step {step})", self.request),
            WriterKind::Copied { from_slot } => write!(f, "copy (req {}, from slot {from_slot})", self.request),
        }
    }
}

/// The kind of a cached tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// One row per position, addressed by position.
    Full,
    /// `window` rows, position t at row t % window.
    Ring,
    /// MLA latent rows (kv_lora + rope) per position.
    Latent,
    /// Compressor output rows (one per `ratio` positions).
    Compressed,
    /// A whole recurrent state (one "row" holding the matrix), valid after the last fed position.
    Recurrent,
    /// A short-convolution window (the last few inputs), valid after the last fed position.
    Conv,
}

/// One cached tensor of one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpTensor {
    pub layer: usize,
    /// e.g. "k", "v", "latent", "conv_k".
    pub name: String,
    pub kind: CacheKind,
    /// Floats per row.
    pub width: usize,
    /// Row-major `rows x width`.
    pub data: Vec<f32>,
    /// The absolute position each row holds (-1: empty). For recurrent/conv: the last position folded in.
    pub positions: Vec<i64>,
    pub writers: Vec<Option<Writer>>,
}

impl DumpTensor {
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// Row index holding absolute position `pos`, if any.
    pub fn row_of_position(&self, pos: i64) -> Option<usize> {
        self.positions.iter().position(|&p| p == pos)
    }
}

/// The record as dumped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordDump {
    pub ids: Vec<u32>,
    pub tainted: bool,
    pub capacity: usize,
}

/// Who and what a dump describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpMeta {
    pub arch: String,
    pub preset: Option<String>,
    pub model_hash: String,
    pub fault: Option<String>,
    pub slot: usize,
    /// Positions the state covers (0..len).
    pub len: usize,
    pub capacity: usize,
}

/// A slot's whole state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateDump {
    pub meta: DumpMeta,
    pub record: RecordDump,
    pub tensors: Vec<DumpTensor>,
}

impl StateDump {
    /// The dump of one slot of the engine `info` describes: `len` positions covered, `capacity` allocated.
    pub fn of_slot(
        info: crate::engine::EngineInfo,
        slot: usize,
        (len, capacity): (usize, usize),
        record: &crate::prefix::PrefixRecord,
        tensors: Vec<DumpTensor>,
    ) -> Self {
        StateDump {
            meta: DumpMeta {
                arch: info.arch,
                preset: info.preset,
                model_hash: info.model_hash,
                fault: info.fault,
                slot,
                len,
                capacity,
            },
            record: RecordDump {
                ids: record.ids().to_vec(),
                tainted: record.is_tainted(),
                capacity: record.capacity(),
            },
            tensors,
        }
    }
}

pub use crate::dump_file::{read_file, write_file};
