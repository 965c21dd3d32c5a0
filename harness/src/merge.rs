//! `kvproof merge DIR... --out DIR`: the shard folders of one sharded run (`kvproof run --shard K/N`) combined
//! into the run folder the unsharded run writes. Trials go to results.jsonl in the unsharded order and every report
//! (summary, bounds, plots, index.html) is derived from the merged records by the same code as a run's; turns.csv
//! rows are the shards' rows, shard after shard; captured provenance folders are copied.
//!
//! The shard folders are untrusted: each is read with the caps every run folder is read with, and refused — by
//! name — unless it is a shard of the same set (same scenarios, versions, fault override, shard count) as the
//! others, every shard is there exactly once, and each holds only trials of the units its shard owns.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::record::{self, Manifest, ScenarioTotals, ShardInfo, Sink, Summary, TrialRecord, TurnRow};
use crate::report::{read_manifest, results, safe_file, write_manifest, write_summaries, ReportError, RunWriter};
use crate::report::{RESULTS, TURNS};
use crate::runner::shard;

/// The largest turns.csv read from a shard (a row per request: a nightly shard writes megabytes).
pub const MAX_TURNS_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{dir}: {message}")]
    Refused { dir: PathBuf, message: String },
    #[error("missing shard(s) {missing} of {count}: merge needs every shard's folder")]
    Missing { missing: String, count: usize },
    #[error(transparent)]
    Report(#[from] ReportError),
}

fn refuse(dir: &Path, message: impl Into<String>) -> MergeError {
    MergeError::Refused { dir: dir.to_path_buf(), message: message.into() }
}

/// One shard folder, checked on its own.
struct ShardRun {
    dir: PathBuf,
    manifest: Manifest,
    info: ShardInfo,
}

fn open_shard(dir: &Path) -> Result<ShardRun, MergeError> {
    let manifest = read_manifest(dir)?;
    let Some(info) = manifest.shard.clone() else {
        return Err(refuse(
            dir,
            "not a shard folder: its run.json has no `shard` (written by `kvproof run --shard K/N`)",
        ));
    };
    if info.count == 0 || info.index == 0 || info.index > info.count {
        return Err(refuse(dir, format!("run.json: shard {}/{} is no shard", info.index, info.count)));
    }
    if record::set_identity(&manifest, &info.totals) != info.set {
        return Err(refuse(dir, "run.json: `shard.set` does not match the scenarios it lists (edited or corrupt)"));
    }
    let names: BTreeSet<&str> = manifest.scenarios.iter().map(|s| s.name.as_str()).collect();
    let totals: BTreeSet<&str> = info.totals.iter().map(|t| t.name.as_str()).collect();
    if names != totals || names.len() != manifest.scenarios.len() {
        return Err(refuse(dir, "run.json: `shard.totals` does not name the scenarios it lists, once each"));
    }
    Ok(ShardRun { dir: dir.to_path_buf(), manifest, info })
}

/// Merge the shard folders `dirs` into the run folder `out` (which must hold none of a run's files); returns the
/// merged run's verdict.
pub fn merge(dirs: &[PathBuf], out: &Path, command: Vec<String>) -> Result<Summary, MergeError> {
    let shards = check_set(dirs)?;
    let first = &shards[0];
    let totals = &first.info.totals;
    check_counts(&shards, totals)?;

    let mut trials = Vec::new();
    let mut seen: BTreeMap<(String, usize, usize), &Path> = BTreeMap::new();
    for s in &shards {
        for t in results::read(&s.dir.join(RESULTS))? {
            let owner = shard::owner(&t.scenario, t.plan_index, s.info.count);
            let what = format!("trial `{}` {} (plan {})", t.scenario, t.name(), t.plan_index);
            if !totals.iter().any(|x| x.name == t.scenario) {
                return Err(refuse(&s.dir, format!("{RESULTS}: {what} of a scenario run.json does not list")));
            }
            if owner != s.info.index {
                return Err(refuse(&s.dir, format!("{RESULTS}: {what} belongs to shard {owner}/{}", s.info.count)));
            }
            if let Some(other) = seen.insert((t.scenario.clone(), t.plan_index, t.step_index), &s.dir) {
                return Err(refuse(&s.dir, format!("{RESULTS}: {what} again (also in {})", other.display())));
            }
            trials.push(t);
        }
    }

    let manifest = merged_manifest(&shards, out, command);
    crate::check::scenario::sort_trials(&manifest, &mut trials);
    let writer = RunWriter::create(out)?;
    write_manifest(out, &manifest)?;
    for t in &trials {
        writer.trial(t);
    }
    for s in &shards {
        copy_turns(&s.dir, &writer)?;
    }
    writer.finish()?;
    for s in &shards {
        copy_provenance(&s.dir, out, &trials)?;
    }
    Ok(write_summaries(out, &manifest, &mut trials)?)
}

/// Open every folder and check they are the N shards of one set, each once; returns them in shard order.
fn check_set(dirs: &[PathBuf]) -> Result<Vec<ShardRun>, MergeError> {
    let mut by_index: BTreeMap<usize, ShardRun> = BTreeMap::new();
    let mut first: Option<(PathBuf, ShardInfo)> = None;
    for dir in dirs {
        let s = open_shard(dir)?;
        if let Some((fdir, f)) = &first {
            if s.info.count != f.count {
                let why =
                    format!("shard {}/{}, but {} is one of {}", s.info.index, s.info.count, fdir.display(), f.count);
                return Err(refuse(dir, why));
            }
            if s.info.set != f.set {
                let why = format!(
                    "a shard of another run than {} (scenario files, kvproof or engine versions, or --fault differ)",
                    fdir.display()
                );
                return Err(refuse(dir, why));
            }
        } else {
            first = Some((dir.clone(), s.info.clone()));
        }
        if let Some(other) = by_index.get(&s.info.index) {
            let why = format!("shard {}/{} again (also {})", s.info.index, s.info.count, other.dir.display());
            return Err(refuse(dir, why));
        }
        by_index.insert(s.info.index, s);
    }
    let Some((_, f)) = first else {
        return Err(MergeError::Missing { missing: "all".into(), count: 0 });
    };
    let missing: Vec<String> = (1..=f.count).filter(|k| !by_index.contains_key(k)).map(|k| k.to_string()).collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing { missing: missing.join(", "), count: f.count });
    }
    Ok(by_index.into_values().collect())
}

/// Each scenario's plans and planned trials, summed over the shards, must be the set's totals.
fn check_counts(shards: &[ShardRun], totals: &[ScenarioTotals]) -> Result<(), MergeError> {
    for t in totals {
        let (mut plans, mut planned) = (0usize, 0usize);
        for s in shards {
            if let Some(e) = s.manifest.scenarios.iter().find(|e| e.name == t.name) {
                plans = plans.saturating_add(e.plans);
                planned = planned.saturating_add(e.planned_trials);
            }
        }
        if (plans, planned) != (t.plans, t.planned_trials) {
            return Err(refuse(
                &shards[0].dir,
                format!(
                    "run.json: scenario `{}`: the shards plan {plans} plans and {planned} trials, the set {} and {}",
                    t.name, t.plans, t.planned_trials
                ),
            ));
        }
    }
    Ok(())
}

/// The unsharded run's manifest: shard 1's, with the whole set's counts, the earliest start and the latest finish.
fn merged_manifest(shards: &[ShardRun], out: &Path, command: Vec<String>) -> Manifest {
    let mut m = shards[0].manifest.clone();
    let totals = shards[0].info.totals.clone();
    m.run = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
    m.command = command;
    m.started_unix = shards.iter().map(|s| s.manifest.started_unix).min().unwrap_or(m.started_unix);
    m.finished_unix =
        shards.iter().map(|s| s.manifest.finished_unix).collect::<Option<Vec<u64>>>().and_then(|f| f.into_iter().max());
    for e in &mut m.scenarios {
        if let Some(t) = totals.iter().find(|t| t.name == e.name) {
            (e.plans, e.planned_trials) = (t.plans, t.planned_trials);
        }
    }
    m.shard = None;
    m
}

/// Append a shard's turns.csv rows (none when it has no such file).
fn copy_turns(dir: &Path, writer: &RunWriter) -> Result<(), MergeError> {
    let path = dir.join(TURNS);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(());
    }
    let file = safe_file::open_regular(&path)?;
    let len = file.metadata().map_err(|source| ReportError::Io { path: path.clone(), source })?.len();
    if len > MAX_TURNS_BYTES {
        return Err(refuse(
            dir,
            format!("{TURNS}: {len} bytes, more than the {} MiB a run writes", MAX_TURNS_BYTES >> 20),
        ));
    }
    let mut reader = csv::Reader::from_reader(file.take(MAX_TURNS_BYTES));
    for (i, row) in reader.deserialize::<TurnRow>().enumerate() {
        // line 1 is the header
        let row = row.map_err(|e| refuse(dir, format!("{TURNS}:{}: {e}", i + 2)))?;
        writer.turn(&row);
    }
    Ok(())
}

/// Copy the provenance folders that trials of `dir` name into `out` (the same relative folder).
fn copy_provenance(dir: &Path, out: &Path, trials: &[TrialRecord]) -> Result<(), MergeError> {
    let named: BTreeSet<&str> = trials.iter().filter_map(|t| t.provenance.as_ref()).map(|p| p.dir.as_str()).collect();
    for rel in named {
        let Ok(from) = safe_file::resolve_inside(dir, rel) else { continue };
        if !from.is_dir() {
            continue; // another shard's capture
        }
        let to = safe_file::resolve_inside(out, rel).map_err(|e| refuse(dir, format!("provenance.dir: {e}")))?;
        // every folder on the way, each a real folder (resolve_inside allowed plain names only)
        let mut at = out.to_path_buf();
        for part in Path::new(rel).components() {
            at.push(part);
            safe_file::ensure_dir(&at)?;
        }
        for name in crate::provenance::capture::FILES {
            let src = from.join(name);
            match std::fs::symlink_metadata(&src) {
                Ok(m) if m.is_file() => {}
                _ => continue,
            }
            let dst = to.join(name);
            if std::fs::symlink_metadata(&dst).is_ok() {
                return Err(refuse(dir, format!("{}: two shards captured `{rel}`", dst.display())));
            }
            std::fs::copy(&src, &dst).map_err(|source| ReportError::Io { path: dst.clone(), source })?;
        }
    }
    Ok(())
}
