//! `kvproof run --shard K/N`, `kvproof merge` and `--jobs J`: a small set of every scenario kind run whole, as three
//! shards merged back, and with two workers gives the same trials, line for line, and the same verdicts, counts
//! and bounds; merge refuses a missing, duplicate or foreign shard and a folder that is no shard.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::{kvproof, text, tmp};

/// The fields of a trial record that measure time, and so differ between any two runs: everything else must be
/// equal. JSON pointers into one line of results.jsonl.
const TIMING_FIELDS: &[&str] = &[
    "/timings",
    "/growth/warm/prefill_ms",
    "/growth/warm/decode_ms",
    "/growth/warm/wall_ms",
    "/growth/warm/wall_min_ms",
    "/growth/warm/wall_max_ms",
    "/growth/cold/prefill_ms",
    "/growth/cold/decode_ms",
    "/growth/cold/wall_ms",
    "/growth/cold/wall_min_ms",
    "/growth/cold/wall_max_ms",
    // the machine's CPU ticks (and the hypervisor's share of them) while the runs went: measured like the times
    "/growth/warm/steal",
    "/growth/cold/steal",
];

/// Per scenario of a verdict (`--json`): the fields that must be equal (the rest are timings or derived from them).
const VERDICT_FIELDS: &[&str] =
    &["name", "kind", "planned", "trials", "passed", "failed", "inconclusive", "errors", "bound", "pass", "checks"];

fn scenarios(dir: &Path) -> PathBuf {
    let set = dir.join("scenarios");
    std::fs::create_dir_all(&set).expect("scenario dir");
    let files = [
        (
            "boundary.json",
            r#"{ "name": "t-boundary", "engine": { "arch": "inkling", "preset": "tiny", "seed": 0 },
                 "kind": "boundary-matrix", "seed": 1,
                 "params": { "cases": ["extend", "exact-repeat", "shorter", "diverge-middle", "prompt-reply",
                                       "window-wrap"], "max_tokens": 4 } }"#,
        ),
        (
            "stress.json",
            r#"{ "name": "t-stress", "engine": { "arch": "glm", "preset": "tiny", "seed": 0 },
                 "kind": "stress-pairs", "seed": 7, "params": { "pairs": 12, "turns": [2, 3], "max_tokens": 4 },
                 "assert": { "max_failure_rate": 0.5, "confidence": 0.95 } }"#,
        ),
        (
            "growth.json",
            r#"{ "name": "t-growth", "engine": { "arch": "inkling", "preset": "tiny", "seed": 0 },
                 "kind": "growth-curve", "seed": 6,
                 "params": { "turns": 4, "opening": 8, "user_len": 8, "max_tokens": 4, "repeats": 2,
                             "cold_repeats": 1 } }"#,
        ),
        (
            "agentic.json",
            r#"{ "name": "t-agentic", "engine": { "arch": "glm", "preset": "tiny", "seed": 0,
                                                  "config": { "max_ctx": 4096 } },
                 "kind": "agentic", "seed": 3,
                 "params": { "sessions": 3, "max_turns": 2, "max_tokens": 6, "tasks": [
                   { "name": "sum", "system": "You add.", "request": "What is {a} plus {b}?",
                     "tools": ["finish"], "answer": "{sum}", "variants": [{ "a": "3", "b": "4", "sum": "7" }] } ] } }"#,
        ),
    ];
    for (name, body) in files {
        std::fs::write(set.join(name), body).expect("scenario");
    }
    set
}

fn run(args: &[&str]) -> Output {
    kvproof().args(args).output().expect("kvproof runs")
}

/// Run and return the verdict `--json` printed; the run must finish (exit 0 or 1).
fn run_json(args: &[&str]) -> Value {
    let o = run(args);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{args:?}: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: verdict JSON: {e}\n{}", text(&o)))
}

/// results.jsonl of a run folder, one JSON value per trial with the timing fields taken out.
fn trials(dir: &Path) -> Vec<Value> {
    let body = std::fs::read_to_string(dir.join("results.jsonl")).expect("results.jsonl");
    body.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("a trial");
            for field in TIMING_FIELDS {
                let (parent, name) = field.rsplit_once('/').expect("pointer");
                if let Some(obj) = v.pointer_mut(parent).and_then(Value::as_object_mut) {
                    obj.remove(name);
                }
            }
            v
        })
        .collect()
}

/// Where two runs' trials differ, trial for trial (in file order), or Ok.
fn same_trials(a: &Path, b: &Path) -> Result<usize, String> {
    let (ta, tb) = (trials(a), trials(b));
    for (i, (x, y)) in ta.iter().zip(&tb).enumerate() {
        if x != y {
            return Err(format!("trial {} differs:\n{}\n{}", i + 1, x, y));
        }
    }
    if ta.len() != tb.len() {
        return Err(format!("{} trials against {}", ta.len(), tb.len()));
    }
    Ok(ta.len())
}

fn verdicts(summary: &Value) -> Vec<Value> {
    let scenarios = summary["scenarios"].as_array().expect("scenarios");
    scenarios.iter().map(|s| VERDICT_FIELDS.iter().map(|f| s[*f].clone()).collect::<Vec<_>>().into()).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn three_shards_merged_and_two_jobs_equal_the_unsharded_run_trial_for_trial() {
    let dir = tmp("equal");
    let set = scenarios(&dir);
    let full = dir.join("full");
    let whole = run_json(&["run", s(&set), "--jobs", "1", "--json", "--out", s(&full)]);
    let shards: Vec<PathBuf> = (1..=3).map(|k| dir.join(format!("shard-{k}"))).collect();
    for (k, out) in shards.iter().enumerate() {
        let shard = format!("{}/3", k + 1);
        run_json(&["run", s(&set), "--shard", &shard, "--jobs", "2", "--json", "--out", s(out)]);
        let n = trials(out).len();
        assert!(n > 0, "shard {shard} ran nothing: the set is too small to show anything");
    }
    // the shards, in any order
    let merged = dir.join("merged");
    let m = run_json(&["merge", s(&shards[2]), s(&shards[0]), s(&shards[1]), "--json", "--out", s(&merged)]);
    let n = same_trials(&full, &merged).unwrap_or_else(|e| panic!("merged vs unsharded: {e}"));
    assert!(n >= 20, "{n} trials");
    assert_eq!(verdicts(&m), verdicts(&whole));
    assert_eq!(verdicts(&whole).len(), 4);
    for f in ["summary.md", "index.html", "junit.xml", "growth.csv", "agentic.csv", "turns.csv"] {
        assert!(merged.join(f).is_file(), "merged folder lacks {f}");
    }
    let summary = |d: &Path| std::fs::read_to_string(d.join("summary.md")).expect("summary.md");
    // the verdict table's rows (the reuse and growth tables' rows carry timings)
    let full_summary = summary(&full);
    let rows: Vec<&str> = full_summary
        .lines()
        .skip_while(|l| !l.starts_with("| scenario | kind | engine |"))
        .skip(2)
        .take_while(|l| l.starts_with("| t-"))
        .collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for line in rows {
        assert!(summary(&merged).contains(line), "the merged summary lacks `{line}`");
    }

    // --jobs 2 on the whole set: the same trials in the same order as --jobs 1
    let two = dir.join("jobs-2");
    let j2 = run_json(&["run", s(&set), "--jobs", "2", "--json", "--out", s(&two)]);
    same_trials(&full, &two).unwrap_or_else(|e| panic!("--jobs 2 vs --jobs 1: {e}"));
    assert_eq!(verdicts(&j2), verdicts(&whole));

    // the comparison sees a changed trial
    let tampered = dir.join("tampered");
    std::fs::create_dir_all(&tampered).expect("dir");
    let body = std::fs::read_to_string(full.join("results.jsonl")).expect("results");
    let changed = body.replacen("\"prompt_tokens\":", "\"prompt_tokens\":1", 1);
    assert_ne!(changed, body);
    std::fs::write(tampered.join("results.jsonl"), changed).expect("write");
    assert!(same_trials(&full, &tampered).is_err(), "a changed trial went unseen");

    // merge refuses: a missing shard, a shard twice, a folder that is no shard, a shard of another run
    let refused = |args: &[&str], says: &str| {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?} should say `{says}`: {}", text(&o));
    };
    let out = |name: &str| dir.join(name);
    refused(&["merge", s(&shards[0]), s(&shards[1]), "--out", s(&out("m1"))], "missing shard(s) 3 of 3");
    refused(
        &["merge", s(&shards[0]), s(&shards[1]), s(&shards[0]), s(&shards[2]), "--out", s(&out("m2"))],
        &format!("{}: shard 1/3 again", shards[0].display()),
    );
    refused(
        &["merge", s(&shards[0]), s(&full), "--out", s(&out("m3"))],
        &format!("{}: not a shard folder", full.display()),
    );
    let foreign = dir.join("foreign");
    run_json(&["run", s(&set), "--shard", "2/3", "--fault", "none", "--json", "--out", s(&foreign)]);
    refused(
        &["merge", s(&shards[0]), s(&foreign), s(&shards[2]), "--out", s(&out("m4"))],
        &format!("{}: a shard of another run", foreign.display()),
    );
    // a shard folder that also holds a trial of another shard's unit
    let stolen = dir.join("stolen");
    std::fs::create_dir_all(&stolen).expect("dir");
    std::fs::copy(shards[0].join("run.json"), stolen.join("run.json")).expect("copy");
    let mut lines = std::fs::read_to_string(shards[0].join("results.jsonl")).expect("results");
    let other = std::fs::read_to_string(shards[1].join("results.jsonl")).expect("results");
    lines.push_str(other.lines().next().expect("a trial"));
    lines.push('\n');
    std::fs::write(stolen.join("results.jsonl"), lines).expect("write");
    refused(
        &["merge", s(&stolen), s(&shards[1]), s(&shards[2]), "--out", s(&out("m6"))],
        &format!("{}: results.jsonl: trial", stolen.display()),
    );
    let four = dir.join("of-four");
    run_json(&["run", s(&set), "--shard", "4/4", "--json", "--out", s(&four)]);
    refused(&["merge", s(&shards[0]), s(&four), "--out", s(&out("m5"))], "shard 4/4, but");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_shard_is_a_usage_error_that_says_what_is_expected() {
    let dir = tmp("bad");
    let set = scenarios(&dir);
    for bad in ["0/3", "4/3", "1/0", "0/0", "x", "1/", "-1/3", "1/3/4"] {
        let o = run(&["run", s(&set), &format!("--shard={bad}"), "--out", s(&dir.join("out"))]);
        assert_eq!(o.status.code(), Some(2), "--shard {bad}: {}", text(&o));
        assert!(text(&o).contains(&format!("--shard `{bad}`")), "--shard {bad}: {}", text(&o));
        assert!(!dir.join("out").exists(), "--shard {bad} wrote a run folder");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
