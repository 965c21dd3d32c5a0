//! scenarios/schema.json is generated from the scenario types (`kvproof schema`): the committed file must be that
//! output. Every committed scenario file loads with the Rust loader, malformed ones are rejected with
//! file:line:column, and the schema agrees: it accepts every committed file (editors check them against it
//! through `"$schema": "../schema.json"`) and rejects the malformed ones.
//!
//! The schema is checked with Python's `jsonschema` package, the reference implementation of JSON Schema; that
//! test is ignored by a plain `cargo test` and run by `.ci/run` (`cargo test -- --ignored`), which installs it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support;
use support::repo;

const REGENERATE: &str = "cargo run -- schema > scenarios/schema.json";

fn committed_schema() -> String {
    std::fs::read_to_string(repo().join("scenarios/schema.json")).expect("scenarios/schema.json")
}

fn scenario_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read scenarios/") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            scenario_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "json")
            && p.file_name().is_some_and(|n| n != "schema.json" && n != "kills.json")
        {
            out.push(p);
        }
    }
}

fn committed_scenarios() -> Vec<PathBuf> {
    let mut files = Vec::new();
    scenario_files(&repo().join("scenarios"), &mut files);
    files.sort();
    assert!(files.len() >= 4, "expected the PR scenarios and examples, found {files:?}");
    files
}

const GOOD: [&str; 7] = [
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
    r#"{"name": "g", "engine": {"arch": "inkling", "preset": "small"}, "kind": "growth-curve",
        "params": {"turns": 10, "opening": 16, "user_len": 40, "max_tokens": 16, "repeats": 5, "cold_repeats": 2},
        "assert": {"max_warm_ratio": 1.2, "max_warm_ratio_over_expected": 1.5, "min_cold_ratio": 3,
                   "min_speedup_of_ideal": 0.5, "min_reuse_fraction": 0.8, "require": ["warm-growth"]}}"#,
    r#"{"name": "s", "engine": {"arch": "glm"}, "kind": "semantic-staleness",
        "params": {"cases": 3, "contexts": ["previous-turn", "other-slot"], "user_len": [4, 9], "other_slot": 2},
        "assert": {"max_failure_rate": 0.05}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling", "preset": "small", "seed": 3, "fault": null}, "kind": "boundary-matrix",
        "params": {"cases": ["extend", "diverge-last"], "max_tokens": 4, "slot": 0}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling", "fault": "memcmp-short"}, "kind": "stress-pairs",
        "params": {"pairs": 10, "turns": [2, 3], "user_len": [1, 9], "max_tokens": 2},
        "assert": {"max_failure_rate": 0.01, "confidence": 0.9, "state": false, "control": true}}"#,
    r#"{"$schema": "../schema.json", "name": "a", "description": "d", "seed": 4,
        "engine": {"command": ["x", "--y", ""], "timeout_ms": 100}, "kind": "stress-pairs"}"#,
    r#"{"name": "a", "engine": {"arch": "glm", "config": {"kv_share": true}}, "kind": "boundary-matrix",
        "params": {"cases": ["share", "grid-diverge", "cancel-retry"]}}"#,
];

const BAD: [&str; 29] = [
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "extra": 1}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "assert": {"max_warm_ratio": 1.2}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs",
        "assert": {"max_warm_ratio_over_expected": 1.5}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve",
        "assert": {"max_warm_ratio_over_expected": 1}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": {"turns": 2}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": {"repeat": 2}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth-curve", "assert": {"min_reuse_fraction": 1.5}}"#,
    r#"{"name": "a", "engine": {"arch": "glm"}, "kind": "semantic-staleness", "params": {"contexts": ["yesterday"]}}"#,
    r#"{"name": "a", "engine": {"arch": "glm"}, "kind": "semantic-staleness", "params": {"cases": 0}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"pair": 1}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"cases": ["nope"]}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"pairs": 3}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling", "command": ["x"]}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"command": ["x"], "seed": 1}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"command": ["x"], "config": {"kv_share": true}}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"arch": "glm", "config": 3}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"command": []}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"command": ["", "x"]}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"arch": "inkling", "preset": "huge"}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "growth"}"#,
    r#"{"engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
    r#"{"name": "", "engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "assert": {"confidence": 1}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [2]}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [1, 3]}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"pairs": -1}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "seed": 1.5}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"max_tokens": 100000}}"#,
    r#"{"name": "a", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": {"turns": [2, 1000]}}"#,
];

#[test]
fn the_committed_schema_is_the_generated_one() {
    let generated = kvproof::scenario::schema_json();
    assert!(
        committed_schema() == generated,
        "scenarios/schema.json differs from the schema the scenario types generate; regenerate it with `{REGENERATE}`"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_kvproof")).arg("schema").output().expect("kvproof schema");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), generated, "`kvproof schema` prints the generated schema");
}

#[test]
fn every_committed_scenario_loads() {
    for f in committed_scenarios() {
        kvproof::scenario::load_file(&f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_loader_accepts_the_good_documents_and_rejects_the_bad_with_their_position() {
    for g in GOOD {
        kvproof::scenario::load_str(Path::new("good.json"), g).unwrap_or_else(|e| panic!("loader rejects {g}: {e}"));
    }
    for b in BAD {
        let e = kvproof::scenario::load_str(Path::new("bad.json"), b).expect_err(b).to_string();
        let mut position = e.strip_prefix("bad.json:").unwrap_or_default().splitn(3, ':');
        let (line, column) = (position.next(), position.next());
        assert!(
            line.is_some_and(|l| l.parse::<usize>().is_ok()) && column.is_some_and(|c| c.parse::<usize>().is_ok()),
            "{b}: the error does not start with file:line:column: {e}"
        );
    }
}

/// Validates each document against the schema with Python's jsonschema (which must be installed).
/// Returns, per document, the validator's first error (None when the document is valid).
fn python_validate(schema: &str, docs: &[Value]) -> Vec<Option<String>> {
    const SCRIPT: &str = r#"
import json, sys
import jsonschema
schema = json.loads(open(sys.argv[1], encoding="utf-8").read())
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
out = []
for doc in json.load(sys.stdin):
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    out.append(None if not errors else "%s: %s" % ("/".join(map(str, errors[0].absolute_path)), errors[0].message))
print(json.dumps(out))
"#;
    let probe = Command::new("python3").args(["-c", "import jsonschema"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with jsonschema is needed (python3 -m pip install jsonschema; .ci/run installs it)"
    );
    let path = std::env::temp_dir().join(format!("kvproof-schema-{}.json", std::process::id()));
    std::fs::write(&path, schema).expect("write schema");
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let input = serde_json::to_vec(docs).expect("json");
    child.stdin.take().expect("stdin").write_all(&input).expect("write documents");
    let o = child.wait_with_output().expect("python3");
    let _ = std::fs::remove_file(&path);
    assert!(o.status.success(), "jsonschema failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("validator output")
}

#[test]
#[ignore = "needs python3 with jsonschema; .ci/run installs it and runs the ignored tests"]
fn the_schema_accepts_every_committed_scenario_and_the_good_documents_and_rejects_the_bad() {
    let files = committed_scenarios();
    let mut docs: Vec<Value> =
        files.iter().map(|f| serde_json::from_str(&std::fs::read_to_string(f).expect("read")).expect("json")).collect();
    docs.extend(GOOD.iter().chain(BAD.iter()).map(|d| serde_json::from_str::<Value>(d).expect("json")));
    let results = python_validate(&kvproof::scenario::schema_json(), &docs);
    assert_eq!(results.len(), docs.len());
    let (committed, rest) = results.split_at(files.len());
    let (good, bad) = rest.split_at(GOOD.len());
    for (f, r) in files.iter().zip(committed) {
        assert!(r.is_none(), "the schema rejects {}: {r:?}", f.display());
    }
    for (g, r) in GOOD.iter().zip(good) {
        assert!(r.is_none(), "the schema rejects {g}: {r:?}");
    }
    for (b, r) in BAD.iter().zip(bad) {
        assert!(r.is_some(), "the schema accepts {b}");
    }
}
