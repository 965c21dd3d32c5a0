//! The agentic sandbox: what a model can call in an agentic session and how each turn is judged.
//!
//! A session gives a model a system prompt listing tools (`prompt`), parses the tool calls out of each reply
//! (`calls`), checks their arguments against the tools' schemas (`tools`), runs them over a *virtual* file tree
//! that never touches the host (`sandbox`, with `calculator` for arithmetic), and evaluates the per-turn
//! assertions over the session so far (`trajectory`, whose turns are `step::AgentStep`). Replies come from engines that may be broken or random, so
//! everything here treats them as untrusted: no panics, bounded allocation, every error a text the model can read.

pub mod calculator;
pub mod calls;
pub mod prompt;
pub mod sandbox;
pub mod step;
pub mod tools;
pub mod trajectory;
