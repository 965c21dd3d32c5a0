//! Which scenarios each fault's pass runs: with `--full`, every scenario the fault applies to; otherwise the
//! cheapest killer the kill map records for it, but only when the map can be trusted for that fault. Any doubt (no
//! map, a map that does not parse, no entry, a named scenario gone, changed or no longer applicable) runs the
//! fault's full set and says why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvproof_engines::fault::Fault;

use super::fingerprint;
use super::kill_map::{KillMap, KillMapError, ScenarioPrint};
use crate::scenario::Scenario;

/// Where the fault passes' scenarios come from.
#[derive(Debug)]
pub enum Source {
    /// Every applicable scenario per fault (`--full`).
    Full,
    /// A kill map, as read from `path` (`None`: no file there).
    Map { path: PathBuf, map: Result<Option<KillMap>, KillMapError> },
    /// No map to read (several paths and no `--kills`): every applicable scenario, for this reason.
    Unmapped { reason: String },
}

/// Why a fault's pass runs what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// `--full`: every applicable scenario.
    Full,
    /// The map's cheapest killer, out of `killers` recorded.
    FromMap { scenario: String, killers: usize },
    /// The map could not be trusted for this fault: every applicable scenario.
    Fallback { reason: String },
}

impl Selection {
    /// One line for the summary.
    pub fn describe(&self) -> String {
        match self {
            Selection::Full => "full sweep".into(),
            Selection::FromMap { scenario, killers } => {
                format!("kill map: {scenario} (cheapest of {killers} recorded killer{})", plural(*killers))
            }
            Selection::Fallback { reason } => format!("every applicable scenario: {reason}"),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// One fault's pass: the scenarios to run under it and why.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    pub fault: Fault,
    pub scenarios: Vec<Scenario>,
    pub selection: Selection,
}

/// Every scenario's file fingerprint by name, or why it could not be read.
pub fn prints(scenarios: &[Scenario]) -> BTreeMap<String, Result<ScenarioPrint, String>> {
    scenarios
        .iter()
        .map(|s| {
            let file = s.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let print = fingerprint::sha256_of_file(&s.path)
                .map(|sha256| ScenarioPrint { file, sha256 })
                .map_err(|e| format!("cannot read {}: {e}", s.path.display()));
            (s.name.clone(), print)
        })
        .collect()
}

/// The pass of every fault, in the order given.
pub fn plan(scenarios: &[Scenario], faults: &[Fault], source: &Source) -> Vec<FaultPlan> {
    let prints = prints(scenarios);
    faults
        .iter()
        .map(|&fault| {
            let applicable: Vec<Scenario> = scenarios.iter().filter(|s| super::applies(s, fault)).cloned().collect();
            let selection = match source {
                Source::Full => Selection::Full,
                Source::Map { path, map } => choose(path, map, fault, &applicable, &prints),
                Source::Unmapped { reason } => Selection::Fallback { reason: reason.clone() },
            };
            let chosen = match &selection {
                Selection::FromMap { scenario, .. } => applicable.into_iter().filter(|s| &s.name == scenario).collect(),
                Selection::Full | Selection::Fallback { .. } => applicable,
            };
            FaultPlan { fault, scenarios: chosen, selection }
        })
        .collect()
}

/// The map's cheapest killer of `fault`, when every killer it names is among `applicable` with the recorded
/// content; otherwise why not.
fn choose(
    path: &std::path::Path,
    map: &Result<Option<KillMap>, KillMapError>,
    fault: Fault,
    applicable: &[Scenario],
    prints: &BTreeMap<String, Result<ScenarioPrint, String>>,
) -> Selection {
    let at = path.display();
    let fallback = |reason: String| Selection::Fallback { reason };
    let map = match map {
        Ok(Some(map)) => map,
        Ok(None) => return fallback(format!("no kill map at {at}")),
        Err(e) => return fallback(e.to_string()),
    };
    let Some(kills) = map.faults.get(fault.name()) else {
        return fallback(format!("{at} has no entry faults.{}", fault.name()));
    };
    if kills.killers.is_empty() {
        return fallback(format!(
            "{at}: faults.{}.killers is empty (nothing killed it in the full sweep)",
            fault.name()
        ));
    }
    for k in &kills.killers {
        let name = &k.scenario;
        if !applicable.iter().any(|s| &s.name == name) {
            return fallback(format!(
                "{at}: faults.{} names scenario {name}, which is not among the scenarios this fault applies to",
                fault.name()
            ));
        }
        let recorded = map.scenarios.get(name).map(|p| p.sha256.as_str());
        match prints.get(name) {
            Some(Ok(now)) if Some(now.sha256.as_str()) == recorded => {}
            Some(Err(why)) => return fallback(why.clone()),
            _ => {
                return fallback(format!(
                    "scenario {name} changed since {at} was recorded (scenarios.{name}.sha256 differs)"
                ))
            }
        }
    }
    let cheapest =
        kills.killers.iter().min_by(|a, b| a.cost_ms.cmp(&b.cost_ms).then_with(|| a.scenario.cmp(&b.scenario)));
    let cheapest = cheapest.expect("killers is not empty");
    Selection::FromMap { scenario: cheapest.scenario.clone(), killers: kills.killers.len() }
}
