//! `params` of kind `stress-pairs`: how many seeded random conversations, and their shape.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_max_tokens, default_max_tokens, MAX_TOKENS, MAX_TURNS, MAX_USER_LEN};

pub const MAX_PAIRS: usize = 1_000_000;

/// `kind: stress-pairs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StressParams {
    /// Compared (warm, cold) pairs to run; conversations are generated until this many turns are compared.
    #[serde(default = "default_pairs")]
    #[schemars(range(min = 1, max = MAX_PAIRS))]
    pub pairs: usize,
    /// Turns per conversation, inclusive range; every turn after the first is compared.
    #[serde(default = "default_turns")]
    #[schemars(inner(range(min = 2, max = MAX_TURNS)))]
    pub turns: [usize; 2],
    /// User-message length range in bytes; absent means derived from the engine so that conversations cross
    /// the sliding window and the initial capacity. A given range whose longest conversation would not fit the
    /// engine's context is an error (it is never cut to fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(range(min = 1, max = MAX_USER_LEN)))]
    pub user_len: Option<[usize; 2]>,
    /// Tokens generated per turn (greedy).
    #[serde(default = "default_max_tokens")]
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// The slot the conversations run on.
    #[serde(default)]
    pub slot: usize,
    /// A JSON Lines file of chats (next to the scenario, `{"id", "system"?, "turns": [...]}` per line): the
    /// conversations are drawn from it and sent as text, so the engine applies its own tokenizer and chat template.
    /// Absent: kvproof's own id prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
}

fn default_pairs() -> usize {
    300
}
fn default_turns() -> [usize; 2] {
    [2, 8]
}

impl Default for StressParams {
    fn default() -> Self {
        StressParams {
            pairs: default_pairs(),
            turns: default_turns(),
            user_len: None,
            max_tokens: default_max_tokens(),
            slot: 0,
            corpus: None,
        }
    }
}

impl StressParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        check_max_tokens(self.max_tokens)?;
        if self.pairs == 0 || self.pairs > MAX_PAIRS {
            return Err(format!("params.pairs: {} is not in 1..={MAX_PAIRS}", self.pairs));
        }
        let [lo, hi] = self.turns;
        if lo < 2 || lo > hi || hi > MAX_TURNS {
            return Err(format!("params.turns: [{lo}, {hi}] must satisfy 2 <= min <= max <= {MAX_TURNS}"));
        }
        if let Some([lo, hi]) = self.user_len {
            if lo == 0 || lo > hi || hi > MAX_USER_LEN {
                return Err(format!("params.user_len: [{lo}, {hi}] must satisfy 1 <= min <= max <= {MAX_USER_LEN}"));
            }
        }
        Ok(())
    }
}
