//! A diff as a terminal table, a CSV, and JSON.

use std::fmt::Write as _;
use std::path::Path;

use super::{DumpDiff, ProvenanceError};

fn writer(w: &Option<kvproof_engines::dump::Writer>) -> String {
    w.map(|w| w.to_string()).unwrap_or_else(|| "-".into())
}

/// The per-layer table, the ring rotations seen, and the headline.
pub fn table(d: &DumpDiff, a_name: &str, b_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{a_name}: {} ({} positions)", d.a, d.len_a);
    let _ = writeln!(out, "{b_name}: {} ({} positions)", d.b, d.len_b);
    let _ = writeln!(
        out,
        "{:>5} {:>8} {:>9} {:>9} {:>11} {:>10}  first divergent row: {a_name} writer / {b_name} writer",
        "layer", "compared", "identical", "first pos", "max |diff|", "max ULP"
    );
    for l in &d.layers {
        let first = l.first_divergent_pos.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let who = match &l.first_tensor {
            Some(t) => format!("{t}: {} / {}", writer(&l.writer_a), writer(&l.writer_b)),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "{:>5} {:>8} {:>9} {:>9} {:>11.3e} {:>10}  {who}",
            l.layer, l.rows_compared, l.rows_identical, first, l.max_abs, l.max_ulp
        );
    }
    for t in d.tensors.iter().filter(|t| t.misplaced_a + t.misplaced_b > 0) {
        let _ = writeln!(
            out,
            "ring layers.{}.{}: {} rows of {a_name} and {} of {b_name} sit where their position does not map \
             (rotation {a_name} {}, {b_name} {})",
            t.layer,
            t.name,
            t.misplaced_a,
            t.misplaced_b,
            t.rotation_a.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            t.rotation_b.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
        );
    }
    if !d.record_equal {
        let _ = writeln!(
            out,
            "records differ{} (tainted: {a_name} {}, {b_name} {})",
            d.record_first_diff.map(|i| format!(" from id {i}")).unwrap_or_default(),
            d.tainted_a,
            d.tainted_b
        );
    }
    let _ = writeln!(out, "{}", d.headline(a_name, b_name));
    out
}

/// One CSV row per layer.
pub fn write_csv(d: &DumpDiff, path: &Path) -> Result<(), ProvenanceError> {
    let err = |e: csv::Error| ProvenanceError::Write { path: path.into(), message: e.to_string() };
    let mut w = csv::Writer::from_path(path).map_err(err)?;
    w.write_record([
        "layer",
        "rows_compared",
        "rows_identical",
        "first_divergent_pos",
        "first_tensor",
        "max_abs_diff",
        "max_ulp",
        "writer_a",
        "writer_b",
    ])
    .map_err(err)?;
    for l in &d.layers {
        w.write_record([
            l.layer.to_string(),
            l.rows_compared.to_string(),
            l.rows_identical.to_string(),
            l.first_divergent_pos.map(|p| p.to_string()).unwrap_or_default(),
            l.first_tensor.clone().unwrap_or_default(),
            format!("{:e}", l.max_abs),
            l.max_ulp.to_string(),
            l.writer_a.map(|x| x.to_string()).unwrap_or_default(),
            l.writer_b.map(|x| x.to_string()).unwrap_or_default(),
        ])
        .map_err(err)?;
    }
    w.flush().map_err(|e| ProvenanceError::Write { path: path.into(), message: e.to_string() })
}

pub fn write_json(d: &DumpDiff, path: &Path) -> Result<(), ProvenanceError> {
    let json = serde_json::to_string_pretty(d)
        .map_err(|e| ProvenanceError::Write { path: path.into(), message: e.to_string() })?;
    std::fs::write(path, json + "\n").map_err(|source| ProvenanceError::Io { path: path.into(), source })
}
