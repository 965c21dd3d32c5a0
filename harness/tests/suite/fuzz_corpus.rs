//! The seed corpora of the file readers' fuzz targets (dump, diff, GGUF, safetensors) in fuzz/corpus/, generated
//! by the real writers. The mutation runs over them are
//! harness/tests/fuzz_bounded.rs (bounded, every `cargo test`) and ci/fuzz.sh (libFuzzer, long).
//!
//! `cargo test -p kvproof --test suite -- --ignored fuzz_corpus::write_seed_corpus` regenerates the seeds from the real
//! writers (the bundled engine's dump, the dump writer, the GGUF builder, the safetensors serializer).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kvproof_engines::config::Preset;
use kvproof_engines::dump::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};
use kvproof_engines::dump_file::{rewrite_metadata, to_bytes};
use kvproof_engines::engine::{NoObserver, Request};
use kvproof_engines::gguf::write::Builder;
use kvproof_engines::gguf::{GgmlType, Value, ValueType};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

// ---- seed generation ----

fn writer(request: u64, chunk: u32) -> Option<Writer> {
    Some(Writer { request, kind: WriterKind::Prefill { chunk, chunk_rows: 4 } })
}

/// A small dump: `layers` full layers of `rows` rows of width 4, and a ring of 4 rows.
fn synthetic(layers: usize, rows: usize) -> StateDump {
    let mut tensors: Vec<DumpTensor> = (0..layers)
        .map(|l| DumpTensor {
            layer: l,
            name: "k".into(),
            kind: CacheKind::Full,
            width: 4,
            data: (0..rows * 4).map(|i| (i + l) as f32 * 0.25).collect(),
            positions: (0..rows as i64).collect(),
            writers: (0..rows).map(|r| writer(1, (r / 4) as u32)).collect(),
        })
        .collect();
    tensors.push(DumpTensor {
        layer: layers,
        name: "win".into(),
        kind: CacheKind::Ring,
        width: 2,
        data: (0..8).map(|i| i as f32).collect(),
        positions: (rows as i64 - 4..rows as i64).collect(),
        writers: vec![writer(1, 0); 4],
    });
    StateDump {
        meta: DumpMeta {
            arch: "synthetic".into(),
            preset: None,
            model_hash: "seed".into(),
            fault: None,
            slot: 0,
            len: rows,
            capacity: rows,
        },
        record: RecordDump { ids: (0..rows as u32).collect(), tainted: false, capacity: rows },
        tensors,
    }
}

fn engine_dump() -> Vec<u8> {
    let mut e = kvproof_engines::bundled::open_preset("inkling", Preset::Tiny, 0, None).expect("engine");
    let prompt: Vec<u32> = (0..20).map(|i| 65 + i % 20).collect();
    e.generate(&Request { id: 1, prompt, max_tokens: 4, ignore_eos: true, ..Default::default() }, &mut NoObserver)
        .expect("generate");
    to_bytes(&e.dump(0).expect("dump")).expect("encode")
}

fn claim(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    rewrite_metadata(bytes, edit).expect("a dump")
}

fn gguf_seed(alignment: Option<u32>, nested: bool) -> Vec<u8> {
    let mut b = Builder::new();
    if let Some(a) = alignment {
        b.alignment(a);
    }
    b.kv("general.architecture", Value::String("llama".into()));
    b.kv("llama.block_count", Value::U32(2));
    b.kv("llama.rope.freq_base", Value::F32(10000.0));
    b.kv(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, ["a", "b", "ab"].map(|s| Value::String(s.into())).to_vec()),
    );
    b.kv("tokenizer.ggml.scores", Value::Array(ValueType::F32, vec![Value::F32(0.0), Value::F32(-1.0)]));
    if nested {
        let inner = Value::Array(ValueType::I64, vec![Value::I64(-1), Value::I64(2)]);
        b.kv("nested", Value::Array(ValueType::Array, vec![inner.clone(), inner]));
        b.kv("flag", Value::Bool(true));
    }
    b.tensor("token_embd.weight", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]);
    b.tensor(
        "output_norm.weight",
        &[4],
        GgmlType::F32,
        [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|f| f.to_le_bytes()).collect(),
    );
    b.tensor("blk.0.attn_q.weight", &[32, 1], GgmlType::Q4_1, vec![7u8; 20]);
    b.finish()
}

fn safetensors_seed(dtype_f16: bool) -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let a: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (0..4).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    let mut views = vec![
        ("model.embed.weight", TensorView::new(Dtype::F32, vec![3, 4], &a).expect("view")),
        ("model.norm.weight", TensorView::new(Dtype::F32, vec![4], &b).expect("view")),
    ];
    if dtype_f16 {
        views.push(("model.half", TensorView::new(Dtype::F16, vec![2, 2], &b[..8]).expect("view")));
    }
    let meta = Some(HashMap::from([("config".to_string(), r#"{"arch":"inkling"}"#.to_string())]));
    safetensors::tensor::serialize(views, &meta).expect("serialize")
}

#[test]
#[ignore = "rewrites fuzz/corpus from the real writers"]
fn write_seed_corpus() {
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("dir");
        assert!(bytes.len() < 64 * 1024, "{target}/{name}: {} bytes", bytes.len());
        std::fs::write(dir.join(name), bytes).expect("write");
    };
    let real = engine_dump();
    let small = to_bytes(&synthetic(2, 6)).expect("encode");
    write("dump", "inkling-tiny-after-24-positions.safetensors", &real);
    write("dump", "synthetic-2-full-layers-and-a-ring.safetensors", &small);
    write(
        "dump",
        "claims-1e12-rows.safetensors",
        &claim(&small, |m| m["tensors"][0]["rows"] = 1_000_000_000_000u64.into()),
    );
    write(
        "dump",
        "claims-layer-2e63-without-rows.safetensors",
        &claim(&small, |m| {
            let entry = serde_json::json!({"layer": 1u64 << 63, "name": "x", "kind": "full", "width": 1, "rows": 0});
            m["tensors"].as_array_mut().expect("tensors").push(entry);
        }),
    );
    write("dump", "claims-len-1e12.safetensors", &claim(&small, |m| m["meta"]["len"] = 1_000_000_000_000u64.into()));
    write("dump", "truncated-half.safetensors", &real[..real.len() / 2]);

    let pair = |a: &[u8], b: &[u8]| {
        assert_eq!(a.len(), b.len(), "halves of a diff seed must be equal");
        [a, b].concat()
    };
    let mut other = synthetic(2, 6);
    other.tensors[1].data[5] = 9.5;
    write("diff", "identical.bin", &pair(&small, &small));
    write("diff", "one-value-differs.bin", &pair(&small, &to_bytes(&other).expect("encode")));
    let mut rotated = synthetic(2, 6);
    rotated.tensors[2].positions.rotate_left(1);
    rotated.tensors[2].data.rotate_left(2);
    write("diff", "ring-rotated.bin", &pair(&small, &to_bytes(&rotated).expect("encode")));
    let huge = claim(&small, |m| m["meta"]["len"] = 1_000_000_000_000u64.into());
    write("diff", "both-claim-len-1e12.bin", &pair(&huge, &huge));
    let shorter = to_bytes(&synthetic(2, 5)).expect("encode");
    write("diff", "different-lengths.bin", &[&small[..], &shorter[..]].concat());

    let g = gguf_seed(None, false);
    write("gguf", "metadata-and-three-tensors.gguf", &g);
    write("gguf", "nested-arrays-alignment-64.gguf", &gguf_seed(Some(64), true));
    let mut counts = g.clone();
    counts[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    write("gguf", "tensor-count-2e40.gguf", &counts);
    write("gguf", "truncated-in-the-directory.gguf", &g[..g.len() * 2 / 3]);

    let s = safetensors_seed(false);
    write("safetensors", "two-f32-tensors.safetensors", &s);
    write("safetensors", "f32-and-f16.safetensors", &safetensors_seed(true));
    write("safetensors", "state-dump.safetensors", &small);
    let mut long = s.clone();
    long[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    write("safetensors", "header-length-u64-max.safetensors", &long);
}
