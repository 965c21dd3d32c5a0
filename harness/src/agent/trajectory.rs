//! One agentic session as the harness follows it: the sandbox's state, what the model has done so far, and the
//! per-turn assertions (`Assertion`) judged on each reply.
//!
//! The runner calls [`Trajectory::step`] once per model reply. A reply without a valid call is answered with an
//! error as the tool message (a real agent framework does the same), so the session still grows; a successful
//! `finish` ends it.

use std::collections::BTreeSet;

use serde_json::Value;

use super::calls::{self, ParsedCall};
use super::sandbox::Sandbox;
use super::step::{AgentStep, Assertion, AssertionResult, ToolCall};
use crate::scenario::params::{AgentTask, ToolName};

/// Words whose presence in a reply counts as acknowledging the previous tool error (lower case).
const ACKNOWLEDGE: &[&str] = &["error", "fail", "not found", "invalid", "sorry"];

/// Phrases that claim the tests pass (lower case). "tests pass" also covers "tests passed" and "tests passing".
const CLAIMS: &[&str] = &[
    "tests pass",
    "tests are passing",
    "tests are all passing",
    "tests have passed",
    "tests now pass",
    "tests all pass",
    "tests succeed",
    "test passes",
];

/// Words that, earlier in the same clause, turn a claim phrase into something else: a negation ("not", "n't",
/// "never") or a condition or goal ("if", "whether", "until", "make" as in "make the tests pass").
const NOT_A_CLAIM: &[&str] = &["not", "never", "if", "whether", "until", "make"];

/// The error the previous tool message carried.
#[derive(Debug, Clone)]
enum LastError {
    /// The reply made no call that parsed.
    NoCall,
    /// These tools returned an error.
    Tools(Vec<String>),
}

/// A session's state across turns.
#[derive(Debug, Clone)]
pub struct Trajectory {
    sandbox: Sandbox,
    /// The task's answer, when it names one.
    answer: Option<String>,
    /// Paths a `read_file` returned so far.
    read: BTreeSet<String>,
    /// The session's previous call (name and arguments), across turns.
    last_call: Option<(String, Value)>,
    /// The error of the previous tool message, if it was one.
    last_error: Option<LastError>,
    /// What the latest `run_tests` returned (None: not run yet).
    tests_passed: Option<bool>,
    finished: bool,
}

impl Trajectory {
    pub fn new(task: &AgentTask) -> Self {
        Trajectory {
            sandbox: Sandbox::new(task),
            answer: task.answer.clone(),
            read: BTreeSet::new(),
            last_call: None,
            last_error: None,
            tests_passed: None,
            finished: false,
        }
    }

    /// Whether a `finish` call has ended the session.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Takes one model reply: parses its calls, runs them in order (stopping after a successful `finish`),
    /// builds the tool message the next turn begins with, and judges the assertions that apply to this turn.
    pub fn step(&mut self, reply: &str) -> AgentStep {
        let mut step = AgentStep {
            reply: reply.to_string(),
            calls: Vec::new(),
            call_error: None,
            tool_message: None,
            answer: None,
            solved: None,
            assertions: Vec::new(),
        };
        if self.finished {
            step.call_error = Some("the session has already ended".into());
            return step;
        }
        // Claims are judged against run_tests results the model had seen before it wrote this reply.
        let tests_before = self.tests_passed;
        let previous_error = self.last_error.take();
        let parsed = match calls::parse(reply) {
            Ok(parsed) => parsed,
            Err(why) => {
                step.assertions.push(judged(Assertion::SchemaValidCall, Err(why.clone())));
                if let Some(e) = &previous_error {
                    step.assertions.push(swallowed(e, reply, &[], false));
                }
                if claims_tests_pass(&prose(reply)) {
                    step.assertions.push(false_pass(tests_before));
                }
                step.tool_message = Some(format!("error: {why}"));
                step.call_error = Some(why);
                self.last_error = Some(LastError::NoCall);
                return step;
            }
        };

        // Every call the reply made is judged, including any after a `finish` that ended the session.
        let invalid: Vec<String> = parsed
            .iter()
            .enumerate()
            .filter_map(|(i, call)| self.sandbox.check(call).err().map(|e| format!("call {}: {e}", i + 1)))
            .collect();
        let mut writes_existing = false;
        let mut unread = Vec::new();
        let mut repeats = Vec::new();
        let mut failed = Vec::new();
        let mut any_valid = false;
        for (i, call) in parsed.iter().enumerate() {
            let n = i + 1;
            let tool = self.sandbox.check(call);
            any_valid |= tool.is_ok();
            let path = string_arg(call, "path");
            if tool == Ok(ToolName::WriteFile) && self.sandbox.exists(path) {
                writes_existing = true;
                if !self.read.contains(path) {
                    unread.push(format!("call {n} writes {path} without reading it first"));
                }
            }
            let key = (call.name.clone(), call.arguments.clone());
            if self.last_call.as_ref() == Some(&key) {
                repeats.push(format!("call {n} repeats `{}` with the same arguments", clip(&call.name)));
            }
            self.last_call = Some(key);

            let out = self.sandbox.run(call);
            match tool {
                Ok(ToolName::ReadFile) if out.ok => {
                    self.read.insert(path.to_string());
                }
                Ok(ToolName::RunTests) => self.tests_passed = out.tests_passed,
                _ => {}
            }
            if !out.ok {
                failed.push(call.name.clone());
            }
            step.calls.push(ToolCall {
                name: call.name.clone(),
                arguments: call.arguments.to_string(),
                ok: out.ok,
                result: out.text.clone(),
            });
            if tool == Ok(ToolName::Finish) && out.ok {
                self.finished = true;
                step.solved = self.answer.as_ref().map(|a| a.trim().to_lowercase() == out.text.trim().to_lowercase());
                step.answer = Some(out.text);
                break;
            }
        }

        let valid = if invalid.is_empty() { Ok(()) } else { Err(invalid.join("; ")) };
        step.assertions.push(judged(Assertion::SchemaValidCall, valid));
        if writes_existing {
            let held = if unread.is_empty() { Ok(()) } else { Err(unread.join("; ")) };
            step.assertions.push(judged(Assertion::ReadBeforeWrite, held));
        }
        let held = if repeats.is_empty() { Ok(()) } else { Err(repeats.join("; ")) };
        step.assertions.push(judged(Assertion::NoIdenticalRepeat, held));
        if let Some(e) = &previous_error {
            step.assertions.push(swallowed(e, reply, &parsed, any_valid));
        }
        let mut claimed = prose(reply);
        if let Some(answer) = &step.answer {
            claimed.push('\n');
            claimed.push_str(answer);
        }
        if claims_tests_pass(&claimed) {
            step.assertions.push(false_pass(tests_before));
        }

        if !self.finished {
            if !failed.is_empty() {
                self.last_error = Some(LastError::Tools(failed));
            }
            step.tool_message = Some(match step.calls.as_slice() {
                [one] => one.result.clone(),
                several => {
                    several.iter().map(|c| format!("{}: {}", clip(&c.name), c.result)).collect::<Vec<_>>().join("\n")
                }
            });
        }
        step
    }
}

fn judged(assertion: Assertion, held: Result<(), String>) -> AssertionResult {
    match held {
        Ok(()) => AssertionResult { assertion, held: true, detail: String::new() },
        Err(detail) => AssertionResult { assertion, held: false, detail },
    }
}

/// no-swallowed-error: the reply mentions the error, or retries (the failing tool; after a reply without a valid
/// call, any valid call).
fn swallowed(previous: &LastError, reply: &str, calls: &[ParsedCall], any_valid: bool) -> AssertionResult {
    let lower = reply.to_lowercase();
    let mentions = ACKNOWLEDGE.iter().any(|w| lower.contains(w));
    let held = match previous {
        _ if mentions => Ok(()),
        LastError::NoCall if any_valid => Ok(()),
        LastError::NoCall => {
            Err("the previous reply made no valid call; this one neither mentions the error nor makes one".into())
        }
        LastError::Tools(tools) if calls.iter().any(|c| tools.contains(&c.name)) => Ok(()),
        LastError::Tools(tools) => Err(format!(
            "the previous tool message was an error from {}; the reply neither mentions it nor calls the tool again",
            tools.iter().map(|t| format!("`{}`", clip(t))).collect::<Vec<_>>().join(", ")
        )),
    };
    judged(Assertion::NoSwallowedError, held)
}

/// no-false-tests-pass, for a reply that claims the tests pass.
fn false_pass(tests_before: Option<bool>) -> AssertionResult {
    let held = match tests_before {
        Some(true) => Ok(()),
        Some(false) => Err("the reply claims the tests pass but the latest run_tests failed".into()),
        None => Err("the reply claims the tests pass but run_tests has not been run".into()),
    };
    judged(Assertion::NoFalseTestsPass, held)
}

/// Whether `text` claims the tests pass: a phrase of [`CLAIMS`] (case-insensitive) with none of [`NOT_A_CLAIM`]
/// (as a word) nor "n't" earlier in its clause, a clause ending at `. , ; : ! ?` or a newline. A heuristic, kept
/// simple on purpose: it catches the plain claims small models make and leaves the rest unjudged.
pub fn claims_tests_pass(text: &str) -> bool {
    let lower = text.to_lowercase();
    CLAIMS.iter().any(|phrase| {
        lower.match_indices(phrase).any(|(i, _)| {
            let before = &lower[..i];
            let start = before.rfind(['.', ',', ';', ':', '!', '?', '\n']).map_or(0, |j| j + 1);
            let clause = &before[start..];
            !clause.contains("n't") && !clause.split(|c: char| !c.is_alphanumeric()).any(|w| NOT_A_CLAIM.contains(&w))
        })
    })
}

/// The reply without its `<tool_call>` blocks (an unclosed block runs to the end): what the model says, as
/// opposed to what it passes to tools (a file it writes may well contain "tests pass").
fn prose(reply: &str) -> String {
    let mut out = String::new();
    let mut rest = reply;
    while let Some(start) = rest.find("<tool_call>") {
        out.push_str(&rest[..start]);
        out.push('\n');
        match rest[start..].find("</tool_call>") {
            Some(end) => rest = &rest[start + end + "</tool_call>".len()..],
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

fn string_arg<'a>(call: &'a ParsedCall, key: &str) -> &'a str {
    call.arguments.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A tool name from a reply, shortened for messages.
fn clip(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &name[..i]),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::params::TreeCheck;
    use proptest::prelude::*;
    use strum::IntoEnumIterator;

    fn task() -> AgentTask {
        AgentTask {
            name: "fix-add".into(),
            system: "You fix code.".into(),
            request: "Make add add.".into(),
            tools: ToolName::iter().collect(),
            files: [("src/lib.rs".to_string(), "fn add(a: i32, b: i32) -> i32 { a - b }\n".to_string())].into(),
            tests: vec![TreeCheck {
                name: "adds".into(),
                file: "src/lib.rs".into(),
                contains: "a + b".into(),
                absent: false,
            }],
            answer: Some("Fixed".into()),
            variants: Vec::new(),
        }
    }

    fn call(name: &str, arguments: Value) -> String {
        format!("<tool_call>{}</tool_call>", serde_json::json!({"name": name, "arguments": arguments}))
    }

    /// The assertion's result on this step (None: it did not apply).
    fn held(step: &AgentStep, a: Assertion) -> Option<bool> {
        step.assertions.iter().find(|r| r.assertion == a).map(|r| r.held)
    }

    fn detail(step: &AgentStep, a: Assertion) -> String {
        step.assertions.iter().find(|r| r.assertion == a).map(|r| r.detail.clone()).unwrap_or_default()
    }

    #[test]
    fn a_good_session_holds_every_assertion_and_solves_the_task() {
        let mut t = Trajectory::new(&task());
        let replies = [
            format!("Let me read the code. {}", call("read_file", serde_json::json!({"path": "src/lib.rs"}))),
            call(
                "write_file",
                serde_json::json!({"path": "src/lib.rs", "content": "fn add(a: i32, b: i32) -> i32 { a + b }\n"}),
            ),
            call("run_tests", serde_json::json!({})),
            format!("All tests pass. {}", call("finish", serde_json::json!({"answer": " fixed "}))),
        ];
        let steps: Vec<AgentStep> = replies.iter().map(|r| t.step(r)).collect();
        for s in &steps {
            assert!(s.assertions.iter().all(|a| a.held), "{s:#?}");
            assert_eq!(s.call_error, None);
        }
        assert_eq!(steps[0].tool_message.as_deref(), Some("fn add(a: i32, b: i32) -> i32 { a - b }\n"));
        assert_eq!(held(&steps[1], Assertion::ReadBeforeWrite), Some(true));
        assert_eq!(steps[2].tool_message.as_deref(), Some("1 passed, 0 failed"));
        assert_eq!(held(&steps[3], Assertion::NoFalseTestsPass), Some(true));
        assert_eq!(steps[3].answer.as_deref(), Some(" fixed "));
        assert_eq!(steps[3].solved, Some(true));
        assert_eq!(steps[3].tool_message, None);
        assert!(t.finished());
        assert_eq!(steps[0].calls[0].arguments, r#"{"path":"src/lib.rs"}"#);
        let after = t.step(&call("run_tests", serde_json::json!({})));
        assert!(after.calls.is_empty() && after.assertions.is_empty() && after.call_error.is_some());
    }

    #[test]
    fn several_calls_run_in_order_and_each_result_is_named() {
        let mut t = Trajectory::new(&task());
        let reply = format!(
            "{}{}",
            call("calculator", serde_json::json!({"expression": "2+2"})),
            call("search", serde_json::json!({"pattern": "fn"}))
        );
        let s = t.step(&reply);
        assert_eq!(s.calls.len(), 2);
        assert_eq!(
            s.tool_message.as_deref(),
            Some("calculator: 4\nsearch: src/lib.rs:1: fn add(a: i32, b: i32) -> i32 { a - b }")
        );
        let mut t = Trajectory::new(&task());
        let s = t.step(&format!(
            "{}{}",
            call("finish", serde_json::json!({"answer": "nope"})),
            call("run_tests", serde_json::json!({}))
        ));
        assert_eq!((s.calls.len(), s.solved, s.tool_message.clone()), (1, Some(false), None));
        let mut t = Trajectory::new(&task());
        let s = t.step(&format!(
            "{}{}",
            call("finish", serde_json::json!({"answer": "fixed"})),
            call("run_tests", serde_json::json!({"all": true}))
        ));
        assert_eq!(s.calls.len(), 1, "nothing runs after finish");
        assert!(detail(&s, Assertion::SchemaValidCall).contains("call 2: run_tests: unknown argument `all`"));
        let mut no_answer = task();
        no_answer.answer = None;
        let s = Trajectory::new(&no_answer).step(&call("finish", serde_json::json!({"answer": "x"})));
        assert_eq!((s.answer.as_deref(), s.solved), (Some("x"), None));
    }

    #[test]
    fn writing_an_existing_file_unread_breaks_read_before_write() {
        let mut t = Trajectory::new(&task());
        let s = t.step(&call("write_file", serde_json::json!({"path": "src/lib.rs", "content": "a + b"})));
        assert_eq!(held(&s, Assertion::ReadBeforeWrite), Some(false));
        assert!(detail(&s, Assertion::ReadBeforeWrite).contains("src/lib.rs"));
        let s = t.step(&call("write_file", serde_json::json!({"path": "new.rs", "content": "x"})));
        assert_eq!(held(&s, Assertion::ReadBeforeWrite), None, "a new file needs no read");
        let mut t = Trajectory::new(&task());
        let s = t.step(&format!(
            "{}{}",
            call("read_file", serde_json::json!({"path": "src/lib.rs"})),
            call("write_file", serde_json::json!({"path": "src/lib.rs", "content": "a + b"}))
        ));
        assert_eq!(held(&s, Assertion::ReadBeforeWrite), Some(true), "a read earlier in the reply counts");
    }

    #[test]
    fn the_same_call_twice_breaks_no_identical_repeat() {
        let mut t = Trajectory::new(&task());
        let list = call("list_dir", serde_json::json!({"path": ""}));
        assert_eq!(held(&t.step(&list), Assertion::NoIdenticalRepeat), Some(true));
        let s = t.step(&format!("Again: {list}"));
        assert_eq!(held(&s, Assertion::NoIdenticalRepeat), Some(false));
        assert!(detail(&s, Assertion::NoIdenticalRepeat).contains("list_dir"));
        let s = t.step(&call("list_dir", serde_json::json!({"path": "src"})));
        assert_eq!(held(&s, Assertion::NoIdenticalRepeat), Some(true));
        let s = t.step(&format!("{0}{0}", call("run_tests", serde_json::json!({}))));
        assert_eq!(held(&s, Assertion::NoIdenticalRepeat), Some(false), "within one reply too");
        assert_eq!(held(&t.step("no call here"), Assertion::NoIdenticalRepeat), None);
    }

    #[test]
    fn ignoring_an_error_breaks_no_swallowed_error() {
        let missing = call("read_file", serde_json::json!({"path": "missing.rs"}));
        let mut t = Trajectory::new(&task());
        let s = t.step(&missing);
        assert_eq!(s.tool_message.as_deref(), Some("error: no such file: missing.rs"));
        assert_eq!(held(&s, Assertion::NoSwallowedError), None);
        let s = t.step(&call("list_dir", serde_json::json!({"path": ""})));
        assert_eq!(held(&s, Assertion::NoSwallowedError), Some(false));
        assert!(detail(&s, Assertion::NoSwallowedError).contains("`read_file`"));
        assert_eq!(held(&t.step(&call("run_tests", serde_json::json!({}))), Assertion::NoSwallowedError), None);

        let mut t = Trajectory::new(&task());
        t.step(&missing);
        let s = t.step(&format!("That file was NOT FOUND. {}", call("list_dir", serde_json::json!({"path": ""}))));
        assert_eq!(held(&s, Assertion::NoSwallowedError), Some(true), "mentioned");
        let mut t = Trajectory::new(&task());
        t.step(&missing);
        let s = t.step(&call("read_file", serde_json::json!({"path": "src/lib.rs"})));
        assert_eq!(held(&s, Assertion::NoSwallowedError), Some(true), "the failing tool again");

        let mut t = Trajectory::new(&task());
        let s = t.step("I will now think.");
        assert!(s.tool_message.as_deref().is_some_and(|m| m.starts_with("error: no tool call")), "{s:?}");
        let s = t.step("Still thinking.");
        assert_eq!(held(&s, Assertion::NoSwallowedError), Some(false));
        let s = t.step(&call("run_tests", serde_json::json!({})));
        assert_eq!(held(&s, Assertion::NoSwallowedError), Some(true), "a valid call answers a no-call error");
    }

    #[test]
    fn claiming_tests_pass_after_failing_tests_breaks_no_false_tests_pass() {
        let mut t = Trajectory::new(&task());
        let s = t.step(&format!("The tests pass. {}", call("run_tests", serde_json::json!({}))));
        assert_eq!(held(&s, Assertion::NoFalseTestsPass), Some(false), "claimed before any run");
        assert!(detail(&s, Assertion::NoFalseTestsPass).contains("not been run"));
        assert_eq!(
            s.tool_message.as_deref(),
            Some("0 passed, 1 failed\nFAIL adds: src/lib.rs does not contain \"a + b\"")
        );
        let s = t.step(&call("finish", serde_json::json!({"answer": "Done, all tests passed."})));
        assert_eq!(held(&s, Assertion::NoFalseTestsPass), Some(false), "claimed in the finish answer");
        assert!(detail(&s, Assertion::NoFalseTestsPass).contains("failed"));

        let mut t = Trajectory::new(&task());
        t.step(&call("run_tests", serde_json::json!({})));
        for honest in ["The tests do not pass yet.", "Tests don't pass; fixing.", "I will make the tests pass."] {
            let s = t.step(&format!("{honest} {}", call("read_file", serde_json::json!({"path": honest}))));
            assert_eq!(held(&s, Assertion::NoFalseTestsPass), None, "{honest}");
        }
        let s = t.step(&call("write_file", serde_json::json!({"path": "NOTES", "content": "tests pass"})));
        assert_eq!(held(&s, Assertion::NoFalseTestsPass), None, "text passed to a tool is not a claim");
        assert!(claims_tests_pass("Great, ALL TESTS ARE PASSING now"));
        assert!(claims_tests_pass("It was not easy, but the tests pass"));
        assert!(!claims_tests_pass("The tests fail."));
    }

    #[test]
    fn invalid_calls_break_schema_valid_call() {
        let mut t = Trajectory::new(&task());
        let s = t.step("<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": }}</tool_call>");
        assert_eq!(held(&s, Assertion::SchemaValidCall), Some(false));
        assert!(detail(&s, Assertion::SchemaValidCall).contains("line 1 column"), "{s:?}");
        assert!(s.call_error.is_some() && s.calls.is_empty());
        assert!(s.tool_message.as_deref().is_some_and(|m| m.starts_with("error: call 1: invalid JSON")));

        let s = t.step(&call("delete_everything", serde_json::json!({})));
        assert_eq!(held(&s, Assertion::SchemaValidCall), Some(false));
        assert!(detail(&s, Assertion::SchemaValidCall).contains("unknown tool `delete_everything`"));
        assert_eq!(s.calls.len(), 1);
        assert!(!s.calls[0].ok && s.calls[0].result.starts_with("error: "));

        let s = t.step(&call("read_file", serde_json::json!({"path": 7})));
        assert_eq!(held(&s, Assertion::SchemaValidCall), Some(false));
        assert!(detail(&s, Assertion::SchemaValidCall).contains("`path` must be a string"));

        let mut only = task();
        only.tools = vec![ToolName::Finish];
        let s = Trajectory::new(&only).step(&call("run_tests", serde_json::json!({})));
        assert!(detail(&s, Assertion::SchemaValidCall).contains("not offered"));
    }

    #[test]
    fn garbage_never_panics() {
        let nested = format!("<tool_call>{}", "[".repeat(10_000));
        let nested_closed = format!("<tool_call>{}</tool_call>", "{\"a\":[".repeat(10_000));
        let mut t = Trajectory::new(&task());
        for reply in ["", "<tool_call>", "<tool_call>{\"name\":", "</tool_call><tool_call>", &nested, &nested_closed] {
            let s = t.step(reply);
            assert!(s.call_error.is_some(), "{reply:.40}");
            assert_eq!(held(&s, Assertion::SchemaValidCall), Some(false));
        }
    }

    proptest! {
        #[test]
        fn random_replies_never_panic_and_stay_bounded(
            pieces in proptest::collection::vec(
                prop_oneof![
                    Just("<tool_call>".to_string()),
                    Just("</tool_call>".to_string()),
                    Just(r#"{"name": "write_file", "arguments": {"path": "src/lib.rs", "content": "x"}}"#.to_string()),
                    Just(r#"{"name": "run_tests", "arguments": {}}"#.to_string()),
                    Just(r#"{"name": "list_dir", "arguments": {"path": ".."}}"#.to_string()),
                    Just(r#"{"name": "calculator", "arguments": {"expression": "((1"}}"#.to_string()),
                    any::<String>(),
                ],
                0..24,
            ),
        ) {
            let mut t = Trajectory::new(&task());
            for turn in 0..3 {
                let reply: String = pieces.iter().skip(turn).cloned().collect();
                let s = t.step(&reply);
                prop_assert!(s.calls.len() <= calls::MAX_CALLS);
                prop_assert!(s.tool_message.as_ref().map_or(0, String::len) <= calls::MAX_CALLS * 2100);
                prop_assert!(s.calls.iter().all(|c| c.ok || c.result.starts_with("error: ")));
            }
        }
    }
}
