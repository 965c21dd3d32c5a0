//! Semantic staleness: does the warm reply answer the current prompt, or a stale context's? Each warm reply is
//! classified *fresh* (it equals a cold run of the current prompt), *stale(X)* (it equals what stale context X
//! would produce: X's own reply, or a cold run of X's fed ids continued with the current prompt's tail — the state
//! X left behind, read with the new question), or *corrupt* (neither). Counts per context come with exact
//! Clopper–Pearson bounds. Derived from the `staleness` field of results.jsonl alone.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::ReportError;
use crate::record::{Shape, StaleOutcome, StalenessStats, TrialRecord};
use crate::stats::{self, Bound};

pub const STALENESS_CSV: &str = "staleness.csv";

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
    let rows = trials.iter().filter_map(|t| t.staleness.as_ref().map(|o| (t, o)));
    let rows: Vec<CsvRow> = rows
        .map(|(t, o): (&TrialRecord, &StaleOutcome)| CsvRow {
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
        .collect();
    super::write_csv_rows(dir, STALENESS_CSV, rows)
}
