//! The verdict of a run and `summary.md`, derived from run.json and results.jsonl alone (a run and
//! `kvproof report DIR` call the same code, so a rebuilt summary is the summary).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::manifest::{Manifest, ScenarioEntry};
use crate::id_diff::IdDiff;
use crate::record::TrialRecord;
use crate::record::{printable, CheckName, Status, Verdict};
use crate::stats::{self, Bound};

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
    pub reused: usize,
    pub expected: usize,
    pub warm_ms: f64,
    pub cold_ms: f64,
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
    /// Skip reasons per check, with how often each occurred.
    pub skip_reasons: BTreeMap<String, usize>,
    pub skipped_cases: Vec<(String, String)>,
    pub reuse: ReuseTotals,
    /// The checks that failed somewhere in this scenario (what caught a fault).
    pub caught_by: BTreeSet<CheckName>,
    /// growth-curve: slopes, ratios, speedup against the ideal, and the growth assertions that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<crate::check::growth::GrowthStats>,
    /// semantic-staleness: fresh / stale / corrupt counts per context, with bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness: Option<super::staleness::StalenessStats>,
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

/// Trials in a stable order: scenario order of the manifest, then plan, then step.
pub fn sort_trials(manifest: &Manifest, trials: &mut [TrialRecord]) {
    let order: BTreeMap<&str, usize> =
        manifest.scenarios.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    trials.sort_by_key(|t| (order.get(t.scenario.as_str()).copied().unwrap_or(usize::MAX), t.plan_index, t.step_index));
}

fn summarize_scenario(entry: &ScenarioEntry, trials: &[&TrialRecord]) -> ScenarioSummary {
    let count = |v: Verdict| trials.iter().filter(|t| t.verdict == v).count();
    let (passed, failed, inconclusive, errors) =
        (count(Verdict::Pass), count(Verdict::Fail), count(Verdict::Inconclusive), count(Verdict::Error));
    let conclusive = (passed + failed) as u64;
    let confidence = entry.assertions.confidence;
    let bound = stats::one_sided(failed as u64, conclusive, confidence).ok();
    let mut checks: BTreeMap<CheckName, CheckCounts> = BTreeMap::new();
    let mut skip_reasons = BTreeMap::new();
    let mut caught_by = BTreeSet::new();
    let mut reuse = ReuseTotals::default();
    for t in trials {
        for c in &t.checks {
            let counts = checks.entry(c.check).or_default();
            match c.status {
                Status::Pass => counts.pass += 1,
                Status::Fail => {
                    counts.fail += 1;
                    caught_by.insert(c.check);
                }
                Status::Skipped => {
                    counts.skipped += 1;
                    *skip_reasons.entry(format!("{}: {}", c.check, c.detail)).or_insert(0) += 1;
                }
            }
        }
        reuse.prompt_tokens += t.prompt_tokens;
        // Only turns that reported reuse: a refused turn has an expectation but nothing to hold it against.
        if let (Some(r), Some(e)) = (t.reused, t.expected_reuse) {
            reuse.reused += r;
            reuse.expected += e;
        }
        reuse.warm_ms += t.timings.warm_ms.unwrap_or(0.0);
        reuse.cold_ms += t.timings.cold_ms.unwrap_or(0.0);
    }
    let mut reasons = Vec::new();
    if failed > 0 && entry.assertions.max_failure_rate.is_none() {
        reasons.push(format!("{failed} trial(s) failed"));
    }
    if errors > 0 {
        reasons.push(format!("{errors} trial(s) could not run: the engine died, hung or refused to start"));
    }
    if trials.len() < entry.planned_trials {
        reasons.push(format!(
            "{} of {} planned trials have no result",
            entry.planned_trials - trials.len(),
            entry.planned_trials
        ));
    }
    if conclusive == 0 {
        reasons.push("no conclusive trial".into());
    }
    let rate = entry.assertions.max_failure_rate;
    if let (Some(limit), Some(b)) = (rate, bound) {
        let ok = b.upper <= limit;
        let counts = checks.entry(CheckName::Rate).or_default();
        if ok {
            counts.pass += 1;
        } else {
            counts.fail += 1;
            caught_by.insert(CheckName::Rate);
            reasons.push(format!(
                "failure rate bound {} > limit {} ({}/{} failed, {:.0}% one-sided)",
                stats::percent(b.upper),
                stats::percent(limit),
                b.failures,
                b.trials,
                confidence * 100.0
            ));
        }
    }
    let (growth, growth_reasons) = match entry.kind {
        crate::scenario::Kind::GrowthCurve => crate::check::growth::assess(trials, &entry.assertions),
        _ => (None, Vec::new()),
    };
    reasons.extend(growth_reasons);
    let staleness =
        (entry.kind == crate::scenario::Kind::SemanticStaleness).then(|| super::staleness::stats(trials, confidence));
    ScenarioSummary {
        name: entry.name.clone(),
        kind: entry.kind.name().to_string(),
        engine: entry.engine_label.clone(),
        planned: entry.planned_trials,
        trials: trials.len(),
        passed,
        failed,
        inconclusive,
        errors,
        bound,
        max_failure_rate: rate,
        pass: reasons.is_empty(),
        reasons,
        checks,
        skip_reasons,
        skipped_cases: entry.skipped.iter().map(|s| (s.name.clone(), s.reason.clone())).collect(),
        reuse,
        caught_by,
        growth,
        staleness,
    }
}

pub fn summarize(manifest: &Manifest, trials: &[TrialRecord]) -> Summary {
    let scenarios: Vec<ScenarioSummary> = manifest
        .scenarios
        .iter()
        .map(|entry| {
            let mine: Vec<&TrialRecord> = trials.iter().filter(|t| t.scenario == entry.name).collect();
            summarize_scenario(entry, &mine)
        })
        .collect();
    Summary {
        run: manifest.run.clone(),
        fault: manifest.fault_override.clone(),
        pass: !scenarios.is_empty() && scenarios.iter().all(|s| s.pass),
        scenarios,
    }
}

fn bound_cell(s: &ScenarioSummary) -> String {
    match s.bound {
        Some(b) => format!("≤ {} ({:.0}%)", stats::percent(b.upper), b.confidence * 100.0),
        None => "—".into(),
    }
}

/// Markdown fit for a CI step summary.
pub fn render(summary: &Summary, trials: &[TrialRecord]) -> String {
    let mut md = String::new();
    let verdict = if summary.pass { "PASS" } else { "FAIL" };
    let _ = writeln!(md, "# kvproof run `{}`: {verdict}\n", summary.run);
    if let Some(f) = &summary.fault {
        let _ = writeln!(md, "Fault override: `{f}`\n");
    }
    let _ = writeln!(md, "{}\n", totals_sentence(summary));
    md.push_str(
        "| scenario | kind | engine | passed | failed | inconclusive | errors | failure rate | limit | verdict |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for s in &summary.scenarios {
        let limit = s.max_failure_rate.map_or_else(|| "any failure fails".to_string(), stats::percent);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.kind,
            s.engine,
            s.passed,
            s.trials,
            s.failed,
            s.inconclusive,
            s.errors,
            bound_cell(s),
            limit,
            if s.pass { "pass" } else { "**FAIL**" }
        );
    }
    md.push_str("\nFailure rates are exact one-sided Clopper–Pearson upper bounds over conclusive trials.\n");

    md.push_str("\n## Reuse\n\n| scenario | prompt tokens | reused (expected) | share reused | warm ms | cold ms | cold / warm |\n|---|---|---|---|---|---|---|\n");
    for s in &summary.scenarios {
        let r = &s.reuse;
        let share = if r.prompt_tokens > 0 { 100.0 * r.reused as f64 / r.prompt_tokens as f64 } else { 0.0 };
        let speed = if r.warm_ms > 0.0 { format!("{:.2}x", r.cold_ms / r.warm_ms) } else { "—".into() };
        let _ = writeln!(
            md,
            "| {} | {} | {} ({}) | {share:.1}% | {:.1} | {:.1} | {speed} |",
            s.name, r.prompt_tokens, r.reused, r.expected, r.warm_ms, r.cold_ms
        );
    }

    let growth: Vec<_> =
        summary.scenarios.iter().filter_map(|s| s.growth.as_ref().map(|g| (s.name.as_str(), g))).collect();
    md.push_str(&super::growth::markdown(&growth));
    let stale: Vec<_> =
        summary.scenarios.iter().filter_map(|s| s.staleness.as_ref().map(|g| (s.name.as_str(), g))).collect();
    md.push_str(&super::staleness::markdown(&stale));

    md.push_str("\n## Checks\n\n| scenario | check | pass | fail | skipped |\n|---|---|---|---|---|\n");
    for s in &summary.scenarios {
        for (c, n) in &s.checks {
            let _ = writeln!(md, "| {} | {} | {} | {} | {} |", s.name, c, n.pass, n.fail, n.skipped);
        }
    }

    let failing: Vec<&TrialRecord> =
        trials.iter().filter(|t| matches!(t.verdict, Verdict::Fail | Verdict::Error)).collect();
    if !summary.pass {
        md.push_str("\n## Why it failed\n\n");
        for s in summary.scenarios.iter().filter(|s| !s.pass) {
            for r in &s.reasons {
                let _ = writeln!(md, "- **{}**: {r}", s.name);
            }
        }
    }
    if !failing.is_empty() {
        const SHOWN: usize = 25;
        let _ = writeln!(md, "\n## Failing trials ({})\n", failing.len());
        for t in failing.iter().take(SHOWN) {
            let _ = writeln!(md, "### {} / {} ({})\n", t.scenario, t.name(), t.verdict.name());
            if let (Some(e), Some(r)) = (t.expected_reuse, t.reused) {
                let _ = writeln!(md, "- prompt {} tokens, reused {r}, expected {e}", t.prompt_tokens);
            }
            for c in t.checks.iter().filter(|c| c.status == Status::Fail) {
                let _ = writeln!(md, "- `{}`: {}", c.check, c.detail);
            }
            if t.warm_reply != t.cold_reply && !(t.warm_reply.is_empty() && t.cold_reply.is_empty()) {
                let diff = IdDiff::new(&t.warm_reply, &t.cold_reply).grouped(3, printable);
                let _ = writeln!(md, "- warm vs cold tokens (`-` warm only, `+` cold only):\n\n```diff\n{diff}```");
            }
            if let Some(p) = &t.provenance {
                let _ = writeln!(
                    md,
                    "- first divergent row: {} — `{}/` (dumps, diff.txt, diff.json; heatmap in plots/)",
                    p.headline, p.dir
                );
            }
            if let Some(e) = &t.error {
                let _ = writeln!(md, "- error: {e}");
            }
            if let Some(tail) = &t.stderr_tail {
                let _ = writeln!(md, "- engine stderr (last lines):\n\n```\n{}\n```", tail.trim_end());
            }
            md.push('\n');
        }
        if failing.len() > SHOWN {
            let _ = writeln!(md, "… and {} more in results.jsonl.\n", failing.len() - SHOWN);
        }
    }

    let inconclusive: Vec<&TrialRecord> = trials.iter().filter(|t| t.verdict == Verdict::Inconclusive).collect();
    if !inconclusive.is_empty() {
        let _ = writeln!(md, "\n## Inconclusive (the cold-vs-cold control disagreed: noise, not reuse)\n");
        for t in inconclusive.iter().take(10) {
            let _ = writeln!(md, "- {} / {}", t.scenario, t.name());
        }
    }

    let any_skips = summary.scenarios.iter().any(|s| !s.skip_reasons.is_empty() || !s.skipped_cases.is_empty());
    if any_skips {
        md.push_str("\n## Skipped (not counted as passed)\n\n");
        for s in &summary.scenarios {
            for (case, why) in &s.skipped_cases {
                let _ = writeln!(md, "- **{}**: case `{case}` skipped: {why}", s.name);
            }
            for (why, n) in &s.skip_reasons {
                let _ = writeln!(md, "- **{}**: {why} ({n}x)", s.name);
            }
        }
    }
    md
}

/// "N scenario(s), M trial(s): a passed, b failed, c inconclusive, d error(s)." — the run in one line.
pub fn totals_sentence(summary: &Summary) -> String {
    let total = |f: fn(&ScenarioSummary) -> usize| summary.scenarios.iter().map(f).sum::<usize>();
    format!(
        "{} scenario(s), {} trial(s): {} passed, {} failed, {} inconclusive, {} error(s).",
        summary.scenarios.len(),
        total(|s| s.trials),
        total(|s| s.passed),
        total(|s| s.failed),
        total(|s| s.inconclusive),
        total(|s| s.errors)
    )
}
