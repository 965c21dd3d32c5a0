//! `params` of kind `semantic-staleness`: which stale contexts to put in the warm instance's way, and how many
//! cases of each.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_in, check_max_tokens, check_span, MAX_TOKENS, MAX_USER_LEN};

/// The stale contexts a case can hold next to its current prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum ContextName {
    /// The slot's previous request: the same conversation with a different last user message (an edited and
    /// re-sent question).
    PreviousTurn,
    /// The slot last served another conversation with the same opening (another user of a shared server).
    OtherConversation,
    /// Another slot holds a conversation with the same opening (slots must never mix).
    OtherSlot,
}

impl ContextName {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// `kind: semantic-staleness`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// A missing field takes its value from `Default`, the one place the defaults are written.
#[serde(deny_unknown_fields, default)]
pub struct StalenessParams {
    /// Cases per stale context.
    #[schemars(range(min = 1, max = MAX_CASES))]
    pub cases: usize,
    /// The stale contexts to run; absent means every one the engine can hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub contexts: Option<Vec<ContextName>>,
    /// User-message length range in tokens.
    #[schemars(inner(range(min = 1, max = MAX_USER_LEN)))]
    pub user_len: [usize; 2],
    /// Reply tokens (generated past eos: every reply has this length).
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// The slot of the current conversation.
    pub slot: usize,
    /// The slot holding the other conversation (`other-slot`); must differ from `slot`.
    pub other_slot: usize,
    /// A JSON Lines file of staleness cases written as text (next to the scenario: `{"id", "system"?, "opening",
    /// "stale": [1 or 2 messages], "current"}` per line), sent as text for the engine's own template: questions
    /// whose fresh answers differ. Absent: kvproof's own id prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
}

impl Default for StalenessParams {
    fn default() -> Self {
        StalenessParams {
            cases: 20,
            contexts: None,
            user_len: [8, 40],
            max_tokens: 8,
            slot: 0,
            other_slot: 1,
            corpus: None,
        }
    }
}

pub const MAX_CASES: usize = 100_000;

impl StalenessParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        let p = self;
        check_in("cases", p.cases, 1..=MAX_CASES)?;
        check_span("user_len", p.user_len, 1, MAX_USER_LEN)?;
        check_max_tokens(p.max_tokens)?;
        if let Some(c) = &p.contexts {
            if c.is_empty() {
                return Err("params.contexts: must list at least one context (or be left out for all)".into());
            }
        }
        if p.slot == p.other_slot {
            return Err(format!("params.other_slot: must differ from params.slot ({})", p.slot));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    #[test]
    fn validation_names_the_field() {
        assert!((StalenessParams::default()).validate().is_ok());
        let e = (StalenessParams { cases: 0, ..StalenessParams::default() }).validate().expect_err("cases");
        assert!(e.contains("params.cases"), "{e}");
        let e = (StalenessParams { other_slot: 0, ..StalenessParams::default() }).validate().expect_err("slots");
        assert!(e.contains("params.other_slot"), "{e}");
        let e = (StalenessParams { contexts: Some(vec![]), ..StalenessParams::default() }).validate().expect_err("ctx");
        assert!(e.contains("params.contexts"), "{e}");
    }

    #[test]
    fn context_names_round_trip() {
        for c in ContextName::iter() {
            assert_eq!(serde_json::to_string(&c).expect("json"), format!("\"{}\"", c.name()));
        }
    }
}
