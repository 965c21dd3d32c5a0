//! KV provenance: reading state dumps through a memory map, diffing them row by row (rows matched by the absolute
//! position they hold, never by slot index), and saying which layer, which position and which writer diverged.

pub mod bench;
pub mod capture;
pub mod diff;
pub mod mapped;
pub mod render;

pub use capture::ProvenanceRef;
pub use diff::{diff, DumpDiff, LayerDiff, TensorDiff};
pub use mapped::MappedDump;

use std::path::PathBuf;

/// Why two dumps could not be read or compared.
#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    BadDump { path: PathBuf, message: String },
    #[error("dumps are not comparable: {0}")]
    Incomparable(String),
    #[error("{path}: {message}")]
    Write { path: PathBuf, message: String },
}
