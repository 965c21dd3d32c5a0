//! Diff throughput on large dumps, next to a plain byte comparison of the same files in the same run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use kvproof_engines::dump::{CacheKind, DumpMeta, DumpTensor, RecordDump, StateDump, Writer, WriterKind};
use rayon::prelude::*;

use kvproof_engines::state_diff;

use super::{MappedDump, ProvenanceError};

/// A synthetic dump of `layers` full layers with `rows` rows of `width` floats for k and v; `perturb` changes
/// one value in every 1000th row of the upper half of the layers (so the diff has work to report).
fn synthetic(layers: usize, rows: usize, width: usize, perturb: bool) -> StateDump {
    let tensors = (0..layers)
        .flat_map(|l| ["k", "v"].into_iter().map(move |name| (l, name)))
        .map(|(l, name)| {
            let mut data: Vec<f32> = (0..rows * width).map(|i| ((i * 31 + l * 7) % 1013) as f32 / 1013.0).collect();
            if perturb && l >= layers / 2 {
                for r in (0..rows).step_by(1000) {
                    data[r * width] += 1e-3;
                }
            }
            DumpTensor {
                layer: l,
                name: name.into(),
                kind: CacheKind::Full,
                width,
                data,
                positions: (0..rows as i64).collect(),
                writers: (0..rows)
                    .map(|r| {
                        Some(Writer {
                            request: 1,
                            kind: WriterKind::Prefill { chunk: (r / 512) as u32, chunk_rows: 512 },
                        })
                    })
                    .collect(),
            }
        })
        .collect();
    StateDump {
        meta: DumpMeta {
            arch: "synthetic".into(),
            preset: None,
            model_hash: "bench".into(),
            fault: None,
            slot: 0,
            len: rows,
            capacity: rows,
        },
        record: RecordDump { ids: vec![0; rows], tainted: false, capacity: rows },
        tensors,
    }
}

/// Write two dumps of about `total_bytes` together into `dir`, then time the diff and a plain comparison.
pub fn run(dir: &Path, total_bytes: u64) -> Result<String, ProvenanceError> {
    let (rows, width) = (8192usize, 256usize);
    let per_layer = (2 * rows * width * 4) as u64;
    let layers = (total_bytes / 2).div_ceil(per_layer).max(1) as usize;
    std::fs::create_dir_all(dir).map_err(|source| ProvenanceError::Io { path: dir.into(), source })?;
    let (pa, pb) = (dir.join("bench-a.safetensors"), dir.join("bench-b.safetensors"));
    let write = |path: &Path, d: &StateDump| {
        kvproof_engines::dump::write_file(d, path)
            .map_err(|e| ProvenanceError::Write { path: path.into(), message: e.to_string() })
    };
    write(&pa, &synthetic(layers, rows, width, false))?;
    write(&pb, &synthetic(layers, rows, width, true))?;
    // both files in the page cache first (through maps that are dropped again), so each timing below opens its
    // own maps and pays the same page faults: what `kvproof diff` and a plain comparison each cost on warm files
    let total = {
        let (a, b) = (MappedDump::open(&pa)?, MappedDump::open(&pb)?);
        let warm: u64 = a.raw().par_iter().chain(b.raw().par_iter()).map(|&x| u64::from(x)).sum();
        std::hint::black_box(warm);
        (a.len() + b.len()) as f64
    };

    let steal = kvproof_engines::cpu_steal::StealMeter::start();
    let t = Instant::now();
    let d = {
        let (a, b) = (MappedDump::open(&pa)?, MappedDump::open(&pb)?);
        state_diff::compare(&a, &b)?
    };
    let diff_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let same = {
        let (a, b) = (MappedDump::open(&pa)?, MappedDump::open(&pb)?);
        a.raw().par_chunks(1 << 20).zip(b.raw().par_chunks(1 << 20)).filter(|(x, y)| x != y).count()
    };
    let plain_s = t.elapsed().as_secs_f64();

    let divergent: usize = d.layers.iter().filter(|l| l.first_divergent_pos.is_some()).count();
    let mut out = String::new();
    let _ = writeln!(out, "dumps: 2 x {layers} layers x 2 tensors x {rows} rows x {width} f32 = {:.2} GB", total / 1e9);
    let _ = writeln!(
        out,
        "kvproof diff (row-matched, per-element |diff| and ULP): {:.3}s, {:.2} GB/s; {divergent} divergent layers",
        diff_s,
        total / diff_s / 1e9
    );
    let _ = writeln!(
        out,
        "plain byte comparison (1 MiB chunks, parallel):         {:.3}s, {:.2} GB/s; {same} differing chunks",
        plain_s,
        total / plain_s / 1e9
    );
    let _ = writeln!(out, "{} during the two timings", kvproof_engines::cpu_steal::describe(steal.ticks()));
    let _ = std::fs::remove_file(&pa);
    let _ = std::fs::remove_file(&pb);
    Ok(out)
}
