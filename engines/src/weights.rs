//! `model.safetensors`, read through a memory map (or held in memory for on-the-fly fixtures).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::Dtype;

use crate::error::{EngineError, Result};
use crate::file_bytes::FileBytes;
use crate::safetensors_layout::Layout;

/// A safetensors file's tensors, by name.
pub struct Weights {
    path: PathBuf,
    bytes: FileBytes,
    layout: Layout,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights").field("path", &self.path).finish()
    }
}

impl Weights {
    /// Map a file read-only.
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(path.into(), FileBytes::map(path)?)
    }

    /// Weights held in memory; `origin` names them in errors.
    pub fn from_bytes(origin: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(origin.into(), FileBytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: FileBytes) -> Result<Self> {
        let layout = Layout::parse(bytes.as_slice()).map_err(|e| EngineError::Weights {
            path: path.clone(),
            message: format!("not a safetensors file: {e}"),
        })?;
        Ok(Weights { path, bytes, layout })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes (for hashing).
    pub fn raw(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Free-form metadata stored in the header.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.layout.metadata().clone()
    }

    /// Tensor `name` as f32, checked against `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let err = |message: String| EngineError::Tensor { path: self.path.clone(), tensor: name.into(), message };
        let info = self.layout.tensor(name).ok_or_else(|| err("missing".into()))?;
        if info.dtype != Dtype::F32 {
            return Err(err(format!("dtype {:?}, expected F32", info.dtype)));
        }
        if info.shape != shape {
            return Err(err(format!("shape {:?}, expected {:?}", info.shape, shape)));
        }
        // the layout checked the range against the file and the shape's size against the range
        let data =
            self.bytes.as_slice().get(info.bytes.clone()).ok_or_else(|| err("data out of file bounds".into()))?;
        Ok(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }
}

/// Fuzz entry: read `data` as a safetensors weight file and every tensor it lists as f32 of its own shape.
pub fn fuzz_safetensors(data: &[u8]) {
    let Ok(w) = Weights::from_bytes("<fuzz>", data.to_vec()) else { return };
    let _ = w.metadata();
    for (name, span) in w.layout.tensors() {
        let _ = w.tensor(name, &span.shape);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors_layout::file;

    #[test]
    fn claimed_offsets_and_shapes_are_checked_against_the_file() {
        // offsets near usize::MAX (the safetensors crate's own reader overflows adding them)
        let big = u64::MAX - 15;
        let h = format!(r#"{{"w":{{"dtype":"U8","shape":[{big}],"data_offsets":[0,{big}]}}}}"#);
        let e = Weights::from_bytes("model.safetensors", file(&h, &[])).expect_err("past the end").to_string();
        assert!(e.contains("model.safetensors") && e.contains("tensor `w`"), "{e}");
        // a shape of 2^62 x 4 floats behind 16 bytes
        let h = r#"{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}"#;
        let e = Weights::from_bytes("model.safetensors", file(h, &[0; 16])).expect_err("overflow").to_string();
        assert!(e.contains("model.safetensors") && e.contains("tensor `w`"), "{e}");
        // a valid file: the tensor reads back, a wrong shape is named
        let h = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let w = Weights::from_bytes("model.safetensors", file(h, &[0, 0, 128, 63, 0, 0, 0, 64])).expect("valid");
        assert_eq!(w.tensor("w", &[2]).expect("w"), vec![1.0, 2.0]);
        let e = w.tensor("w", &[3]).expect_err("shape").to_string();
        assert!(e.contains("tensor `w`") && e.contains("expected [3]"), "{e}");
    }
}
