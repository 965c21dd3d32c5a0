//! An engine under test that breaks the protocol costs the trials it breaks, never the run: a flood of DATA without
//! DONE, DATA past `max_tokens`, a line that never ends, a dump whose contents lie (read as an error, or making a
//! check panic) each make an `error` trial naming what happened, while every other trial runs, results.jsonl keeps
//! every line and the summary is written. An engine's ERROR detail reaches the record and the summary.
//! `tests/suite/support/misbehave.sh` stands between the harness and a real `kvproof-engine` and misbehaves on cue.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvproof::record::{CheckName, Status, TrialRecord, Verdict};
use kvproof::report::{self, results};
use kvproof::scenario::load_str;
use kvproof::session::{run_scenarios, RunOptions};
use kvproof_engines::engine::Request;
use kvproof_engines::serve::StdioEngine;

fn engine_command() -> Vec<String> {
    let exe = std::env::current_exe().expect("test executable");
    let engine = kvproof::driver::sibling_binary(&exe, "kvproof-engine").unwrap_or_else(|| {
        panic!("kvproof-engine is not built next to {}: run `cargo test --workspace`", exe.display())
    });
    [engine.to_string_lossy().as_ref(), "--arch", "inkling", "--preset", "tiny"].map(String::from).to_vec()
}

fn misbehaving(mode: &str, after: usize, arg: &str) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/support/misbehave.sh");
    let mut c = vec![script.to_string_lossy().into_owned(), mode.into(), after.to_string(), arg.into()];
    c.extend(engine_command());
    c
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvproof-misbehave-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// What a run left on disk.
struct Run {
    out: PathBuf,
    returned: Vec<TrialRecord>,
    lines: Vec<TrialRecord>,
    summary: String,
}

impl Run {
    fn errors(&self) -> Vec<&TrialRecord> {
        self.lines.iter().filter(|t| t.verdict == Verdict::Error).collect()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.out);
    }
}

/// A boundary matrix over `command`; the run must complete, with every trial's line and the summary on disk.
fn run(name: &str, command: Vec<String>, timeout_ms: u64) -> Run {
    let json = serde_json::json!({
        "name": name,
        "engine": { "command": command, "timeout_ms": timeout_ms },
        "kind": "boundary-matrix",
        "seed": 1,
        "params": { "cases": ["extend", "diverge-last"], "max_tokens": 6 },
    });
    let s = load_str(Path::new("misbehave.json"), &json.to_string()).expect("scenario");
    let out = out_dir(name);
    let opts = RunOptions { out: out.clone(), fault: None, progress: false, command: vec![] };
    let (_, returned) = run_scenarios(&[s], &opts).expect("the run itself completes");
    let lines = results::read(&out.join(report::RESULTS)).expect("results.jsonl");
    let summary = std::fs::read_to_string(out.join(report::SUMMARY)).expect("summary.md is written");
    assert_eq!(lines.len(), returned.len(), "every trial has its line in results.jsonl");
    assert!(!lines.is_empty());
    Run { out, returned, lines, summary }
}

/// Each warm process misbehaves at its second request (the compared turn 2 of each plan; cold processes run one
/// request): that trial is an error saying `what`.
fn assert_one_error_per_plan(r: &Run, what: &str) {
    let errors = r.errors();
    assert_eq!(errors.len(), 2, "one error per plan: {:#?}", r.lines);
    for e in &errors {
        let msg = e.error.as_deref().unwrap_or_default();
        assert!(msg.contains(what), "error {msg:?} does not say {what:?}");
        assert_eq!(e.step, "turn 2", "{e:#?}");
    }
    assert!(r.summary.contains(what), "{}", r.summary);
}

#[test]
fn a_flood_of_data_without_done_is_a_protocol_error_of_that_trial() {
    // the 20 s timeout is not what ends it: the DATA frame past max_tokens is
    let started = std::time::Instant::now();
    let r = run("flood", misbehaving("flood", 1, "-"), 20_000);
    assert_one_error_per_plan(&r, "exceeds the request's max_tokens 6");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    let msg = r.errors()[0].error.clone().unwrap_or_default();
    assert!(msg.contains("breaking the protocol") && msg.contains("DATA frame 7 for request"), "{msg}");
}

#[test]
fn data_past_max_tokens_then_done_is_a_protocol_error() {
    let r = run("over-max", misbehaving("over-max", 1, "-"), 20_000);
    assert_one_error_per_plan(&r, "DATA frame 7 for request");
}

#[test]
fn a_line_that_never_ends_is_a_protocol_error_not_a_timeout() {
    let r = run("long-line", misbehaving("long-line", 1, "-"), 20_000);
    assert_one_error_per_plan(&r, "header line longer than 65536 bytes");
}

#[test]
fn an_engine_error_detail_reaches_the_record_and_the_summary() {
    let detail = "kv page 7 was freed twice";
    let r = run("error-detail", misbehaving("error", 1, detail), 20_000);
    let failed: Vec<_> = r.lines.iter().filter(|t| t.verdict == Verdict::Fail).collect();
    assert_eq!(failed.len(), 2, "{:#?}", r.lines);
    for t in failed {
        let outcome = t.checks.iter().find(|c| c.check == CheckName::Outcome).expect("outcome check");
        assert!(outcome.detail.contains(&format!("refused with INTERNAL ({detail})")), "{}", outcome.detail);
    }
    assert!(r.summary.contains(detail), "{}", r.summary);
}

/// A real dump of the bundled engine, its `kvproof` header changed by `lie`, written to `dir`.
fn lying_dump(dir: &Path, name: &str, lie: impl Fn(&mut serde_json::Value)) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    let real = dir.join("real.safetensors");
    let mut engine = StdioEngine::spawn(&engine_command(), &[], Duration::from_secs(30)).expect("engine");
    let req = Request { id: 1, prompt: vec![256, 259, 104, 105, 257, 260], max_tokens: 3, ..Request::default() };
    engine.submit(&req).expect("reply");
    engine.dump(0, &real.to_string_lossy()).expect("dump");
    let bytes = std::fs::read(&real).expect("read dump");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("safetensors header");
    let meta = header["__metadata__"]["kvproof"].as_str().expect("kvproof metadata");
    let mut meta: serde_json::Value = serde_json::from_str(meta).expect("kvproof header");
    lie(&mut meta);
    header["__metadata__"]["kvproof"] = meta.to_string().into();
    let mut new_header = header.to_string().into_bytes();
    new_header.resize(new_header.len().next_multiple_of(8), b' ');
    let mut out = (new_header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&new_header);
    out.extend_from_slice(&bytes[8 + n..]);
    let path = dir.join(name);
    std::fs::write(&path, out).expect("write lying dump");
    path
}

#[test]
fn a_dump_that_does_not_read_is_an_error_of_that_trial() {
    let dir = out_dir("dump-rows-files");
    // the first tensor claims 10^12 rows: the arrays hold 8
    let lie = lying_dump(&dir, "rows.safetensors", |m| m["tensors"][0]["rows"] = 1_000_000_000_000u64.into());
    let r = run("dump-rows", misbehaving("dump", 0, &lie.to_string_lossy()), 20_000);
    let errors = r.errors();
    assert_eq!(errors.len(), 2, "every dump lies: {:#?}", r.lines);
    for e in errors {
        let msg = e.error.as_deref().unwrap_or_default();
        assert!(msg.starts_with("warm (dump): the engine's DUMP of slot 0 is malformed"), "{msg}");
        assert!(msg.contains("layers.0.k.rows"), "the error names the tensor: {msg}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dump_at_the_last_layer_index_is_judged_not_a_crash() {
    // On 87df1d6 the diff sized a per-layer table by this index and the whole run aborted (overflow at
    // state_diff.rs:459, or an allocation of what the index says). The dump's arrays are well formed and the
    // reader takes it; the checks then judge what it holds: its 8-id record is not what the engine was fed.
    let dir = out_dir("dump-layer-files");
    let lie = lying_dump(&dir, "layer.safetensors", |m| {
        m["tensors"][0]["layer"] = u64::MAX.into();
        m["tensors"][0]["rows"] = 0.into();
    });
    let r = run("dump-layer", misbehaving("dump", 0, &lie.to_string_lossy()), 20_000);
    assert!(!r.returned.is_empty() && r.errors().is_empty(), "{:#?}", r.lines);
    for t in &r.lines {
        assert_eq!(t.verdict, Verdict::Fail, "{t:#?}");
        let record = t.checks.iter().find(|c| c.check == CheckName::Record).expect("a record check");
        assert!(record.status == Status::Fail && record.detail.contains("8 ids held"), "{record:#?}");
    }
    assert!(r.summary.contains("record"), "{}", r.summary);
    let _ = std::fs::remove_dir_all(&dir);
}
