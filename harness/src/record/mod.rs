//! What a run produces, as data: trial records (one line of results.jsonl each), turn rows (turns.csv), and what
//! they carry — check results, token divergences, state-diff summaries, growth and staleness outcomes, provenance
//! references. The runner sends them to a `Sink` as they complete; checks produce them; reports read them.

mod agent;
mod agentic_stats;
mod check_result;
mod divergence;
mod growth;
mod manifest;
mod provenance_ref;
mod shard_info;
mod staleness;
mod state;
mod summary;
mod trial;
mod turn_row;

pub use agent::{AgentStep, AgentTurn, Assertion, AssertionResult, RerenderReuse, ToolCall};
pub use agentic_stats::{AgenticStats, AssertionRate, TaskStats, TrajectoryStats};
pub use check_result::{CheckName, CheckResult, Status, Verdict};
pub use divergence::{show_piece, Divergence};
pub use growth::{median, GrowthStats, GrowthTurn, Run, Timing, TurnCost};
pub use manifest::{stamp, unix_now, Machine, Manifest, ScenarioEntry};
pub use provenance_ref::ProvenanceRef;
pub use shard_info::{set_identity, ScenarioTotals, ShardInfo};
pub use staleness::{Class, ContextCounts, Hypothesis, Shape, StaleOutcome, StalenessStats};
pub use state::StateSummary;
pub use summary::{CheckCounts, GapStats, ReuseTotals, ScenarioSummary, Summary};
pub use trial::{TrialRecord, TrialTimings};
pub use turn_row::TurnRow;

use kvproof_engines::dump::StateDump;
use kvproof_engines::state_diff::StateDiff;

/// Where records go as they complete.
pub trait Sink: Sync {
    fn trial(&self, t: &TrialRecord);
    fn turn(&self, row: &TurnRow);
    /// Keep both dumps of a failing comparison and their diff (computed once, by the state check); returns where
    /// (None: this sink keeps none).
    fn provenance(
        &self,
        _case: &str,
        _warm: &StateDump,
        _cold: &StateDump,
        _diff: &StateDiff,
    ) -> Option<ProvenanceRef> {
        None
    }
}

/// A sink that keeps nothing (the caller uses the returned records).
pub struct NullSink;
impl Sink for NullSink {
    fn trial(&self, _: &TrialRecord) {}
    fn turn(&self, _: &TurnRow) {}
}
