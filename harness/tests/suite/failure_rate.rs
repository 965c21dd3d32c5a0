//! The scenario-level `rate` check end to end: a stress scenario's failure-rate bound against
//! `assert.max_failure_rate`, judged once per scenario, shown in the checks table, and a requirement
//! (`assert.require: ["rate"]`) that a judged bound satisfies and a planted fault's bound fails.

use std::path::{Path, PathBuf};

use crate::support;
use support::{kvproof, text, tmp};

/// 24 stress pairs on deepseek/tiny whose failure rate may be at most 30%, the rate check required.
fn scenario(dir: &Path, assert: &str) -> PathBuf {
    let p = dir.join("rate.json");
    let text = format!(
        r#"{{
  "name": "tiny-rate",
  "engine": {{ "arch": "deepseek", "preset": "tiny", "seed": 0 }},
  "kind": "stress-pairs",
  "seed": 7,
  "params": {{ "pairs": 24, "turns": [2, 4], "user_len": [1, 12], "max_tokens": 4 }},
  "assert": {assert}
}}
"#
    );
    std::fs::write(&p, text).expect("write scenario");
    p
}

/// summary.md's checks-table row of `rate`: (ran, pass, fail, skipped, required).
fn rate_row(md: &str) -> Option<String> {
    md.lines().find(|l| l.starts_with("| tiny-rate | rate |")).map(str::to_string)
}

#[test]
fn a_required_rate_is_judged_and_fails_only_when_the_bound_exceeds_the_limit() {
    let dir = tmp("rate");
    let p = scenario(&dir, r#"{ "max_failure_rate": 0.3, "require": ["rate", "tokens"] }"#);

    let out = dir.join("clean");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "a judged bound within its limit satisfies the requirement: {}", text(&o));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert_eq!(rate_row(&md).as_deref(), Some("| tiny-rate | rate | 1 | 1 | 0 | 0 | yes |"), "{md}");

    // every reply recorded one id too many: every pair fails, the bound is far above the limit
    let out = dir.join("bulk-record");
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(&out).args(["--fault", "bulk-record"]).output().expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let why = "failure rate bound 100.0% > limit 30.0% (24/24 failed, 95% one-sided)";
    assert!(text(&o).contains(why), "{}", text(&o));
    assert!(!text(&o).contains("was not judged"), "the bound was judged: {}", text(&o));
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert_eq!(rate_row(&md).as_deref(), Some("| tiny-rate | rate | 1 | 0 | 1 | 0 | yes |"), "{md}");
    assert_eq!(md.matches(why).count(), 1, "one reason, not a second from the requirement: {md}");
}

#[test]
fn requiring_the_rate_without_a_limit_is_an_input_error() {
    let dir = tmp("rate-without-limit");
    let p = scenario(&dir, r#"{ "require": ["rate"] }"#);
    let o = kvproof().arg("run").arg(&p).arg("--out").arg(dir.join("out")).output().expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("rate.json")
            && msg.contains("assert.require: `rate` is judged only on a scenario with assert.max_failure_rate"),
        "{msg}"
    );
}
