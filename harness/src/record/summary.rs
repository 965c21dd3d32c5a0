//! A run's verdict as data: per scenario, the trial counts, the failure-rate bound, per-check counts, reuse and
//! time, growth and staleness numbers, and why it failed. `check::scenario` computes it from the trial records;
//! the reports render it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{AgenticStats, CheckName, GrowthStats, StalenessStats};
use crate::stats::Bound;

/// Pass / fail / skipped counts of one check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckCounts {
    pub pass: usize,
    pub fail: usize,
    pub skipped: usize,
}

/// Reuse and time over a scenario's compared turns: what reuse buys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReuseTotals {
    pub prompt_tokens: usize,
    /// Positions the engine reported reusing, over every trial that reported a count (with or without an
    /// expectation: an engine kvproof has no rule for still shows what it reuses).
    pub reused: usize,
    /// Prompt tokens of the trials that reported a count (the share's denominator).
    #[serde(default)]
    pub reported_prompt_tokens: usize,
    /// The oracle's count, over the trials that have one.
    pub expected: usize,
    /// Trials with an expectation, and what the engine reported on exactly those.
    #[serde(default)]
    pub expected_trials: usize,
    #[serde(default)]
    pub reused_where_expected: usize,
    pub warm_ms: f64,
    pub cold_ms: f64,
}

/// Where warm and cold part, how confident the reference was: the top-2 gap at every first divergence, against the
/// near-tie threshold (the scenario's, or the engine's own 5th percentile of gaps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GapStats {
    /// The gap at each first divergence that had one, ascending.
    pub at_divergence: Vec<f32>,
    pub threshold: Option<f32>,
    /// "set by the scenario", or "the engine's 5th percentile of N cold gaps".
    pub threshold_source: String,
    /// First divergences whose gap is below the threshold.
    pub near_ties: usize,
}

impl GapStats {
    /// Whether a divergence at `gap` is a near-tie.
    pub fn is_near_tie(&self, gap: f32) -> bool {
        self.threshold.is_some_and(|t| gap < t)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioSummary {
    pub name: String,
    pub kind: String,
    pub engine: String,
    pub planned: usize,
    pub trials: usize,
    pub passed: usize,
    pub failed: usize,
    pub inconclusive: usize,
    pub errors: usize,
    /// One-sided upper bound on the failure rate over conclusive trials (passed + failed).
    pub bound: Option<Bound>,
    pub max_failure_rate: Option<f64>,
    pub pass: bool,
    /// Why the scenario failed.
    pub reasons: Vec<String>,
    pub checks: BTreeMap<CheckName, CheckCounts>,
    /// The top-2 gaps where warm and cold parted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gaps: Option<GapStats>,
    /// The checks the scenario requires (`assert.require`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<CheckName>,
    /// Skip reasons per check, with how often each occurred.
    pub skip_reasons: BTreeMap<String, usize>,
    pub skipped_cases: Vec<(String, String)>,
    pub reuse: ReuseTotals,
    /// The checks that failed somewhere in this scenario (what caught a fault).
    pub caught_by: BTreeSet<CheckName>,
    /// growth-curve: slopes, ratios, speedup against the ideal, and the growth assertions that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthStats>,
    /// semantic-staleness: fresh / stale / corrupt counts per context, with bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness: Option<StalenessStats>,
    /// agentic: per task, turns, tool calls, assertion rates warm and cold with bounds, and reuse accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<AgenticStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub run: String,
    pub fault: Option<String>,
    pub pass: bool,
    pub scenarios: Vec<ScenarioSummary>,
}

impl Summary {
    /// Every check that failed in any scenario, plus `error` when an engine died (as the mutants table shows).
    pub fn caught_by(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> =
            self.scenarios.iter().flat_map(|s| s.caught_by.iter().map(|c| c.name().to_string())).collect();
        if self.scenarios.iter().any(|s| s.errors > 0) {
            out.insert("error".into());
        }
        if self.scenarios.iter().any(|s| s.growth.as_ref().is_some_and(|g| !g.violations.is_empty())) {
            out.insert("growth".into());
        }
        out
    }
}
