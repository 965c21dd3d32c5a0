//! `kind: growth-curve` end to end on a tiny engine: the CSV, the plots, the derived numbers and the growth
//! assertions — and a fault that silently stops reuse (`drop-grow-record`) failing them. Wall-clock ratios are
//! not asserted here (tests do not time things); the reuse fraction is exact and is what the fault breaks.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support;
use support::{kvproof, text, tmp};

/// Six turns on inkling/tiny crossing its initial capacity (64) twice, so capacity growth happens mid-curve.
fn scenario(dir: &Path) -> PathBuf {
    let p = dir.join("growth.json");
    std::fs::write(
        &p,
        r#"{
  "name": "tiny-growth",
  "engine": { "arch": "inkling", "preset": "tiny", "seed": 0 },
  "kind": "growth-curve",
  "seed": 3,
  "params": { "turns": 6, "opening": 24, "user_len": 30, "max_tokens": 8, "repeats": 2, "cold_repeats": 2 },
  "assert": { "min_reuse_fraction": 0.7 }
}
"#,
    )
    .expect("write scenario");
    p
}

fn run(dir: &Path, out: &str, extra: &[&str]) -> (Output, PathBuf) {
    let out = dir.join(out);
    let o = kvproof().arg("run").arg(scenario(dir)).arg("--out").arg(&out).args(extra).output().expect("run");
    (o, out)
}

#[derive(Debug, serde::Deserialize)]
struct Row {
    scenario: String,
    turn: usize,
    context: usize,
    reused: usize,
    expected_reuse: Option<usize>,
    warm_repeats: usize,
    cold_repeats: usize,
    warm_prefilled: usize,
    cold_prefilled: usize,
    warm_wall_ms: f64,
    cold_wall_ms: f64,
    expected_warm_prefill_flops: Option<f64>,
    expected_cold_prefill_flops: Option<f64>,
    expected_decode_flops: Option<f64>,
    expected_oracle_warm_prefill_flops: Option<f64>,
    warm_steal: Option<f64>,
    cold_steal: Option<f64>,
}

fn rows(run: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(run.join("growth.csv")).expect("growth.csv");
    r.deserialize().map(|x| x.expect("row")).collect()
}

#[test]
fn a_clean_curve_writes_the_csv_and_plots_and_passes() {
    let dir = tmp("clean");
    let (o, out) = run(&dir, "run", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = rows(&out);
    assert_eq!(rows.len(), 6);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!((r.scenario.as_str(), r.turn), ("tiny-growth", i + 1));
        assert_eq!((r.warm_repeats, r.cold_repeats), (2, 2));
        assert_eq!(r.expected_reuse, Some(r.reused), "turn {}: reuse is the oracle's", r.turn);
        assert_eq!(r.warm_prefilled, r.context - r.reused);
        assert_eq!(r.cold_prefilled, r.context);
        assert!(r.warm_wall_ms > 0.0 && r.cold_wall_ms > 0.0);
        // a share of CPU time, empty when no tick of the system's clock passed during the repeats or it cannot tell
        for s in [r.warm_steal, r.cold_steal] {
            assert!(s.is_none_or(|f| (0.0..=1.0).contains(&f)), "turn {}: steal {s:?}", r.turn);
        }
    }
    // where the system tells (Linux), every side of every turn carries the CPU ticks its repeats ran over
    let results = std::fs::read_to_string(out.join("results.jsonl")).expect("results");
    let known = kvproof_engines::cpu_steal::CpuTimes::now().is_some();
    let growth: Vec<&str> = results.lines().filter(|l| l.contains("\"growth\":")).collect();
    assert_eq!(growth.len(), 6, "one growth record per turn");
    for line in growth {
        let v: serde_json::Value = serde_json::from_str(line).expect("a record");
        for side in ["warm", "cold"] {
            let ticks = &v["growth"][side]["steal"];
            assert_eq!(ticks["total"].is_u64() && ticks["steal"].is_u64(), known, "{side}: {ticks}");
        }
    }
    assert_eq!(rows[0].reused, 0, "turn 1 has nothing to reuse");
    assert!(rows[1..].iter().all(|r| r.reused > 0), "every later turn reuses");
    // the context grows by the same amount every turn: fixed user text and fixed-length replies
    let steps: Vec<usize> = rows.windows(2).map(|w| w[1].context - w[0].context).collect();
    assert!(steps.iter().all(|&s| s == steps[0]), "{steps:?}");

    for f in ["growth-wall-tiny-growth", "growth-reuse-tiny-growth", "bounds"] {
        for ext in ["svg", "png"] {
            let p = out.join("plots").join(format!("{f}.{ext}"));
            assert!(std::fs::metadata(&p).map(|m| m.len() > 2000).unwrap_or(false), "{} missing", p.display());
        }
    }
    let svg = std::fs::read_to_string(out.join("plots/growth-wall-tiny-growth.svg")).expect("svg");
    for label in
        ["per-turn wall time vs context", "context length at the turn (prompt tokens)", "wall time of the turn (ms)"]
    {
        assert!(svg.contains(label), "plot lacks {label:?}");
    }
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert!(md.contains("## Growth curves") && md.contains("| tiny-growth | "), "{md}");
    assert!(md.contains("| CPU steal |"), "{md}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains("name=\"growth assertions (warm "), "{junit}");
    assert!(!junit.contains("<failure"), "{junit}");
}

/// The turn's cost as the model's own description gives it, for a turn of `context` tokens, `reused` of them
/// reused, 8 reply tokens (7 decode steps).
fn cost_of(context: usize, reused: usize) -> (f64, f64, f64) {
    use kvproof_engines::config::{ArchConfig, Preset};
    let cost = kvproof_engines::arch::inkling::Config::preset(Preset::Tiny).cost();
    (cost.flops(reused, context), cost.flops(0, context), cost.flops(context, context + 7))
}

#[test]
fn the_models_expected_cost_shows_beside_the_measured_one() {
    let dir = tmp("expected");
    let (o, out) = run(&dir, "run", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for r in rows(&out) {
        let (warm, cold, decode) = cost_of(r.context, r.reused);
        assert!(r.reused == 0 || (warm > 0.0 && cold > warm), "turn {}", r.turn);
        assert_eq!(r.expected_warm_prefill_flops, Some(warm), "turn {}", r.turn);
        assert_eq!(r.expected_cold_prefill_flops, Some(cold), "turn {}", r.turn);
        assert_eq!(r.expected_decode_flops, Some(decode), "turn {}", r.turn);
    }
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert!(md.contains("| expected warm ratio |") && md.contains("ideal: model cost / tokens"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| tiny-growth | ") && l.contains(" → ")).expect("growth row");
    assert!(!row.contains("unknown"), "a bundled engine reports its cost: {row}");
    let html = std::fs::read_to_string(out.join("index.html")).expect("index.html");
    assert!(html.contains("<th>expected warm ratio</th>") && html.contains("ideal: model cost / tokens"), "{html}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains("% of model-cost ideal speedup"), "{junit}");

    // a report rebuilt from the records alone shows the same numbers
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(out.join("summary.md")).expect("summary"), md);
}

#[test]
fn an_engine_that_reports_no_cost_shows_the_expected_column_unknown() {
    let dir = tmp("stdio");
    let p = dir.join("stdio.json");
    let scenario = std::fs::read_to_string(scenario(&dir)).expect("scenario");
    let scenario = scenario.replace(r#""seed": 0 }"#, r#""seed": 0, "via": "stdio" }"#);
    assert!(scenario.contains("stdio"), "{scenario}");
    std::fs::write(&p, scenario).expect("write");
    let out = dir.join("run");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(rows(&out).iter().all(|r| r.expected_warm_prefill_flops.is_none()));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    let row = md.lines().find(|l| l.starts_with("| tiny-growth | ") && l.contains(" → ")).expect("growth row");
    assert!(row.contains("| unknown |"), "{row}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains("expected unknown") && junit.contains("% of token ideal speedup"), "{junit}");
}

#[test]
fn stopped_reuse_fails_the_growth_assertion_and_a_rebuild_agrees() {
    let dir = tmp("fault");
    let (o, out) = run(&dir, "run", &["--fault", "drop-grow-record"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains("of prompt tokens reused over turns 2..6; at least 70.0% required"), "{msg}");
    let rows = rows(&out);
    let lost: Vec<usize> = rows.iter().filter(|r| r.turn > 1 && r.reused == 0).map(|r| r.turn).collect();
    assert!(!lost.is_empty(), "capacity growth dropped the record on some turn");
    // the expected cost of a lost turn is a correct engine's, which reuses: the fault's full prefill is not excused
    for r in rows.iter().filter(|r| lost.contains(&r.turn)) {
        let (warm, cold, _) = cost_of(r.context, r.expected_reuse.expect("the oracle's count"));
        assert_eq!(r.expected_warm_prefill_flops, Some(cold), "turn {}: what the engine prefilled", r.turn);
        assert_eq!(r.expected_oracle_warm_prefill_flops, Some(warm), "turn {}: what it should have", r.turn);
        assert!(warm < cold, "turn {}", r.turn);
    }
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains("growth assertions") && junit.contains("<failure message=\""), "{junit}");

    // the report rebuilt from results.jsonl alone says the same
    let before = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    std::fs::remove_dir_all(out.join("plots")).expect("rm plots");
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(out.join("summary.md")).expect("summary"), before);
    assert!(out.join("plots/growth-wall-tiny-growth.svg").is_file(), "plots redrawn from the artifacts");
}

/// The tiny scenario with `assert` in place of its own, over stdio when `stdio` (where no cost travels).
fn scenario_asserting(dir: &Path, name: &str, assert: &str, stdio: bool) -> PathBuf {
    let text = std::fs::read_to_string(scenario(dir)).expect("scenario");
    let mut text = text.replace(r#""assert": { "min_reuse_fraction": 0.7 }"#, &format!(r#""assert": {assert}"#));
    if stdio {
        text = text.replace(r#""seed": 0 }"#, r#""seed": 0, "via": "stdio" }"#);
    }
    assert!(text.contains(assert) && text.contains("stdio") == stdio, "{text}");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// The row of `check` in summary.md's checks table: (ran, pass, fail, skipped).
fn check_row(md: &str, check: &str) -> Option<(usize, usize, usize, usize)> {
    let row = md.lines().find(|l| l.starts_with(&format!("| tiny-growth | {check} |")))?;
    let n: Vec<usize> = row.split('|').skip(3).take(4).map(|c| c.trim().parse().expect("count")).collect();
    Some((n[0], n[1], n[2], n[3]))
}

#[test]
fn the_warm_ratio_over_the_expected_one_is_judged_and_shown_with_its_bound() {
    // Wall-clock ratios are not asserted here: the bound is far above any a reusing engine reaches, so the check
    // runs and passes; the unit tests of src/check/growth.rs hold synthetic curves against tight bounds.
    let dir = tmp("over-expected");
    let p = scenario_asserting(&dir, "over.json", r#"{ "max_warm_ratio_over_expected": 50 }"#, false);
    let out = dir.join("run");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert_eq!(check_row(&md, "warm-growth"), Some((1, 1, 0, 0)), "{md}");
    assert!(md.contains("| warm / expected |"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| tiny-growth | ") && l.contains(" → ")).expect("growth row");
    assert!(row.contains("x** (≤ 50x) |"), "{row}");
    let html = std::fs::read_to_string(out.join("index.html")).expect("index.html");
    assert!(html.contains("<th>warm / expected</th>") && html.contains("x (≤ 50x)</td>"), "{html}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains("warm/expected ") && !junit.contains("<skipped"), "{junit}");
    // a clean engine reuses what the oracle expects: the expected cost is the one it paid
    for r in rows(&out) {
        assert_eq!(r.expected_oracle_warm_prefill_flops, r.expected_warm_prefill_flops, "turn {}", r.turn);
    }
}

#[test]
fn without_a_cost_the_bound_over_the_expected_ratio_is_skipped_and_fails_only_when_required() {
    let dir = tmp("over-expected-stdio");
    let p = scenario_asserting(&dir, "stdio.json", r#"{ "max_warm_ratio_over_expected": 1.5 }"#, true);
    let out = dir.join("run");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert_eq!(check_row(&md, "warm-growth"), Some((0, 0, 0, 1)), "skipped, not passed: {md}");
    let skipped = md.split("## Skipped (not counted as passed)").nth(1).expect("a skipped section");
    assert!(skipped.contains("- **tiny-growth**: warm-growth: the engine reports no cost"), "{skipped}");
    let row = md.lines().find(|l| l.starts_with("| tiny-growth | ") && l.contains(" → ")).expect("growth row");
    assert!(row.contains("| unknown (≤ 1.5x not judged) |"), "{row}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(junit.contains(r#"<testcase name="warm-growth""#) && junit.contains("<skipped"), "{junit}");

    // required, it cannot pass unjudged
    let p = scenario_asserting(
        &dir,
        "required.json",
        r#"{ "max_warm_ratio_over_expected": 1.5, "require": ["warm-growth"] }"#,
        true,
    );
    let out = dir.join("required");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let why = "required check `warm-growth` was skipped: the engine reports no cost";
    assert!(text(&o).contains(why), "{}", text(&o));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert!(md.contains(&format!("- **tiny-growth**: {why}")), "{md}");
}

#[test]
fn growth_assertions_on_another_kind_are_an_input_error() {
    let dir = tmp("misplaced");
    for (scenario, error) in [
        (
            r#"{"name": "x", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "assert": {"max_warm_ratio": 1.2}}"#,
            "assert.max_warm_ratio: applies to kind growth-curve only",
        ),
        (
            r#"{"name": "x", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": {"turns": 2}}"#,
            "params.turns: 2 is not in 3..=256",
        ),
    ] {
        let p = dir.join("bad.json");
        std::fs::write(&p, scenario).expect("write");
        let o = kvproof().arg("run").arg(&p).arg("--out").arg(dir.join("out")).output().expect("run");
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(error), "{}", text(&o));
    }
}
