//! An agentic turn as records carry it: the warm and cold trajectories' steps (`agent::step`, where the sandbox
//! makes them), and where the reuse went.

use serde::{Deserialize, Serialize};

pub use crate::agent::step::{AgentStep, Assertion, AssertionResult, ToolCall};

/// Where one turn's reuse went: what the engine reused, what a token-exact transcript (the previous turn's own
/// ids, extended) would have allowed, and what the re-rendered transcript still shared with the ids fed last turn.
/// `lost` = token-exact − rendered: tokens lost because the reply's text does not re-tokenize to its ids or the
/// template is not prefix-stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RerenderReuse {
    pub engine: Option<usize>,
    pub token_exact: Option<usize>,
    pub rendered: Option<usize>,
    pub lost: Option<usize>,
}

/// An agentic turn on a trial record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTurn {
    pub task: String,
    /// The session's index in the scenario and the turn's in the session (from 1).
    pub session: usize,
    pub turn: usize,
    /// The warm trajectory's turn (the session follows it).
    pub warm: AgentStep,
    /// The cold trajectory's turn at this index: the cold reply of the same transcript until warm and cold part,
    /// then the next turn of a session that ran cold throughout (None when that session has ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<AgentStep>,
    /// The turn at which the warm and cold trajectories parted, once they have (this turn or an earlier one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parted_at: Option<usize>,
    pub reuse: RerenderReuse,
    /// The cold trajectory's prompt tokens and wall time on this turn, once it runs apart from the warm session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_prompt_tokens: Option<usize>,
    /// Why the session ended after this turn (None: it went on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// On the session's last warm turn: the cold trajectory's turns past the warm session's end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cold_tail: Vec<AgentStep>,
}

impl AgentTurn {
    /// Turn `turn` of session `session` (task `task`) with its warm step; the rest not known yet.
    pub fn new(task: &str, session: usize, turn: usize, warm: AgentStep) -> Self {
        AgentTurn {
            task: task.to_string(),
            session,
            turn,
            warm,
            cold: None,
            parted_at: None,
            reuse: RerenderReuse::default(),
            cold_prompt_tokens: None,
            ended: None,
            cold_tail: Vec::new(),
        }
    }
}
