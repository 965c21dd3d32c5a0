//! The GGUF reader against hand-built corrupt files: every claimed count, length, offset and type is checked
//! against the file before it is believed, and a bad file is an error naming the file and the key or tensor at
//! fault, never a panic or an allocation the header merely claims. Then a property loop over truncations and
//! random byte flips of a small valid file.

use kvproof_engines::gguf::write::Builder;
use kvproof_engines::gguf::{GgmlType, Gguf, Value, ValueType};
use proptest::prelude::*;

/// A GGUF header written field by field, so any field can be made wrong.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A tensor directory entry: name, dims innermost first, type id, offset.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        dims.iter().for_each(|&d| {
            self.u64(d);
        });
        self.u32(ty).u64(offset)
    }
    /// Pad to 32 and append `n` data bytes.
    fn data(&mut self, n: usize) -> Vec<u8> {
        let mut b = self.0.clone();
        b.resize(b.len().div_ceil(32) * 32 + n, 0);
        b
    }
}

fn err(bytes: Vec<u8>) -> String {
    match Gguf::from_bytes("corrupt.gguf", bytes) {
        Ok(_) => panic!("a corrupt file was accepted"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("corrupt.gguf"), "the error names the file: {e}");
            e
        }
    }
}

fn expect(bytes: Vec<u8>, parts: &[&str]) {
    let e = err(bytes);
    for p in parts {
        assert!(e.contains(p), "`{e}` should mention `{p}`");
    }
}

const F32: u32 = 0;

#[test]
fn bad_magic_version_and_byte_order() {
    expect(b"GGML\x03\0\0\0".to_vec(), &["not a GGUF file"]);
    expect(Raw::new(1, 0, 0).0, &["version 1"]);
    expect(Raw::new(3u32.swap_bytes(), 0, 0).0, &["big-endian"]);
    expect(b"GG".to_vec(), &["magic", "truncated"]);
    expect(Raw::new(3, 0, 0).0[..20].to_vec(), &["metadata count", "truncated"]);
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    expect(Raw::new(3, u64::MAX, 0).0, &["tensor count", "claimed"]);
    expect(Raw::new(3, 0, 1 << 60).0, &["metadata count", "claimed"]);
    // a key whose length runs past the end
    let mut r = Raw::new(3, 0, 1);
    r.u64(u64::MAX / 2).u64(0);
    expect(r.0, &["metadata pair 0", "string of"]);
    // an array claiming 2^60 u64 elements
    let mut r = Raw::new(3, 0, 1);
    r.str("tokenizer.ggml.tokens").u32(ValueType::Array.id()).u32(ValueType::U64.id()).u64(1 << 60);
    expect(r.0, &["`tokenizer.ggml.tokens`", "claimed"]);
    // a string value whose length runs past the end
    let mut r = Raw::new(3, 0, 1);
    r.str("general.name").u32(ValueType::String.id()).u64(1 << 40);
    expect(r.0, &["`general.name`", "string of"]);
}

#[test]
fn unknown_types_are_errors() {
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(99).u32(0);
    expect(r.0, &["`k`", "unknown value type 99"]);
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(ValueType::Array.id()).u32(77).u64(1);
    expect(r.0, &["`k`", "unknown value type 77"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("blk.0.attn_q.weight", &[32], 4, 0);
    expect(r.data(32), &["`blk.0.attn_q.weight`", "unknown tensor type 4"]);
    let mut r = Raw::new(3, 0, 1);
    r.str("b").u32(ValueType::Bool.id()).0.push(2);
    expect(r.0, &["`b`", "bool byte 2"]);
}

#[test]
fn arrays_nested_too_deep_are_errors() {
    let mut r = Raw::new(3, 0, 1);
    r.str("deep").u32(ValueType::Array.id());
    for _ in 0..20 {
        r.u32(ValueType::Array.id()).u64(1);
    }
    expect(r.0, &["`deep`", "nested deeper"]);
}

#[test]
fn tensor_data_past_the_end_is_an_error() {
    let mut r = Raw::new(3, 1, 0);
    r.tensor("output.weight", &[8], F32, 64);
    expect(r.data(32), &["`output.weight`", "past the end"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[8], F32, u64::MAX - 31);
    expect(r.data(32), &["`t`"]);
    // the dimensions' product overflows
    let mut r = Raw::new(3, 1, 0);
    r.tensor("big", &[1 << 40, 1 << 40], F32, 0);
    expect(r.data(32), &["`big`", "overflow"]);
    // the size (elements times bytes) overflows
    let mut r = Raw::new(3, 1, 0);
    r.tensor("big", &[1 << 62], F32, 0);
    expect(r.data(32), &["`big`"]);
    // no data section at all
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[8], F32, 0);
    expect(r.0.clone(), &["`t`"]);
}

#[test]
fn overlapping_tensors_are_an_error() {
    let mut r = Raw::new(3, 2, 0);
    r.tensor("a", &[16], F32, 0).tensor("b", &[8], F32, 32);
    expect(r.data(96), &["`a`", "overlaps", "`b`"]);
}

#[test]
fn misalignment_is_an_error() {
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[8], F32, 4);
    expect(r.data(64), &["`t`", "alignment 32"]);
    let mut r = Raw::new(3, 0, 1);
    r.str("general.alignment").u32(ValueType::U32.id()).u32(3);
    expect(r.0, &["general.alignment", "power-of-two"]);
    let mut r = Raw::new(3, 0, 1);
    r.str("general.alignment").u32(ValueType::U32.id()).u32(0);
    expect(r.0, &["general.alignment"]);
    let mut r = Raw::new(3, 0, 1);
    r.str("general.alignment").u32(ValueType::String.id()).str("x");
    expect(r.0, &["general.alignment"]);
}

#[test]
fn bad_shapes_and_duplicates_are_errors() {
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[], F32, 0);
    expect(r.data(32), &["`t`", "0 dimensions"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], F32, 0);
    expect(r.data(32), &["`t`", "5 dimensions"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[8, 0], F32, 0);
    expect(r.data(32), &["`t`", "zero dimension"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("q", &[16], GgmlType::Q8_0.id(), 0);
    expect(r.data(64), &["`q`", "blocks"]);
    let mut r = Raw::new(3, 2, 0);
    r.tensor("t", &[8], F32, 0).tensor("t", &[8], F32, 32);
    expect(r.data(64), &["`t`", "twice"]);
    let mut r = Raw::new(3, 0, 2);
    r.str("k").u32(ValueType::U8.id()).0.push(1);
    r.str("k").u32(ValueType::U8.id()).0.push(1);
    expect(r.0, &["`k`", "twice"]);
    let mut r = Raw::new(3, 0, 1);
    r.u64(2).0.extend_from_slice(&[0xff, 0xfe]);
    r.u32(ValueType::U64.id()).u64(0);
    expect(r.0, &["metadata pair 0", "UTF-8"]);
}

#[test]
fn every_value_type_reads_back() {
    let values = [
        Value::U8(1),
        Value::I8(-2),
        Value::U16(3),
        Value::I16(-4),
        Value::U32(5),
        Value::I32(-6),
        Value::F32(7.5),
        Value::Bool(true),
        Value::String("eight".into()),
        Value::U64(9),
        Value::I64(-10),
        Value::F64(11.25),
        Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-1)]),
        Value::Array(ValueType::Array, vec![Value::Array(ValueType::U8, vec![Value::U8(1)])]),
        Value::Array(ValueType::String, vec![]),
    ];
    let mut b = Builder::new();
    for (i, v) in values.iter().enumerate() {
        b.kv(&format!("k{i}"), v.clone());
    }
    let g = Gguf::from_bytes("all.gguf", b.finish()).expect("valid");
    for (i, v) in values.iter().enumerate() {
        assert_eq!(g.get(&format!("k{i}")), Some(v));
    }
    assert_eq!(g.ints("k12").expect("ints"), [1, -1]);
    assert_eq!(g.float("k6").expect("float"), 7.5);
    assert!(g.bool("k7").expect("bool"));
    let e = g.strings("k12").expect_err("not strings").to_string();
    assert!(e.contains("`k12`") && e.contains("all.gguf"), "{e}");
    let e = g.uint("missing").expect_err("missing").to_string();
    assert!(e.contains("`missing`") && e.contains("missing"), "{e}");
}

#[test]
fn a_custom_alignment_is_honoured() {
    let mut b = Builder::new();
    b.alignment(64);
    b.f32_tensor("a", &[3], &[1.0, 2.0, 3.0]);
    b.f32_tensor("b", &[2, 2], &[4.0, 5.0, 6.0, 7.0]);
    let g = Gguf::from_bytes("a64.gguf", b.finish()).expect("valid");
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    let t = g.tensor("b").expect("b");
    assert_eq!(t.info.offset, 64);
    assert_eq!(t.info.shape(), [2, 2]);
    let floats: Vec<f32> = t.bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect();
    assert_eq!(floats, [4.0, 5.0, 6.0, 7.0]);
}

/// A small valid file with metadata of several types and tensors of three storage types.
fn small_file() -> Vec<u8> {
    let mut b = Builder::new();
    b.kv("general.architecture", Value::String("llama".into()));
    b.kv("llama.block_count", Value::U32(2));
    b.kv(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, ["a", "b", "<s>"].map(|s| Value::String(s.into())).to_vec()),
    );
    b.kv("tokenizer.ggml.scores", Value::Array(ValueType::F32, vec![Value::F32(0.0); 3]));
    b.kv("x", Value::F64(0.5));
    b.tensor("q41", &[32, 2], GgmlType::Q4_1, vec![7u8; 40]);
    b.tensor("q80", &[64], GgmlType::Q8_0, vec![9u8; 68]);
    b.f32_tensor("f", &[4], &[1.0, 2.0, 3.0, 4.0]);
    b.finish()
}

#[test]
fn every_truncation_is_an_error() {
    let full = small_file();
    let g = Gguf::from_bytes("small.gguf", full.clone()).expect("valid");
    let end_of_data = g.tensors().iter().map(|t| g.data_start() + (t.offset + t.size) as usize).max().expect("tensors");
    for len in 0..end_of_data {
        let e = err(full[..len].to_vec());
        assert!(!e.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte flips: the reader never panics; an accepted file's tensors all lie inside it and their
    /// bytes are readable; a refused file's error names it.
    #[test]
    fn random_flips_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = small_file();
        for (at, x) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x | 1;
        }
        let len = bytes.len();
        match Gguf::from_bytes("flipped.gguf", bytes) {
            Ok(g) => {
                for t in g.tensors() {
                    let d = g.tensor(&t.name).expect("a listed tensor reads");
                    prop_assert!(g.data_start() + t.offset as usize + d.bytes.len() <= len);
                    prop_assert_eq!(d.bytes.len() as u64, t.size);
                }
                for (k, _) in g.metadata() {
                    prop_assert!(g.get(k).is_some());
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("flipped.gguf")),
        }
    }
}

/// The SmolLM2 GGUF the llama arch serves (fetched by `bash ci/fetch-smollm2.sh`; `.ci/run` runs it).
#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn the_smollm2_file_reads() {
    let path = kvproof_engines::gguf::smollm2_path().unwrap_or_else(|e| panic!("{e}"));
    let g = Gguf::open(&path).expect("the model reads");
    assert_eq!(g.architecture().expect("arch"), "llama");
    assert_eq!(g.uint("llama.block_count").expect("layers"), 30);
    assert_eq!(g.uint("llama.embedding_length").expect("hidden"), 576);
    assert_eq!(g.uint("llama.attention.head_count").expect("heads"), 9);
    assert_eq!(g.uint("llama.attention.head_count_kv").expect("kv heads"), 3);
    let tokens = g.strings("tokenizer.ggml.tokens").expect("vocabulary");
    assert_eq!(tokens.len(), 49152);
    assert!(g.chat_template().is_some_and(|t| t.contains("im_start")));
    let emb = g.tensor("token_embd.weight").expect("embedding");
    assert_eq!(emb.info.shape(), [49152, 576]);
    for t in g.tensors() {
        assert!(matches!(t.ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::F32), "{}: {}", t.name, t.ty);
    }
}
