//! kvproof: the harness that turns scenario files into verdicts a CI can act on.
//!
//! A scenario names an engine and a kind of trial. The runner drives a *warm* instance through each conversation
//! and replays every compared turn on a *cold* instance (fresh state, same weights) and a second cold instance
//! (the control). The checks compare tokens, reuse counts and state dumps; the report writes the artifacts.
//!
//! Where things live: `scenario` (file format and loading), `driver` (in-process and stdio engines),
//! `oracle` (the expected reuse of a turn, per arch), `conversation` (transcripts and prompt edits),
//! `cases` (boundary matrix and stress pairs), `runner` (warm/cold/control execution), `check` (the
//! comparisons), `stats` (Clopper–Pearson), `report` (artifacts and summaries), `mutants` (fault injection
//! sweeps), `session` (a whole run: engines, artifacts, verdict), `merge` (shard folders into one run folder),
//! `conformance` (an engine process checked against the stdio protocol). The command line is the binary's `cli`.

pub mod agent;
pub mod cases;
pub mod check;
pub mod conformance;
pub mod conversation;
pub mod driver;
pub mod history;
pub mod id_diff;
pub mod investigate;
pub mod merge;
pub mod mutants;
pub mod oracle;
pub mod plot;
pub mod progress;
pub mod provenance;
pub mod record;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod session;
pub mod stats;
pub mod text_conversation;

/// Exit codes of the `kvproof` binary.
pub mod exit {
    /// Every check passed.
    pub const PASS: i32 = 0;
    /// A check failed (or an engine errored, or a fault survived `mutants`).
    pub const FAIL: i32 = 1;
    /// Usage or input error: bad arguments, unreadable or malformed scenario, unknown engine.
    pub const USAGE: i32 = 2;
}
