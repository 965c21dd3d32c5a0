//! `junit.xml`: one testsuite per scenario, one testcase per trial (and one for the failure-rate bound, one for a
//! growth curve's assertions, a skipped one for a `warm-growth` bound that could not be judged), so CI
//! systems list every case and show the failing ones with their checks. Built as a `quick_junit::Report` and
//! written by its serializer, which escapes text and attributes and drops what XML 1.0 cannot carry; the suite
//! and document totals are the counts of the cases they hold.

use std::time::Duration;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::record::TrialRecord;
use crate::record::{CheckName, Status, Verdict};
use crate::record::{GrowthStats, ScenarioSummary, Summary};
use crate::stats;

/// The trial's wall time: warm, cold and control runs together. None when a recorded time is not a finite,
/// non-negative number (the attribute is then left out rather than written as `NaN`).
fn duration(t: &TrialRecord) -> Option<Duration> {
    let ms: f64 = [t.timings.warm_ms, t.timings.cold_ms, t.timings.control_ms].iter().flatten().sum();
    Duration::try_from_secs_f64(ms / 1000.0).ok()
}

/// A failed (or errored) status with a one-line message and the whole story as the element's text.
fn non_success(kind: NonSuccessKind, message: &str, description: Option<&str>) -> TestCaseStatus {
    let mut status = TestCaseStatus::non_success(kind);
    status.set_message(message);
    if let Some(d) = description {
        status.set_description(d);
    }
    status
}

fn skipped(message: &str) -> TestCaseStatus {
    let mut status = TestCaseStatus::skipped();
    status.set_message(message);
    status
}

fn trial_case(scenario: &str, t: &TrialRecord) -> TestCase {
    let status = match t.verdict {
        Verdict::Pass => TestCaseStatus::success(),
        Verdict::Fail => {
            let failed: Vec<String> = t
                .checks
                .iter()
                .filter(|c| c.status == Status::Fail)
                .map(|c| format!("{}: {}", c.check, c.detail))
                .collect();
            let first = failed.first().map_or("", String::as_str);
            non_success(NonSuccessKind::Failure, first, Some(&failed.join("\n")))
        }
        Verdict::Error => {
            let msg = t.error.as_deref().unwrap_or_default();
            let body = format!("{msg}\n{}", t.stderr_tail.as_deref().unwrap_or_default());
            non_success(NonSuccessKind::Error, msg, Some(body.trim_end()))
        }
        Verdict::Inconclusive => skipped("inconclusive: the cold-vs-cold control disagreed"),
    };
    let mut case = TestCase::new(t.step.as_str(), status);
    case.set_classname(format!("{scenario}.{}", t.plan));
    if let Some(d) = duration(t) {
        case.set_time(d);
    }
    case
}

/// The testcase of a growth scenario's assertions, its name carrying the measured numbers.
fn growth_case(scenario: &str, g: &GrowthStats) -> TestCase {
    let ideal = if g.cost_ideal_speedup.is_some() { "model-cost ideal" } else { "token ideal" };
    let name = format!(
        "growth assertions (warm {:.2}x, expected {}, warm/expected {}, cold {:.2}x over {:.1}x context, {:.0}% of \
         {ideal} speedup, {:.1}% reused)",
        g.warm_ratio,
        super::growth::or_unknown(g.expected_warm_ratio, 2, "x"),
        super::growth::over_expected_cell(g, ("", "")),
        g.cold_ratio,
        g.context_growth,
        100.0 * g.speedup_of_ideal,
        100.0 * g.reuse_fraction
    );
    let status = match g.violations.first() {
        None => TestCaseStatus::success(),
        Some(first) => non_success(NonSuccessKind::Failure, first, Some(&g.violations.join("\n"))),
    };
    let mut case = TestCase::new(name, status);
    case.set_classname(scenario);
    case
}

/// A skipped testcase for the `warm-growth` check when it could not be judged (the engine reports no cost): the
/// growth testcase passing must not read as that bound holding.
fn warm_growth_skip(s: &ScenarioSummary) -> Option<TestCase> {
    let c = crate::check::growth::warm_growth_check(s.growth.as_ref()?)?;
    (c.status == Status::Skipped).then(|| {
        let mut case = TestCase::new(c.check.name(), skipped(&c.detail));
        case.set_classname(s.name.as_str());
        case
    })
}

/// The testcase of a scenario's `max_failure_rate`: the Clopper–Pearson bound against the limit.
fn rate_case(s: &ScenarioSummary) -> Option<TestCase> {
    let (Some(limit), Some(b)) = (s.max_failure_rate, s.bound) else { return None };
    let failed = s.checks.get(&CheckName::Rate).is_some_and(|c| c.fail > 0);
    let status = if failed {
        let msg =
            format!("{} > {} ({}/{} failed)", stats::percent(b.upper), stats::percent(limit), b.failures, b.trials);
        non_success(NonSuccessKind::Failure, &msg, None)
    } else {
        TestCaseStatus::success()
    };
    let mut case = TestCase::new("failure rate bound", status);
    case.set_classname(s.name.as_str());
    Some(case)
}

fn suite(s: &ScenarioSummary, trials: &[TrialRecord]) -> TestSuite {
    let mut suite = TestSuite::new(s.name.as_str());
    suite.add_test_cases(trials.iter().filter(|t| t.scenario == s.name).map(|t| trial_case(&s.name, t)));
    suite.add_test_cases(s.skipped_cases.iter().map(|(case, why)| {
        let mut c = TestCase::new("case", skipped(why));
        c.set_classname(format!("{}.{case}", s.name));
        c
    }));
    if let Some(g) = &s.growth {
        suite.add_test_case(growth_case(&s.name, g));
    }
    suite.add_test_cases(warm_growth_skip(s));
    if let Some(c) = rate_case(s) {
        suite.add_test_case(c);
    }
    suite
}

/// The run as a JUnit report: one suite per scenario, in the summary's order.
pub fn report(summary: &Summary, trials: &[TrialRecord]) -> Report {
    let mut report = Report::new(format!("kvproof {}", summary.run));
    report.add_test_suites(summary.scenarios.iter().map(|s| suite(s, trials)));
    report
}

/// junit.xml's text.
pub fn render(summary: &Summary, trials: &[TrialRecord]) -> String {
    match report(summary, trials).to_string() {
        Ok(xml) => xml,
        // Serializing into memory has no I/O that could fail; should the serializer still refuse, CI gets a
        // valid file with one error saying why instead of a truncated one.
        Err(e) => {
            let mut suite = TestSuite::new("junit.xml");
            let status = non_success(NonSuccessKind::Error, &format!("junit.xml could not be written: {e}"), None);
            suite.add_test_case(TestCase::new("serialize", status));
            let mut report = Report::new(format!("kvproof {}", summary.run));
            report.add_test_suite(suite);
            report.to_string().unwrap_or_default()
        }
    }
}
