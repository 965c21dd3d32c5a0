//! The PR gate's scenarios, run in-process through the library: they pass on every clean engine, with reuse
//! actually firing, every boundary case of each engine run with its checks performed, every artifact written, and
//! the summary rebuilt identically from the artifacts alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kvproof::record::TrialRecord;
use kvproof::record::{CheckName, Status, Verdict};
use kvproof::report;
use kvproof::scenario::{load_paths, EngineSpec, Kind, Params};
use kvproof::session::{run_scenarios, RunOptions};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

const ARCHES: [&str; 5] = ["deepseek", "glm", "glm53", "inkling", "kimi"];

fn status(t: &TrialRecord, c: CheckName) -> Status {
    t.checks.iter().find(|r| r.check == c).unwrap_or_else(|| panic!("{} lacks {c}", t.name())).status
}

/// (expected, reported) reuse of a boundary trial.
fn reuse_of<'a>(trials: &'a [TrialRecord], scenario: &str, plan: &str, step: &str) -> (Option<usize>, Option<usize>) {
    let t: &'a TrialRecord = trials
        .iter()
        .find(|t| t.scenario == scenario && t.plan == plan && t.step == step)
        .unwrap_or_else(|| panic!("{scenario} / {plan} / {step} did not run"));
    (t.expected_reuse, t.reused)
}

#[test]
fn pr_scenarios_pass_in_process_and_reports_rebuild() {
    let scenarios = load_paths(&[repo().join("scenarios/pr")]).expect("load scenarios/pr");
    // every engine has a boundary matrix and a stress gate of at least 299 pairs at 1% / 95%
    for arch in ARCHES {
        let of = |kind: Kind| {
            scenarios
                .iter()
                .filter(|s| s.kind == kind && matches!(&s.engine, EngineSpec::Bundled { arch: a, .. } if a == arch))
                .count()
        };
        assert_eq!(of(Kind::BoundaryMatrix), 1, "{arch} boundary scenarios");
        assert_eq!(of(Kind::StressPairs), 1, "{arch} stress scenarios");
    }
    for s in scenarios.iter().filter(|s| s.kind == Kind::StressPairs) {
        assert_eq!(s.assertions.max_failure_rate, Some(0.01), "{}", s.name);
        assert_eq!(s.assertions.confidence, 0.95, "{}", s.name);
        assert!(matches!(&s.params, Params::StressPairs(p) if p.pairs >= 299), "{}", s.name);
    }

    let out = std::env::temp_dir().join(format!("kvproof-pr-gate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec!["test".into()] };
    let (summary, trials) = run_scenarios(&scenarios, &opts).expect("run");
    let failing: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    assert!(summary.pass && failing.is_empty(), "{:#?}", failing.first());

    // the stress gates: at least 299 pairs each, bound at or below 1%
    let stress: Vec<_> = summary.scenarios.iter().filter(|s| s.kind == "stress-pairs").collect();
    assert_eq!(stress.len(), ARCHES.len());
    for s in stress {
        assert!(s.trials >= 299, "{}: {} pairs", s.name, s.trials);
        assert!(s.bound.is_some_and(|b| b.upper <= 0.01), "{}: {:?}", s.name, s.bound);
    }

    // reuse fired, in every scenario: every reply reports exactly the oracle's count
    for s in &scenarios {
        let fired = trials.iter().filter(|t| t.scenario == s.name && t.expected_reuse.unwrap_or(0) > 0).count();
        assert!(fired >= 5, "{}: only {fired} trials expected reuse", s.name);
    }
    assert!(trials.iter().all(|t| t.reused.is_none() || t.reused == t.expected_reuse));

    // every boundary case each file lists ran, none skipped, with its checks performed (refused turns excepted)
    for s in scenarios.iter().filter(|s| s.kind == Kind::BoundaryMatrix) {
        let b = summary.scenarios.iter().find(|x| x.name == s.name).expect("boundary summary");
        assert!(b.skipped_cases.is_empty(), "{}: {:?}", s.name, b.skipped_cases);
        let ran: BTreeSet<&str> = trials.iter().filter(|t| t.scenario == s.name).map(|t| t.plan.as_str()).collect();
        let listed: BTreeSet<&str> = match &s.params {
            Params::BoundaryMatrix(p) => p.cases.iter().flatten().map(|c| c.name()).collect(),
            _ => unreachable!(),
        };
        assert_eq!(ran, listed, "{}", s.name);
    }
    for t in trials.iter().filter(|t| t.kind == Kind::BoundaryMatrix && t.reused.is_some()) {
        for c in [CheckName::Tokens, CheckName::Control, CheckName::Reuse, CheckName::State, CheckName::Coverage] {
            assert_eq!(status(t, c), Status::Pass, "{} {c}", t.name());
        }
        // the record is pinned down exactly except for glm53's conservative one
        if t.scenario != "glm53-boundary" {
            assert_eq!(status(t, CheckName::Record), Status::Pass, "{} record", t.name());
        }
        // memory is compared wherever a single-slot plan meets a capacity already seen
        assert_ne!(status(t, CheckName::Memory), Status::Fail, "{} memory", t.name());
    }
    // glm53's state check covers every dumped tensor: each main layer's k/v and the drafter's draft_k/draft_v
    let c = <kvproof_engines::arch::glm53::Config as kvproof_engines::config::ArchConfig>::preset(
        kvproof_engines::config::Preset::Tiny,
    );
    let tensors = 2 * (c.layers + c.draft_layers);
    for t in trials.iter().filter(|t| t.scenario == "glm53-boundary" && t.reused.is_some()) {
        let diff = t.state.as_ref().unwrap_or_else(|| panic!("{}: no state diff", t.name()));
        assert_eq!(diff.tensors, tensors, "{}", t.name());
    }
    // the 20-turn kimi conversation: state bytes compared on (nearly) every turn
    let mem: Vec<Status> = trials
        .iter()
        .filter(|t| t.scenario == "kimi-boundary" && t.plan == "growing-conversation")
        .map(|t| status(t, CheckName::Memory))
        .collect();
    assert!(mem.iter().filter(|&&s| s == Status::Pass).count() >= 15, "{mem:?}");

    // the exact counts the engines' reuse rules give at their boundaries
    let glm53 = |plan: &str, step: &str| reuse_of(&trials, "glm53-boundary", plan, step);
    for (d, want) in [(30, 16), (31, 16), (32, 32), (33, 32), (34, 32), (47, 32), (48, 48)] {
        assert_eq!(glm53("grid-diverge", &format!("diverge at {d}")), (Some(want), Some(want)), "diverge at {d}");
    }
    assert_eq!(glm53("grid-repeat", "repeat of 50"), (Some(48), Some(48)));
    assert_eq!(glm53("grid-repeat", "repeat of 48"), (Some(32), Some(32)));
    for (n, want) in [(40, 32), (33, 32), (32, 16), (16, 0)] {
        assert_eq!(glm53("grid-shorter", &format!("prefix of {n}")), (Some(want), Some(want)), "prefix of {n}");
    }
    for (conv, want) in [("A", 16), ("B", 32), ("C", 32)] {
        assert_eq!(glm53("grid-reply", &format!("{conv}: next turn")), (Some(want), Some(want)), "{conv}");
    }
    // glm: with sharing on, an empty slot adopts the shared opening (BOS, system message, user marker)
    let opening = Some(kvproof::cases::exact::opening_len() - 2);
    let glm = |plan: &str, step: &str| reuse_of(&trials, "glm-boundary", plan, step);
    for (plan, step) in
        [("share", "B turn 1 on slot 1"), ("interleave", "B turn 1 on slot 1"), ("slot-switch", "B turn 2 on slot 0")]
    {
        let (expected, reused) = glm(plan, step);
        assert!(expected >= opening && expected < Some(20) && reused == expected, "{plan} / {step}: {expected:?}");
    }
    assert!(glm("share", "A turn 3 on slot 2").0 > Some(40), "A's whole conversation is adopted");
    // failures are never reused
    for s in ["deepseek-boundary", "kimi-boundary", "glm-boundary", "glm53-boundary", "inkling-boundary"] {
        assert_eq!(reuse_of(&trials, s, "cancel-retry", "turn 3 (extends turn 2)"), (Some(0), Some(0)), "{s}");
        assert!(reuse_of(&trials, s, "cancel-retry", "turn 4").1 > Some(0), "{s}: reuse resumes");
    }

    // artifacts
    for f in [report::RUN_JSON, report::RESULTS, report::TURNS, report::SUMMARY, report::JUNIT] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let lines = std::fs::read_to_string(out.join(report::RESULTS)).expect("results").lines().count();
    assert_eq!(lines, trials.len());
    let md = std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary");
    assert!(md.contains("≤ 0.994% (95%)") && md.contains("| 1.000% |"), "{md}");
    let xml = std::fs::read_to_string(out.join(report::JUNIT)).expect("junit");
    for arch in ARCHES {
        assert!(xml.contains(&format!("<testsuite name=\"{arch}-stress\"")), "{arch}");
    }
    assert!(!xml.contains("<failure"));
    let manifest = report::read_manifest(&out).expect("manifest");
    assert!(manifest.finished_unix.is_some());
    let archs: BTreeSet<&str> = manifest.scenarios.iter().map(|s| s.engine_info.arch.as_str()).collect();
    assert_eq!(archs, ARCHES.into_iter().collect());
    assert!(manifest.scenarios.iter().all(|s| s.sha256.len() == 64));

    std::fs::remove_file(out.join(report::SUMMARY)).expect("rm");
    std::fs::remove_file(out.join(report::JUNIT)).expect("rm");
    let rebuilt = report::rebuild(&out).expect("rebuild");
    assert_eq!(rebuilt, summary);
    assert_eq!(std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary"), md);
    assert_eq!(std::fs::read_to_string(out.join(report::JUNIT)).expect("junit"), xml);
    let _ = std::fs::remove_dir_all(&out);
}

/// The same scenario run twice gives the same trials (prompts, replies, reuse): runs are repeatable, with
/// several slots and conversations interleaved on one warm instance too.
#[test]
fn runs_are_repeatable() {
    for file in ["inkling-boundary.json", "glm-boundary.json"] {
        let scenarios = load_paths(&[repo().join("scenarios/pr").join(file)]).expect("load");
        let run = |n: u32| {
            let out = std::env::temp_dir().join(format!("kvproof-repeat-{}-{file}-{n}", std::process::id()));
            let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
            let (_, mut trials) = run_scenarios(&scenarios, &opts).expect("run");
            let _ = std::fs::remove_dir_all(&out);
            trials.sort_by_key(|t| (t.plan_index, t.step_index));
            trials
                .into_iter()
                .map(|t| (t.plan, t.step, t.prompt_tokens, t.reused, t.warm_reply, t.verdict))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(2), "{file}");
    }
}
