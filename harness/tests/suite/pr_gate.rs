//! The PR gate's logic on small scenarios. The gate itself (`ci/pr-gate.sh`: `kvproof mutants scenarios/pr`, whose
//! clean pass is the PR run) runs the full files once per CI; here, the files are checked for the gate's shape
//! without running them, and subsets of their cases pin the exact reuse counts of each engine's rules, the checks
//! every reused turn must perform, the artifacts, and the report rebuilt identically from them.

use std::collections::BTreeSet;
use std::path::PathBuf;

use kvproof::record::{CheckName, Status, TrialRecord, Verdict};
use kvproof::report;
use kvproof::scenario::{load_file, load_paths, CaseName, EngineSpec, Kind, Params, Scenario, Via};
use kvproof::session::{run_scenarios, RunOptions};

use crate::support;
use support::repo;

const ARCHES: [&str; 5] = ["deepseek", "glm", "glm53", "inkling", "kimi"];

fn status(t: &TrialRecord, c: CheckName) -> Status {
    t.checks.iter().find(|r| r.check == c).unwrap_or_else(|| panic!("{} lacks {c}", t.name())).status
}

/// (expected, reported) reuse of a boundary trial.
fn reuse_of(trials: &[TrialRecord], scenario: &str, plan: &str, step: &str) -> (Option<usize>, Option<usize>) {
    let t = trials
        .iter()
        .find(|t| t.scenario == scenario && t.plan == plan && t.step == step)
        .unwrap_or_else(|| panic!("{scenario} / {plan} / {step} did not run"));
    (t.expected_reuse, t.reused)
}

/// A PR scenario file with only `cases` of its boundary matrix.
fn subset(file: &str, cases: &[CaseName]) -> Scenario {
    let mut s = load_file(&repo().join("scenarios/pr").join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    match &mut s.params {
        Params::BoundaryMatrix(p) => p.cases = Some(cases.to_vec()),
        _ => panic!("{file} is not a boundary matrix"),
    }
    s
}

fn run(name: &str, scenarios: &[Scenario]) -> (kvproof::record::Summary, Vec<TrialRecord>, PathBuf) {
    let out = std::env::temp_dir().join(format!("kvproof-gate-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec!["test".into()] };
    let (summary, trials) = run_scenarios(scenarios, &opts).expect("run");
    let failing: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    assert!(summary.pass && failing.is_empty(), "{:#?}", failing.first());
    (summary, trials, out)
}

#[test]
fn pr_scenarios_are_shaped_for_the_gate() {
    let scenarios = load_paths(&[repo().join("scenarios/pr")]).expect("load scenarios/pr");
    // every engine has a boundary matrix and a stress gate of at least 299 pairs at 1% / 95% in-process, and a
    // boundary matrix served over stdio (so the serve layer is under the gate too)
    for arch in ARCHES {
        let of = |kind: Kind, how: Via| {
            scenarios
                .iter()
                .filter(|s| {
                    s.kind == kind
                        && matches!(&s.engine, EngineSpec::Bundled { arch: a, via, .. } if a == arch && *via == how)
                })
                .count()
        };
        assert_eq!(of(Kind::BoundaryMatrix, Via::InProcess), 1, "{arch} boundary scenarios");
        assert_eq!(of(Kind::StressPairs, Via::InProcess), 1, "{arch} stress scenarios");
        assert_eq!(of(Kind::BoundaryMatrix, Via::Stdio), 1, "{arch} boundary scenarios over stdio");
    }
    // every scenario requires the checks a pass must rest on: a pass with them skipped fails the gate
    for s in &scenarios {
        for c in [CheckName::Tokens, CheckName::Reuse, CheckName::ReuseFired, CheckName::State, CheckName::Record] {
            assert!(s.assertions.require.contains(&c), "{} does not require {c}", s.name);
        }
    }
    for s in scenarios.iter().filter(|s| s.kind == Kind::StressPairs) {
        assert_eq!(s.assertions.max_failure_rate, Some(0.01), "{}", s.name);
        assert_eq!(s.assertions.confidence, 0.95, "{}", s.name);
        assert!(matches!(&s.params, Params::StressPairs(p) if p.pairs >= 299), "{}", s.name);
    }
    // the agentic tool loop is under the gate on a bundled engine (the real model's task set is nightly)
    assert!(
        scenarios.iter().any(|s| s.kind == Kind::Agentic && !on_gguf(s)),
        "no agentic scenario on a bundled engine in scenarios/pr"
    );
    // every boundary case a file lists is planned for its engine (none skipped), and each plan compares turns;
    // the scenarios on a real model are checked by `the_real_model_boundary_matrix_is_planned_in_full`
    for s in scenarios.iter().filter(|s| s.kind == Kind::BoundaryMatrix && !on_gguf(s)) {
        assert_planned_in_full(s);
    }
}

fn on_gguf(s: &Scenario) -> bool {
    matches!(&s.engine, EngineSpec::Bundled { gguf: Some(_), .. })
}

fn assert_planned_in_full(s: &Scenario) {
    {
        let prepared = kvproof::runner::prepare(s, None).unwrap_or_else(|e| panic!("prepare {}: {e}", s.name));
        assert!(prepared.skipped.is_empty(), "{}: {:?}", s.name, prepared.skipped);
        let listed: BTreeSet<&str> = match &s.params {
            Params::BoundaryMatrix(p) => p.cases.iter().flatten().map(|c| c.name()).collect(),
            _ => unreachable!(),
        };
        let planned: BTreeSet<&str> = prepared.plans.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(planned, listed, "{}", s.name);
        assert!(prepared.plans.iter().all(|p| p.compared() > 0), "{}", s.name);
    }
}

#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn the_real_model_boundary_matrix_is_planned_in_full() {
    let scenarios = load_paths(&[repo().join("scenarios/pr")]).expect("load scenarios/pr");
    let real: Vec<&Scenario> = scenarios.iter().filter(|s| on_gguf(s)).collect();
    assert_eq!(real.iter().filter(|s| s.kind == Kind::BoundaryMatrix).count(), 1, "a SmolLM2 boundary matrix");
    for s in real {
        assert_planned_in_full(s);
    }
}

#[test]
fn each_engines_reuse_rule_gives_its_exact_counts_with_every_check_performed() {
    use CaseName::*;
    let scenarios = vec![
        subset("glm53-boundary.json", &[GridDiverge, GridRepeat, GridShorter, GridReply, CancelRetry]),
        subset("glm-boundary.json", &[Interleave, Share, SlotSwitch, CancelRetry]),
        subset("kimi-boundary.json", &[GrowingConversation, CancelRetry]),
        subset("inkling-boundary.json", &[CancelRetry, CapacityGrowth, AudioTaint]),
        subset("deepseek-boundary.json", &[CancelRetry, BlockEdges]),
    ];
    let (_, trials, out) = run("counts", &scenarios);

    // every reply reports exactly the oracle's count; every reused turn performed its checks
    assert!(trials.iter().all(|t| t.reused.is_none() || t.reused == t.expected_reuse));
    for t in trials.iter().filter(|t| t.reused.is_some_and(|r| r > 0)) {
        for c in [CheckName::Tokens, CheckName::Control, CheckName::Reuse, CheckName::State, CheckName::Coverage] {
            assert_eq!(status(t, c), Status::Pass, "{} {c}", t.name());
        }
        // the record is pinned down exactly except for glm53's conservative one
        if t.scenario != "glm53-boundary" {
            assert_eq!(status(t, CheckName::Record), Status::Pass, "{} record", t.name());
        }
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

    // glm53: reuse = min(LCP, canonical end, len - 1) rounded down to the 16-position grid
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
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_run_writes_every_artifact_and_its_report_rebuilds_identically() {
    let mut stress = load_file(&repo().join("scenarios/pr/inkling-stress.json")).expect("inkling-stress");
    if let Params::StressPairs(p) = &mut stress.params {
        p.pairs = 40;
    }
    // 0 of 40 bounds the failure rate at 7.216% (95%, one-sided)
    stress.assertions.max_failure_rate = Some(0.08);
    let scenarios = vec![subset("inkling-boundary.json", &[CaseName::Extend, CaseName::DivergeLast]), stress];
    let (summary, trials, out) = run("artifacts", &scenarios);
    let fired = trials.iter().filter(|t| t.scenario == "inkling-stress" && t.expected_reuse.unwrap_or(0) > 0).count();
    assert!(fired >= 20, "reuse fired on {fired} of 40 stress pairs");

    for f in [report::RUN_JSON, report::RESULTS, report::TURNS, report::SUMMARY, report::JUNIT] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let lines = std::fs::read_to_string(out.join(report::RESULTS)).expect("results").lines().count();
    assert_eq!(lines, trials.len());
    let md = std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary");
    assert!(md.contains("≤ 7.216% (95%)") && md.contains("| 8.000% |"), "{md}");
    let xml = std::fs::read_to_string(out.join(report::JUNIT)).expect("junit");
    assert!(xml.contains("<testsuite name=\"inkling-stress\""), "{xml}");
    assert!(!xml.contains("<failure"));
    let manifest = report::read_manifest(&out).expect("manifest");
    assert!(manifest.finished_unix.is_some());
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
    use CaseName::*;
    for (file, cases) in [
        ("inkling-boundary.json", &[Extend, WindowWrap, CapacityGrowth, AudioTaint][..]),
        ("glm-boundary.json", &[Interleave, SlotSwitch, Share][..]),
    ] {
        let scenarios = vec![subset(file, cases)];
        let trials = |n: u32| {
            let (_, mut trials, out) = run(&format!("repeat-{file}-{n}"), &scenarios);
            let _ = std::fs::remove_dir_all(&out);
            trials.sort_by_key(|t| (t.plan_index, t.step_index));
            trials
                .into_iter()
                .map(|t| (t.plan, t.step, t.prompt_tokens, t.reused, t.warm_reply, t.verdict))
                .collect::<Vec<_>>()
        };
        assert_eq!(trials(1), trials(2), "{file}");
    }
}
