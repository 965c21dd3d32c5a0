//! The artifacts of a run under `reports/<run>/`: `run.json` (manifest), `results.jsonl` (one line per trial,
//! flushed as each completes), `turns.csv` (one row per request) and the provenance of failing comparisons, all
//! streamed from the records by `RunWriter`; then `summary.md`, `junit.xml`, the CSVs, plots and `index.html`,
//! derived from the records alone (`kvproof report DIR` rebuilds them, never by rerunning engines).

pub mod agentic;
pub mod growth;
pub mod index_html;
pub mod junit;
pub mod out_dir;
pub mod plots;
pub mod results;
pub mod safe_file;
pub mod staleness;
pub mod summary;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kvproof_engines::dump::StateDump;
use kvproof_engines::state_diff::StateDiff;

use crate::record::{Manifest, Summary};
use crate::record::{ProvenanceRef, Sink, TrialRecord, TurnRow};

pub const RUN_JSON: &str = "run.json";
pub const RESULTS: &str = "results.jsonl";
pub const TURNS: &str = "turns.csv";
pub const SUMMARY: &str = "summary.md";
pub const JUNIT: &str = "junit.xml";

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(
        "{dir} is not empty (it holds {found}): choose a new or empty folder, or pass --force to replace \
         kvproof's own files there (other files are kept)"
    )]
    NotEmpty { dir: PathBuf, found: String },
}

/// The largest run.json `kvproof report` reads (a manifest lists scenarios, not trials: kilobytes).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

fn io(path: &Path) -> impl Fn(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io { path: path.to_path_buf(), source }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    // Write then rename: a reader never sees half a manifest or summary, and a link at the name is replaced.
    safe_file::replace(path, bytes)
}

/// Write `name` in `dir` with one CSV row per item of `rows`; no file (an old one is removed) when there are none.
pub(crate) fn write_csv_rows<R: serde::Serialize>(dir: &Path, name: &str, rows: Vec<R>) -> Result<bool, ReportError> {
    let path = dir.join(name);
    if rows.is_empty() {
        let _ = std::fs::remove_file(&path);
        return Ok(false);
    }
    let bad = |e: csv::Error| ReportError::Invalid { path: path.clone(), message: e.to_string() };
    let mut w = csv::Writer::from_writer(Vec::new());
    for row in rows {
        w.serialize(row).map_err(bad)?;
    }
    let bytes = w.into_inner().map_err(|e| ReportError::Invalid { path: path.clone(), message: e.to_string() })?;
    write_atomic(&path, &bytes)?;
    Ok(true)
}

pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), ReportError> {
    let path = dir.join(RUN_JSON);
    let json = serde_json::to_string_pretty(manifest)
        .map_err(|e| ReportError::Invalid { path: path.clone(), message: e.to_string() })?;
    write_atomic(&path, format!("{json}\n").as_bytes())
}

pub fn read_manifest(dir: &Path) -> Result<Manifest, ReportError> {
    let path = dir.join(RUN_JSON);
    let bytes = safe_file::read_bounded(&path, MAX_MANIFEST_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| ReportError::Parse {
        path: path.clone(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// Writes results.jsonl and turns.csv as trials complete. Write errors are kept and reported at `finish`: a
/// full disk must fail the run, not lose lines silently.
pub struct RunWriter {
    dir: PathBuf,
    results: Mutex<BufWriter<File>>,
    turns: Mutex<csv::Writer<File>>,
    error: Mutex<Option<ReportError>>,
    /// Provenance captures so far (bounded: a broken engine in a long stress run fails thousands of trials).
    captures: std::sync::atomic::AtomicUsize,
}

/// At most this many failing comparisons per run keep their dumps and diff under provenance/.
pub const MAX_CAPTURES: usize = 20;

impl RunWriter {
    /// Create the run folder's streaming files in `dir`, which must hold none of a run's files
    /// ([`out_dir::require_fresh`]): a run never overwrites another, nor writes through a link.
    pub fn create(dir: &Path) -> Result<Self, ReportError> {
        out_dir::require_fresh(dir)?;
        let results = safe_file::create_new(&dir.join(RESULTS))?;
        let turns = csv::Writer::from_writer(safe_file::create_new(&dir.join(TURNS))?);
        Ok(RunWriter {
            dir: dir.to_path_buf(),
            results: Mutex::new(BufWriter::new(results)),
            turns: Mutex::new(turns),
            error: Mutex::new(None),
            captures: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn keep(&self, e: ReportError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// The first write error, if any.
    pub fn finish(self) -> Result<(), ReportError> {
        if let Some(e) = self.error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let path = self.dir.join(TURNS);
        let mut turns = self.turns.into_inner().unwrap_or_else(|p| p.into_inner());
        turns.flush().map_err(io(&path))
    }
}

impl Sink for RunWriter {
    fn trial(&self, t: &TrialRecord) {
        let path = self.dir.join(RESULTS);
        let line = match serde_json::to_string(t) {
            Ok(l) => l,
            Err(e) => return self.keep(ReportError::Invalid { path, message: e.to_string() }),
        };
        let mut w = self.results.lock().unwrap_or_else(|p| p.into_inner());
        // One write per line, flushed at once: a crash after this point loses nothing of this trial.
        if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
            drop(w);
            self.keep(ReportError::Io { path, source: e });
        }
    }

    fn turn(&self, row: &TurnRow) {
        let mut w = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = w.serialize(row).map_err(|e| e.to_string()).and_then(|()| w.flush().map_err(|e| e.to_string()))
        {
            drop(w);
            self.keep(ReportError::Invalid { path: self.dir.join(TURNS), message: e });
        }
    }

    fn provenance(&self, case: &str, warm: &StateDump, cold: &StateDump, diff: &StateDiff) -> Option<ProvenanceRef> {
        if self.captures.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= MAX_CAPTURES {
            return None;
        }
        match crate::provenance::capture::capture(&self.dir, case, warm, cold, diff) {
            Ok(p) => Some(p),
            Err(e) => {
                self.keep(ReportError::Invalid {
                    path: self.dir.join("provenance").join(case),
                    message: e.to_string(),
                });
                None
            }
        }
    }
}

/// Write summary.md and junit.xml for a finished (or interrupted) run.
pub fn write_summaries(dir: &Path, manifest: &Manifest, trials: &mut [TrialRecord]) -> Result<Summary, ReportError> {
    crate::check::scenario::sort_trials(manifest, trials);
    let s = crate::check::scenario::summarize(manifest, trials);
    write_atomic(&dir.join(SUMMARY), summary::render(&s, trials).as_bytes())?;
    write_atomic(&dir.join(JUNIT), junit::render(&s, trials).as_bytes())?;
    // growth.csv, staleness.csv, agentic.csv and agentic-sessions.md, plots/ and index.html: also derived from the artifacts alone.
    growth::write_csv(dir, trials)?;
    staleness::write_csv(dir, trials)?;
    agentic::write_csv(dir, trials)?;
    agentic::write_sessions(dir, trials)?;
    let drawn = plots::draw_run(dir, &s, trials)?;
    index_html::write(dir, manifest, &s, trials, &drawn)?;
    Ok(s)
}

/// `kvproof report DIR`: rebuild summary.md and junit.xml from run.json and results.jsonl alone.
pub fn rebuild(dir: &Path) -> Result<Summary, ReportError> {
    let manifest = read_manifest(dir)?;
    let mut trials = results::read(&dir.join(RESULTS))?;
    for t in &trials {
        if !manifest.scenarios.iter().any(|s| s.name == t.scenario) {
            return Err(ReportError::Invalid {
                path: dir.join(RESULTS),
                message: format!("trial of scenario `{}`, which run.json does not list", t.scenario),
            });
        }
    }
    write_summaries(dir, &manifest, &mut trials)
}
