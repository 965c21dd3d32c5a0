//! `run.json`: everything a run depended on (versions, seeds, engine configurations, fault, machine) and what
//! each scenario required, so a report can be rebuilt and a verdict re-derived without rerunning anything.

use std::path::PathBuf;

use kvproof_engines::engine::EngineInfo;
use serde::{Deserialize, Serialize};

use crate::cases::Skipped;
use crate::driver::Caps;
use crate::scenario::{Assertions, EngineSpec, Kind, Scenario};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub os: String,
    pub arch: String,
    pub cpus: usize,
    pub hostname: Option<String>,
}

impl Machine {
    pub fn current() -> Self {
        let hostname =
            std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
        Machine {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            hostname,
        }
    }
}

/// One scenario as it was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioEntry {
    pub name: String,
    pub path: PathBuf,
    /// sha256 of the scenario file's bytes.
    pub sha256: String,
    pub kind: Kind,
    pub seed: u64,
    /// The engine as the file names it.
    pub engine: EngineSpec,
    /// The engine as it ran (fault override applied), and what it reported about itself.
    pub engine_label: String,
    pub fault: Option<String>,
    pub engine_info: EngineInfo,
    pub caps: Caps,
    pub assertions: Assertions,
    pub plans: usize,
    /// Compared turns planned (each one trial).
    pub planned_trials: usize,
    pub skipped: Vec<Skipped>,
}

impl ScenarioEntry {
    pub fn new(
        s: &Scenario,
        engine_label: String,
        engine_info: EngineInfo,
        caps: Caps,
        plans: usize,
        planned_trials: usize,
        skipped: Vec<Skipped>,
    ) -> Self {
        use sha2::{Digest, Sha256};
        let sha256 = std::fs::read(&s.path).map(|b| format!("{:x}", Sha256::digest(b))).unwrap_or_default();
        ScenarioEntry {
            name: s.name.clone(),
            path: s.path.clone(),
            sha256,
            kind: s.kind,
            seed: s.seed,
            engine: s.engine.clone(),
            engine_label,
            fault: engine_info.fault.clone(),
            engine_info,
            caps,
            assertions: s.assertions.clone(),
            plans,
            planned_trials,
            skipped,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub run: String,
    pub kvproof_version: String,
    pub engines_version: String,
    /// The command line, as given.
    pub command: Vec<String>,
    /// `--fault` as given (overrides the scenarios' for bundled engines); "none" forces clean engines.
    pub fault_override: Option<String>,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    pub machine: Machine,
    pub scenarios: Vec<ScenarioEntry>,
    /// `--shard K/N`: this run is one shard of a set (its entries count this shard's plans and trials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<super::ShardInfo>,
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `YYYYMMDD-HHMMSS` (UTC) for a Unix time: run folder names that sort by time. A time past the year 9999
/// (which the format has no room for) is written as its plain number of seconds.
pub fn stamp(unix: u64) -> String {
    use chrono::Datelike as _;
    i64::try_from(unix)
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
        .filter(|t| t.year() <= 9999)
        .map_or_else(|| unix.to_string(), |t| t.format("%Y%m%d-%H%M%S").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_civil_time() {
        assert_eq!(stamp(0), "19700101-000000");
        assert_eq!(stamp(951_782_400), "20000229-000000");
        assert_eq!(stamp(1_700_000_000), "20231114-221320");
        assert_eq!(stamp(1_764_401_468), "20251129-073108");
        assert_eq!(stamp(253_402_300_799), "99991231-235959");
    }

    #[test]
    fn a_time_no_calendar_holds_is_written_as_seconds() {
        assert_eq!(stamp(253_402_300_800), "253402300800");
        assert_eq!(stamp(u64::MAX), u64::MAX.to_string());
    }
}
