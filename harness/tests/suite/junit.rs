//! junit.xml as CI test reporters read it: a well-formed JUnit document (parsed back with quick-junit's reader)
//! whose suites, cases, failures, errors, skips and totals are those of the run, with names that need escaping.

use std::path::Path;

use kvproof::record::{CheckName, Verdict};
use kvproof::report;
use kvproof::scenario::load_str;
use kvproof::session::{run_scenarios, RunOptions};
use quick_junit::{NonSuccessKind, Report, TestCaseStatus};

use crate::support;
use support::engine_binary;

/// An inkling engine over stdio whose warm process is killed at its third request (tests/suite/support/die-after.sh).
fn dying_engine() -> Vec<String> {
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/support/die-after.sh");
    let engine = engine_binary().to_string_lossy().into_owned();
    [wrapper.to_string_lossy().as_ref(), "die", "2", &engine, "--arch", "inkling", "--preset", "tiny"]
        .map(String::from)
        .to_vec()
}

#[derive(Debug, Default, PartialEq)]
struct Counts {
    tests: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
}

#[test]
fn junit_xml_parses_back_with_the_suites_cases_and_counts_of_the_run() {
    let faulty = serde_json::json!({
        "name": "bound <x> & 'y'",
        "engine": { "arch": "inkling", "preset": "tiny", "fault": "memcmp-short" },
        "kind": "boundary-matrix",
        "seed": 1,
        "params": { "cases": ["extend", "diverge-last", "interleave"], "max_tokens": 6 },
        "assert": { "max_failure_rate": 0.01 },
    });
    let dying = serde_json::json!({
        "name": "stdio \"death\"",
        "engine": { "command": dying_engine(), "timeout_ms": 30_000 },
        "kind": "stress-pairs",
        "seed": 1,
        "params": { "pairs": 4, "turns": [3, 3], "user_len": [3, 12], "max_tokens": 4 },
    });
    let scenarios: Vec<_> =
        [faulty, dying].iter().map(|j| load_str(Path::new("s.json"), &j.to_string()).expect("scenario")).collect();
    let out = std::env::temp_dir().join(format!("kvproof-junit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (summary, trials) = run_scenarios(&scenarios, &opts).expect("run");

    let xml = std::fs::read_to_string(out.join(report::JUNIT)).expect("junit.xml");
    let parsed = Report::deserialize_from_str(&xml).unwrap_or_else(|e| panic!("junit.xml does not parse: {e}\n{xml}"));
    assert_eq!(parsed.to_string().expect("serialize"), xml, "junit.xml round-trips through the JUnit data model");
    assert_eq!(parsed.name.as_deref(), Some(format!("kvproof {}", summary.run).as_str()));

    let names: Vec<&str> = parsed.test_suites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["bound <x> & 'y'", "stdio \"death\""], "one suite per scenario, names unescaped intact");
    let mut total = Counts::default();
    for (suite, s) in parsed.test_suites.iter().zip(&summary.scenarios) {
        let mine: Vec<_> = trials.iter().filter(|t| t.scenario == s.name).collect();
        let count = |v: Verdict| mine.iter().filter(|t| t.verdict == v).count();
        let rate_failed = s.checks.get(&CheckName::Rate).is_some_and(|c| c.fail > 0);
        let expected = Counts {
            tests: mine.len() + s.skipped_cases.len() + usize::from(s.max_failure_rate.is_some()),
            failures: count(Verdict::Fail) + usize::from(rate_failed),
            errors: count(Verdict::Error),
            skipped: count(Verdict::Inconclusive) + s.skipped_cases.len(),
        };
        let mut seen = Counts { tests: suite.test_cases.len(), ..Counts::default() };
        for case in &suite.test_cases {
            match &case.status {
                TestCaseStatus::Success { .. } => {}
                TestCaseStatus::NonSuccess { kind: NonSuccessKind::Failure, .. } => seen.failures += 1,
                TestCaseStatus::NonSuccess { kind: NonSuccessKind::Error, .. } => seen.errors += 1,
                TestCaseStatus::Skipped { .. } => seen.skipped += 1,
            }
        }
        assert_eq!(seen, expected, "{}: cases in the file", s.name);
        let declared =
            Counts { tests: suite.tests, failures: suite.failures, errors: suite.errors, skipped: suite.skipped };
        assert_eq!(declared, expected, "{}: the suite's attributes", s.name);
        total.tests += suite.tests;
        total.failures += suite.failures;
        total.errors += suite.errors;
        total.skipped += suite.skipped;
        // every trial's case carries its time, and its class names the scenario and plan
        for t in &mine {
            let case = suite
                .test_cases
                .iter()
                .find(|c| c.classname.as_deref() == Some(format!("{}.{}", s.name, t.plan).as_str()) && c.name == t.step)
                .unwrap_or_else(|| panic!("no case for {}", t.name()));
            assert!(case.time.is_some(), "{}: no time", t.name());
        }
    }
    let declared =
        Counts { tests: parsed.tests, failures: parsed.failures, errors: parsed.errors, skipped: parsed.skipped };
    assert_eq!(declared, total, "the document's totals are its suites' sums");

    // what CI shows for each kind of case
    let faulty = &parsed.test_suites[0];
    let messages: Vec<(&str, &str)> = faulty
        .test_cases
        .iter()
        .filter_map(|c| match &c.status {
            TestCaseStatus::NonSuccess { message, .. } | TestCaseStatus::Skipped { message, .. } => {
                Some((c.name.as_str(), message.as_deref().unwrap_or_default()))
            }
            TestCaseStatus::Success { .. } => None,
        })
        .collect();
    assert!(messages.iter().any(|(n, m)| *n == "turn 2" && m.starts_with("tokens: ")), "{messages:?}");
    assert!(messages.iter().any(|(n, m)| *n == "case" && m.contains("slot(s)")), "skipped case: {messages:?}");
    assert!(messages.iter().any(|(n, m)| *n == "failure rate bound" && m.contains(" > 1.000% (")), "{messages:?}");
    let died = parsed.test_suites[1]
        .test_cases
        .iter()
        .find_map(|c| match &c.status {
            TestCaseStatus::NonSuccess { kind: NonSuccessKind::Error, description, .. } => description.clone(),
            _ => None,
        })
        .expect("an error case");
    assert!(died.contains("die-after: killing the engine"), "the error carries the engine's stderr: {}", died.as_str());
    let _ = std::fs::remove_dir_all(&out);
}
