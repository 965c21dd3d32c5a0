//! Prompts of exact lengths: the boundary cases of chunked and block-wise engines sit at given positions, so
//! their first turns are sized through the chat template rather than by their user text alone.

use kvproof_engines::rng::SplitMix64;

use crate::conversation::{random_text, Conversation, PromptSpec};

/// Ids a conversation's first prompt has besides its user text (the system message and the role markers).
pub fn opening_len() -> usize {
    let mut c = Conversation::new(0, 0);
    c.prepare(&PromptSpec::User { text: Vec::new(), audio_frames: 0 }).map_or(0, |(p, _)| p.prompt.len())
}

/// A first turn whose prompt is exactly `total` ids (or the opening alone, when `total` is shorter).
pub fn first_turn(rng: &mut SplitMix64, total: usize) -> PromptSpec {
    PromptSpec::User { text: random_text(rng, total.saturating_sub(opening_len())), audio_frames: 0 }
}

/// A user message of `len` random bytes.
pub fn user(rng: &mut SplitMix64, len: usize) -> PromptSpec {
    PromptSpec::User { text: random_text(rng, len), audio_frames: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_turns_have_the_asked_length() {
        let mut rng = SplitMix64::new(3);
        for total in [opening_len(), 30, 64, 100] {
            let mut c = Conversation::new(9, 0);
            let (p, _) = c.prepare(&first_turn(&mut rng, total)).expect("prepare");
            assert_eq!(p.prompt.len(), total);
        }
        assert!(opening_len() > 2, "the opening has a system message and role markers");
    }
}
