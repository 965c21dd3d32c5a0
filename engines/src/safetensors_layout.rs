//! A safetensors file's header, read and checked against the file's real length: the one place kvproof reads a
//! safetensors layout (model weights, state dumps). The `safetensors` crate writes the files; its reader adds
//! the claimed offsets without checking for overflow (a header claiming offsets near `usize::MAX` panics it), so
//! every length, shape and offset is checked here with checked arithmetic before any slice is taken.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use safetensors::tensor::Dtype;
use serde::Deserialize;

/// The largest header read: the `safetensors` crate's own limit.
pub const MAX_HEADER_BYTES: usize = 100_000_000;

/// Why a safetensors header cannot be read; each names the tensor or field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{0} bytes: too short for the 8-byte header length")]
    TooShort(usize),
    #[error("header length {claimed} exceeds the {left} bytes after it (truncated or corrupt)")]
    HeaderPastEnd { claimed: u64, left: usize },
    #[error("header length {0} exceeds the limit of {MAX_HEADER_BYTES} bytes")]
    HeaderTooLarge(u64),
    #[error("header is not valid JSON for a safetensors file: {0}")]
    HeaderJson(String),
    #[error("the tensors' data ends at byte {end}, the file at {file_len} (truncated or trailing bytes)")]
    DataLength { end: usize, file_len: usize },
    #[error("tensor `{tensor}`: {message}")]
    Tensor { tensor: String, message: String },
}

/// One tensor's dtype, shape and the byte range of its data in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpan {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file, inside it.
    pub bytes: Range<usize>,
}

/// The checked header of a safetensors file.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    tensors: HashMap<String, TensorSpan>,
    metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

impl Layout {
    /// Read the header of the file held in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Layout, LayoutError> {
        let len_field: [u8; 8] =
            bytes.get(..8).and_then(|b| b.try_into().ok()).ok_or(LayoutError::TooShort(bytes.len()))?;
        let claimed = u64::from_le_bytes(len_field);
        let left = bytes.len() - 8;
        if claimed > left as u64 {
            return Err(LayoutError::HeaderPastEnd { claimed, left });
        }
        if claimed > MAX_HEADER_BYTES as u64 {
            return Err(LayoutError::HeaderTooLarge(claimed));
        }
        // claimed <= left, so it fits a usize and the header lies inside the file
        let data_start = 8 + claimed as usize;
        let header = std::str::from_utf8(&bytes[8..data_start])
            .map_err(|e| LayoutError::HeaderJson(format!("not UTF-8: {e}")))?;
        let raw: HashMap<String, serde_json::Value> =
            serde_json::from_str(header).map_err(|e| LayoutError::HeaderJson(e.to_string()))?;
        let data_len = bytes.len() - data_start;
        let mut layout = Layout::default();
        for (name, value) in raw {
            if name == "__metadata__" {
                layout.metadata = serde_json::from_value(value)
                    .map_err(|e| LayoutError::HeaderJson(format!("`__metadata__`: {e}")))?;
                continue;
            }
            let span = Self::span(&name, value, data_start, data_len)?;
            layout.tensors.insert(name, span);
        }
        layout.check_packed(data_start, bytes.len())?;
        Ok(layout)
    }

    /// A tensor's entry checked: its shape's byte size equals its offsets' span, which lies in the data section.
    fn span(
        name: &str,
        value: serde_json::Value,
        data_start: usize,
        data_len: usize,
    ) -> Result<TensorSpan, LayoutError> {
        let bad = |message: String| LayoutError::Tensor { tensor: name.to_string(), message };
        let raw: RawTensor = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        let (start, end) = raw.data_offsets;
        if start > end || end > data_len {
            return Err(bad(format!(
                "data offsets [{start}, {end}] do not lie inside the {data_len}-byte data section (truncated?)"
            )));
        }
        let size = raw.shape.iter().try_fold(raw.dtype.size(), |n, &d| n.checked_mul(d));
        if size != Some(end - start) {
            return Err(bad(format!(
                "{:?} {:?} does not take the {} bytes of its data offsets",
                raw.dtype,
                raw.shape,
                end - start
            )));
        }
        Ok(TensorSpan { dtype: raw.dtype, shape: raw.shape, bytes: data_start + start..data_start + end })
    }

    /// As the format requires: the tensors' data back to back, from the end of the header to the end of the file.
    fn check_packed(&self, data_start: usize, file_len: usize) -> Result<(), LayoutError> {
        let mut spans: Vec<(&String, &Range<usize>)> = self.tensors.iter().map(|(n, t)| (n, &t.bytes)).collect();
        spans.sort_by_key(|(_, r)| (r.start, r.end));
        let mut at = data_start;
        for (name, r) in spans {
            if r.start != at {
                let message = format!("data starts at byte {}, expected {at} (a gap or an overlap)", r.start);
                return Err(LayoutError::Tensor { tensor: name.clone(), message });
            }
            at = r.end;
        }
        if at != file_len {
            return Err(LayoutError::DataLength { end: at, file_len });
        }
        Ok(())
    }

    /// Every tensor, in no particular order.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorSpan)> {
        self.tensors.iter().map(|(name, span)| (name.as_str(), span))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorSpan> {
        self.tensors.get(name)
    }

    /// Free-form string metadata (`__metadata__`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

/// A safetensors file from a header written by hand (tests that claim what no serializer would write).
#[cfg(test)]
pub(crate) fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back() {
        let data = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let view = safetensors::tensor::TensorView::new(Dtype::F32, vec![2], &data).expect("view");
        let meta = Some(HashMap::from([("k".to_string(), "v".to_string())]));
        let bytes = safetensors::tensor::serialize([("t", view)], &meta).expect("serialize");
        let l = Layout::parse(&bytes).expect("parse");
        let t = l.tensor("t").expect("t");
        assert_eq!((t.dtype, &t.shape[..], &bytes[t.bytes.clone()]), (Dtype::F32, &[2][..], &data[..]));
        assert_eq!(l.metadata().get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn claimed_sizes_are_checked_against_the_file_not_believed() {
        // offsets near usize::MAX: the safetensors crate's reader overflows adding them
        let big = u64::MAX - 15;
        let h = format!(r#"{{"x":{{"dtype":"U8","shape":[{big}],"data_offsets":[0,{big}]}}}}"#);
        let e = Layout::parse(&file(&h, &[])).expect_err("past the end");
        assert!(e.to_string().contains("tensor `x`") && e.to_string().contains("data section"), "{e}");
        // a shape whose byte size overflows
        let h = r#"{"x":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,4]}}"#;
        let e = Layout::parse(&file(h, &[0; 4])).expect_err("overflow");
        assert!(e.to_string().contains("does not take the 4 bytes"), "{e}");
        // a header length past the end
        let mut b = file("{}", &[]);
        b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(Layout::parse(&b), Err(LayoutError::HeaderPastEnd { .. })));
        assert_eq!(Layout::parse(&[0; 5]).expect_err("short"), LayoutError::TooShort(5));
        let e = Layout::parse(&file(r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"z":1}}"#, &[0; 4]));
        assert!(e.is_err());
        // trailing bytes and gaps, which the format forbids
        let h = r#"{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
        assert!(Layout::parse(&file(h, &[1, 2])).is_ok());
        assert!(Layout::parse(&file(h, &[1, 2, 3])).expect_err("trailing").to_string().contains("trailing"));
        let h = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(Layout::parse(&file(h, &[1, 2])).expect_err("gap").to_string().contains("tensor `x`"));
    }
}
