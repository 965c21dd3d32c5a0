//! Provenance for a failing comparison: both dumps, the row-by-row diff (table, CSV, JSON) and the heatmap,
//! saved under reports/<run>/provenance/<case>/ so the first divergent layer, position and writers can be read
//! without rerunning anything.

use std::path::Path;

use kvproof_engines::dump::StateDump;
use serde::{Deserialize, Serialize};

use super::{diff, render, MappedDump, ProvenanceError};

/// What a run keeps about a captured case (carried in results.jsonl, so reports rebuild from artifacts alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceRef {
    /// The case folder, relative to the run folder.
    pub dir: String,
    /// "layer 3, pos 8: warm row by decode (req 2, step 3), cold row by prefill (req 3, chunk 0 of 16 rows)"
    pub headline: String,
}

/// Files a capture writes, relative to its folder.
pub const FILES: [&str; 6] =
    ["warm.safetensors", "cold.safetensors", "diff.txt", "diff.csv", "diff.json", "heatmap.svg"];

/// A folder name from a case's name: letters, digits, '-' and '_' kept, everything else '-'.
pub fn case_dir(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| {
            let s: String = p.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' }).collect();
            s.trim_matches('-').to_string()
        })
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// Write both dumps and their diff into `run_dir/provenance/<case>`.
pub fn capture(
    run_dir: &Path,
    case: &str,
    warm: &StateDump,
    cold: &StateDump,
) -> Result<ProvenanceRef, ProvenanceError> {
    let rel = format!("provenance/{case}");
    let dir = run_dir.join(&rel);
    std::fs::create_dir_all(&dir).map_err(|source| ProvenanceError::Io { path: dir.clone(), source })?;
    let write = |name: &str, d: &StateDump| {
        let path = dir.join(name);
        kvproof_engines::dump::write_file(d, &path)
            .map_err(|e| ProvenanceError::Write { path: path.clone(), message: e.to_string() })
            .map(|_| path)
    };
    let (wp, cp) = (write(FILES[0], warm)?, write(FILES[1], cold)?);
    let d = diff(&MappedDump::open(&wp)?, &MappedDump::open(&cp)?)?;
    let table = render::table(&d, "warm", "cold");
    let txt = dir.join(FILES[2]);
    std::fs::write(&txt, &table).map_err(|source| ProvenanceError::Io { path: txt, source })?;
    render::write_csv(&d, &dir.join(FILES[3]))?;
    render::write_json(&d, &dir.join(FILES[4]))?;
    let heat = dir.join(FILES[5]);
    crate::plot::heatmap::draw(&d, &heat, &format!("warm vs cold state, {case}: log10 max |diff| per row"))
        .map_err(|e| ProvenanceError::Write { path: heat.clone(), message: e.to_string() })?;
    Ok(ProvenanceRef { dir: rel, headline: d.headline("warm", "cold") })
}
