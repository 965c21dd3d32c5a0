//! The PR gate's scenarios, run in-process through the library: they pass on the clean engine, with reuse
//! actually firing, every artifact written, and the summary rebuilt identically from the artifacts alone.

use std::path::{Path, PathBuf};

use kvproof::check::{CheckName, Status, Verdict};
use kvproof::report;
use kvproof::scenario::{load_paths, Kind};
use kvproof::session::{run_scenarios, RunOptions};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn pr_scenarios_pass_in_process_and_reports_rebuild() {
    let scenarios = load_paths(&[repo().join("scenarios/pr")]).expect("load scenarios/pr");
    assert!(scenarios.iter().any(|s| s.kind == Kind::BoundaryMatrix));
    let stress = scenarios.iter().find(|s| s.kind == Kind::StressPairs).expect("a stress scenario");
    assert_eq!(stress.assertions.max_failure_rate, Some(0.01));
    assert_eq!(stress.assertions.confidence, 0.95);

    let out = std::env::temp_dir().join(format!("kvproof-pr-gate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec!["test".into()] };
    let (summary, trials) = run_scenarios(&scenarios, &opts).expect("run");
    let failing: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    assert!(summary.pass && failing.is_empty(), "{:#?}", failing.first());

    // the stress gate: at least 299 pairs, bound at or below 1%
    let s = summary.scenarios.iter().find(|s| s.kind == "stress-pairs").expect("stress summary");
    assert!(s.trials >= 299, "{} pairs", s.trials);
    assert!(s.bound.is_some_and(|b| b.upper <= 0.01), "{:?}", s.bound);

    // reuse fired: every pair where the oracle expects reuse reports exactly that much
    let fired = trials.iter().filter(|t| t.expected_reuse.unwrap_or(0) > 0).count();
    assert!(fired > 200, "only {fired} trials expected reuse");
    assert!(trials.iter().all(|t| t.reused.is_none() || t.reused == t.expected_reuse));

    // every boundary case ran with its checks performed, not skipped (refused turns excepted)
    let b = summary.scenarios.iter().find(|s| s.kind == "boundary-matrix").expect("boundary summary");
    assert!(b.skipped_cases.is_empty(), "{:?}", b.skipped_cases);
    for t in trials.iter().filter(|t| t.kind == Kind::BoundaryMatrix && t.reused.is_some()) {
        for c in [
            CheckName::Tokens,
            CheckName::Control,
            CheckName::Reuse,
            CheckName::State,
            CheckName::Record,
            CheckName::Coverage,
        ] {
            let r = t.checks.iter().find(|r| r.check == c).unwrap_or_else(|| panic!("{} lacks {c}", t.name()));
            assert_eq!(r.status, Status::Pass, "{} {c}: {}", t.name(), r.detail);
        }
    }
    let cases: std::collections::BTreeSet<&str> =
        trials.iter().filter(|t| t.kind == Kind::BoundaryMatrix).map(|t| t.plan.as_str()).collect();
    assert_eq!(cases.len(), 11, "{cases:?}");

    // artifacts
    for f in [report::RUN_JSON, report::RESULTS, report::TURNS, report::SUMMARY, report::JUNIT] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let lines = std::fs::read_to_string(out.join(report::RESULTS)).expect("results").lines().count();
    assert_eq!(lines, trials.len());
    let md = std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary");
    assert!(md.contains("≤ 0.994% (95%)") && md.contains("| 1.000% |"), "{md}");
    let xml = std::fs::read_to_string(out.join(report::JUNIT)).expect("junit");
    assert!(xml.contains("<testsuite name=\"inkling-stress\"") && !xml.contains("<failure"));
    let manifest = report::read_manifest(&out).expect("manifest");
    assert!(manifest.finished_unix.is_some());
    assert!(manifest.scenarios.iter().all(|s| s.engine_info.arch == "inkling" && s.sha256.len() == 64));

    std::fs::remove_file(out.join(report::SUMMARY)).expect("rm");
    std::fs::remove_file(out.join(report::JUNIT)).expect("rm");
    let rebuilt = report::rebuild(&out).expect("rebuild");
    assert_eq!(rebuilt, summary);
    assert_eq!(std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary"), md);
    assert_eq!(std::fs::read_to_string(out.join(report::JUNIT)).expect("junit"), xml);
    let _ = std::fs::remove_dir_all(&out);
}

/// The same scenario run twice gives the same trials (prompts, replies, reuse): runs are repeatable.
#[test]
fn runs_are_repeatable() {
    let scenarios = load_paths(&[repo().join("scenarios/pr/inkling-boundary.json")]).expect("load");
    let run = |n: u32| {
        let out = std::env::temp_dir().join(format!("kvproof-repeat-{}-{n}", std::process::id()));
        let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
        let (_, mut trials) = run_scenarios(&scenarios, &opts).expect("run");
        let _ = std::fs::remove_dir_all(&out);
        trials.sort_by_key(|t| (t.plan_index, t.step_index));
        trials
            .into_iter()
            .map(|t| (t.plan, t.step, t.prompt_tokens, t.reused, t.warm_reply, t.verdict))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(2));
}
