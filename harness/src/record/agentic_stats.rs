//! What an agentic scenario's records add up to, per task and over all: turns and tool calls on the warm and
//! cold trajectories, each per-turn assertion as a rate with its Clopper–Pearson interval (warm beside cold: a
//! reuse bug shows as a difference between them), sessions solved, and where the reuse went.

use serde::{Deserialize, Serialize};

use super::Assertion;
use crate::stats::Bound;

/// One assertion on one trajectory: how often it applied and held, with the interval on the rate it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssertionRate {
    pub assertion: Assertion,
    pub applied: usize,
    pub held: usize,
    /// Two-sided Clopper–Pearson interval on held / applied (None when it never applied).
    pub bound: Option<Bound>,
}

/// One trajectory's totals (warm: the session as run; cold: the session as it would have gone cold throughout).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TrajectoryStats {
    pub turns: usize,
    pub tool_calls: usize,
    /// Sessions that called `finish`, and those whose answer was the task's.
    pub finished: usize,
    pub solved: usize,
    pub assertions: Vec<AssertionRate>,
}

/// One task's sessions (or all of them: task "all").
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskStats {
    pub task: String,
    pub sessions: usize,
    /// Sessions whose warm and cold trajectories parted.
    pub parted: usize,
    pub warm: TrajectoryStats,
    pub cold: TrajectoryStats,
    /// Warm prompt tokens, and what the engine reused of them.
    pub prompt_tokens: usize,
    pub reused: usize,
    /// Over turns after the first: what a token-exact transcript would have allowed, what the re-rendered one
    /// kept, and the difference (tokens lost to re-tokenization or template instability).
    pub token_exact: usize,
    pub rendered: usize,
    pub lost: usize,
    /// Turns that lost any.
    pub turns_losing: usize,
}

impl TaskStats {
    /// The share of warm prompt tokens the engine reused.
    pub fn reuse_share(&self) -> f64 {
        crate::stats::share(self.reused as f64, self.prompt_tokens as f64)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticStats {
    pub confidence: f64,
    pub tasks: Vec<TaskStats>,
    pub total: TaskStats,
}
