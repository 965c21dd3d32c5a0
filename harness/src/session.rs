//! A whole run: start every scenario's engine, run the plans, stream the artifacts, and derive the verdict.
//! The CLI's `run` and every pass of `mutants` go through here.

use std::path::{Path, PathBuf};

use kvproof_engines::fault::Fault;

use crate::driver::DriverError;
use crate::progress::Progress;
use crate::record::Summary;
use crate::record::TrialRecord;
use crate::record::{self as manifest, Machine, Manifest, ScenarioEntry, ScenarioTotals, ShardInfo};
use crate::report::{self, ReportError, RunWriter};
use crate::runner;
use crate::runner::shard::Shard;
use crate::scenario::{EngineSpec, Scenario};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    // `error` is no `source`: the message carries it already, and a chain printer would repeat it
    #[error("{path}: scenario `{scenario}`: {error}")]
    Engine { scenario: String, path: PathBuf, error: DriverError },
    #[error("{path}: scenario `{scenario}`: {message}")]
    Fault { scenario: String, path: PathBuf, message: String },
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run folder (created).
    pub out: PathBuf,
    /// `Some(f)` overrides every bundled engine's fault (`Some(None)`: force clean engines).
    pub fault: Option<Option<Fault>>,
    pub progress: bool,
    /// The command line, for the manifest.
    pub command: Vec<String>,
}

/// How a run spreads its units: which shard of the set it runs, and how many units run side by side.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub shard: Option<Shard>,
    /// Workers (`--jobs`), at least 1.
    pub jobs: usize,
}

impl Default for Spread {
    /// The whole set, as many units at once as the machine has cores.
    fn default() -> Self {
        Spread { shard: None, jobs: default_jobs() }
    }
}

/// Units side by side when `--jobs` is not given: one per core (the plans of a scenario always ran that wide).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A run folder name: `reports/<stamp>` (with a suffix if it exists already).
pub fn default_out(base: &Path, prefix: &str) -> PathBuf {
    let stamp = manifest::stamp(manifest::unix_now());
    let mut dir = base.join(format!("{prefix}{stamp}"));
    let mut n = 1;
    while dir.exists() {
        n += 1;
        dir = base.join(format!("{prefix}{stamp}-{n}"));
    }
    dir
}

fn fault_override_name(fault: Option<Option<Fault>>) -> Option<String> {
    fault.map(|f| f.map_or_else(|| "none".to_string(), |f| f.name().to_string()))
}

/// Check that a fault override applies to every bundled engine it would change.
pub fn check_fault(scenarios: &[Scenario], fault: Option<Option<Fault>>) -> Result<(), SessionError> {
    let Some(Some(f)) = fault else { return Ok(()) };
    for s in scenarios {
        if let EngineSpec::Bundled { arch, .. } = &s.engine {
            kvproof_engines::bundled::check_fault(arch, Some(f)).map_err(|e| SessionError::Fault {
                scenario: s.name.clone(),
                path: s.path.clone(),
                message: format!("--fault: {e}"),
            })?;
        }
    }
    Ok(())
}

/// Run `scenarios` into `opts.out`; returns the verdict and every trial.
pub fn run_scenarios(scenarios: &[Scenario], opts: &RunOptions) -> Result<(Summary, Vec<TrialRecord>), SessionError> {
    run_spread(scenarios, opts, Spread::default())
}

/// Run the units of `scenarios` that `spread.shard` selects, `spread.jobs` at a time, into `opts.out`.
pub fn run_spread(
    scenarios: &[Scenario],
    opts: &RunOptions,
    spread: Spread,
) -> Result<(Summary, Vec<TrialRecord>), SessionError> {
    check_fault(scenarios, opts.fault)?;
    // Start every engine first: a scenario that cannot start is an input error before anything runs.
    let mut prepared = Vec::with_capacity(scenarios.len());
    for s in scenarios {
        let p = runner::prepare(s, opts.fault).map_err(|error| SessionError::Engine {
            scenario: s.name.clone(),
            path: s.path.clone(),
            error,
        })?;
        prepared.push(p);
    }
    // The whole set's totals, before a shard keeps its part.
    let totals: Vec<ScenarioTotals> = prepared
        .iter()
        .map(|p| ScenarioTotals { name: p.scenario.name.clone(), plans: p.plans.len(), planned_trials: p.compared() })
        .collect();
    if let Some(shard) = spread.shard {
        prepared.iter_mut().for_each(|p| p.select(shard));
    }
    let run_name = opts.out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
    let mut manifest = Manifest {
        run: run_name,
        kvproof_version: env!("CARGO_PKG_VERSION").to_string(),
        engines_version: kvproof_engines::VERSION.to_string(),
        command: opts.command.clone(),
        fault_override: fault_override_name(opts.fault),
        started_unix: manifest::unix_now(),
        finished_unix: None,
        machine: Machine::current(),
        scenarios: prepared
            .iter()
            .map(|p| {
                ScenarioEntry::new(
                    p.scenario,
                    p.launcher.label(),
                    p.launcher.info().clone(),
                    p.launcher.caps().clone(),
                    p.selected.len(),
                    p.compared(),
                    p.skipped.clone(),
                )
            })
            .collect(),
        shard: None,
    };
    if let Some(shard) = spread.shard {
        let set = manifest::set_identity(&manifest, &totals);
        manifest.shard = Some(ShardInfo { index: shard.index, count: shard.count, set, totals });
    }
    let writer = RunWriter::create(&opts.out)?;
    report::write_manifest(&opts.out, &manifest)?;
    let total: usize = prepared.iter().map(runner::Prepared::turns).sum();
    let progress = Progress::new(total as u64, opts.progress);
    let mut trials = runner::workers::run_all(&prepared, &writer, &progress, spread.jobs);
    progress.finish();
    writer.finish()?;
    manifest.finished_unix = Some(manifest::unix_now());
    report::write_manifest(&opts.out, &manifest)?;
    let summary = report::write_summaries(&opts.out, &manifest, &mut trials)?;
    Ok((summary, trials))
}
