//! A scenario's verdict from its trial records: counts by verdict, the exact failure-rate bound against the
//! scenario's limit, planned trials without a result, growth assertions and staleness counts. The run and
//! `kvproof report DIR` call the same code, so a rebuilt summary is the summary.

use std::collections::{BTreeMap, BTreeSet};

use crate::record::{
    CheckCounts, CheckName, CheckResult, GapStats, Manifest, ReuseTotals, ScenarioEntry, ScenarioSummary, Status,
    Summary, TrialRecord, Verdict,
};
use crate::stats;

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
    let mut tally = |c: &CheckResult| {
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
    };
    for t in trials {
        t.checks.iter().for_each(&mut tally);
        reuse.prompt_tokens += t.prompt_tokens;
        if let Some(r) = t.reused {
            reuse.reused += r;
            reuse.reported_prompt_tokens += t.prompt_tokens;
        }
        // Only turns that reported reuse: a refused turn has an expectation but nothing to hold it against.
        if let (Some(r), Some(e)) = (t.reused, t.expected_reuse) {
            reuse.expected += e;
            reuse.expected_trials += 1;
            reuse.reused_where_expected += r;
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
    // Checks of the scenario as a whole, counted beside the trials' (skipped ones with their reason).
    let (growth, growth_reasons) = match entry.kind {
        crate::scenario::Kind::GrowthCurve => super::growth::assess(trials, &entry.assertions),
        _ => (None, Vec::new()),
    };
    let rate = entry.assertions.max_failure_rate;
    let rate_check = rate_check(rate, bound.as_ref(), confidence);
    let scenario_checks: Vec<CheckResult> =
        growth.as_ref().and_then(super::growth::warm_growth_check).into_iter().chain(rate_check.clone()).collect();
    scenario_checks.iter().for_each(&mut tally);
    reasons.extend(required_checks(&entry.assertions.require, trials, &scenario_checks));
    reasons.extend(rate_check.filter(|c| c.status == Status::Fail).map(|c| c.detail));
    reasons.extend(growth_reasons);
    let staleness =
        (entry.kind == crate::scenario::Kind::SemanticStaleness).then(|| super::staleness::stats(trials, confidence));
    let agentic = (entry.kind == crate::scenario::Kind::Agentic).then(|| super::agentic::stats(trials, confidence));
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
        gaps: gap_stats(trials, entry.assertions.near_tie),
        required: entry.assertions.require.clone(),
        skip_reasons,
        skipped_cases: entry.skipped.iter().map(|s| (s.name.clone(), s.reason.clone())).collect(),
        reuse,
        caught_by,
        growth,
        staleness,
        agentic,
    }
}

pub fn summarize(manifest: &Manifest, trials: &[TrialRecord]) -> Summary {
    let scenarios: Vec<ScenarioSummary> = manifest
        .scenarios
        .iter()
        .map(|entry| {
            let mine: Vec<&TrialRecord> = trials.iter().filter(|t| t.scenario == entry.name).collect();
            let mut s = summarize_scenario(entry, &mine);
            // A shard that owns no unit of this scenario has nothing to judge it on; the merged run judges it.
            if manifest.shard.is_some() && entry.planned_trials == 0 && mine.is_empty() {
                s.reasons.clear();
                s.pass = true;
            }
            s
        })
        .collect();
    Summary {
        run: manifest.run.clone(),
        fault: manifest.fault_override.clone(),
        pass: !scenarios.is_empty() && scenarios.iter().all(|s| s.pass),
        scenarios,
    }
}

/// The share of the engine's own gaps below which a divergence counts as a near-tie.
const NEAR_TIE_PERCENTILE: f64 = 0.05;

/// The top-2 gaps at first divergences and the near-tie threshold; `None` when no trial diverged.
fn gap_stats(trials: &[&TrialRecord], near_tie: Option<f32>) -> Option<GapStats> {
    let diverged: Vec<_> = trials.iter().filter_map(|t| t.divergence.as_ref()).collect();
    if diverged.is_empty() {
        return None;
    }
    let mut at_divergence: Vec<f32> = diverged.iter().filter_map(|d| d.gap()).filter(|g| g.is_finite()).collect();
    at_divergence.sort_by(f32::total_cmp);
    let mut observed: Vec<f32> =
        trials.iter().flat_map(|t| t.cold_gaps.iter().copied()).filter(|g| g.is_finite()).collect();
    observed.sort_by(f32::total_cmp);
    let (threshold, threshold_source) = match near_tie {
        Some(t) => (Some(t), "set by the scenario (assert.near_tie)".to_string()),
        None if observed.is_empty() => (None, "no gaps reported by the engine".to_string()),
        None => {
            let i = ((observed.len() - 1) as f64 * NEAR_TIE_PERCENTILE).round() as usize;
            (Some(observed[i]), format!("the engine's 5th percentile of {} cold-reply gaps", observed.len()))
        }
    };
    let near_ties = at_divergence.iter().filter(|&&g| threshold.is_some_and(|t| g < t)).count();
    Some(GapStats { at_divergence, threshold, threshold_source, near_ties })
}

/// The scenario's failure-rate bound held against `assert.max_failure_rate`; none without a limit or without a
/// conclusive trial to bound (that is a reason of its own).
fn rate_check(limit: Option<f64>, bound: Option<&stats::Bound>, confidence: f64) -> Option<CheckResult> {
    let (limit, b) = (limit?, bound?);
    let holds = b.upper <= limit;
    let detail = format!(
        "failure rate bound {} {} limit {} ({}/{} failed, {:.0}% one-sided)",
        stats::percent(b.upper),
        if holds { "<=" } else { ">" },
        stats::percent(limit),
        b.failures,
        b.trials,
        confidence * 100.0
    );
    Some(CheckResult::from_bool(CheckName::Rate, holds, detail))
}

/// Why the scenario's required checks fail it: one skipped on a trial that was not refused as its case expects,
/// or one that ran on no trial at all; a check of the scenario as a whole (`scenario_checks`), one it skipped or
/// could not judge.
fn required_checks(require: &[CheckName], trials: &[&TrialRecord], scenario_checks: &[CheckResult]) -> Vec<String> {
    let mut reasons = Vec::new();
    for &check in require {
        if let Some(c) = scenario_checks.iter().find(|c| c.check == check) {
            if c.status == Status::Skipped {
                reasons.push(format!("required check `{check}` was skipped: {}", c.detail));
            }
            continue;
        }
        if check.is_scenario_level() {
            reasons.push(format!("required check `{check}` was not judged"));
            continue;
        }
        let mut ran = 0usize;
        let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
        for t in trials.iter().filter(|t| t.refused.is_none()) {
            match t.checks.iter().find(|c| c.check == check).map(|c| (c.status, c.detail.as_str())) {
                Some((Status::Pass | Status::Fail, _)) => ran += 1,
                Some((Status::Skipped, why)) => *skipped.entry(why).or_default() += 1,
                None => {}
            }
        }
        let n: usize = skipped.values().sum();
        if let Some((why, _)) = skipped.iter().max_by_key(|(_, &k)| k) {
            reasons.push(format!("required check `{check}` was skipped on {n} trial(s) (e.g. {why})"));
        } else if ran == 0 {
            reasons.push(format!("required check `{check}` ran on no trial"));
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::CheckResult;
    use crate::scenario::Kind;

    fn trial(checks: Vec<CheckResult>, refused: Option<&str>) -> TrialRecord {
        let mut t = TrialRecord::new("s", Kind::BoundaryMatrix, "p", 0, "turn 2", 1);
        t.checks = checks;
        t.refused = refused.map(str::to_string);
        t
    }

    #[test]
    fn a_required_check_skipped_or_never_run_fails_the_scenario() {
        let ran = trial(vec![CheckResult::pass(CheckName::State, "")], None);
        let skipped = trial(vec![CheckResult::skipped(CheckName::State, "the engine offers no state dumps")], None);
        let refused = trial(vec![CheckResult::skipped(CheckName::State, "request refused")], Some("CANCELLED"));
        assert!(required_checks(&[CheckName::State], &[&ran, &refused], &[]).is_empty(), "refused turns are excused");
        let r = required_checks(&[CheckName::State], &[&ran, &skipped], &[]);
        assert_eq!(r.len(), 1);
        assert!(r[0].contains("`state` was skipped on 1 trial(s) (e.g. the engine offers no state dumps)"), "{r:?}");
        let r = required_checks(&[CheckName::ReuseFired], &[&ran], &[]);
        assert_eq!(r, vec!["required check `reuse-fired` ran on no trial".to_string()]);
        assert!(required_checks(&[], &[&skipped], &[]).is_empty());
    }

    #[test]
    fn a_required_scenario_level_check_skipped_or_not_judged_fails_the_scenario() {
        let ran = trial(vec![CheckResult::pass(CheckName::State, "")], None);
        let warm = CheckName::WarmGrowth;
        let held = CheckResult::pass(warm, "1.02 times");
        let failed = CheckResult::fail(warm, "3.9 times");
        let skipped = CheckResult::skipped(warm, "the engine reports no cost");
        // judged on the scenario, not on trials: no trial carrying it is not a reason
        assert!(required_checks(&[warm], &[&ran], &[held]).is_empty());
        // a failure is the growth assertion's own reason, not a second one here
        assert!(required_checks(&[warm], &[&ran], &[failed]).is_empty());
        let r = required_checks(&[warm], &[&ran], std::slice::from_ref(&skipped));
        assert_eq!(r, vec!["required check `warm-growth` was skipped: the engine reports no cost".to_string()]);
        let r = required_checks(&[warm], &[&ran], &[]);
        assert_eq!(r, vec!["required check `warm-growth` was not judged".to_string()]);
        // skipped but not required: reported as skipped, not a reason
        assert!(required_checks(&[CheckName::State], &[&ran], &[skipped]).is_empty());
    }
}
