//! Token identity: warm vs cold, and the cold-vs-cold control. On a mismatch, where and how close it was: a
//! difference at a near-tie (tiny top-2 gap) reads differently from one where the reference was confident.

use serde::{Deserialize, Serialize};

use super::{CheckName, CheckResult};
use crate::driver::Generation;

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

pub fn first_divergence(warm: &Generation, cold: &Generation) -> Option<Divergence> {
    let n = warm.tokens.len().max(cold.tokens.len());
    let index = (0..n).find(|&i| warm.tokens.get(i) != cold.tokens.get(i))?;
    let gap = |g: &Generation| g.gaps.as_ref().and_then(|gaps| gaps.get(index).copied());
    Some(Divergence {
        index,
        warm: warm.tokens.get(index).copied(),
        cold: cold.tokens.get(index).copied(),
        warm_gap: gap(warm),
        cold_gap: gap(cold),
    })
}

/// Warm vs cold token identity.
pub fn identity(warm: &Generation, cold: &Generation) -> (CheckResult, Option<Divergence>) {
    match first_divergence(warm, cold) {
        None => (CheckResult::pass(CheckName::Tokens, format!("{} tokens identical", warm.tokens.len())), None),
        Some(d) => (CheckResult::fail(CheckName::Tokens, d.describe()), Some(d)),
    }
}

/// Cold vs cold: the engine's own determinism on this prompt.
pub fn control(cold: &Generation, control: &Generation) -> CheckResult {
    match first_divergence(cold, control) {
        None => CheckResult::pass(CheckName::Control, "two cold runs identical"),
        Some(d) => CheckResult::fail(
            CheckName::Control,
            format!("two cold runs differ (noise, not reuse): {}", d.describe().replace("warm", "cold#2")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvproof_engines::engine::StopReason;
    use std::time::Duration;

    fn gen(tokens: &[u32], gaps: &[f32]) -> Generation {
        Generation {
            tokens: tokens.to_vec(),
            gaps: Some(gaps.to_vec()),
            reused: Some(0),
            prompt_tokens: 3,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            wall: Duration::ZERO,
            stop: StopReason::Length,
        }
    }

    #[test]
    fn identical_replies_pass() {
        let (r, d) = identity(&gen(&[1, 2], &[0.5, 0.5]), &gen(&[1, 2], &[0.5, 0.5]));
        assert_eq!(r.status, super::super::Status::Pass);
        assert!(d.is_none());
    }

    #[test]
    fn first_difference_carries_the_gap_there() {
        let (r, d) = identity(&gen(&[104, 105, 7], &[1.0, 0.001, 2.0]), &gen(&[104, 101], &[1.0, 0.004]));
        let d = d.expect("diverges");
        assert_eq!((d.index, d.warm, d.cold), (1, Some(105), Some(101)));
        assert_eq!(d.cold_gap, Some(0.004));
        assert!(d.near_tie());
        assert!(r.detail.contains("#1") && r.detail.contains("'i'") && r.detail.contains("near-tie"), "{}", r.detail);
    }

    #[test]
    fn a_longer_reply_diverges_where_the_shorter_ends() {
        let d = first_divergence(&gen(&[1, 2, 3], &[5.0; 3]), &gen(&[1, 2], &[5.0; 2])).expect("diverges");
        assert_eq!((d.index, d.warm, d.cold), (2, Some(3), None));
        assert!(!d.near_tie());
    }
}
