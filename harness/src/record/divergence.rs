//! The first token where two replies differ, and how close the pick was there: a difference at a near-tie (tiny
//! top-2 gap) reads differently from one where the reference was confident.

use serde::{Deserialize, Serialize};

/// Gaps below this are reported as near-ties: a tiny numeric difference may flip the pick there.
pub const NEAR_TIE: f32 = 1e-2;

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
}

impl Divergence {
    pub fn near_tie(&self) -> bool {
        self.warm_gap.into_iter().chain(self.cold_gap).any(|g| g < NEAR_TIE)
    }

    pub fn describe(&self) -> String {
        let tok = |t: Option<u32>, gap: Option<f32>| {
            let id = match t {
                Some(t) => format!("{t} {}", printable(t)),
                None => "(ended)".into(),
            };
            match gap {
                Some(g) => format!("{id} gap {g:.4}"),
                None => id,
            }
        };
        let tie = if self.near_tie() { " (near-tie)" } else { "" };
        format!(
            "first differing token #{}: warm {}, cold {}{tie}",
            self.index,
            tok(self.warm, self.warm_gap),
            tok(self.cold, self.cold_gap)
        )
    }
}

/// A token id as a reader wants to see it: the byte as a character, or the special's name.
pub fn printable(id: u32) -> String {
    let bytes = kvproof_engines::tokenizer::Tokenizer.token_bytes(id);
    match bytes.as_slice() {
        [b] if b.is_ascii_graphic() || *b == b' ' => format!("'{}'", *b as char),
        [b] => format!("0x{b:02x}"),
        _ => String::from_utf8_lossy(&bytes).into_owned(),
    }
}
