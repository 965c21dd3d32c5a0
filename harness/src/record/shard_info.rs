//! A shard's part of `run.json`: which shard of how many, the identity of the whole scenario set, and each
//! scenario's totals over every shard — what `kvproof merge` checks before it combines shard folders.

use serde::{Deserialize, Serialize};

use super::{Manifest, ScenarioEntry};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// K of `--shard K/N` (1-based).
    pub index: usize,
    /// N of `--shard K/N`.
    pub count: usize,
    /// sha256 of what every shard of one run must share (see [`set_identity`]).
    pub set: String,
    /// Every scenario's plans and planned trials in the whole set (the run's own entries count this shard's).
    pub totals: Vec<ScenarioTotals>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScenarioTotals {
    pub name: String,
    pub plans: usize,
    pub planned_trials: usize,
}

/// The identity of a sharded run's whole set: kvproof and engine versions, the fault override, and every
/// scenario as the manifest records it (file hash, seed, engine, what the engine reported, assertions, skipped
/// cases) with the whole set's totals, in name order — the order files were given in does not matter, and the
/// scenario's path (which differs between checkouts) is left out.
pub fn set_identity(manifest: &Manifest, totals: &[ScenarioTotals]) -> String {
    use sha2::{Digest, Sha256};
    let mut entries: Vec<ScenarioEntry> = manifest
        .scenarios
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.path = Default::default();
            if let Some(t) = totals.iter().find(|t| t.name == e.name) {
                (e.plans, e.planned_trials) = (t.plans, t.planned_trials);
            }
            e
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let what = serde_json::json!({
        "kvproof_version": manifest.kvproof_version,
        "engines_version": manifest.engines_version,
        "fault_override": manifest.fault_override,
        "scenarios": entries,
    });
    format!("{:x}", Sha256::digest(what.to_string().as_bytes()))
}
