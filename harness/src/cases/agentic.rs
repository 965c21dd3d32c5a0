//! Kind `agentic`: one plan per session, session i running task i mod T (of T tasks) with that task's variant
//! i / T. Only a session's first
//! turn is known in advance (the system prompt with the offered tools, and the user's request); every later turn
//! is the tool message the sandbox answers the warm reply with, so `runner::agentic` builds those as it goes.

use super::{plan_seed, Plan, Step};
use crate::agent::prompt::system_prompt;
use crate::conversation::PromptSpec;
use crate::scenario::params::{AgentTask, AgenticParams};

/// The task a session runs (its variant filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSession {
    pub task: AgentTask,
    /// The session's index in the scenario.
    pub session: usize,
}

/// The sessions as plans (each holding its first turn).
pub fn plans(p: &AgenticParams, seed: u64) -> Vec<Plan> {
    (0..p.sessions)
        .map(|i| {
            let n = p.tasks.len();
            let task = p.tasks[i % n].variant(i / n);
            let first = PromptSpec::Say { text: task.request.clone(), system: Some(system_prompt(&task)) };
            Plan {
                name: format!("{}-{i:04}", task.name),
                seed: plan_seed(seed, i as u64),
                slot: p.slot,
                steps: vec![Step::compared("turn 1", first, p.max_tokens)],
                stale: None,
                agent: Some(AgentSession { task, session: i }),
            }
        })
        .collect()
}
