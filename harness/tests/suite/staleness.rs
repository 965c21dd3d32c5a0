//! `kind: semantic-staleness` end to end on tiny engines: clean engines answer every current prompt fresh; a
//! reuse length taken from counts (`counter-reuse`) answers from the stale context's state — classified
//! stale(X), with the hypothesis it matched — and a slot that keeps its previous conversation's rows
//! (`stale-slot`) produces replies that match nothing (corrupt), each counted with its bound.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support;
use support::{kvproof, text, tmp};

fn scenario(dir: &Path, arch: &str, cases: usize) -> PathBuf {
    let p = dir.join(format!("{arch}.json"));
    let body = format!(
        r#"{{"name": "{arch}-stale", "engine": {{"arch": "{arch}", "preset": "tiny", "seed": 0}},
            "kind": "semantic-staleness", "seed": 1, "params": {{"cases": {cases}, "max_tokens": 8}}}}"#
    );
    std::fs::write(&p, body).expect("write scenario");
    p
}

#[derive(Debug, serde::Deserialize)]
struct Row {
    context: String,
    shape: String,
    class: String,
    matched: String,
    distinguishable: bool,
}

fn run(dir: &Path, arch: &str, cases: usize, fault: Option<&str>) -> (Output, Vec<Row>, String) {
    let out = dir.join(format!("run-{arch}-{}", fault.unwrap_or("clean")));
    let mut c = kvproof();
    c.arg("run").arg(scenario(dir, arch, cases)).arg("--out").arg(&out);
    if let Some(f) = fault {
        c.args(["--fault", f]);
    }
    let o = c.output().expect("run");
    let mut r = csv::Reader::from_path(out.join("staleness.csv")).expect("staleness.csv");
    let rows = r.deserialize().map(|x| x.expect("row")).collect();
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    (o, rows, md)
}

#[test]
fn clean_engines_answer_every_current_prompt_fresh() {
    let dir = tmp("clean");
    for (arch, contexts) in [("glm", 3), ("inkling", 2)] {
        let (o, rows, md) = run(&dir, arch, 4, None);
        assert_eq!(o.status.code(), Some(0), "{arch}: {}", text(&o));
        assert_eq!(rows.len(), 4 * contexts, "{arch}");
        assert!(rows.iter().all(|r| r.class == "fresh"), "{arch}: {rows:?}");
        // the test has power: in every case a stale reply would have differed from the fresh one
        assert!(rows.iter().all(|r| r.distinguishable), "{arch}: {rows:?}");
        assert!(rows.iter().any(|r| r.shape == "current-longer") && rows.iter().any(|r| r.shape == "current-shorter"));
        assert!(md.contains("## Semantic staleness"), "{md}");
    }
    // a single-slot engine reports the context it cannot hold as skipped, not passed
    let (_, _, md) = run(&dir, "inkling", 1, None);
    assert!(md.contains("case `other-slot` skipped: the engine has 1 slot"), "{md}");
}

#[test]
fn a_reuse_length_from_counts_is_classified_stale_with_its_context() {
    let dir = tmp("counter");
    let (o, rows, md) = run(&dir, "inkling", 4, Some("counter-reuse"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // a longer current prompt reuses exactly what the stale context fed: the reply is that state's
    for r in rows.iter().filter(|r| r.shape == "current-longer") {
        assert_eq!(r.class, format!("stale({})", r.context), "{r:?}");
        assert!(r.matched.starts_with("state@"), "{r:?}");
    }
    // a shorter one rewinds the sliding-window ring past rows it already overwrote: nothing reproduces it
    assert!(rows.iter().filter(|r| r.shape == "current-shorter").all(|r| r.class == "corrupt"), "{rows:?}");
    assert!(md.contains("| inkling-stale | previous-turn | 4 | 0 | 2 | 2 |"), "{md}");
    assert!(md.contains("| inkling-stale | all | 8 | 0 | 4 | 4 |"), "{md}");
    // glm's rows are position-addressed: both shapes answer from the stale context's state
    let (o, rows, _) = run(&dir, "glm", 2, Some("counter-reuse"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let own: Vec<&Row> = rows.iter().filter(|r| r.context != "other-slot").collect();
    assert!(own.iter().all(|r| r.class == format!("stale({})", r.context)), "{rows:?}");
    assert!(rows.iter().filter(|r| r.context == "other-slot").all(|r| r.class == "fresh"), "{rows:?}");
}

#[test]
fn rows_left_from_a_slots_previous_conversation_are_corrupt() {
    let dir = tmp("stale-slot");
    let (o, rows, md) = run(&dir, "glm", 4, Some("stale-slot"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    for r in &rows {
        // a longer prompt overwrites every stale row; a shorter one leaves them where decode attends
        let want = if r.context != "other-slot" && r.shape == "current-shorter" { "corrupt" } else { "fresh" };
        assert_eq!(r.class, want, "{r:?}");
    }
    // 4 corrupt of 12: the bound is reported per context and overall
    assert!(md.contains("| glm-stale | all | 12 | 8 | 0 | 4 |"), "{md}");
    let bound = kvproof::stats::percent(kvproof::stats::upper_one_sided(4, 12, 0.95).expect("bound"));
    assert!(md.contains(&format!("| ≤ {bound} | ≤ {bound} (95%) |")), "corrupt and not-fresh bound of 4/12: {md}");
    let junit = std::fs::read_to_string(rows_dir(&dir).join("junit.xml")).expect("junit");
    assert!(junit.contains("corrupt: the warm reply equals neither"), "{junit}");
}

fn rows_dir(dir: &Path) -> PathBuf {
    dir.join("run-glm-stale-slot")
}
