//! Scenario values that cannot run on the engine they name are input errors (exit 2, naming the file and the
//! field) before any trial runs: a slot the engine does not have, user texts longer than its context holds.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support;
use support::{engine_binary, kvproof, text, tmp};

fn run(dir: &Path, scenario: &str) -> (PathBuf, Output) {
    let path = dir.join("s.json");
    std::fs::write(&path, scenario).expect("write scenario");
    let o = kvproof().arg("run").arg(&path).arg("--out").arg(dir.join("out")).output().expect("run");
    (path, o)
}

/// `o` is an input error: exit 2, a message naming `at` (the file, or a place in it) and `field`, and nothing ran.
/// The message, for further checks.
fn assert_input_error(dir: &Path, o: &Output, at: &str, field: &str) -> String {
    let msg = text(o);
    assert_eq!(o.status.code(), Some(2), "{msg}");
    assert!(msg.contains(at) && msg.contains(field), "{msg}");
    assert!(!dir.join("out").exists(), "nothing runs when an input is bad");
    msg
}

#[test]
fn a_slot_a_bundled_engine_does_not_have_exits_2_at_the_field() {
    let dir = tmp("bundled-slot");
    let (path, o) = run(
        &dir,
        "{\"name\": \"s\", \"engine\": {\"arch\": \"inkling\"}, \"kind\": \"stress-pairs\",\n\
         \"params\": {\"pairs\": 2, \"slot\": 7}}",
    );
    assert_input_error(&dir, &o, &format!("{}:2:", path.display()), "params.slot");
}

#[test]
fn a_slot_a_command_engine_does_not_report_exits_2_before_trials_run() {
    let dir = tmp("command-slot");
    let engine = serde_json::to_string(&engine_binary().display().to_string()).expect("json");
    let (path, o) = run(
        &dir,
        &format!(
            "{{\"name\": \"s\", \"engine\": {{\"command\": [{engine}, \"--arch\", \"inkling\", \"--preset\", \"tiny\"]}},\n\
             \"kind\": \"stress-pairs\", \"params\": {{\"pairs\": 2, \"slot\": 7}}}}"
        ),
    );
    let msg = assert_input_error(&dir, &o, &path.display().to_string(), "params.slot");
    assert!(!msg.contains("engine died"), "{msg}");
}

#[test]
fn user_texts_longer_than_the_context_holds_are_an_error_not_clamped() {
    let dir = tmp("user-len");
    let (path, o) = run(
        &dir,
        "{\"name\": \"s\", \"engine\": {\"arch\": \"inkling\"}, \"kind\": \"stress-pairs\",\n\
         \"params\": {\"pairs\": 1, \"turns\": [2, 2], \"user_len\": [100000, 100000]}}",
    );
    assert_input_error(&dir, &o, &path.display().to_string(), "params.user_len");
}
