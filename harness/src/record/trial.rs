//! One trial: a compared turn (or a plan that could not run), with every check's result and what was measured.
//! A line of results.jsonl; reports are rebuilt from these lines alone.

use serde::{Deserialize, Serialize};

use super::{AgentTurn, CheckResult, Divergence, GrowthTurn, ProvenanceRef, StaleOutcome, StateSummary, Verdict};
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
    /// Each reply token's text in the engine's own vocabulary, kept when the replies differ (the summary's token
    /// diff shows it); empty when the driver reports no text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_pieces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cold_pieces: Vec<String>,
    /// The cold reply's top-2 gap at every token: the engine's own gap distribution, against which a divergence
    /// at a near-tie is told from a confident one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cold_gaps: Vec<f32>,
    pub checks: Vec<CheckResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergence: Option<Divergence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateSummary>,
    /// A text turn whose rendered prompt does not begin with what its conversation fed last turn: why (the
    /// template or the reply's re-tokenization is not prefix-stable — a real cause of lost reuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_note: Option<String>,
    /// The protocol error code both instances refused the turn with, as the case expected (checks that need a
    /// reply could not run on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// What went wrong when the verdict is `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last lines the engine wrote on stderr before it died or hung.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    pub timings: TrialTimings,
    /// Where both dumps and their diff were saved for this failing comparison, and the diff's headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<ProvenanceRef>,
    /// growth-curve: the turn's context, reuse and medians of warm and cold timings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthTurn>,
    /// semantic-staleness: fresh, stale(context) or corrupt, and the hypotheses compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness: Option<StaleOutcome>,
    /// agentic: the turn on the warm and cold trajectories, its tool calls, assertions and reuse accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<AgentTurn>>,
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
            warm_pieces: Vec::new(),
            cold_pieces: Vec::new(),
            cold_gaps: Vec::new(),
            checks: Vec::new(),
            divergence: None,
            state: None,
            prefix_note: None,
            refused: None,
            error: None,
            stderr_tail: None,
            timings: TrialTimings::default(),
            provenance: None,
            growth: None,
            staleness: None,
            agent: None,
        }
    }

    /// The text of token `id` as either reply has it (empty when the driver reported no text).
    pub fn token_text(&self, id: u32) -> String {
        fn find(ids: &[u32], pieces: &[String], id: u32) -> Option<String> {
            ids.iter().position(|&t| t == id).and_then(|i| pieces.get(i)).cloned()
        }
        find(&self.warm_reply, &self.warm_pieces, id)
            .or_else(|| find(&self.cold_reply, &self.cold_pieces, id))
            .unwrap_or_default()
    }

    /// Keep what the replies of `warm` and `cold` say besides their ids: the cold gaps always, each token's text
    /// when the replies differ.
    pub fn keep_reply_detail(
        &mut self,
        warm: Option<&crate::driver::Generation>,
        cold: Option<&crate::driver::Generation>,
    ) {
        let texts = |g: Option<&crate::driver::Generation>| -> Vec<String> {
            g.and_then(|g| g.pieces.as_ref())
                .map(|p| p.iter().map(|b| super::show_piece(b)).collect())
                .unwrap_or_default()
        };
        if let Some(gaps) = cold.and_then(|c| c.gaps.as_ref()) {
            self.cold_gaps = gaps.clone();
        }
        if self.warm_reply != self.cold_reply {
            self.warm_pieces = texts(warm);
            self.cold_pieces = texts(cold);
        }
    }

    /// "plan / step", the trial's name in reports.
    pub fn name(&self) -> String {
        format!("{} / {}", self.plan, self.step)
    }
}
