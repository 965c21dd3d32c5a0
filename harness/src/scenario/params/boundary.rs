//! `params` of kind `boundary-matrix`: which edge cases of the reuse decision to run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_max_tokens, DEFAULT_MAX_TOKENS, MAX_TOKENS};

/// `kind: boundary-matrix`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// A missing field takes its value from `Default`, the one place the defaults are written.
#[serde(deny_unknown_fields, default)]
pub struct BoundaryParams {
    /// The cases to run; absent means every case the engine's capabilities allow.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub cases: Option<Vec<CaseName>>,
    /// Tokens generated per turn (greedy).
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// The slot the cases run on.
    pub slot: usize,
}

impl Default for BoundaryParams {
    fn default() -> Self {
        BoundaryParams { cases: None, max_tokens: DEFAULT_MAX_TOKENS, slot: 0 }
    }
}

/// The boundary cases of the reuse decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum CaseName {
    /// The next chat turn: prompt + reply + new user text. Reuse is everything fed.
    Extend,
    /// The same prompt again: nothing left to prefill, so no reuse.
    ExactRepeat,
    /// A prompt shorter than what was fed: the state cannot be rewound.
    Shorter,
    /// Longer prompt that differs at the first fed id.
    DivergeFirst,
    /// Longer prompt that differs in the middle of what was fed.
    DivergeMiddle,
    /// Longer prompt that differs at the last fed id (the off-by-one memcmp boundary).
    DivergeLast,
    /// Exactly prompt + reply, plus one id: the last reply id was never fed, so reuse stops before it.
    PromptReply,
    /// A conversation longer than the sliding window, continued.
    WindowWrap,
    /// A continuation that grows the slot past its initial capacity: the record must survive the growth.
    CapacityGrowth,
    /// A turn carrying audio frames (never reused), then a turn after it (tainted: never reused).
    AudioTaint,
    /// A prompt past the context limit fails on warm and cold alike; the failed state is never reused.
    ContextOverflow,
    /// A request cancelled mid-prefill (at a fixed prefill poll), then a prompt extending it: the half-written
    /// state is never reused; reuse resumes after the next completed turn.
    CancelRetry,
    /// A 20-turn conversation, every turn compared: reuse grows with the context and the state's bytes follow
    /// its capacity, not the turn count.
    GrowingConversation,
    /// Continuations whose fed length sits on a 16-position block boundary and one off either side (deepseek's
    /// compressed blocks, prefill segments).
    BlockEdges,
    /// Divergence at a chunk-grid boundary -2/-1/+0/+1/+2 and at the next two boundaries (glm53).
    GridDiverge,
    /// Exact repeats of a prompt just past a grid boundary and of one on it (glm53).
    GridRepeat,
    /// Ever shorter prefixes across grid boundaries (glm53).
    GridShorter,
    /// A reply that crosses a grid boundary, then the next turn: rows written by decode are never reused (glm53).
    GridReply,
    /// Two prompt lengths whose chunks would tile the shared prefix differently if chunking followed the length.
    GridTiling,
    /// Two conversations interleaved on slots 0 and 1, each pinned to its slot.
    Interleave,
    /// A conversation lands on the slot another one used: only their common opening is reused there.
    SlotSwitch,
    /// Requests on empty slots: with cross-slot sharing they adopt another slot's matching prefix.
    Share,
}

impl CaseName {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl BoundaryParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        check_max_tokens(self.max_tokens)?;
        if self.cases.as_ref().is_some_and(Vec::is_empty) {
            return Err("params.cases: must list at least one case (or be left out for all)".into());
        }
        Ok(())
    }
}
