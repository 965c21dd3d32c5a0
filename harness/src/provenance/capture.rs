//! Provenance for a failing comparison: both dumps and their row-by-row diff (table, CSV, and the diff itself as
//! JSON, which the heatmap is drawn from), saved under reports/<run>/provenance/<case>/ so the first divergent
//! layer, position and writers can be read without rerunning anything. The diff is the one the state check
//! computed; nothing is compared twice.

use std::path::Path;

use kvproof_engines::dump::StateDump;
use kvproof_engines::state_diff::StateDiff;

use super::{render, ProvenanceError};
use crate::record::ProvenanceRef;

/// Files a capture writes, relative to its folder (the report draws `heatmap.svg` beside them from diff.json).
pub const FILES: [&str; 5] = ["warm.safetensors", "cold.safetensors", "diff.txt", "diff.csv", "diff.json"];

/// The diff file the heatmap is drawn from.
pub const DIFF_JSON: &str = FILES[4];

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
    diff: &StateDiff,
) -> Result<ProvenanceRef, ProvenanceError> {
    let rel = format!("provenance/{case}");
    let dir = run_dir.join(&rel);
    std::fs::create_dir_all(&dir).map_err(|source| ProvenanceError::Io { path: dir.clone(), source })?;
    let write = |name: &str, d: &StateDump| {
        let path = dir.join(name);
        kvproof_engines::dump::write_file(d, &path)
            .map(|_| ())
            .map_err(|e| ProvenanceError::Write { path, message: e.to_string() })
    };
    write(FILES[0], warm)?;
    write(FILES[1], cold)?;
    render::write_all(
        diff,
        &dir,
        (&dir.join(FILES[0]).display().to_string(), &dir.join(FILES[1]).display().to_string()),
    )?;
    Ok(ProvenanceRef { dir: rel, headline: diff.headline("warm", "cold") })
}
