//! GGUF files: the header, every metadata value, the tensor directory and the tensors' data, read through a
//! memory map.
//!
//! Layout (little-endian): `GGUF`, version (2 or 3), tensor count (u64), metadata count (u64); the metadata
//! pairs (key string, value type u32, value); the tensor directory (name, dimension count u32, dimensions u64
//! innermost first, type u32, offset u64 into the data section); padding to the alignment (`general.alignment`,
//! 32 by default); the data section. A string is a u64 length and its bytes; an array an element type u32, a
//! count u64 and the elements.
//!
//! Nothing the header claims is believed before it is checked against the file: every count, length and offset is
//! bounded by the bytes left before anything is allocated or indexed, each tensor's data must lie aligned inside
//! the data section and overlap no other tensor's, and its type must be one whose block size is known. A corrupt
//! or truncated file is an error naming the file and the key or tensor at fault, never a panic.

mod reader;
mod types;
mod value;
pub mod write;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use types::GgmlType;
pub use value::{Value, ValueType};

use crate::error::{EngineError, Result};
use crate::file_bytes::FileBytes;
use reader::Cursor;

/// The magic at the start of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The data section's alignment when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The file name of the SmolLM2 model the llama arch is tested with.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cache folder models are fetched into: `$KVPROOF_CACHE`, else `~/.cache/kvproof`.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("KVPROOF_CACHE") {
        Some(c) if !c.is_empty() => Some(PathBuf::from(c)),
        _ => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kvproof")),
    }
}

/// Where SmolLM2's GGUF is: `$KVPROOF_CACHE/models/` (or `~/.cache/kvproof/models/`). Missing: an error saying
/// how to fetch it.
pub fn smollm2_path() -> std::result::Result<PathBuf, String> {
    let dir = cache_dir().ok_or("neither KVPROOF_CACHE nor HOME is set")?;
    let path = dir.join("models").join(SMOLLM2_FILE);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: fetch it with `bash ci/fetch-smollm2.sh {}` (or set KVPROOF_CACHE to the cache holding it)",
            path.display(),
            dir.display()
        ))
    }
}

/// The models kvproof knows how to fetch, by the name a scenario's `engine.gguf` or `kvproof-engine --gguf` may
/// give instead of a path.
pub const KNOWN_MODELS: &[&str] = &["smollm2"];

/// The GGUF file `model` names: a known model's name (`smollm2`, found in the cache) or a path to a file. Missing:
/// an error saying how to get it.
pub fn resolve(model: &str) -> std::result::Result<PathBuf, String> {
    match model {
        "smollm2" => smollm2_path(),
        path if std::path::Path::new(path).is_file() => Ok(PathBuf::from(path)),
        path => Err(format!(
            "{path} not found: give a GGUF file or a known model ({}; `smollm2` is fetched with `bash \
             ci/fetch-smollm2.sh`)",
            KNOWN_MODELS.join(", ")
        )),
    }
}

/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// How deep arrays may nest (deeper: an error, not a stack overflow).
pub const MAX_NESTING: usize = 8;

/// One entry of the tensor directory, checked against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions innermost first (`dims[0]` is a row's length: `[in, out]` for a weight `W[out, in]`).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Elements in the tensor.
    pub fn elems(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape outermost first (`[out, in]` for a weight), as a checkpoint names it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A tensor's directory entry and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorData<'a> {
    pub info: &'a TensorInfo,
    pub bytes: &'a [u8],
}

/// A GGUF file: its metadata and tensor directory, and its bytes.
pub struct Gguf {
    path: PathBuf,
    bytes: FileBytes,
    version: u32,
    alignment: u64,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Map a file read-only and read its header.
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(path.into(), FileBytes::map(path)?)
    }

    /// A GGUF held in memory; `origin` names it in errors.
    pub fn from_bytes(origin: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(origin.into(), FileBytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: FileBytes) -> Result<Self> {
        let header = parse_header(bytes.as_slice())
            .map_err(|e| EngineError::Weights { path: path.clone(), message: e.to_string() })?;
        let Header { version, alignment, data_start, metadata, tensors } = header;
        let keys = metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let names = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf { path, bytes, version, alignment, data_start, metadata, keys, tensors, names })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts in the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// The file's bytes (for hashing).
    pub fn raw(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Every metadata pair, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    fn key_error(&self, key: &str, message: impl std::fmt::Display) -> EngineError {
        EngineError::Weights { path: self.path.clone(), message: format!("metadata key `{key}`: {message}") }
    }

    fn need(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| self.key_error(key, "missing"))
    }

    fn wrong(&self, key: &str, expected: &str, v: &Value) -> EngineError {
        self.key_error(key, format!("expected {expected}, found {}", v.describe()))
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "a string", v))
    }

    /// An integer value of any width, as `T`; `out_of_range` says why a value `T` cannot hold is refused.
    fn integer<T: TryFrom<i128>>(&self, key: &str, out_of_range: &str) -> Result<T> {
        let v = self.need(key)?;
        let i = v.as_int().ok_or_else(|| self.wrong(key, "an integer", v))?;
        T::try_from(i).map_err(|_| self.key_error(key, format!("{i} is {out_of_range}")))
    }

    /// A non-negative integer value of any width.
    pub fn uint(&self, key: &str) -> Result<u64> {
        self.integer(key, "negative")
    }

    /// A non-negative integer that must fit a `usize`.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let n = self.uint(key)?;
        usize::try_from(n).map_err(|_| self.key_error(key, format!("{n} is too large")))
    }

    /// A signed integer value of any width.
    pub fn int(&self, key: &str) -> Result<i64> {
        self.integer(key, "too large")
    }

    /// A float value (an integer is read as one).
    pub fn float(&self, key: &str) -> Result<f64> {
        let v = self.need(key)?;
        v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        let v = self.need(key)?;
        v.as_bool().ok_or_else(|| self.wrong(key, "a bool", v))
    }

    /// An array value: its element type and elements.
    pub fn array(&self, key: &str) -> Result<(ValueType, &[Value])> {
        let v = self.need(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, "an array", v))
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let (t, items) = self.array(key)?;
        if t != ValueType::String {
            return Err(self.key_error(key, format!("expected an array of string, found an array of {}", t.name())));
        }
        Ok(items.iter().filter_map(Value::as_str).collect())
    }

    /// An array of integers (any width), as i64.
    pub fn ints(&self, key: &str) -> Result<Vec<i64>> {
        let (t, items) = self.array(key)?;
        items.iter().map(|v| v.as_int().and_then(|i| i64::try_from(i).ok())).collect::<Option<Vec<_>>>().ok_or_else(
            || self.key_error(key, format!("expected an array of integers, found an array of {}", t.name())),
        )
    }

    /// An array of numbers, as f32.
    pub fn floats(&self, key: &str) -> Result<Vec<f32>> {
        let (t, items) = self.array(key)?;
        items
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.key_error(key, format!("expected an array of numbers, found an array of {}", t.name())))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.str("general.architecture")
    }

    /// The chat template (`tokenizer.chat_template`), if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.get("tokenizer.chat_template").and_then(Value::as_str)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.names.get(name).map(|&i| &self.tensors[i])
    }

    /// An error naming this file and tensor `name`.
    pub fn tensor_error(&self, name: &str, message: impl Into<String>) -> EngineError {
        EngineError::Tensor { path: self.path.clone(), tensor: name.into(), message: message.into() }
    }

    /// Tensor `name` and its bytes.
    pub fn tensor(&self, name: &str) -> Result<TensorData<'_>> {
        let info = self.tensor_info(name).ok_or_else(|| self.tensor_error(name, "missing"))?;
        // checked when the header was read: the range lies inside the file
        let start = self.data_start + info.offset as usize;
        let bytes = self
            .raw()
            .get(start..start + info.size as usize)
            .ok_or_else(|| self.tensor_error(name, "data out of file bounds"))?;
        Ok(TensorData { info, bytes })
    }
}

impl AsRef<[u8]> for Gguf {
    fn as_ref(&self) -> &[u8] {
        self.raw()
    }
}

/// What the header holds, checked.
struct Header {
    version: u32,
    alignment: u64,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
}

/// A header error: what was being read and what is wrong.
#[derive(Debug)]
struct HeaderError(String);

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn parse_header(bytes: &[u8]) -> std::result::Result<Header, HeaderError> {
    let mut c = Cursor::new(bytes);
    fn at(what: &'static str) -> impl Fn(String) -> HeaderError {
        move |e| HeaderError(format!("{what}: {e}"))
    }
    let magic = c.take(4).map_err(at("magic"))?;
    if magic != MAGIC {
        return Err(HeaderError(format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")")));
    }
    let version = c.u32().map_err(at("version"))?;
    if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
        return Err(HeaderError("a big-endian GGUF file (only little-endian files are read)".into()));
    }
    if version != 2 && version != 3 {
        return Err(HeaderError(format!("GGUF version {version} (versions 2 and 3 are read)")));
    }
    let n_tensors = c.u64().map_err(at("tensor count"))?;
    let n_kv = c.u64().map_err(at("metadata count"))?;
    // each pair takes at least a key length, a type and one byte; each tensor entry at least 24 bytes
    c.fits(n_kv, 13).map_err(at("metadata count"))?;
    c.fits(n_tensors, 24).map_err(at("tensor count"))?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = HashMap::new();
    for i in 0..n_kv {
        let key = c.string().map_err(|e| HeaderError(format!("metadata pair {i}: key: {e}")))?;
        let in_key = |e: String| HeaderError(format!("metadata key `{key}`: {e}"));
        let ty = c.u32().map_err(in_key)?;
        let ty = ValueType::from_id(ty).ok_or_else(|| in_key(format!("unknown value type {ty}")))?;
        let value = c.value(ty, 0).map_err(in_key)?;
        if seen.insert(key.clone(), i).is_some() {
            return Err(in_key("appears twice".into()));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(HeaderError(format!(
                "metadata key `general.alignment`: {} is not a power-of-two u32",
                match v {
                    Value::U32(a) => a.to_string(),
                    v => v.describe(),
                }
            )))
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut names = HashMap::new();
    for i in 0..n_tensors {
        let name = c.string().map_err(|e| HeaderError(format!("tensor {i}: name: {e}")))?;
        let in_tensor = |e: String| HeaderError(format!("tensor `{name}`: {e}"));
        let n_dims = c.u32().map_err(in_tensor)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(in_tensor(format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(c.u64().map_err(in_tensor)?);
        }
        let ty = c.u32().map_err(in_tensor)?;
        let ty = GgmlType::from_id(ty).ok_or_else(|| in_tensor(format!("unknown tensor type {ty}")))?;
        let offset = c.u64().map_err(in_tensor)?;
        let elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let elems = elems.ok_or_else(|| in_tensor(format!("dimensions {dims:?} overflow")))?;
        if dims.contains(&0) {
            return Err(in_tensor(format!("a zero dimension in {dims:?}")));
        }
        if !dims[0].is_multiple_of(ty.block_elems() as u64) {
            return Err(in_tensor(format!(
                "rows of {} elements are not whole {ty} blocks of {}",
                dims[0],
                ty.block_elems()
            )));
        }
        let size = ty.bytes_for(elems).ok_or_else(|| in_tensor(format!("size of {elems} {ty} elements overflows")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(in_tensor(format!("offset {offset} is not a multiple of the alignment {alignment}")));
        }
        if names.insert(name.clone(), i).is_some() {
            return Err(in_tensor("appears twice".into()));
        }
        tensors.push(TensorInfo { name, dims, ty, offset, size });
    }

    let data_start = c.pos().div_ceil(alignment as usize).checked_mul(alignment as usize);
    let data_start = data_start.ok_or_else(|| HeaderError("data section start overflows".into()))?;
    let data_len = (bytes.len() as u64).saturating_sub(data_start as u64);
    if let Some(t) = tensors.first().filter(|_| data_start > bytes.len()) {
        return Err(HeaderError(format!(
            "truncated: the data section (tensor `{}` first) would start at {data_start}, past the end ({} bytes)",
            t.name,
            bytes.len()
        )));
    }
    for t in &tensors {
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|e| e > data_len) {
            return Err(HeaderError(format!(
                "tensor `{}`: data {}..{} (+{} bytes) lies past the end of the data section ({data_len} bytes)",
                t.name,
                t.offset,
                t.offset.saturating_add(t.size),
                t.size
            )));
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(HeaderError(format!(
                "tensor `{}`: data {}..{} overlaps tensor `{}` at {}",
                w[0].name,
                w[0].offset,
                w[0].offset + w[0].size,
                w[1].name,
                w[1].offset
            )));
        }
    }
    Ok(Header { version, alignment, data_start, metadata, tensors })
}

/// Fuzz entry: read `data` as a GGUF file: the header, every metadata value through the typed getters, and
/// every tensor of the directory.
pub fn fuzz_gguf(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes("<fuzz>", data.to_vec()) else { return };
    for (key, value) in g.metadata() {
        let _ = (value.describe(), g.str(key), g.usize(key), g.int(key), g.float(key), g.bool(key));
        let _ = (g.strings(key), g.ints(key), g.floats(key));
    }
    let _ = (g.architecture(), g.chat_template());
    for t in g.tensors() {
        let _ = (t.elems(), t.shape(), g.tensor(&t.name).map(|d| d.bytes.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::write::Builder;
    use super::*;

    #[test]
    fn a_built_file_reads_back() {
        let mut b = Builder::new();
        b.kv("general.architecture", Value::String("llama".into()));
        b.kv("n", Value::U32(7));
        b.kv("x", Value::F32(1.5));
        b.kv("neg", Value::I64(-3));
        b.kv("words", Value::Array(ValueType::String, vec![Value::String("a".into()), Value::String("bc".into())]));
        b.tensor("t", &[32, 2], GgmlType::Q8_0, vec![0u8; 68]);
        b.tensor("f", &[3], GgmlType::F32, [1.0f32, 2.0, 3.0].iter().flat_map(|f| f.to_le_bytes()).collect());
        let g = Gguf::from_bytes("mem", b.finish()).expect("valid");
        assert_eq!(g.architecture().expect("arch"), "llama");
        assert_eq!(g.uint("n").expect("n"), 7);
        assert_eq!(g.float("x").expect("x"), 1.5);
        assert_eq!(g.int("neg").expect("neg"), -3);
        assert!(g.uint("neg").is_err());
        assert_eq!(g.strings("words").expect("words"), ["a", "bc"]);
        let t = g.tensor("t").expect("t");
        assert_eq!((t.info.shape(), t.bytes.len()), (vec![2, 32], 68));
        let f = g.tensor("f").expect("f");
        assert_eq!(f.bytes.len(), 12);
        assert_eq!(g.data_start() % 32, 0);
        let e = g.str("n").expect_err("not a string").to_string();
        assert!(e.contains("mem") && e.contains("`n`") && e.contains("expected a string"), "{e}");
        let e = g.tensor("nope").expect_err("missing").to_string();
        assert!(e.contains("`nope`"), "{e}");
    }
}
