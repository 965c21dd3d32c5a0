//! A model file's bytes: memory-mapped from disk, or held in memory (fixtures generated on the fly). The one
//! place a model file is mapped, for the safetensors and the GGUF readers alike.

use std::path::Path;

use crate::error::{EngineError, Result};

pub(crate) enum FileBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Map `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| EngineError::Io { path: path.into(), source })?;
        // Safety: the map is read-only and private to this process. kvproof never writes a model file while an
        // engine has it open; a file truncated underneath us by another process is outside what we defend.
        #[allow(unsafe_code)]
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|source| EngineError::Io { path: path.into(), source })?;
        Ok(FileBytes::Mapped(map))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}
