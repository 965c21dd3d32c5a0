//! The folders kvproof writes (`--out` of run, mutants, investigate and fixture) and which of their files are its
//! own. A folder that holds anything is refused unless `--force`; `--force` removes kvproof's own files (and any
//! link at a name kvproof writes: the link, never what it points to) and keeps every other file.

use std::path::{Path, PathBuf};

use super::{agentic, growth, index_html, plots, safe_file, staleness, ReportError};
use super::{JUNIT, RESULTS, RUN_JSON, SUMMARY, TURNS};
use crate::provenance::capture;

/// What a folder holds when kvproof writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A run folder (`kvproof run --out`, each pass of `mutants`).
    Run,
    /// `plots/` of a run folder.
    Plots,
    /// `provenance/` of a run folder and its case folders.
    Provenance,
    /// A `mutants --out` folder: the sweep's reports and one run folder per pass.
    Mutants,
    /// An `investigate --out` folder: one `turn-<n>/` folder per turn.
    Investigate,
    /// A `turn-<n>/` folder of an investigation.
    InvestigateTurn,
    /// A `fixture --out` folder.
    Fixture,
}

/// Whether an entry of a folder is kvproof's, as a file or as a folder of the given layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owned {
    Not,
    File,
    Dir(Layout),
}

/// The files a run writes at the top of its folder (plots/ and provenance/ are folders of their own layouts).
pub const RUN_FILES: [&str; 10] = [
    RUN_JSON,
    RESULTS,
    TURNS,
    SUMMARY,
    JUNIT,
    index_html::INDEX,
    growth::GROWTH_CSV,
    staleness::STALENESS_CSV,
    agentic::AGENTIC_CSV,
    agentic::SESSIONS_MD,
];

/// The sweep's report as markdown, beside its pass folders.
pub const MUTANTS_MD: &str = "mutants.md";
/// The sweep's report as JSON.
pub const MUTANTS_JSON: &str = "mutants.json";
/// The reports a mutants sweep writes beside its pass folders.
pub const MUTANTS_FILES: [&str; 2] = [MUTANTS_MD, MUTANTS_JSON];
/// The files `kvproof fixture` writes.
pub const FIXTURE_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];
/// The heatmap drawn beside a capture's files.
pub const HEATMAP_SVG: &str = "heatmap.svg";

impl Layout {
    fn entry(self, name: &str) -> Owned {
        if safe_file::is_temp_name(name) {
            return Owned::File;
        }
        match self {
            Layout::Run if name == plots::PLOTS_DIR => Owned::Dir(Layout::Plots),
            Layout::Run if name == "provenance" => Owned::Dir(Layout::Provenance),
            Layout::Run if RUN_FILES.contains(&name) => Owned::File,
            Layout::Plots if plots::is_plot_file(name) => Owned::File,
            Layout::Provenance if capture::FILES.contains(&name) || name == HEATMAP_SVG => Owned::File,
            // Case folders are named after the cases: any other name is one.
            Layout::Provenance => Owned::Dir(Layout::Provenance),
            Layout::Mutants if MUTANTS_FILES.contains(&name) => Owned::File,
            Layout::Mutants if is_pass_name(name) => Owned::Dir(Layout::Run),
            Layout::Investigate if is_turn_dir(name) => Owned::Dir(Layout::InvestigateTurn),
            Layout::InvestigateTurn if capture::FILES.contains(&name) || name == HEATMAP_SVG => Owned::File,
            Layout::Fixture if FIXTURE_FILES.contains(&name) => Owned::File,
            _ => Owned::Not,
        }
    }
}

/// A mutants pass folder: `clean` or a fault's name.
fn is_pass_name(name: &str) -> bool {
    name == "clean" || name.parse::<kvproof_engines::fault::Fault>().is_ok()
}

fn is_turn_dir(name: &str) -> bool {
    name.strip_prefix("turn-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io { path: path.to_path_buf(), source }
}

/// Up to this many of a refused folder's entries are named in the error.
const NAMED_ENTRIES: usize = 5;

/// Refuse `dir` when it holds anything, unless `force`; a missing or empty folder is fine. Nothing is changed.
pub fn check(dir: &Path, force: bool) -> Result<(), ReportError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
    };
    if force {
        return Ok(());
    }
    let mut names = Vec::new();
    for e in entries {
        names.push(e.map_err(io(dir))?.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let more = names.len().saturating_sub(NAMED_ENTRIES);
    names.truncate(NAMED_ENTRIES);
    let found = if more > 0 { format!("{} and {more} more", names.join(", ")) } else { names.join(", ") };
    Err(ReportError::NotEmpty { dir: dir.to_path_buf(), found })
}

/// Make room for kvproof in `dir`: refuse it when it holds anything (see [`check`]) unless `force`, and with
/// `force` remove kvproof's own files of `layout` from it. Afterwards no name kvproof writes exists there (the
/// folder itself is created by whatever writes into it).
pub fn make_room(dir: &Path, layout: Layout, force: bool) -> Result<(), ReportError> {
    check(dir, force)?;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => clear_own(dir, layout).map(drop),
        Ok(_) => Err(ReportError::Invalid { path: dir.to_path_buf(), message: "is a file, not a folder".into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Remove kvproof's own files of `layout` under `dir`, and its folders that end up empty; returns the entries
/// kept. Links are never followed: a link at a name kvproof writes is removed itself.
pub fn clear_own(dir: &Path, layout: Layout) -> Result<Vec<PathBuf>, ReportError> {
    let mut kept = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let path = e.path();
        let kind = e.file_type().map_err(io(&path))?;
        let name = e.file_name();
        match (layout.entry(&name.to_string_lossy()), kind.is_dir()) {
            (Owned::File, false) => std::fs::remove_file(&path).map_err(io(&path))?,
            (Owned::Dir(_), false) if kind.is_symlink() => std::fs::remove_file(&path).map_err(io(&path))?,
            (Owned::Dir(sub), true) => {
                let inner = clear_own(&path, sub)?;
                if inner.is_empty() {
                    std::fs::remove_dir(&path).map_err(io(&path))?;
                } else {
                    kept.extend(inner);
                }
            }
            _ => kept.push(path),
        }
    }
    Ok(kept)
}

/// Every file (or link) under `dir` at a name kvproof writes in `layout`; links are not followed.
fn find_own(dir: &Path, layout: Layout, found: &mut Vec<PathBuf>) -> Result<(), ReportError> {
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let path = e.path();
        let kind = e.file_type().map_err(io(&path))?;
        match (layout.entry(&e.file_name().to_string_lossy()), kind.is_dir()) {
            (Owned::File, false) => found.push(path),
            (Owned::Dir(_), false) if kind.is_symlink() => found.push(path),
            (Owned::Dir(sub), true) => find_own(&path, sub, found)?,
            _ => {}
        }
    }
    Ok(())
}

/// `dir` for a new run: it must hold none of the files a run writes (a caller that passed `--force` cleared
/// them); created when missing.
pub fn require_fresh(dir: &Path) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut own = Vec::new();
    find_own(dir, Layout::Run, &mut own)?;
    if own.is_empty() {
        return Ok(());
    }
    own.sort();
    let found: Vec<String> =
        own.iter().take(NAMED_ENTRIES).map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string()).collect();
    Err(ReportError::NotEmpty { dir: dir.to_path_buf(), found: found.join(", ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_by_name() {
        assert_eq!(Layout::Run.entry("results.jsonl"), Owned::File);
        assert_eq!(Layout::Run.entry("notes.txt"), Owned::Not);
        assert_eq!(Layout::Run.entry("plots"), Owned::Dir(Layout::Plots));
        assert_eq!(Layout::Plots.entry("bounds.svg"), Owned::File);
        assert_eq!(Layout::Plots.entry("mine.png"), Owned::Not);
        assert_eq!(Layout::Provenance.entry("diff.json"), Owned::File);
        assert_eq!(Layout::Provenance.entry("notes.txt"), Owned::Dir(Layout::Provenance));
        assert_eq!(Layout::Mutants.entry("clean"), Owned::Dir(Layout::Run));
        assert_eq!(Layout::Mutants.entry("memcmp-short"), Owned::Dir(Layout::Run));
        assert_eq!(Layout::Mutants.entry("other"), Owned::Not);
        assert_eq!(Layout::Investigate.entry("turn-12"), Owned::Dir(Layout::InvestigateTurn));
        assert_eq!(Layout::Investigate.entry("turn-x"), Owned::Not);
        assert_eq!(Layout::Fixture.entry("config.json"), Owned::File);
        assert_eq!(Layout::Run.entry(".summary.md.12-0.tmp"), Owned::File);
    }
}
