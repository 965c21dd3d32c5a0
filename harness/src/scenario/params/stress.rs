//! `params` of kind `stress-pairs`: how many seeded random conversations, and their shape.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_in, check_max_tokens, check_span, DEFAULT_MAX_TOKENS, MAX_TOKENS, MAX_TURNS, MAX_USER_LEN};

pub const MAX_PAIRS: usize = 1_000_000;

/// `kind: stress-pairs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// A missing field takes its value from `Default`, the one place the defaults are written.
#[serde(deny_unknown_fields, default)]
pub struct StressParams {
    /// Compared (warm, cold) pairs to run; conversations are generated until this many turns are compared.
    #[schemars(range(min = 1, max = MAX_PAIRS))]
    pub pairs: usize,
    /// Turns per conversation, inclusive range; every turn after the first is compared.
    #[schemars(inner(range(min = 2, max = MAX_TURNS)))]
    pub turns: [usize; 2],
    /// User-message length range in bytes; absent means derived from the engine so that conversations cross
    /// the sliding window and the initial capacity. A given range whose longest conversation would not fit the
    /// engine's context is an error (it is never cut to fit).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(inner(range(min = 1, max = MAX_USER_LEN)))]
    pub user_len: Option<[usize; 2]>,
    /// Tokens generated per turn (greedy).
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// The slot the conversations run on.
    pub slot: usize,
    /// A JSON Lines file of chats (next to the scenario, `{"id", "system"?, "turns": [...]}` per line): the
    /// conversations are drawn from it and sent as text, so the engine applies its own tokenizer and chat template.
    /// Absent: kvproof's own id prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
}

impl Default for StressParams {
    fn default() -> Self {
        StressParams {
            pairs: 300,
            turns: [2, 8],
            user_len: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            slot: 0,
            corpus: None,
        }
    }
}

impl StressParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        check_max_tokens(self.max_tokens)?;
        check_in("pairs", self.pairs, 1..=MAX_PAIRS)?;
        check_span("turns", self.turns, 2, MAX_TURNS)?;
        if let Some(user_len) = self.user_len {
            check_span("user_len", user_len, 1, MAX_USER_LEN)?;
        }
        Ok(())
    }
}
