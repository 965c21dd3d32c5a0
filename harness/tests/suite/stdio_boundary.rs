//! What the gate's stdio scenarios (scenarios/pr/<arch>-stdio.json, a bundled engine served by a sibling
//! `kvproof-engine`, built by `cargo test --workspace` next to this test's binary) do not show by passing: that
//! their checks were performed rather than skipped — the protocol carries ids, reuse counts and dumps, and what it
//! cannot carry (state bytes) is skipped with the reason — and that a scenario run in-process and over stdio gives
//! the same trials: the same prompts, replies, reuse counts and verdicts.

use kvproof::record::{CheckName, Status, TrialRecord, Verdict};
use kvproof::scenario::{load_file, Cold, EngineSpec, Params, Scenario, Via};

use crate::support;
use support::{repo, run_in_tmp};

const ARCHES: [&str; 5] = ["deepseek", "glm", "glm53", "inkling", "kimi"];

fn stdio_scenario(arch: &str) -> Scenario {
    let path = repo().join(format!("scenarios/pr/{arch}-stdio.json"));
    let s = load_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(matches!(s.engine, EngineSpec::Bundled { via: Via::Stdio, .. }), "{arch}: not served over stdio");
    s
}

/// The same scenario with its engine in this process.
fn in_process(s: &Scenario) -> Scenario {
    let mut twin = s.clone();
    if let EngineSpec::Bundled { via, cold, .. } = &mut twin.engine {
        *via = Via::InProcess;
        *cold = Cold::Process;
    }
    twin.name = format!("{}-in-process", s.name);
    twin
}

fn status(t: &TrialRecord, c: CheckName) -> (Status, String) {
    let r = t.checks.iter().find(|r| r.check == c).unwrap_or_else(|| panic!("{} lacks {c}", t.name()));
    (r.status, r.detail.clone())
}

#[test]
fn over_stdio_every_check_the_protocol_carries_is_performed() {
    let scenarios: Vec<Scenario> = ARCHES.iter().map(|a| stdio_scenario(a)).collect();
    let (summary, trials) = run_in_tmp("checks", &scenarios);
    let bad: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    // the scenarios' own reasons too: a scenario can fail with every trial passing (a required check skipped,
    // planned trials without a result)
    let reasons: Vec<_> = summary.scenarios.iter().filter(|s| !s.pass).map(|s| (&s.name, &s.reasons)).collect();
    assert!(summary.pass, "failing trials: {bad:#?}\nfailing scenarios: {reasons:#?}");
    for s in &summary.scenarios {
        // nothing is skipped over stdio any more: cancel-retry runs through cancel_at=N
        assert!(s.skipped_cases.is_empty(), "{}: {:?}", s.name, s.skipped_cases);
    }
    for t in trials.iter().filter(|t| t.reused.is_some()) {
        let mut performed = vec![CheckName::Tokens, CheckName::Control, CheckName::Reuse, CheckName::State];
        performed.push(CheckName::Coverage);
        // the record is pinned down exactly except for glm53's conservative one
        if t.scenario != "glm53-stdio" {
            performed.push(CheckName::Record);
        }
        for c in performed {
            let (st, detail) = status(t, c);
            assert_eq!(st, Status::Pass, "{} {c}: {detail}", t.name());
        }
        // state bytes do not travel: the memory check is skipped with that reason, never passed
        let (st, detail) = status(t, CheckName::Memory);
        assert_eq!(st, Status::Skipped, "{}", t.name());
        assert!(detail.contains("no state bytes") || detail.contains("several slots"), "{detail}");
    }
    for arch in ARCHES {
        let of = |t: &&TrialRecord| t.scenario == format!("{arch}-stdio");
        assert!(trials.iter().filter(of).any(|t| t.reused.unwrap_or(0) > 0), "{arch}: reuse never fired over stdio");
        // the cancelled turn failed CANCELLED on warm and cold alike, and its retry reused nothing
        let retry = trials.iter().filter(of).find(|t| t.plan == "cancel-retry" && t.step.starts_with("turn 3"));
        let retry = retry.unwrap_or_else(|| panic!("{arch}: no cancel-retry turn 3"));
        assert_eq!((retry.reused, retry.expected_reuse), (Some(0), Some(0)), "{arch}");
    }
    // the engine label says how the engine ran, and a reset cold says it is weaker
    let kimi = summary.scenarios.iter().find(|s| s.name == "kimi-stdio").expect("kimi");
    assert!(kimi.engine.contains("via stdio") && kimi.engine.contains(Cold::RESET_NOTE), "{}", kimi.engine);
}

/// The acceptance of issue 11, its stdio half: the same scenario files run in-process and over stdio against a
/// bundled engine give the same trials.
#[test]
fn in_process_and_over_stdio_the_same_scenario_gives_the_same_trials() {
    for arch in ARCHES {
        let stdio = stdio_scenario(arch);
        let local = in_process(&stdio);
        let (_, trials) = run_in_tmp(&format!("twins-{arch}"), &[stdio.clone(), local.clone()]);
        let of = |name: &str| {
            let mut v: Vec<_> = trials
                .iter()
                .filter(|t| t.scenario == name)
                .map(|t| {
                    let verdict: &str = t.verdict.into();
                    (
                        t.plan.clone(),
                        t.step.clone(),
                        t.prompt_tokens,
                        t.reused,
                        t.expected_reuse,
                        t.warm_reply.clone(),
                        t.cold_reply.clone(),
                        verdict,
                    )
                })
                .collect();
            v.sort();
            v
        };
        let (a, b) = (of(&stdio.name), of(&local.name));
        assert!(!a.is_empty(), "{arch}");
        assert_eq!(a, b, "{arch}: stdio and in-process trials differ");
        assert!(matches!(&stdio.params, Params::BoundaryMatrix(_)));
    }
}
