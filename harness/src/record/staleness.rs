//! A semantic-staleness case as records carry it: what the warm reply was classified as, and the replies each
//! stale hypothesis predicted.

use serde::{Deserialize, Serialize};

use crate::scenario::ContextName;

/// What a warm reply was classified as.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "kebab-case")]
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
