//! Writing GGUF files: what the tests build their valid (and, by editing the bytes, corrupt) files with, and
//! what the synthetic llama fixtures are written as.

use super::types::GgmlType;
use super::value::Value;
use super::DEFAULT_ALIGNMENT;

/// A GGUF file under construction: metadata pairs and tensors, written in the order given.
#[derive(Debug, Default)]
pub struct Builder {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: Option<u32>,
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(t, items) => {
            out.extend_from_slice(&t.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl Builder {
    pub fn new() -> Self {
        Builder::default()
    }

    /// Set `general.alignment` (written as a metadata pair too).
    pub fn alignment(&mut self, a: u32) -> &mut Self {
        self.alignment = Some(a);
        self.kv("general.alignment", Value::U32(a))
    }

    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.kv.push((key.into(), value));
        self
    }

    /// A tensor with dimensions innermost first and its raw bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }

    /// An F32 tensor of shape `shape` (outermost first, as a checkpoint names it).
    pub fn f32_tensor(&mut self, name: &str, shape: &[usize], data: &[f32]) -> &mut Self {
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensor(name, &dims, GgmlType::F32, data.iter().flat_map(|f| f.to_le_bytes()).collect())
    }

    /// The file's bytes, version 3.
    pub fn finish(&self) -> Vec<u8> {
        let align = u64::from(self.alignment.unwrap_or(DEFAULT_ALIGNMENT as u32)).max(1);
        let mut out = Vec::new();
        out.extend_from_slice(super::MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_string(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_string(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(align) * align;
        }
        let pad = |out: &mut Vec<u8>| {
            let n = (out.len() as u64).div_ceil(align) * align;
            out.resize(n as usize, 0);
        };
        pad(&mut out);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            pad(&mut out);
        }
        out
    }
}
