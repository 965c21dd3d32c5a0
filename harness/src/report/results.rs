//! `results.jsonl`: one line per trial (a compared turn, or a plan that could not run), written and flushed as
//! each trial completes, so a crash loses nothing already decided. Reports are rebuilt from these lines.

use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ReportError;
use crate::check::state::StateDiff;
use crate::check::tokens::Divergence;
use crate::check::{CheckResult, Verdict};
use crate::scenario::Kind;

/// Milliseconds, as reports print them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialTimings {
    pub warm_ms: Option<f64>,
    pub cold_ms: Option<f64>,
    pub control_ms: Option<f64>,
}

/// One trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    pub scenario: String,
    pub kind: Kind,
    /// The case or conversation (e.g. "diverge-last", "conv-0007") and its index in the scenario.
    pub plan: String,
    pub plan_index: usize,
    /// The turn (e.g. "turn 2") and its index in the plan.
    pub step: String,
    pub step_index: usize,
    pub verdict: Verdict,
    /// Whether the warm instance ran this turn before the cold one (pairs alternate).
    pub warm_first: bool,
    pub prompt_tokens: usize,
    pub expected_reuse: Option<usize>,
    pub reused: Option<usize>,
    #[serde(default)]
    pub warm_reply: Vec<u32>,
    #[serde(default)]
    pub cold_reply: Vec<u32>,
    pub checks: Vec<CheckResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergence: Option<Divergence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateDiff>,
    /// What went wrong when the verdict is `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last lines the engine wrote on stderr before it died or hung.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    pub timings: TrialTimings,
    /// Where both dumps and their diff were saved for this failing comparison, and the diff's headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::provenance::ProvenanceRef>,
    /// growth-curve: the turn's context, reuse and medians of warm and cold timings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<super::growth::GrowthTurn>,
    /// semantic-staleness: fresh, stale(context) or corrupt, and the hypotheses compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness: Option<super::staleness::StaleOutcome>,
}

impl TrialRecord {
    /// A trial with nothing decided yet (verdict `error` until checks say otherwise).
    pub fn new(scenario: &str, kind: Kind, plan: &str, plan_index: usize, step: &str, step_index: usize) -> Self {
        TrialRecord {
            scenario: scenario.to_string(),
            kind,
            plan: plan.to_string(),
            plan_index,
            step: step.to_string(),
            step_index,
            verdict: Verdict::Error,
            warm_first: true,
            prompt_tokens: 0,
            expected_reuse: None,
            reused: None,
            warm_reply: Vec::new(),
            cold_reply: Vec::new(),
            checks: Vec::new(),
            divergence: None,
            state: None,
            error: None,
            stderr_tail: None,
            timings: TrialTimings::default(),
            provenance: None,
            growth: None,
            staleness: None,
        }
    }

    /// "plan / step", the trial's name in reports.
    pub fn name(&self) -> String {
        format!("{} / {}", self.plan, self.step)
    }
}

/// Read results.jsonl; a torn last line (a run killed mid-write) is ignored, any other bad line is an error that
/// names its line.
pub fn read(path: &Path) -> Result<Vec<TrialRecord>, ReportError> {
    let file = std::fs::File::open(path).map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<TrialRecord>(line) {
            Ok(t) => out.push(t),
            Err(e) if i + 1 == lines.len() && e.is_eof() => break,
            Err(e) => {
                return Err(ReportError::Parse {
                    path: path.to_path_buf(),
                    line: i + 1,
                    column: e.column(),
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}
