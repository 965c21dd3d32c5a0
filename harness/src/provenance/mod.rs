//! KV provenance: state dumps read through a memory map (`mapped`), compared by the one row matcher
//! (`kvproof_engines::state_diff`: rows matched by the absolute position they hold, never by slot index), the diff
//! rendered as a table, CSV and JSON (`render`), a failing comparison's dumps and diff kept in a run folder
//! (`capture`), the diff's throughput against a plain byte comparison (`bench`), and the fuzz entries (`fuzz`).

pub mod bench;
pub mod capture;
pub mod fuzz;
pub mod mapped;
pub mod render;

pub use mapped::MappedDump;

use kvproof_engines::state_diff::{self, Incomparable, StateDiff};

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

impl From<Incomparable> for ProvenanceError {
    fn from(e: Incomparable) -> Self {
        ProvenanceError::Incomparable(e.to_string())
    }
}

/// Diff two dump files.
pub fn diff_files(a: &std::path::Path, b: &std::path::Path) -> Result<StateDiff, ProvenanceError> {
    let (a, b) = (MappedDump::open(a)?, MappedDump::open(b)?);
    Ok(state_diff::compare(&a, &b)?)
}
