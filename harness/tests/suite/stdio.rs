//! The stdio driver against real engine processes (`kvproof-engine`, built by `cargo test --workspace` next to
//! this test's binary): the boundary matrix passes over the protocol, and an engine that is killed or hangs in
//! the middle of a run becomes an error trial while the run goes on and no earlier line is lost.

use std::path::{Path, PathBuf};

use kvproof::record::{CheckName, Status, Verdict};
use kvproof::report::{self, results};
use kvproof::scenario::load_str;
use kvproof::session::{run_scenarios, RunOptions};

use crate::support;
use support::engine_binary;

fn wrapper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/support/die-after.sh")
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvproof-stdio-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn scenario(
    name: &str,
    command: &[String],
    kind: &str,
    params: serde_json::Value,
    timeout_ms: u64,
) -> kvproof::scenario::Scenario {
    let json = serde_json::json!({
        "name": name,
        "engine": { "command": command, "timeout_ms": timeout_ms },
        "kind": kind,
        "seed": 1,
        "params": params,
    });
    load_str(Path::new("stdio.json"), &json.to_string()).expect("scenario")
}

fn cases(list: &[&str]) -> serde_json::Value {
    serde_json::json!({ "cases": list, "max_tokens": 6 })
}

fn engine_command() -> Vec<String> {
    let engine = engine_binary().to_string_lossy().into_owned();
    vec![engine, "--arch".into(), "inkling".into(), "--preset".into(), "tiny".into()]
}

#[test]
fn boundary_matrix_passes_over_stdio() {
    let params = cases(&["extend", "diverge-last", "prompt-reply", "window-wrap", "audio-taint"]);
    let s = scenario("stdio-boundary", &engine_command(), "boundary-matrix", params, 30_000);
    let out = out_dir("pass");
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (summary, trials) = run_scenarios(&[s], &opts).expect("run");
    let bad: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
    assert!(summary.pass, "{bad:#?}");
    // the protocol carries ids, reuse counts and dumps: nothing is skipped on the compared replies
    for t in &trials {
        for c in [CheckName::Tokens, CheckName::Reuse, CheckName::State, CheckName::Record] {
            let r = t.checks.iter().find(|r| r.check == c).expect("check present");
            assert_eq!(r.status, Status::Pass, "{} {c}: {}", t.name(), r.detail);
        }
    }
    assert!(trials.iter().any(|t| t.reused.unwrap_or(0) > 0), "reuse never fired over stdio");
    let _ = std::fs::remove_dir_all(&out);
}

fn wrapped(mode: &str, after: usize) -> Vec<String> {
    let mut c = vec![wrapper().to_string_lossy().into_owned(), mode.into(), after.to_string()];
    c.extend(engine_command());
    c
}

/// Each warm process dies at its third request: in two five-turn conversations, turn 3 is an error (with the
/// wrapper's last stderr line), a fresh warm process takes over for turns 4 and 5, and every other trial runs.
#[test]
fn an_engine_killed_mid_run_is_an_error_trial_and_the_run_goes_on() {
    let params = serde_json::json!({ "pairs": 8, "turns": [5, 5], "user_len": [3, 12], "max_tokens": 4 });
    let s = scenario("stdio-death", &wrapped("die", 2), "stress-pairs", params, 30_000);
    let planned = 8;
    let out = out_dir("death");
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (summary, _) = run_scenarios(&[s], &opts).expect("the run itself completes");
    assert!(!summary.pass, "errors must fail the run");

    // read back what was flushed to disk: every planned trial has its line, in JSON, none lost
    let lines = results::read(&out.join(report::RESULTS)).expect("results.jsonl");
    assert_eq!(lines.len(), planned, "{lines:#?}");
    let mut errors: Vec<String> = lines.iter().filter(|t| t.verdict == Verdict::Error).map(|t| t.name()).collect();
    errors.sort();
    assert_eq!(errors, vec!["conv-0000 / turn 3", "conv-0001 / turn 3"], "{lines:#?}");
    for e in lines.iter().filter(|t| t.verdict == Verdict::Error) {
        let tail = e.stderr_tail.as_deref().unwrap_or_default();
        assert!(tail.contains("die-after: killing the engine at request 3"), "stderr tail: {tail:?}");
        assert!(e.error.as_deref().is_some_and(|m| m.starts_with("warm")), "{:?}", e.error);
    }
    // turns 4 and 5 ran on a fresh warm process: nothing to reuse at turn 4, reuse again at turn 5 (unless the
    // generator put audio in that last turn, which is never reused)
    let mut resumed = 0;
    for conv in ["conv-0000", "conv-0001"] {
        let turn = |n: u32| lines.iter().find(|t| t.plan == conv && t.step == format!("turn {n}")).expect("ran");
        assert_eq!(turn(4).verdict, Verdict::Pass, "{:#?}", turn(4));
        assert_eq!(turn(4).expected_reuse, Some(0));
        assert_eq!(turn(5).verdict, Verdict::Pass, "{:#?}", turn(5));
        assert_eq!(turn(5).reused, turn(5).expected_reuse);
        resumed += usize::from(turn(5).reused.unwrap_or(0) > 0);
    }
    assert!(resumed > 0, "reuse never resumed on a replacement process");
    assert_eq!(lines.iter().filter(|t| t.verdict == Verdict::Pass).count(), planned - 2);
    assert_eq!(summary.scenarios[0].errors, 2);
    let md = std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary");
    assert!(md.contains("die-after: killing the engine"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A warm process that stops answering is killed at the per-request timeout; that trial is an error and the
/// run goes on with a fresh process.
#[test]
fn a_hanging_engine_times_out_into_an_error_trial() {
    let s = scenario("stdio-hang", &wrapped("hang", 2), "boundary-matrix", cases(&["window-wrap", "extend"]), 3_000);
    let out = out_dir("hang");
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (summary, trials) = run_scenarios(&[s], &opts).expect("run");
    assert!(!summary.pass);
    let hung = trials.iter().find(|t| t.verdict == Verdict::Error).expect("an error trial");
    assert_eq!(hung.name(), "window-wrap / turn 3");
    assert!(hung.error.as_deref().is_some_and(|e| e.contains("timed out")), "{:?}", hung.error);
    assert!(hung.stderr_tail.as_deref().is_some_and(|t| t.contains("die-after: hanging")), "{:?}", hung.stderr_tail);
    assert_eq!(trials.iter().filter(|t| t.verdict == Verdict::Pass).count(), 2, "{trials:#?}");
    let _ = std::fs::remove_dir_all(&out);
}
