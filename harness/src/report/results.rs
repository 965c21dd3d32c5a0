//! `results.jsonl`: one line per trial, written and flushed as each trial completes (`RunWriter`), so a crash
//! loses nothing already decided; reports are rebuilt from these lines. Read back, the file is untrusted: a line
//! is bounded, and a path in it must lead to a file inside the run folder.

use std::io::{BufRead, Read};
use std::path::Path;

use super::{safe_file, ReportError};
use crate::record::TrialRecord;

/// The longest line read (a trial record is kilobytes; an agentic session's trajectory at most a few MiB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Read results.jsonl; a torn last line (a run killed mid-write) is ignored, any other bad line is an error that
/// names its line, and so is a `provenance.dir` that leaves the run folder (the file's own folder).
pub fn read(path: &Path) -> Result<Vec<TrialRecord>, ReportError> {
    let run_dir = path.parent().unwrap_or(Path::new("."));
    read_from(std::io::BufReader::new(safe_file::open_regular(path)?), path, run_dir)
}

/// Fuzz entry: arbitrary bytes read as results.jsonl of a run folder that does not exist.
pub fn fuzz_results(data: &[u8]) {
    let _ = read_from(data, Path::new("results.jsonl"), Path::new("/nonexistent/kvproof-fuzz-run"));
}

/// Read the lines of `reader` as the results file `path` of the run folder `run_dir` (see [`read`]).
fn read_from(mut reader: impl BufRead, path: &Path, run_dir: &Path) -> Result<Vec<TrialRecord>, ReportError> {
    let io = |source| ReportError::Io { path: path.to_path_buf(), source };
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        number += 1;
        // One byte past the bound tells an over-long line from one of exactly the bound.
        let limit = MAX_LINE_BYTES as u64 + 1;
        let read = (&mut reader).take(limit).read_until(b'\n', &mut line).map_err(io)?;
        if read == 0 {
            break;
        }
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() > MAX_LINE_BYTES {
            return Err(ReportError::Parse {
                path: path.to_path_buf(),
                line: number,
                column: 1,
                message: format!("line longer than {} MiB, more than any trial record", MAX_LINE_BYTES >> 20),
            });
        }
        let text = match std::str::from_utf8(&line) {
            Ok(t) => t,
            Err(e) => {
                return Err(ReportError::Parse {
                    path: path.to_path_buf(),
                    line: number,
                    column: e.valid_up_to() + 1,
                    message: "not UTF-8".into(),
                })
            }
        };
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<TrialRecord>(text) {
            Ok(t) => {
                check_paths(run_dir, &t).map_err(|message| ReportError::Parse {
                    path: path.to_path_buf(),
                    line: number,
                    column: 1,
                    message,
                })?;
                out.push(t);
            }
            // A torn last line: a run killed mid-write.
            Err(e) if e.is_eof() && reader.fill_buf().map_err(io)?.is_empty() => break,
            Err(e) => {
                return Err(ReportError::Parse {
                    path: path.to_path_buf(),
                    line: number,
                    column: e.column(),
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}

/// Every path a record names must resolve inside the run folder.
fn check_paths(run_dir: &Path, t: &TrialRecord) -> Result<(), String> {
    if let Some(p) = &t.provenance {
        safe_file::resolve_inside(run_dir, &p.dir).map_err(|e| format!("provenance.dir: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed of the fuzz corpus goes through the entry point, and the valid ones read back.
    #[test]
    fn fuzz_corpus_seeds_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/results");
        let mut seeds = 0;
        for e in std::fs::read_dir(&dir).expect("fuzz/corpus/results") {
            let path = e.expect("entry").path();
            let bytes = std::fs::read(&path).expect("seed");
            fuzz_results(&bytes);
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let read = read_from(bytes.as_slice(), &path, Path::new("/nonexistent/kvproof-fuzz-run"));
            if name.starts_with("valid-") {
                assert!(read.is_ok_and(|t| !t.is_empty()), "{name}");
            }
            seeds += 1;
        }
        assert!(seeds >= 3);
    }

    #[test]
    fn escaping_provenance_is_an_error_with_its_line() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/results");
        let text = std::fs::read_to_string(dir.join("invalid-provenance-escapes.jsonl")).expect("seed");
        let e = read_from(text.as_bytes(), Path::new("r.jsonl"), Path::new("/nonexistent")).expect_err("escapes");
        assert!(e.to_string().starts_with("r.jsonl:") && e.to_string().contains("provenance.dir"), "{e}");
    }
}
