//! Every engine's PR boundary scenario, with the engine served over stdio (`kvproof-engine --arch X --preset tiny
//! --seed 0`, built by `cargo test --workspace` next to this test's binary) instead of in-process: the same cases
//! pass through the protocol, with the checks the protocol cannot carry reported as skipped, never passed.

use std::path::{Path, PathBuf};

use kvproof::record::TrialRecord;
use kvproof::record::{CheckName, Status, Verdict};
use kvproof::scenario::{load_str, CaseName, Params, Scenario};
use kvproof::session::{run_scenarios, RunOptions};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn engine_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    kvproof::driver::sibling_binary(&exe, "kvproof-engine").unwrap_or_else(|| {
        panic!(
            "kvproof-engine is not built next to {}: run `cargo test --workspace` (or `cargo build -p kvproof-engines`)",
            exe.display()
        )
    })
}

/// scenarios/pr/<arch>-boundary.json with its engine served over stdio.
fn over_stdio(arch: &str) -> Scenario {
    let path = repo().join(format!("scenarios/pr/{arch}-boundary.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    let engine = engine_binary().to_string_lossy().into_owned();
    let command = [engine.as_str(), "--arch", arch, "--preset", "tiny", "--seed", "0"];
    doc["engine"] = serde_json::json!({ "command": command, "timeout_ms": 60_000 });
    load_str(&path, &doc.to_string()).expect("scenario")
}

fn status(t: &TrialRecord, c: CheckName) -> (Status, String) {
    let r = t.checks.iter().find(|r| r.check == c).unwrap_or_else(|| panic!("{} lacks {c}", t.name()));
    (r.status, r.detail.clone())
}

/// Run `arch`'s boundary scenario over stdio; returns its trials after the checks every engine shares.
fn passes_over_stdio(arch: &str) -> Vec<TrialRecord> {
    let s = over_stdio(arch);
    let listed: Vec<CaseName> = match &s.params {
        Params::BoundaryMatrix(p) => p.cases.clone().expect("the PR boundary files list their cases"),
        _ => panic!("{arch}: not a boundary matrix"),
    };
    let out = std::env::temp_dir().join(format!("kvproof-stdio-boundary-{}-{arch}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (summary, trials) = run_scenarios(&[s], &opts).expect("run");
    let bad: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    assert!(summary.pass, "{arch}: {bad:#?}");

    // only the cancel case is skipped: a CANCEL frame races the engine, so no mid-prefill cancel is deterministic
    let skipped: Vec<&str> = summary.scenarios[0].skipped_cases.iter().map(|(n, _)| n.as_str()).collect();
    let expect_skipped: Vec<&str> = listed.iter().filter(|c| **c == CaseName::CancelRetry).map(|c| c.name()).collect();
    assert_eq!(skipped, expect_skipped, "{arch}");
    let ran: std::collections::BTreeSet<&str> = trials.iter().map(|t| t.plan.as_str()).collect();
    assert_eq!(ran.len(), listed.len() - expect_skipped.len(), "{arch}: {ran:?}");

    // ids, reuse counts and dumps travel over the protocol: compared replies are checked, not skipped
    for t in trials.iter().filter(|t| t.reused.is_some()) {
        for c in [CheckName::Tokens, CheckName::Reuse, CheckName::State, CheckName::Coverage] {
            let (st, detail) = status(t, c);
            assert_eq!(st, Status::Pass, "{arch}: {} {c}: {detail}", t.name());
        }
        // state bytes do not: the memory check is skipped with that reason, never passed
        let (st, detail) = status(t, CheckName::Memory);
        assert_eq!(st, Status::Skipped, "{arch}: {}", t.name());
        assert!(detail.contains("no state bytes") || detail.contains("several slots"), "{detail}");
    }
    assert!(trials.iter().any(|t| t.reused.unwrap_or(0) > 0), "{arch}: reuse never fired over stdio");
    assert!(trials.iter().all(|t| t.reused.is_none() || t.reused == t.expected_reuse), "{arch}");
    let _ = std::fs::remove_dir_all(&out);
    trials
}

fn reuse(trials: &[TrialRecord], plan: &str, step: &str) -> Option<usize> {
    trials.iter().find(|t| t.plan == plan && t.step == step).unwrap_or_else(|| panic!("{plan} / {step}")).reused
}

#[test]
fn glm53_boundary_passes_over_stdio() {
    let trials = passes_over_stdio("glm53");
    assert_eq!(reuse(&trials, "grid-diverge", "diverge at 33"), Some(32));
    assert_eq!(reuse(&trials, "grid-reply", "A: next turn"), Some(16));
}

#[test]
fn glm_boundary_passes_over_stdio() {
    let trials = passes_over_stdio("glm");
    // `--preset` serves glm with sharing off (its CAPS do not announce kv_share): an empty slot reuses nothing
    assert_eq!(reuse(&trials, "share", "B turn 1 on slot 1"), Some(0));
    assert!(reuse(&trials, "slot-switch", "B turn 2 on slot 0") > Some(0), "the common opening on a used slot");
}

#[test]
fn kimi_boundary_passes_over_stdio() {
    let trials = passes_over_stdio("kimi");
    assert_eq!(trials.iter().filter(|t| t.plan == "growing-conversation").count(), 19);
}

#[test]
fn deepseek_boundary_passes_over_stdio() {
    let trials = passes_over_stdio("deepseek");
    assert_eq!(reuse(&trials, "block-edges", "from 47 (fed 65)"), Some(47));
}

#[test]
fn inkling_boundary_passes_over_stdio() {
    passes_over_stdio("inkling");
}
