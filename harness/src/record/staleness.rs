//! A semantic-staleness case as records carry it: what the warm reply was classified as, and the replies each
//! stale hypothesis predicted.

use serde::{Deserialize, Serialize};

use super::{TrialRecord, Verdict};
use crate::stats::{self, Bound};

use crate::scenario::ContextName;

/// What a warm reply was classified as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum Class {
    Fresh,
    Stale,
    Corrupt,
    /// Two cold runs of the current prompt disagree: nothing can be classified.
    Inconclusive,
}

impl Class {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Whether the current prompt is longer than what the stale context fed (a longer prompt overwrites every stale
/// position; a shorter one leaves stale positions past its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    CurrentLonger,
    CurrentShorter,
}

/// One reply a stale context would produce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hypothesis {
    /// "answer" (the stale context's own reply) or "state@N" (a cold run of its first N fed ids, then the
    /// current prompt from N on).
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splice_at: Option<usize>,
    pub reply: Vec<u32>,
    /// The hypothesis predicts the fresh reply: this case cannot tell it from fresh.
    pub equals_fresh: bool,
}

/// The classification of one case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleOutcome {
    pub context: ContextName,
    pub shape: Shape,
    pub class: Class,
    /// The hypothesis the warm reply matched, when stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<String>,
    pub hypotheses: Vec<Hypothesis>,
}

impl StaleOutcome {
    /// Some hypothesis predicts a reply other than the fresh one: a stale reuse would have been visible.
    pub fn distinguishable(&self) -> bool {
        self.hypotheses.iter().any(|h| !h.equals_fresh)
    }

    /// "fresh", "stale(previous-turn)", "corrupt".
    pub fn label(&self) -> String {
        match self.class {
            Class::Stale => format!("stale({})", self.context),
            c => c.name().to_string(),
        }
    }
}

/// Counts of one context (or of all of them), with one-sided upper bounds over the conclusive cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextCounts {
    pub context: String,
    pub cases: usize,
    pub fresh: usize,
    pub stale: usize,
    pub corrupt: usize,
    pub inconclusive: usize,
    /// Cases that could not run (engine error).
    pub errors: usize,
    /// Cases in which some stale hypothesis predicted a reply other than the fresh one.
    pub distinguishable: usize,
    /// Conclusive cases (fresh, stale or corrupt) that were distinguishable: the only ones where a stale reply
    /// could have shown, so the stale rate's denominator.
    #[serde(default)]
    pub distinguishable_conclusive: usize,
    pub stale_bound: Option<Bound>,
    pub corrupt_bound: Option<Bound>,
    pub not_fresh_bound: Option<Bound>,
}

impl ContextCounts {
    pub fn new(context: &str) -> Self {
        ContextCounts {
            context: context.into(),
            cases: 0,
            fresh: 0,
            stale: 0,
            corrupt: 0,
            inconclusive: 0,
            errors: 0,
            distinguishable: 0,
            distinguishable_conclusive: 0,
            stale_bound: None,
            corrupt_bound: None,
            not_fresh_bound: None,
        }
    }

    /// Count one case.
    pub fn add(&mut self, t: &TrialRecord) {
        self.cases += 1;
        let Some(o) = &t.staleness else {
            self.errors += usize::from(t.verdict == Verdict::Error);
            return;
        };
        match o.class {
            Class::Fresh => self.fresh += 1,
            Class::Stale => self.stale += 1,
            Class::Corrupt => self.corrupt += 1,
            Class::Inconclusive => self.inconclusive += 1,
        }
        self.distinguishable += usize::from(o.distinguishable());
        self.distinguishable_conclusive += usize::from(o.distinguishable() && o.class != Class::Inconclusive);
    }

    /// The bounds over the conclusive cases counted.
    pub fn bound(&mut self, confidence: f64) {
        let n = (self.fresh + self.stale + self.corrupt) as u64;
        let b = |k: usize, n: u64| stats::one_sided(k as u64, n, confidence).ok();
        // A stale reply can only show where some hypothesis differs from the fresh reply; any case can show a
        // corrupt one.
        self.stale_bound = b(self.stale, self.distinguishable_conclusive as u64);
        self.corrupt_bound = b(self.corrupt, n);
        self.not_fresh_bound = b(self.stale + self.corrupt, n);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StalenessStats {
    /// Confidence of every bound (the scenario's).
    pub confidence: f64,
    pub contexts: Vec<ContextCounts>,
    pub total: ContextCounts,
}
