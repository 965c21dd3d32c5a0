//! Peak memory of `kvproof diff` (provenance::diff_files, the code behind it) on dumps whose headers claim 10^12
//! rows, positions or layers: it must stay near the files' real size, never grow with what the header claims.
//!
//! Measured in-process from /proc/self/status: the peak (VmHWM) is reset to the current RSS through
//! /proc/self/clear_refs, then read after the diff. This file holds one test, so no other test allocates meanwhile.
//! The bound is the two files' sizes plus a fixed 4 MiB: the mapped files count once each (every page is read
//! once); rayon's pool and the allocator's arenas are set up by a first diff before the peak is reset; what is
//! left is transient: the header's JSON, and the positions (8 bytes a row) and writers (24) of the tensors being
//! compared at that moment (here at most 4 tensors of 2048 rows, both sides: 0.5 MiB).

use std::path::Path;

use kvproof::provenance::diff_files;
use kvproof_engines::dump::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};
use kvproof_engines::dump_file::{rewrite_metadata, to_bytes};

const FIXED_ALLOWANCE: u64 = 4 << 20;
const CLAIM: u64 = 1_000_000_000_000;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB")
}

/// (peak bytes above the RSS before `f`, its result).
fn peak_during<T>(f: impl FnOnce() -> T) -> (u64, T) {
    // "5" resets the peak RSS to the current one (Linux 4.0+); without it the peak so far is the baseline
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = if reset { status_kib("VmRSS:") } else { status_kib("VmHWM:") };
    let out = f();
    ((status_kib("VmHWM:").saturating_sub(before)) * 1024, out)
}

/// 4 full layers of 2048 rows of 16 floats: about 0.8 MB of real data.
fn dump(seed: f32) -> StateDump {
    let rows = 2048;
    let tensors = (0..4)
        .map(|layer| DumpTensor {
            layer,
            name: "k".into(),
            kind: CacheKind::Full,
            width: 16,
            data: (0..rows * 16).map(|i| i as f32 * seed).collect(),
            positions: (0..rows as i64).collect(),
            writers: vec![Some(Writer { request: 1, kind: WriterKind::Decode { step: 0 } }); rows],
        })
        .collect();
    StateDump {
        meta: DumpMeta {
            arch: "synthetic".into(),
            preset: None,
            model_hash: "m".into(),
            fault: None,
            slot: 0,
            len: rows,
            capacity: rows,
        },
        record: RecordDump { ids: vec![7; rows], tainted: false, capacity: rows },
        tensors,
    }
}

fn write(path: &Path, d: &StateDump, edit: impl FnOnce(&mut serde_json::Value)) -> u64 {
    let bytes = rewrite_metadata(&to_bytes(d).expect("encode"), edit).expect("a dump");
    std::fs::write(path, &bytes).expect("write");
    bytes.len() as u64
}

#[test]
fn diff_memory_stays_near_the_file_size_whatever_the_header_claims() {
    let dir = std::env::temp_dir().join(format!("kvproof-diff-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    // warm up what every diff needs once (rayon's pool, the allocator), so only the claims are measured
    let size = write(&a, &dump(0.5), |_| {}) + write(&b, &dump(0.25), |_| {});
    let _ = diff_files(&a, &b).expect("a plain diff");

    // 10^12 rows in the kvproof header: refused against the arrays, naming the tensor
    let rows = |m: &mut serde_json::Value| m["tensors"][1]["rows"] = CLAIM.into();
    let size_rows = write(&a, &dump(0.5), rows) + write(&b, &dump(0.25), rows);
    let (peak_rows, result) = peak_during(|| diff_files(&a, &b));
    let e = result.expect_err("a claim the arrays do not back").to_string();
    assert!(e.contains("a.safetensors") && e.contains("layers.1.k.rows"), "{e}");

    // 10^12 positions covered and a tensor of layer 10^12: believed (no arrays contradict them), and compared
    let huge = |m: &mut serde_json::Value| {
        m["meta"]["len"] = CLAIM.into();
        let entry = serde_json::json!({"layer": CLAIM, "name": "x", "kind": "full", "width": 1, "rows": 0});
        m["tensors"].as_array_mut().expect("tensors").push(entry);
    };
    let size_huge = write(&a, &dump(0.5), huge) + write(&b, &dump(0.25), huge);
    let (peak_huge, result) = peak_during(|| diff_files(&a, &b));
    let d = result.expect("comparable");
    assert_eq!((d.covered as u64, d.layers.len(), d.rows_compared()), (CLAIM, 5, 4 * 2048));

    eprintln!(
        "diff memory: files {size} B; claims of 10^12 rows: files {size_rows} B, peak +{peak_rows} B; 10^12 \
         positions and layer 10^12: files {size_huge} B, peak +{peak_huge} B"
    );
    for (what, files, peak) in [("rows", size_rows, peak_rows), ("positions/layer", size_huge, peak_huge)] {
        assert!(peak <= files + FIXED_ALLOWANCE, "{what}: peak +{peak} B for {files} B of files");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
