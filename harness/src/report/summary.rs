//! `summary.md`: the run's verdict (`check::scenario`), rendered — fit for a CI step summary.

use std::fmt::Write as _;

use crate::id_diff::IdDiff;
use crate::record::{CheckName, ScenarioSummary, Status, Summary, TrialRecord, Verdict};
use crate::stats;

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

    md.push_str(
        "\n## Reuse\n\nWhat each engine reported reusing (over every trial that reported a count), and what the oracle \
         expects where it has a rule for the engine.\n\n| scenario | prompt tokens | reused (reported) | share reused \
         | expected by the oracle | warm ms | cold ms | cold / warm |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in &summary.scenarios {
        let r = &s.reuse;
        let share = match r.reported_prompt_tokens {
            0 => "—".to_string(),
            n => format!("{:.1}%", 100.0 * r.reused as f64 / n as f64),
        };
        let expected = match r.expected_trials {
            0 => "— (no rule)".to_string(),
            n => format!("{} on {n} trial(s), the engine {}", r.expected, r.reused_where_expected),
        };
        let speed = if r.warm_ms > 0.0 { format!("{:.2}x", r.cold_ms / r.warm_ms) } else { "—".into() };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {share} | {expected} | {:.1} | {:.1} | {speed} |",
            s.name, r.prompt_tokens, r.reused, r.warm_ms, r.cold_ms
        );
    }

    let growth: Vec<_> =
        summary.scenarios.iter().filter_map(|s| s.growth.as_ref().map(|g| (s.name.as_str(), g))).collect();
    md.push_str(&super::growth::markdown(&growth));
    let stale: Vec<_> =
        summary.scenarios.iter().filter_map(|s| s.staleness.as_ref().map(|g| (s.name.as_str(), g))).collect();
    md.push_str(&super::staleness::markdown(&stale));
    let agentic: Vec<_> =
        summary.scenarios.iter().filter_map(|s| s.agentic.as_ref().map(|g| (s.name.as_str(), g))).collect();
    md.push_str(&super::agentic::markdown(&agentic, trials));

    md.push_str(
        "\n## Checks\n\nPer check, on how many trials it ran (passed or failed) and was skipped; a required check \
         (`assert.require`) that was skipped fails its scenario.\n\n| scenario | check | ran | pass | fail | skipped \
         | required |\n|---|---|---|---|---|---|---|\n",
    );
    for s in &summary.scenarios {
        for (c, n) in &s.checks {
            let required = if s.required.contains(c) { "yes" } else { "" };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {required} |",
                s.name,
                c,
                n.pass + n.fail,
                n.pass,
                n.fail,
                n.skipped
            );
        }
    }

    let gaps: Vec<_> = summary.scenarios.iter().filter_map(|s| s.gaps.as_ref().map(|g| (s, g))).collect();
    if !gaps.is_empty() {
        md.push_str(
            "\n## Where warm and cold part\n\nThe reference's top-2 logit gap at every first differing token: a \
             divergence at a near-tie (a gap below the threshold) can be a tiny numeric difference flipping the pick; \
             one where the reference was confident is a real divergence.\n\n| scenario | divergences | gap min / \
             median / max | near-tie threshold | near-ties |\n|---|---|---|---|---|\n",
        );
        for (s, g) in gaps {
            let spread = match g.at_divergence.as_slice() {
                [] => "— (no gaps reported)".to_string(),
                v => format!("{:.4} / {:.4} / {:.4}", v[0], v[v.len() / 2], v[v.len() - 1]),
            };
            let threshold = g.threshold.map_or_else(|| "—".to_string(), |t| format!("{t:.4}"));
            let _ = writeln!(
                md,
                "| {} | {} | {spread} | {threshold} ({}) | {} of {} |",
                s.name,
                g.at_divergence.len(),
                g.threshold_source,
                g.near_ties,
                g.at_divergence.len()
            );
        }
    }

    let unstable: Vec<&TrialRecord> = trials.iter().filter(|t| t.prefix_note.is_some()).collect();
    if !unstable.is_empty() {
        let _ = writeln!(
            md,
            "\n## Transcripts that did not re-render as fed ({})\n\nA conversation sent as text is re-rendered every turn; \
             where the new prompt does not begin with what the last turn fed (the template, or the reply's text \
             re-tokenized to other ids), no engine can reuse past that point. Reuse lost this way is the \
             template's, not a reuse bug.\n",
            unstable.len()
        );
        for t in unstable.iter().take(10) {
            let _ = writeln!(md, "- {} / {}: {}", t.scenario, t.name(), t.prefix_note.as_deref().unwrap_or_default());
        }
        if unstable.len() > 10 {
            let _ = writeln!(md, "- … and {} more in results.jsonl", unstable.len() - 10);
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
            let gaps = summary.scenarios.iter().find(|s| s.name == t.scenario).and_then(|s| s.gaps.as_ref());
            for c in t.checks.iter().filter(|c| c.status == Status::Fail) {
                let tie = match (c.check, t.divergence.as_ref().and_then(|d| d.gap()), gaps) {
                    (CheckName::Tokens, Some(gap), Some(g)) if g.is_near_tie(gap) => {
                        format!(" — a near-tie (gap below {:.4}, {})", g.threshold.unwrap_or(0.0), g.threshold_source)
                    }
                    _ => String::new(),
                };
                let _ = writeln!(md, "- `{}`: {}{tie}", c.check, c.detail);
            }
            if t.warm_reply != t.cold_reply && !(t.warm_reply.is_empty() && t.cold_reply.is_empty()) {
                let diff = IdDiff::new(&t.warm_reply, &t.cold_reply).grouped(3, |id| t.token_text(id));
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
