//! Continuations of one conversation at chosen points: after a mid-prefill cancel, at block boundaries, and over
//! many turns.
//!
//! What each catches: `record-on-failure` (a cancelled segment still recorded: the retry reuses it), `kv-leak`
//! (the memory check over 20 turns), `counter-reuse`/`bulk-record` at block ends, and any compressor or segment
//! state resumed one position off.

use kvproof_engines::rng::SplitMix64;

use super::exact::{first_turn, user};
use super::Step;
use crate::conversation::{random_text, PromptSpec, Tail};

/// Positions of one block: deepseek's largest compression ratio (4 x compress_ratio 4) and the tiny prefill
/// segment. Multiples of it are block ends for every ratio that divides it.
pub const BLOCK: usize = 16;

/// Turns of `growing-conversation`.
pub const GROWING_TURNS: usize = 20;
/// The longest user message of `growing-conversation`.
const GROWING_USER: usize = 14;

/// The prefill poll the cancel lands on: the first. Deepseek polls between the layers of a segment, so this is
/// inside the first segment of the tail; engines that poll after each segment cancel after the first one.
pub const CANCEL_POLL: usize = 0;

/// Positions `growing-conversation` needs.
pub fn growing_span(max_tokens: usize) -> usize {
    GROWING_TURNS * (GROWING_USER + max_tokens + 4) + 16
}

/// Positions `block-edges` needs.
pub fn block_span(max_tokens: usize) -> usize {
    4 * BLOCK + 8 + max_tokens
}

/// A turn, then a prompt extending it by three blocks cancelled at the first prefill poll (both instances fail
/// with CANCELLED), then that cancelled prompt extended (reuse 0: the state is half-written), then one more
/// extension (reuse resumes).
pub fn cancel_retry(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let tail = random_text(rng, 3 * BLOCK);
    let mut longer = tail.clone();
    longer.extend(random_text(rng, 5));
    vec![
        Step::setup("turn 1", user(rng, 12), m),
        Step::compared("turn 2 (cancelled)", PromptSpec::Extend { tail: Tail::Ids(tail) }, m).cancelled_at(CANCEL_POLL),
        Step::compared("turn 3 (extends turn 2)", PromptSpec::Extend { tail: Tail::Ids(longer) }, m),
        Step::compared("turn 4", PromptSpec::Extend { tail: Tail::Ids(random_text(rng, 6)) }, m),
    ]
}

/// Fed lengths on a block end and one either side: a first prompt of 2 blocks answered with one token (so
/// exactly the prompt is fed), extended to 3 blocks - 1, then to 4 blocks + 1, then continued. Each compared turn
/// resumes the state at one of those lengths.
pub fn block_edges(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let to = |n: usize| PromptSpec::Extend { tail: Tail::ToLength(n) };
    vec![
        Step::setup(format!("fed {}", 2 * BLOCK), first_turn(rng, 2 * BLOCK), 1),
        Step::compared(format!("from {} (fed {})", 2 * BLOCK, 3 * BLOCK - 1), to(3 * BLOCK - 1), 1),
        Step::compared(format!("from {} (fed {})", 3 * BLOCK - 1, 4 * BLOCK + 1), to(4 * BLOCK + 1), 1),
        Step::compared(
            format!("from {}", 4 * BLOCK + 1),
            PromptSpec::Extend { tail: Tail::Ids(random_text(rng, 6)) },
            m,
        ),
    ]
}

/// Twenty chat turns of short user messages; every turn after the first is compared.
pub fn growing(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    (1..=GROWING_TURNS)
        .map(|n| {
            let len = 6 + rng.below((GROWING_USER - 5) as u64) as usize;
            let label = format!("turn {n}");
            if n == 1 {
                Step::setup(label, user(rng, len), m)
            } else {
                Step::compared(label, user(rng, len), m)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let mut rng = SplitMix64::new(4);
        let c = cancel_retry(4, &mut rng);
        assert_eq!(c[1].cancel_at_poll, Some(CANCEL_POLL));
        assert_eq!(c[1].expect_refusal, Some("CANCELLED"));
        // the retry extends exactly the cancelled prompt's tail
        match (&c[1].prompt, &c[2].prompt) {
            (PromptSpec::Extend { tail: Tail::Ids(a) }, PromptSpec::Extend { tail: Tail::Ids(b) }) => {
                assert!(b.len() > a.len() && b.starts_with(a));
            }
            other => panic!("{other:?}"),
        }
        let g = growing(4, &mut rng);
        assert_eq!(g.len(), GROWING_TURNS);
        assert_eq!(g.iter().filter(|s| s.compare).count(), GROWING_TURNS - 1);
        assert!(growing_span(8) < 1024, "fits the tiny context");
        let b = block_edges(4, &mut rng);
        assert_eq!(b.iter().map(|s| s.max_tokens).collect::<Vec<_>>(), vec![1, 1, 1, 4]);
    }
}
