//! Semantic staleness: does the warm reply answer the current prompt, or a stale context's? Each warm reply is
//! classified *fresh* (it equals a cold run of the current prompt), *stale(X)* (it equals what stale context X
//! would produce: X's own reply, or a cold run of X's fed ids continued with the current prompt's tail — the state
//! X left behind, read with the new question), or *corrupt* (neither). Counts per context come with exact
//! Clopper–Pearson bounds. Derived from the `staleness` field of results.jsonl alone.

use std::fmt::Write as _;
use std::path::Path;
use strum::IntoEnumIterator;

use serde::{Deserialize, Serialize};

use super::ReportError;
use crate::record::TrialRecord;
use crate::record::{Class, Shape, StaleOutcome, Verdict};
use crate::scenario::ContextName;
use crate::stats::{self, Bound};

pub const STALENESS_CSV: &str = "staleness.csv";

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
            .or_else(|| ContextName::iter().find(|c| t.plan.starts_with(c.name())));
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
