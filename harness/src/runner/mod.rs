//! The runner: from a scenario's plans to trial records. `instances` is the instance layer every kind drives
//! (roles, request ids, launching and replacing instances, turn rows); `plan_state` builds each step's request on
//! its slot and thread and keeps what the oracle and the memory check know of the warm instance. Kinds:
//! `paired` (boundary matrices, stress pairs, semantic staleness — with `staleness`'s extra probes) and `growth`
//! (growth-curve passes). `kvproof investigate` and `kvproof dump` replay plans through `paired::run_plan`. A run
//! selects the plans of its `shard` and hands them, one unit each, to `workers` (`--jobs`).

pub mod agentic;
pub mod growth;
pub mod guard;
pub mod instances;
pub mod paired;
pub mod plan_state;
pub mod shard;
pub mod staleness;
pub mod workers;

use crate::cases::{self, Plan, Skipped};
use crate::driver::{self, DriverError, Launcher};
use crate::progress::Progress;
use crate::record::{Sink, TrialRecord};
use crate::scenario::{Kind, Params, Scenario};

/// A scenario with its engine started and its plans generated.
pub struct Prepared<'a> {
    pub scenario: &'a Scenario,
    pub launcher: Box<dyn Launcher>,
    pub plans: Vec<Plan>,
    pub skipped: Vec<Skipped>,
    /// The indexes of the plans this run runs (all of them unless a shard selects some).
    pub selected: Vec<usize>,
}

impl Prepared<'_> {
    /// Turns of the selected plans.
    pub fn turns(&self) -> usize {
        self.selected_plans().map(|p| p.steps.len()).sum()
    }
    /// Compared turns (trials) of the selected plans.
    pub fn compared(&self) -> usize {
        self.selected_plans().map(Plan::compared).sum()
    }
    fn selected_plans(&self) -> impl Iterator<Item = &Plan> {
        self.selected.iter().filter_map(|&i| self.plans.get(i))
    }
    /// Keep only the plans `shard` owns.
    pub fn select(&mut self, shard: shard::Shard) {
        let name = &self.scenario.name;
        self.selected.retain(|&i| shard.owns(name, i));
    }
}

/// Start the scenario's engine (with `fault` overriding a bundled engine's) and generate its plans.
pub fn prepare<'a>(
    scenario: &'a Scenario,
    fault: Option<Option<kvproof_engines::fault::Fault>>,
) -> Result<Prepared<'a>, DriverError> {
    let launcher = driver::launcher_for(&scenario.engine, fault)?;
    // a value the started engine cannot take is the scenario's error, reported before any trial runs
    cases::inputs::check(scenario, launcher.info()).map_err(DriverError::Unsupported)?;
    let (plans, skipped) = cases::plans(scenario, launcher.info(), launcher.caps());
    let selected = (0..plans.len()).collect();
    Ok(Prepared { scenario, launcher, plans, skipped, selected })
}

/// Run plan `plan_index` of a prepared scenario, one unit of `workers`; its records go to `sink` in step order.
pub fn run_unit(p: &Prepared<'_>, plan_index: usize, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let Some(plan) = p.plans.get(plan_index) else { return Vec::new() };
    match (&p.scenario.kind, &p.scenario.params) {
        (Kind::GrowthCurve, _) => growth::run_one(p, plan_index, sink, progress),
        (Kind::Agentic, Params::Agentic(params)) => {
            agentic::run_session(&paired::Paired::new(p, sink, progress), params, plan_index, plan, &mut paired::NoTap)
        }
        (Kind::Agentic, _) => Vec::new(),
        (Kind::BoundaryMatrix | Kind::StressPairs | Kind::SemanticStaleness, _) => {
            paired::run_plan(&paired::Paired::new(p, sink, progress), plan_index, plan, &mut paired::NoTap)
        }
    }
}

/// Run every plan of a prepared scenario; records go to `sink` as they complete and are also returned.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    match p.scenario.kind {
        Kind::GrowthCurve => growth::run(p, sink, progress),
        Kind::Agentic => agentic::run(p, sink, progress),
        Kind::BoundaryMatrix | Kind::StressPairs | Kind::SemanticStaleness => paired::run(p, sink, progress),
    }
}
