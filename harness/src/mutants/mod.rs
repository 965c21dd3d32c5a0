//! `kvproof mutants`: prove the scenarios catch every bug class they claim to. The scenarios run once on clean
//! engines (which must pass) and then once per fault of each bundled engine they use (each of which must fail):
//! with `--full`, every scenario the fault applies to; otherwise (the gate) only the cheapest scenario the kill
//! map records as killing it. The table says which checks caught each fault; the summary where the time went.

mod fingerprint;
pub mod kill_map;
mod render;
pub mod selection;
mod timing;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kvproof_engines::fault::Fault;
use serde::{Deserialize, Serialize};

pub use kill_map::{KillMap, KillMapError};
pub use render::{render_markdown, render_table, render_times_line, survivor_advice};
pub use selection::{FaultPlan, Selection, Source};
pub use timing::{engine_times, EngineTime};

use crate::record::{Summary, TrialRecord};
use crate::scenario::{EngineSpec, Scenario, Via};
use crate::session::{self, RunOptions, SessionError};

/// One pass of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MutantRow {
    /// The fault's name, or "clean".
    pub fault: String,
    pub description: String,
    /// The scenarios that ran in this pass.
    pub scenarios: Vec<String>,
    /// Whether the run failed (for a fault: caught; for the clean pass: a problem).
    pub failed: bool,
    /// The checks that failed somewhere (plus "error" when an engine died).
    pub caught_by: BTreeSet<String>,
    /// The pass's run folder.
    pub out: PathBuf,
    /// Why the pass ran these scenarios (`Selection::describe`).
    #[serde(default)]
    pub selection: String,
    /// The scenarios came from the kill map (a survivor then means the map is stale).
    #[serde(default)]
    pub from_map: bool,
    /// The pass's wall time, in seconds.
    #[serde(default)]
    pub seconds: f64,
    /// Per scenario: whether it failed, what caught it, its engine time.
    #[serde(default)]
    pub outcomes: Vec<ScenarioOutcome>,
}

/// One scenario of one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioOutcome {
    pub scenario: String,
    /// The engine it ran on, short: arch (or arch/gguf model), " via stdio" when served.
    pub engine: String,
    /// The scenario failed (under a fault: it killed the fault).
    pub killed: bool,
    pub caught_by: BTreeSet<String>,
    /// The engine time of its trials (warm + cold + control), in milliseconds.
    pub engine_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MutantsReport {
    pub clean: MutantRow,
    pub faults: Vec<MutantRow>,
    /// Scenarios whose engine is a command: faults cannot be injected into them.
    pub not_mutated: Vec<String>,
    /// Every applicable scenario ran per fault (`--full`), rather than the kill map's choice.
    #[serde(default)]
    pub full: bool,
    /// The kill map the fault passes were chosen from (none with `--full`).
    #[serde(default)]
    pub kill_map: Option<PathBuf>,
}

impl MutantsReport {
    pub fn survivors(&self) -> Vec<&MutantRow> {
        self.faults.iter().filter(|r| !r.failed).collect()
    }

    /// The clean engines pass and every fault is caught.
    pub fn ok(&self) -> bool {
        !self.clean.failed && self.survivors().is_empty() && !self.faults.is_empty()
    }
}

/// The faults of every bundled engine the scenarios use, in catalog order.
pub fn faults_of(scenarios: &[Scenario]) -> Result<Vec<Fault>, kvproof_engines::EngineError> {
    let mut out = BTreeSet::new();
    for s in scenarios {
        if let EngineSpec::Bundled { arch, .. } = &s.engine {
            out.extend(kvproof_engines::bundled::arch(arch)?.faults.iter().copied());
        }
    }
    Ok(out.into_iter().collect())
}

fn applies(s: &Scenario, f: Fault) -> bool {
    match &s.engine {
        EngineSpec::Bundled { arch, .. } => kvproof_engines::bundled::check_fault(arch, Some(f)).is_ok(),
        EngineSpec::Command { .. } | EngineSpec::Http(_) => false,
    }
}

/// The engine a scenario runs on, short enough for a table: arch (or arch/gguf model), " via stdio" when served.
pub fn engine_of(s: &Scenario) -> String {
    match &s.engine {
        EngineSpec::Bundled { arch, via, gguf, .. } => {
            let mut label = match gguf {
                Some(model) => format!("{arch}/{model}"),
                None => arch.clone(),
            };
            if *via == Via::Stdio {
                label.push_str(" via stdio");
            }
            label
        }
        EngineSpec::Command { .. } => "command".into(),
        EngineSpec::Http(_) => "http".into(),
    }
}

/// Each scenario's verdict, catches and engine time in one run.
fn outcomes(set: &[Scenario], summary: &Summary, trials: &[TrialRecord]) -> Vec<ScenarioOutcome> {
    let mut ms: BTreeMap<&str, f64> = BTreeMap::new();
    for t in trials {
        let time = [t.timings.warm_ms, t.timings.cold_ms, t.timings.control_ms].iter().flatten().sum::<f64>();
        *ms.entry(t.scenario.as_str()).or_default() += time;
    }
    set.iter()
        .map(|s| {
            let summary = summary.scenarios.iter().find(|x| x.name == s.name);
            let mut caught_by: BTreeSet<String> =
                summary.map(|x| x.caught_by.iter().map(|c| c.name().to_string()).collect()).unwrap_or_default();
            if summary.is_some_and(|x| x.errors > 0) {
                caught_by.insert("error".into());
            }
            if summary.is_some_and(|x| x.growth.as_ref().is_some_and(|g| !g.violations.is_empty())) {
                caught_by.insert("growth".into());
            }
            ScenarioOutcome {
                scenario: s.name.clone(),
                engine: engine_of(s),
                killed: summary.is_some_and(|x| !x.pass),
                caught_by,
                engine_ms: ms.get(s.name.as_str()).copied().unwrap_or(0.0),
            }
        })
        .collect()
}

/// The kill map a full sweep learned, fingerprinting every scenario it ran (an unreadable scenario file is an
/// error: a map without its fingerprint could not be trusted).
pub fn learned_map(report: &MutantsReport, scenarios: &[Scenario], recorded_by: &str) -> Result<KillMap, String> {
    let mut prints = BTreeMap::new();
    for (name, print) in selection::prints(scenarios) {
        prints.insert(name, print?);
    }
    Ok(KillMap::learn(report, prints, recorded_by))
}

/// The default kill map of a scenario set: `kills.json` in its folder, when it is one folder.
pub fn default_kill_map(paths: &[PathBuf]) -> Option<PathBuf> {
    match paths {
        [dir] if dir.is_dir() => Some(dir.join("kills.json")),
        _ => None,
    }
}

/// Run the sweep into `out` (one run folder per pass): the clean pass, then each fault's pass with the scenarios
/// `source` selects for it. `on_pass` is told about each finished pass.
pub fn sweep(
    scenarios: &[Scenario],
    out: &Path,
    progress: bool,
    command: &[String],
    source: &Source,
    on_pass: &mut dyn FnMut(&MutantRow),
) -> Result<MutantsReport, SessionError> {
    let faults = faults_of(scenarios).map_err(|e| SessionError::Fault {
        scenario: scenarios.first().map(|s| s.name.clone()).unwrap_or_default(),
        path: scenarios.first().map(|s| s.path.clone()).unwrap_or_default(),
        message: e.to_string(),
    })?;
    let pass = |name: &str, description: &str, set: &[Scenario], fault: Option<Fault>, selection: &Selection| {
        let opts = RunOptions { out: out.join(name), fault: Some(fault), progress, command: command.to_vec() };
        let started = Instant::now();
        let (summary, trials) = session::run_scenarios(set, &opts)?;
        Ok::<MutantRow, SessionError>(MutantRow {
            fault: name.to_string(),
            description: description.to_string(),
            scenarios: set.iter().map(|s| s.name.clone()).collect(),
            failed: !summary.pass,
            caught_by: summary.caught_by(),
            out: opts.out,
            selection: selection.describe(),
            from_map: matches!(selection, Selection::FromMap { .. }),
            seconds: started.elapsed().as_secs_f64(),
            outcomes: outcomes(set, &summary, &trials),
        })
    };
    let clean = pass("clean", "no fault: every scenario must pass", scenarios, None, &Selection::Full)?;
    on_pass(&clean);
    let mut rows = Vec::new();
    for plan in selection::plan(scenarios, &faults, source) {
        let f = plan.fault;
        let row = pass(f.name(), f.describe(), &plan.scenarios, Some(f), &plan.selection)?;
        on_pass(&row);
        rows.push(row);
    }
    let not_mutated =
        scenarios.iter().filter(|s| !matches!(s.engine, EngineSpec::Bundled { .. })).map(|s| s.name.clone()).collect();
    let (full, kill_map) = match source {
        Source::Full => (true, None),
        Source::Map { path, .. } => (false, Some(path.clone())),
        Source::Unmapped { .. } => (false, None),
    };
    Ok(MutantsReport { clean, faults: rows, not_mutated, full, kill_map })
}
