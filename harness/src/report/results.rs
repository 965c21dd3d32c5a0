//! `results.jsonl`: one line per trial, written and flushed as each trial completes (`RunWriter`), so a crash
//! loses nothing already decided; reports are rebuilt from these lines.

use std::io::BufRead;
use std::path::Path;

use super::ReportError;
use crate::record::TrialRecord;

/// Read results.jsonl; a torn last line (a run killed mid-write) is ignored, any other bad line is an error that
/// names its line.
pub fn read(path: &Path) -> Result<Vec<TrialRecord>, ReportError> {
    let file = std::fs::File::open(path).map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<TrialRecord>(line) {
            Ok(t) => out.push(t),
            Err(e) if i + 1 == lines.len() && e.is_eof() => break,
            Err(e) => {
                return Err(ReportError::Parse {
                    path: path.to_path_buf(),
                    line: i + 1,
                    column: e.column(),
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}
