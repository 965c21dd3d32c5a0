//! The runner: from a scenario's plans to trial records. `instances` is the instance layer every kind drives
//! (roles, request ids, launching and replacing instances, turn rows); `plan_state` builds each step's request on
//! its slot and thread and keeps what the oracle and the memory check know of the warm instance. Kinds:
//! `paired` (boundary matrices, stress pairs, semantic staleness — with `staleness`'s extra probes) and `growth`
//! (growth-curve passes). `kvproof investigate` and `kvproof dump` replay plans through `paired::run_plan`.

pub mod agentic;
pub mod growth;
pub mod guard;
pub mod instances;
pub mod paired;
pub mod plan_state;
pub mod staleness;

use crate::cases::{self, Plan, Skipped};
use crate::driver::{self, DriverError, Launcher};
use crate::progress::Progress;
use crate::record::{Sink, TrialRecord};
use crate::scenario::{Kind, Scenario};

/// A scenario with its engine started and its plans generated.
pub struct Prepared<'a> {
    pub scenario: &'a Scenario,
    pub launcher: Box<dyn Launcher>,
    pub plans: Vec<Plan>,
    pub skipped: Vec<Skipped>,
}

impl Prepared<'_> {
    pub fn turns(&self) -> usize {
        self.plans.iter().map(|p| p.steps.len()).sum()
    }
    pub fn compared(&self) -> usize {
        self.plans.iter().map(Plan::compared).sum()
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
    Ok(Prepared { scenario, launcher, plans, skipped })
}

/// Run every plan of a prepared scenario; records go to `sink` as they complete and are also returned.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    match p.scenario.kind {
        Kind::GrowthCurve => growth::run(p, sink, progress),
        Kind::Agentic => agentic::run(p, sink, progress),
        Kind::BoundaryMatrix | Kind::StressPairs | Kind::SemanticStaleness => paired::run(p, sink, progress),
    }
}
