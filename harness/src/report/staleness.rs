//! Semantic staleness: does the warm reply answer the current prompt, or a stale context's? Each warm reply is
//! classified *fresh* (it equals a cold run of the current prompt), *stale(X)* (it equals what stale context X
//! would produce: X's own reply, or a cold run of X's fed ids continued with the current prompt's tail — the state
//! X left behind, read with the new question), or *corrupt* (neither). Counts per context come with exact
//! Clopper–Pearson bounds. Derived from the `staleness` field of results.jsonl alone.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::results::TrialRecord;
use super::ReportError;
use crate::check::Verdict;
use crate::scenario::ContextName;
use crate::stats::{self, Bound};

pub const STALENESS_CSV: &str = "staleness.csv";

/// What a warm reply was classified as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    Fresh,
    Stale,
    Corrupt,
    /// Two cold runs of the current prompt disagree: nothing can be classified.
    Inconclusive,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Fresh => "fresh",
            Class::Stale => "stale",
            Class::Corrupt => "corrupt",
            Class::Inconclusive => "inconclusive",
        }
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

/// Classify a warm reply. `control` is a second cold run of the current prompt (when the scenario runs one).
pub fn classify(
    warm: &[u32],
    fresh: &[u32],
    control: Option<&[u32]>,
    hypotheses: &[Hypothesis],
) -> (Class, Option<String>) {
    if control.is_some_and(|c| c != fresh) {
        return (Class::Inconclusive, None);
    }
    if warm == fresh {
        return (Class::Fresh, None);
    }
    match hypotheses.iter().find(|h| h.reply == warm) {
        Some(h) => (Class::Stale, Some(h.label.clone())),
        None => (Class::Corrupt, None),
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
    pub stale_bound: Option<Bound>,
    pub corrupt_bound: Option<Bound>,
    pub not_fresh_bound: Option<Bound>,
}

impl ContextCounts {
    fn new(context: &str) -> Self {
        ContextCounts {
            context: context.into(),
            cases: 0,
            fresh: 0,
            stale: 0,
            corrupt: 0,
            inconclusive: 0,
            errors: 0,
            distinguishable: 0,
            stale_bound: None,
            corrupt_bound: None,
            not_fresh_bound: None,
        }
    }

    fn add(&mut self, t: &TrialRecord) {
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
    }

    fn bound(&mut self, confidence: f64) {
        let n = (self.fresh + self.stale + self.corrupt) as u64;
        let b = |k: usize| stats::one_sided(k as u64, n, confidence).ok();
        self.stale_bound = b(self.stale);
        self.corrupt_bound = b(self.corrupt);
        self.not_fresh_bound = b(self.stale + self.corrupt);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StalenessStats {
    /// Confidence of every bound (the scenario's).
    pub confidence: f64,
    pub contexts: Vec<ContextCounts>,
    pub total: ContextCounts,
}

/// The counts of a scenario's cases, per context in catalog order, and overall.
pub fn stats(trials: &[&TrialRecord], confidence: f64) -> StalenessStats {
    let mut per: Vec<(ContextName, ContextCounts)> = Vec::new();
    let mut total = ContextCounts::new("all");
    for t in trials {
        total.add(t);
        // an error trial has no outcome; its context is the plan name's prefix ("previous-turn-0003")
        let ctx = t
            .staleness
            .as_ref()
            .map(|o| o.context)
            .or_else(|| ContextName::ALL.into_iter().find(|c| t.plan.starts_with(c.name())));
        let Some(ctx) = ctx else { continue };
        match per.iter_mut().find(|(c, _)| *c == ctx) {
            Some((_, counts)) => counts.add(t),
            None => {
                let mut counts = ContextCounts::new(ctx.name());
                counts.add(t);
                per.push((ctx, counts));
            }
        }
    }
    per.sort_by_key(|(c, _)| *c);
    let mut contexts: Vec<ContextCounts> = per.into_iter().map(|(_, c)| c).collect();
    contexts.iter_mut().for_each(|c| c.bound(confidence));
    total.bound(confidence);
    StalenessStats { confidence, contexts, total }
}

fn bound_cell(b: Option<Bound>) -> String {
    b.map_or_else(|| "—".into(), |b| format!("≤ {}", stats::percent(b.upper)))
}

/// The staleness section of summary.md.
pub fn markdown(rows: &[(&str, &StalenessStats)]) -> String {
    let mut md = String::new();
    if rows.is_empty() {
        return md;
    }
    md.push_str(
        "\n## Semantic staleness\n\nEach warm reply: *fresh* (equals a cold run of the current prompt), *stale(X)* \
         (equals what stale context X produces: its own reply, or its state continued with the current prompt), \
         or *corrupt* (neither). Bounds are one-sided Clopper–Pearson upper bounds over conclusive cases; \
         *distinguishable* counts the cases where a stale reply would have differed from the fresh one.\n\n\
         | scenario | context | cases | fresh | stale | corrupt | inconclusive | errors | distinguishable | stale rate \
         | corrupt rate | not fresh |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, s) in rows {
        for c in s.contexts.iter().chain(std::iter::once(&s.total)) {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({:.0}%) |",
                c.context,
                c.cases,
                c.fresh,
                c.stale,
                c.corrupt,
                c.inconclusive,
                c.errors,
                c.distinguishable,
                bound_cell(c.stale_bound),
                bound_cell(c.corrupt_bound),
                bound_cell(c.not_fresh_bound),
                s.confidence * 100.0
            );
        }
    }
    md
}

#[derive(Serialize)]
struct CsvRow<'a> {
    scenario: &'a str,
    case: &'a str,
    context: &'a str,
    shape: &'a str,
    class: String,
    matched: &'a str,
    prompt_tokens: usize,
    reused: Option<usize>,
    expected_reuse: Option<usize>,
    distinguishable: bool,
    hypotheses: String,
    warm_reply: String,
    fresh_reply: String,
}

fn ids(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// Write `staleness.csv` (one row per classified case); no file when the run has none.
pub fn write_csv(dir: &Path, trials: &[TrialRecord]) -> Result<bool, ReportError> {
    let path = dir.join(STALENESS_CSV);
    let rows: Vec<(&TrialRecord, &StaleOutcome)> =
        trials.iter().filter_map(|t| t.staleness.as_ref().map(|o| (t, o))).collect();
    if rows.is_empty() {
        let _ = std::fs::remove_file(&path);
        return Ok(false);
    }
    let bad = |e: csv::Error| ReportError::Invalid { path: path.clone(), message: e.to_string() };
    let mut w = csv::Writer::from_path(&path).map_err(bad)?;
    for (t, o) in rows {
        w.serialize(CsvRow {
            scenario: &t.scenario,
            case: &t.plan,
            context: o.context.name(),
            shape: match o.shape {
                Shape::CurrentLonger => "current-longer",
                Shape::CurrentShorter => "current-shorter",
            },
            class: o.label(),
            matched: o.matched.as_deref().unwrap_or(""),
            prompt_tokens: t.prompt_tokens,
            reused: t.reused,
            expected_reuse: t.expected_reuse,
            distinguishable: o.distinguishable(),
            hypotheses: o
                .hypotheses
                .iter()
                .map(|h| format!("{}{}", h.label, if h.equals_fresh { "=fresh" } else { "" }))
                .collect::<Vec<_>>()
                .join(" "),
            warm_reply: ids(&t.warm_reply),
            fresh_reply: ids(&t.cold_reply),
        })
        .map_err(bad)?;
    }
    w.flush().map_err(|source| ReportError::Io { path: path.clone(), source })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyp(label: &str, reply: &[u32], fresh: &[u32]) -> Hypothesis {
        Hypothesis { label: label.into(), splice_at: None, reply: reply.to_vec(), equals_fresh: reply == fresh }
    }

    #[test]
    fn classification_prefers_fresh_then_a_named_stale_context() {
        let fresh = [1, 2, 3];
        let hs = [hyp("answer", &[7, 7, 7], &fresh), hyp("state@40", &[1, 2, 9], &fresh)];
        assert_eq!(classify(&[1, 2, 3], &fresh, Some(&fresh), &hs), (Class::Fresh, None));
        assert_eq!(classify(&[1, 2, 9], &fresh, Some(&fresh), &hs), (Class::Stale, Some("state@40".into())));
        assert_eq!(classify(&[7, 7, 7], &fresh, None, &hs), (Class::Stale, Some("answer".into())));
        assert_eq!(classify(&[5, 5, 5], &fresh, None, &hs), (Class::Corrupt, None));
        // a disagreeing control makes nothing classifiable, not even a match
        assert_eq!(classify(&[1, 2, 9], &fresh, Some(&[1, 2, 4]), &hs), (Class::Inconclusive, None));
    }

    #[test]
    fn a_case_whose_hypotheses_all_predict_fresh_has_no_power() {
        let fresh = [1, 2];
        let o = StaleOutcome {
            context: ContextName::PreviousTurn,
            shape: Shape::CurrentLonger,
            class: Class::Fresh,
            matched: None,
            hypotheses: vec![hyp("answer", &fresh, &fresh)],
        };
        assert!(!o.distinguishable());
        assert_eq!(o.label(), "fresh");
        let o = StaleOutcome { class: Class::Stale, hypotheses: vec![hyp("answer", &[3], &fresh)], ..o };
        assert!(o.distinguishable());
        assert_eq!(o.label(), "stale(previous-turn)");
    }

    #[test]
    fn context_names_round_trip() {
        for c in ContextName::ALL {
            assert_eq!(serde_json::to_string(&c).expect("json"), format!("\"{}\"", c.name()));
        }
    }
}
