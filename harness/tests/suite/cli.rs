//! The `kvproof` binary as a CI calls it: exit codes, error messages that name file:line:column, the report
//! rebuild, and the small commands.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;
use support::{kvproof, text, tmp};

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write scenario");
    p
}

#[test]
fn malformed_scenario_exits_2_with_file_line_column() {
    let dir = tmp("malformed");
    let bad = write(&dir, "bad.json", "{\n  \"name\": \"x\",\n  \"engine\": {\"arch\": \"inkling\"},\n  \"kind\": \"boundary-matrix\",\n  \"parms\": {}\n}\n");
    let o = kvproof().args(["run"]).arg(&bad).arg("--out").arg(dir.join("out")).output().expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains(&format!("{}:5:", bad.display())), "file:line:column missing: {msg}");
    assert!(msg.contains("unknown field `parms`"), "the unknown key is not named: {msg}");
    assert!(!dir.join("out").exists(), "nothing runs when an input is bad");

    let truncated = write(&dir, "cut.json", "{\"name\": \"x\",\n \"engine\": {\"arch\": \"inkling\"}");
    let o = kvproof().arg("run").arg(&truncated).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains(&format!("{}:2:", truncated.display())), "{}", text(&o));

    let nested = write(
        &dir,
        "nested.json",
        r#"{"name": "x", "engine": {"arch": "inkling"}, "kind": "stress-pairs",
  "params": {"pairs": 3,
             "max_token": 2}}"#,
    );
    let o = kvproof().arg("run").arg(&nested).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    let msg = text(&o);
    assert!(msg.contains(&format!("{}:3:", nested.display())) && msg.contains("unknown field `max_token`"), "{msg}");
}

#[test]
fn usage_errors_exit_2() {
    let o = kvproof().args(["run"]).output().expect("run");
    assert_eq!(o.status.code(), Some(2), "no scenario given");
    let o = kvproof().args(["run", "/nonexistent/scenario.json"]).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("/nonexistent/scenario.json"), "{}", text(&o));
    let o = kvproof().args(["run", "scenarios/pr", "--fault", "no-such-fault"]).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("unknown fault"), "{}", text(&o));
    let o = kvproof().args(["frobnicate"]).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    let empty = tmp("empty-dir");
    let o = kvproof().arg("run").arg(&empty).output().expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no scenario files"), "{}", text(&o));
}

#[test]
fn help_documents_the_exit_codes() {
    let o = kvproof().arg("--help").output().expect("help");
    assert_eq!(o.status.code(), Some(0));
    let t = text(&o);
    for needle in ["Exit codes", "0  every check passed", "1  a check failed", "2  usage or input error"] {
        assert!(t.contains(needle), "--help lacks {needle:?}: {t}");
    }
    let o = kvproof().args(["run", "--help"]).output().expect("help");
    assert!(text(&o).contains("Exit codes"));
}

#[test]
fn list_names_engines_faults_kinds_and_cases() {
    let o = kvproof().arg("list").output().expect("list");
    assert_eq!(o.status.code(), Some(0));
    let t = text(&o);
    for needle in
        ["inkling", "memcmp-short", "ring-linear-copy", "boundary-matrix", "stress-pairs", "diverge-last", "tiny"]
    {
        assert!(t.contains(needle), "list lacks {needle}: {t}");
    }
    let o = kvproof().args(["list", "--json"]).output().expect("list");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["engines"].as_array().is_some_and(|a| !a.is_empty()));
}

#[test]
fn fixture_writes_a_loadable_model() {
    let dir = tmp("fixture");
    let out = dir.join("model");
    let o = kvproof()
        .args(["fixture", "--arch", "inkling", "--preset", "tiny", "--seed", "3", "--out"])
        .arg(&out)
        .output()
        .expect("fixture");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    kvproof_engines::bundled::open_dir(&out, None).expect("the fixture opens");
    let o = kvproof().args(["fixture", "--arch", "nope", "--out"]).arg(dir.join("x")).output().expect("fixture");
    assert_eq!(o.status.code(), Some(2));
}

/// A small boundary run: passes clean (exit 0) with every artifact; the same scenario with a fault fails (exit 1)
/// and names the check that caught it; `report` rebuilds the summaries byte for byte from the artifacts.
#[test]
fn run_exit_codes_artifacts_and_report_rebuild() {
    let dir = tmp("run");
    let s = write(
        &dir,
        "s.json",
        r#"{"name": "small", "engine": {"arch": "inkling", "preset": "tiny"}, "kind": "boundary-matrix",
        "seed": 3, "params": {"cases": ["extend", "diverge-last", "prompt-reply"], "max_tokens": 5}}"#,
    );
    let out = dir.join("clean");
    let o = kvproof().arg("run").arg(&s).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for f in ["run.json", "results.jsonl", "turns.csv", "summary.md", "junit.xml"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary");
    assert!(summary.contains("3/3") && summary.contains("≤ 63.2% (95%)"), "{summary}");

    // rebuild from the artifacts alone
    let (md, xml) = (summary.clone(), std::fs::read_to_string(out.join("junit.xml")).expect("junit"));
    std::fs::remove_file(out.join("summary.md")).expect("rm");
    std::fs::remove_file(out.join("junit.xml")).expect("rm");
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(out.join("summary.md")).expect("summary"), md);
    assert_eq!(std::fs::read_to_string(out.join("junit.xml")).expect("junit"), xml);

    // a fault the cases catch
    let faulty = dir.join("faulty");
    let o = kvproof()
        .arg("run")
        .arg(&s)
        .arg("--out")
        .arg(&faulty)
        .args(["--fault", "memcmp-short", "--json"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints the verdict");
    assert_eq!(v["pass"], false);
    assert!(v["scenarios"][0]["caught_by"].as_array().is_some_and(|a| a.iter().any(|c| c == "reuse")), "{v}");
    let md = std::fs::read_to_string(faulty.join("summary.md")).expect("summary");
    assert!(md.contains("diverge-last / turn 2") && md.contains("`reuse`: reused"), "{md}");

    // a hostile diff.json in the run folder (layer indices and positions at the integer edges) still draws a
    // bounded heatmap, and the report is rebuilt (on 87df1d6 the picture was sized by the layer index, and
    // plotters overflowed placing the positions)
    let diff_json = faulty.join("provenance/small/diverge-last/turn-2/diff.json");
    let mut d: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&diff_json).expect("diff.json")).expect("json");
    d["first"]["layer"] = u64::MAX.into();
    d["first"]["position"] = i64::MAX.into();
    let mut last = d["layers"][0].clone();
    last["layer"] = u64::MAX.into();
    d["layers"].as_array_mut().expect("layers").push(last);
    for t in d["tensors"].as_array_mut().expect("tensors") {
        t["layer"] = u64::MAX.into();
    }
    std::fs::write(&diff_json, d.to_string()).expect("write");
    let o = kvproof().arg("report").arg(&faulty).output().expect("report");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let svg = std::fs::read_to_string(faulty.join("plots/heatmap-01-small-diverge-last-turn-2.svg")).expect("heatmap");
    assert!(svg.len() < 1 << 20, "{} bytes", svg.len());

    // a report of a run folder with a torn results file still rebuilds; a corrupted one names the line
    let results = std::fs::read_to_string(faulty.join("results.jsonl")).expect("results");
    let mut lines: Vec<&str> = results.lines().collect();
    let last = lines.pop().expect("a line");
    std::fs::write(faulty.join("results.jsonl"), format!("{}\n{}", lines.join("\n"), &last[..last.len() / 2]))
        .expect("write");
    let o = kvproof().arg("report").arg(&faulty).output().expect("report");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    std::fs::write(faulty.join("results.jsonl"), format!("{}\nnot json\n{last}\n", lines.join("\n"))).expect("write");
    let o = kvproof().arg("report").arg(&faulty).output().expect("report");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains(&format!("results.jsonl:{}:", lines.len() + 1)), "{}", text(&o));
}

/// `mutants` over a scenario set that cannot catch most faults exits non-zero and names the survivors.
#[test]
fn mutants_with_a_weak_scenario_set_exits_non_zero() {
    let dir = tmp("mutants");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/examples/diverge-last-only.json");
    let o = kvproof().arg("mutants").arg(&scenario).arg("--out").arg(&dir).output().expect("mutants");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("SURVIVED: ring-linear-copy"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("memcmp-short") && l.contains("caught")), "{t}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("mutants.json")).expect("mutants.json")).expect("json");
    assert_eq!(report["clean"]["failed"], false);
    assert!(dir.join("mutants.md").is_file() && dir.join("clean/summary.md").is_file());
}

#[test]
fn a_missing_real_model_exits_2_with_the_command_that_fetches_it() {
    let dir = tmp("no-model");
    let scenario = write(
        &dir,
        "real.json",
        r#"{"name": "real", "engine": {"arch": "llama", "gguf": "smollm2"}, "kind": "boundary-matrix"}"#,
    );
    let empty = dir.join("empty-cache");
    let o = kvproof()
        .env("KVPROOF_CACHE", &empty)
        .args(["run"])
        .arg(&scenario)
        .arg("--out")
        .arg(dir.join("out"))
        .output()
        .expect("run");
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "{msg}");
    assert!(msg.contains("real.json") && msg.contains("bash ci/fetch-smollm2.sh"), "{msg}");
    assert!(!dir.join("out").exists(), "nothing runs without the model");
    // the served engine says the same (`cargo test --workspace` builds it next to kvproof)
    let engine = PathBuf::from(env!("CARGO_BIN_EXE_kvproof")).with_file_name("kvproof-engine");
    let o = Command::new(&engine).env("KVPROOF_CACHE", &empty).args(["--gguf", "smollm2"]).output().expect("engine");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bash ci/fetch-smollm2.sh"), "{}", text(&o));
}

/// The huge-pages rerun (`kvproof_engines::huge_pages`) is kvproof's own: an engine it starts sees
/// `GLIBC_TUNABLES` as the user gave it, set or unset, whichever way the machine's huge pages are configured.
#[cfg(unix)]
#[test]
fn an_engine_gets_the_users_glibc_tunables() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp("tunables");
    let seen = dir.join("seen");
    let script = write(
        &dir,
        "engine.sh",
        &format!("#!/bin/sh\necho \"[${{GLIBC_TUNABLES-unset}}]\" > '{}'\nexit 1\n", seen.display()),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let scenario = write(
        &dir,
        "env.json",
        &serde_json::json!({
            "name": "env",
            "engine": { "command": [script], "timeout_ms": 5000 },
            "kind": "boundary-matrix",
            "seed": 1,
            "params": {},
        })
        .to_string(),
    );
    for (given, want) in [(None, "[unset]"), (Some("glibc.malloc.arena_max=2"), "[glibc.malloc.arena_max=2]")] {
        let _ = std::fs::remove_file(&seen);
        let mut cmd = kvproof();
        cmd.args(["run"]).arg(&scenario).arg("--out").arg(dir.join("out"));
        match given {
            Some(v) => cmd.env("GLIBC_TUNABLES", v),
            None => cmd.env_remove("GLIBC_TUNABLES"),
        };
        let out = cmd.output().expect("run kvproof");
        let got = std::fs::read_to_string(&seen).unwrap_or_else(|e| panic!("the engine ran ({e}): {}", text(&out)));
        assert_eq!(got.trim(), want, "GLIBC_TUNABLES given {given:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
