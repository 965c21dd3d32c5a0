//! The first token where two replies differ, and how close the pick was there: a difference at a near-tie (tiny
//! top-2 gap) reads differently from one where the reference was confident.

use serde::{Deserialize, Serialize};

/// The first token where warm and cold differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub index: usize,
    /// The token each emitted there (`None`: that reply had already ended).
    pub warm: Option<u32>,
    pub cold: Option<u32>,
    /// Top-1 minus top-2 logit at that step, when the driver reports gaps.
    pub warm_gap: Option<f32>,
    pub cold_gap: Option<f32>,
    /// The token's text in the engine's own vocabulary, when the driver reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_text: Option<String>,
}

impl Divergence {
    /// How confident the reference (the cold instance) was where they part; the warm gap when there is no cold one.
    pub fn gap(&self) -> Option<f32> {
        self.cold_gap.or(self.warm_gap)
    }

    pub fn describe(&self) -> String {
        let tok = |t: Option<u32>, text: &Option<String>, gap: Option<f32>| {
            let id = match (t, text) {
                (Some(t), Some(text)) => format!("{t} {text}"),
                (Some(t), None) => t.to_string(),
                (None, _) => "(ended)".into(),
            };
            match gap {
                Some(g) => format!("{id} gap {g:.4}"),
                None => id,
            }
        };
        format!(
            "first differing token #{}: warm {}, cold {}",
            self.index,
            tok(self.warm, &self.warm_text, self.warm_gap),
            tok(self.cold, &self.cold_text, self.cold_gap)
        )
    }
}

/// A token's text as a reader wants to see it: quoted when it is printable text, its bytes in hex otherwise.
pub fn show_piece(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.is_empty() && s.chars().all(|c| !c.is_control()) => format!("{s:?}"),
        _ if bytes.is_empty() => "''".into(),
        _ => bytes.iter().map(|b| format!("0x{b:02x}")).collect::<Vec<_>>().join(" "),
    }
}
