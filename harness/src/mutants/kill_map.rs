//! The kill map (`scenarios/pr/kills.json`): for each fault, the scenarios that killed it in a full sweep, what
//! each cost and which checks caught it, and the content hash of every scenario the sweep ran. The gate runs, per
//! fault, only the cheapest recorded killer; the nightly's full sweep fails when the recorded killer sets differ
//! from what it learns. Schema: docs/mutants.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::MutantsReport;

/// The map's format version; another version is refused (and its faults run their full sets).
pub const KILL_MAP_SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillMap {
    /// Format version (1).
    pub schema: u32,
    /// The command that recorded the map.
    pub recorded_by: String,
    /// Every scenario of the full sweep by name: its file and the sha256 of the file's bytes.
    pub scenarios: BTreeMap<String, ScenarioPrint>,
    /// Per fault, the scenarios that killed it (sorted by name); empty when none did.
    pub faults: BTreeMap<String, FaultKills>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioPrint {
    /// The scenario file's name.
    pub file: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultKills {
    pub killers: Vec<Killer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Killer {
    pub scenario: String,
    /// The engine time of the scenario's trials under the fault (warm + cold + control), in milliseconds: what
    /// choosing it costs the gate.
    pub cost_ms: u64,
    /// The checks that failed (plus `error` when the engine died).
    pub caught_by: BTreeSet<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KillMapError {
    #[error("{}: cannot read the kill map: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not a kill map: {source}", path.display())]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{}: field `{field}`: {message}", path.display())]
    Field { path: PathBuf, field: String, message: String },
}

impl KillMap {
    /// Read and check a map; `Ok(None)` when there is no file at `path`.
    pub fn load(path: &Path) -> Result<Option<KillMap>, KillMapError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(KillMapError::Read { path: path.to_path_buf(), source }),
        };
        Self::parse(path, &text).map(Some)
    }

    /// Parse a map's text (`path` names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<KillMap, KillMapError> {
        let map: KillMap =
            serde_json::from_str(text).map_err(|source| KillMapError::Parse { path: path.to_path_buf(), source })?;
        let field = |field: String, message: String| KillMapError::Field { path: path.to_path_buf(), field, message };
        if map.schema != KILL_MAP_SCHEMA {
            return Err(field("schema".into(), format!("version {} is not {KILL_MAP_SCHEMA}", map.schema)));
        }
        for (name, print) in &map.scenarios {
            if print.sha256.len() != 64 || !print.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(field(format!("scenarios.{name}.sha256"), "not a sha256 in hex".into()));
            }
        }
        for (fault, kills) in &map.faults {
            for (i, k) in kills.killers.iter().enumerate() {
                if !map.scenarios.contains_key(&k.scenario) {
                    return Err(field(
                        format!("faults.{fault}.killers[{i}].scenario"),
                        format!("`{}` is not listed under `scenarios`", k.scenario),
                    ));
                }
            }
        }
        Ok(map)
    }

    /// What a full sweep learned: every fault's killers with their cost and checks. `prints` fingerprints every
    /// scenario of the sweep by name.
    pub fn learn(report: &MutantsReport, prints: BTreeMap<String, ScenarioPrint>, recorded_by: &str) -> KillMap {
        let faults = report
            .faults
            .iter()
            .map(|row| {
                let mut killers: Vec<Killer> = row
                    .outcomes
                    .iter()
                    .filter(|o| o.killed)
                    .map(|o| Killer {
                        scenario: o.scenario.clone(),
                        cost_ms: o.engine_ms.round() as u64,
                        caught_by: o.caught_by.clone(),
                    })
                    .collect();
                killers.sort_by(|a, b| a.scenario.cmp(&b.scenario));
                (row.fault.clone(), FaultKills { killers })
            })
            .collect();
        KillMap { schema: KILL_MAP_SCHEMA, recorded_by: recorded_by.to_string(), scenarios: prints, faults }
    }

    /// The map as written to disk: pretty JSON, one field a line, keys sorted.
    pub fn to_json(&self) -> String {
        format!("{}\n", serde_json::to_string_pretty(self).expect("a kill map serializes"))
    }

    /// How `self` (recorded) differs from `learned`, in the terms that decide what the gate runs: a fault's
    /// killer set, a scenario's hash, a fault or scenario only one of them has. Costs and checks are not compared
    /// (they vary by machine and do not change which scenarios kill). Empty when the recorded map is current.
    pub fn staleness(&self, learned: &KillMap) -> Vec<String> {
        let mut out = Vec::new();
        for name in self.scenarios.keys().chain(learned.scenarios.keys()).collect::<BTreeSet<_>>() {
            match (self.scenarios.get(name), learned.scenarios.get(name)) {
                (Some(a), Some(b)) if a.sha256 != b.sha256 => out.push(format!("scenario {name}: content changed")),
                (Some(_), None) => out.push(format!("scenario {name}: recorded but not in this sweep")),
                (None, Some(_)) => out.push(format!("scenario {name}: in this sweep but not recorded")),
                _ => {}
            }
        }
        let killers = |k: &FaultKills| k.killers.iter().map(|k| k.scenario.clone()).collect::<BTreeSet<_>>();
        for fault in self.faults.keys().chain(learned.faults.keys()).collect::<BTreeSet<_>>() {
            match (self.faults.get(fault), learned.faults.get(fault)) {
                (Some(a), Some(b)) if killers(a) != killers(b) => out.push(format!(
                    "fault {fault}: recorded killers [{}], this sweep's [{}]",
                    killers(a).into_iter().collect::<Vec<_>>().join(", "),
                    killers(b).into_iter().collect::<Vec<_>>().join(", ")
                )),
                (Some(_), None) => out.push(format!("fault {fault}: recorded but not in this sweep")),
                (None, Some(_)) => out.push(format!("fault {fault}: in this sweep but not recorded")),
                _ => {}
            }
        }
        out
    }
}
