//! Where the sweep's minutes go, per engine: each pass's wall time split between the engines of its scenarios in
//! proportion to their trials' engine time (a pass on one engine is all that engine's).

use std::collections::BTreeMap;

use super::{MutantRow, MutantsReport};

/// One engine's share of the sweep's wall time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineTime {
    pub engine: String,
    /// Its share of the clean pass, in seconds.
    pub clean_s: f64,
    /// Its share of the fault passes, in seconds.
    pub faults_s: f64,
    /// Fault passes that ran a scenario on it.
    pub fault_passes: usize,
}

/// Per engine, sorted by name.
pub fn engine_times(report: &MutantsReport) -> Vec<EngineTime> {
    let mut by: BTreeMap<String, EngineTime> = BTreeMap::new();
    for (engine, s) in shares(&report.clean) {
        by.entry(engine.clone()).or_insert_with(|| EngineTime { engine, ..Default::default() }).clean_s += s;
    }
    for row in &report.faults {
        for (engine, s) in shares(row) {
            let t = by.entry(engine.clone()).or_insert_with(|| EngineTime { engine, ..Default::default() });
            t.faults_s += s;
            t.fault_passes += 1;
        }
    }
    by.into_values().collect()
}

/// A pass's wall time split between its engines by engine time (evenly when none was measured).
fn shares(row: &MutantRow) -> BTreeMap<String, f64> {
    let mut ms: BTreeMap<String, f64> = BTreeMap::new();
    for o in &row.outcomes {
        *ms.entry(o.engine.clone()).or_default() += o.engine_ms;
    }
    let total: f64 = ms.values().sum();
    let n = ms.len() as f64;
    ms.into_iter()
        .map(|(engine, m)| {
            let share = if total > 0.0 { m / total } else { 1.0 / n };
            (engine, row.seconds * share)
        })
        .collect()
}
