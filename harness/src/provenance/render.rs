//! A state diff as a terminal table, a CSV, and JSON (diff.json: the `StateDiff` itself, which the heatmap reads).

use std::fmt::Write as _;
use std::path::Path;

use kvproof_engines::state_diff::StateDiff;

use super::ProvenanceError;

fn writer(w: &Option<kvproof_engines::dump::Writer>) -> String {
    w.map(|w| w.to_string()).unwrap_or_else(|| "-".into())
}

/// One side of a diff: its name in the table ("warm") and where its dump is.
pub type Side<'a> = (&'a str, &'a str);

/// The per-layer table, the ring rotations seen, and the headline (the first divergent row).
pub fn table(d: &StateDiff, (a_name, a_path): Side<'_>, (b_name, b_path): Side<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{a_name}: {a_path} ({} positions)", d.len_a);
    let _ = writeln!(out, "{b_name}: {b_path} ({} positions)", d.len_b);
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
            l.layer,
            l.rows.rows_compared,
            l.rows.rows_identical,
            first,
            l.rows.distance.max_abs,
            l.rows.distance.max_ulp
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
    if !d.record.equal() {
        let _ = writeln!(
            out,
            "records differ{} (tainted: {a_name} {}, {b_name} {})",
            d.record.first_diff.map(|i| format!(" from id {i}")).unwrap_or_default(),
            d.record.tainted_a,
            d.record.tainted_b
        );
    }
    let first = if d.first.is_some() { "first divergent row: " } else { "" };
    let _ = writeln!(out, "{first}{}", d.headline(a_name, b_name));
    out
}

/// One CSV row per layer.
pub fn write_csv(d: &StateDiff, path: &Path) -> Result<(), ProvenanceError> {
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
            l.rows.rows_compared.to_string(),
            l.rows.rows_identical.to_string(),
            l.first_divergent_pos.map(|p| p.to_string()).unwrap_or_default(),
            l.first_tensor.clone().unwrap_or_default(),
            format!("{:e}", l.rows.distance.max_abs),
            l.rows.distance.max_ulp.to_string(),
            l.writer_a.map(|x| x.to_string()).unwrap_or_default(),
            l.writer_b.map(|x| x.to_string()).unwrap_or_default(),
        ])
        .map_err(err)?;
    }
    w.flush().map_err(|e| ProvenanceError::Write { path: path.into(), message: e.to_string() })
}

pub fn write_json(d: &StateDiff, path: &Path) -> Result<(), ProvenanceError> {
    let json = serde_json::to_string_pretty(d)
        .map_err(|e| ProvenanceError::Write { path: path.into(), message: e.to_string() })?;
    std::fs::write(path, json + "\n").map_err(|source| ProvenanceError::Io { path: path.into(), source })
}

/// diff.txt, diff.csv and diff.json of a warm-vs-cold diff into `dir`; `paths` are the warm and cold dumps.
pub fn write_all(d: &StateDiff, dir: &Path, (warm, cold): (&str, &str)) -> Result<(), ProvenanceError> {
    let txt = dir.join("diff.txt");
    std::fs::write(&txt, table(d, ("warm", warm), ("cold", cold)))
        .map_err(|source| ProvenanceError::Io { path: txt, source })?;
    write_csv(d, &dir.join("diff.csv"))?;
    write_json(d, &dir.join(super::capture::DIFF_JSON))
}

/// Read a diff.json back (the heatmap is drawn from it).
pub fn read_json(path: &Path) -> Result<StateDiff, ProvenanceError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProvenanceError::Io { path: path.into(), source })?;
    serde_json::from_str(&text).map_err(|e| ProvenanceError::BadDump {
        path: path.into(),
        message: format!("line {}, column {}: {e}", e.line(), e.column()),
    })
}
