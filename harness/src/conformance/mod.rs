//! `kvproof conformance -- COMMAND...`: start an engine process and check it against docs/protocol.md frame by
//! frame — READY and CAPS, every verb it declares, DATA and DONE fields and their consistency, the error code of
//! every malformed or invalid frame and staying in sync after it, the reuse count of continuations against the
//! rule the engine declares (the harness's own oracle), the last generated token never fed back, and the
//! extensions (DUMP, RESET, chat, echo, cancel_at) when declared.
//!
//! Each check ends as passed, violated (with the frame that showed it, and what was sent), or skipped with the
//! reason (an extension not declared, a case the engine's answers did not reach). `conn` reads the engine's
//! stdout without trusting it; `checks` is the sequence of checks.

mod checks;
pub mod conn;

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// Every check after start-up (READY and CAPS, which every run reports): a run that ends early lists the ones it
/// did not reach as skipped.
pub const CHECKS: [&str; 21] = [
    "submit-ids",
    "data",
    "done",
    "tok-s",
    "reuse",
    "last-token",
    "stop",
    "not-found",
    "barrier",
    "cancel",
    "cancel-at",
    "context-exceeded",
    "dump",
    "reset",
    "concurrency",
    "submit-text",
    "echo",
    "chat",
    "errors",
    "sync",
    "eof",
];

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Violation,
    Skipped,
}

/// One result of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The check's name (`caps`, `done`, `reuse`, ...; docs/engine-authors.md lists them).
    pub check: String,
    pub status: Status,
    /// What was checked, what was wrong, or why the check was skipped.
    pub detail: String,
    /// The frame that showed a violation, as the engine wrote it (escaped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<String>,
    /// What the check had sent before it (escaped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<String>,
    /// How often this same violation was seen.
    pub times: usize,
}

/// What `kvproof conformance` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub command: Vec<String>,
    /// The CAPS line as the engine wrote it.
    pub caps: Option<String>,
    pub findings: Vec<Finding>,
    /// The last lines the engine wrote on stderr.
    pub stderr_tail: String,
}

/// Why the engine could not be checked at all.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` wrote no READY marker within {after:?}{}", tail(.stderr))]
    NoReady { command: String, after: Duration, stderr: String },
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("\n--- engine stderr (last lines) ---\n{stderr}")
    }
}

/// Knobs of a conformance run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// How long any one answer may take.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { timeout: Duration::from_secs(30) }
    }
}

/// Start `command` and check it; `Err` only when it cannot start or never writes READY.
pub fn run(command: &[String], options: Options) -> Result<Report, StartError> {
    checks::run(command, options)
}

impl Report {
    pub fn violations(&self) -> usize {
        self.findings.iter().filter(|f| f.status == Status::Violation).count()
    }

    /// The checks that were violated, in order, without repeats.
    pub fn violated_checks(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for f in self.findings.iter().filter(|f| f.status == Status::Violation) {
            if !out.contains(&f.check.as_str()) {
                out.push(&f.check);
            }
        }
        out
    }

    /// The process exit code: 0 when nothing is violated, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.violations() == 0 {
            crate::exit::PASS
        } else {
            crate::exit::FAIL
        }
    }

    /// The report for a terminal: every violation with its frame, then what passed and what was skipped.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "kvproof conformance: `{}`", self.command.join(" "));
        if let Some(caps) = &self.caps {
            let _ = writeln!(out, "{caps}");
        }
        out.push('\n');
        let violations: Vec<&Finding> = self.findings.iter().filter(|f| f.status == Status::Violation).collect();
        if !violations.is_empty() {
            let _ = writeln!(out, "violations:");
            for f in &violations {
                let times = if f.times > 1 { format!(" (seen {} times)", f.times) } else { String::new() };
                let _ = writeln!(out, "  FAIL  {:<18} {}{times}", f.check, f.detail);
                if let Some(sent) = &f.sent {
                    let _ = writeln!(out, "        {:<18} sent:  {sent}", "");
                }
                if let Some(frame) = &f.frame {
                    let _ = writeln!(out, "        {:<18} frame: {frame}", "");
                }
            }
            out.push('\n');
        }
        let mut passed: Vec<&str> = Vec::new();
        for f in self.findings.iter().filter(|f| f.status == Status::Pass) {
            let violated = violations.iter().any(|v| v.check == f.check);
            if !violated && !passed.contains(&f.check.as_str()) {
                passed.push(&f.check);
            }
        }
        if !passed.is_empty() {
            let _ = writeln!(out, "passed:");
            for check in &passed {
                let details: Vec<&str> = self
                    .findings
                    .iter()
                    .filter(|f| f.status == Status::Pass && f.check == *check)
                    .map(|f| f.detail.as_str())
                    .collect();
                let _ = writeln!(out, "  ok    {check:<18} {}", details.join("; "));
            }
            out.push('\n');
        }
        let skipped: Vec<&Finding> = self.findings.iter().filter(|f| f.status == Status::Skipped).collect();
        if !skipped.is_empty() {
            let _ = writeln!(out, "skipped (not checked):");
            for f in &skipped {
                let _ = writeln!(out, "  skip  {:<18} {}", f.check, f.detail);
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{} violation(s) in {} check(s); {} check(s) passed, {} skipped",
            violations.len(),
            self.violated_checks().len(),
            passed.len(),
            skipped.len()
        );
        if !violations.is_empty() && !self.stderr_tail.is_empty() {
            let _ = writeln!(out, "\n--- engine stderr (last lines) ---\n{}", self.stderr_tail);
        }
        out
    }
}
