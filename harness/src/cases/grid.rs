//! Chunk-grid cases (glm53, seed 004): reuse is min(LCP, previous prompt length, prompt length - 1) rounded down
//! to the `prompt_rows` grid `g`. Each case puts that minimum at, or one or two ids around, a grid boundary; the
//! oracle gives the exact count. At the tiny grid of 16 the values are those the engine's authors list (a 64-id
//! prompt diverging at 30/31/32/33/34/47/48 reuses 16/16/32/32/32/32/48, and so on).
//!
//! What each catches: `no-grid-quantize` (any count off the grid), `no-canonical-bound` (a reply crossing a
//! boundary), `variable-chunks` (rows of the reused prefix written by differently sized chunks: the state check),
//! `drafter-not-resumed` (the drafter's rows after any partial reuse: the state check).

use kvproof_engines::rng::SplitMix64;

use super::exact::{first_turn, user};
use super::Step;
use crate::conversation::{random_text, At, PromptSpec, Tail};

/// Positions the longest grid case needs (its first prompt, replies and probe tails).
pub fn span(g: usize, max_tokens: usize) -> usize {
    4 * g + 2 * max_tokens + 16
}

/// A 4g-id prompt, then prompts diverging at 2g-2, 2g-1, 2g, 2g+1, 2g+2, 3g-1 and 3g.
pub fn diverge(g: usize, m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = vec![Step::setup("turn 1", first_turn(rng, 4 * g), m)];
    let at = [2 * g - 2, 2 * g - 1, 2 * g, 2 * g + 1, 2 * g + 2, 3 * g - 1, 3 * g];
    for d in at {
        let tail = Tail::Ids(random_text(rng, 3));
        steps.push(Step::compared(format!("diverge at {d}"), PromptSpec::Diverge { at: At::Index(d), tail }, m));
    }
    steps
}

/// Exact repeats: of a (3g+2)-id prompt (reuse 3g), and of a 3g-id one (reuse 2g: one id is always prefilled).
pub fn repeat(g: usize, m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    vec![
        Step::setup("turn 1", first_turn(rng, 3 * g + 2), m),
        Step::compared(format!("repeat of {}", 3 * g + 2), PromptSpec::Repeat, m),
        Step::setup(format!("prefix of {}", 3 * g), PromptSpec::Prefix { len: 3 * g }, m),
        Step::compared(format!("repeat of {}", 3 * g), PromptSpec::Repeat, m),
    ]
}

/// After a (3g+2)-id prompt, ever shorter prefixes: 2g+g/2, 2g+1, 2g, g ids.
pub fn shorter(g: usize, m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = vec![Step::setup("turn 1", first_turn(rng, 3 * g + 2), m)];
    for len in [2 * g + g / 2, 2 * g + 1, 2 * g, g] {
        steps.push(Step::compared(format!("prefix of {len}"), PromptSpec::Prefix { len }, m));
    }
    steps
}

/// Three conversations whose first reply crosses a grid boundary, each continued: (2g-2)-id prompt + 6 replies,
/// 2g + 20, (2g+g/2) + 4. The continuation never reuses past the first prompt.
pub fn reply(g: usize, m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = Vec::new();
    for (thread, (len, replies)) in [(2 * g - 2, 6), (2 * g, 20), (2 * g + g / 2, 4)].into_iter().enumerate() {
        let name = char::from(b'A' + thread as u8);
        steps.push(
            Step::setup(format!("{name}: {len} ids + {replies} replies"), first_turn(rng, len), replies)
                .in_thread(thread),
        );
        steps.push(Step::compared(format!("{name}: next turn"), user(rng, 6), m).in_thread(thread));
    }
    steps
}

/// A (2g+g/2)-id prompt answered with one token (so exactly the prompt is fed), then the same ids extended to
/// 3g-1: a chunker sized from the prompt length cuts the shared prefix differently in the two.
pub fn tiling(g: usize, m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    vec![
        Step::setup(format!("{} ids", 2 * g + g / 2), first_turn(rng, 2 * g + g / 2), 1),
        Step::compared(format!("extended to {}", 3 * g - 1), PromptSpec::Extend { tail: Tail::ToLength(3 * g - 1) }, m),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(steps: &[Step]) -> Vec<(bool, usize)> {
        steps.iter().map(|s| (s.compare, s.max_tokens)).collect()
    }

    #[test]
    fn the_tiny_grid_positions() {
        let mut rng = SplitMix64::new(1);
        let d = diverge(16, 8, &mut rng);
        let at: Vec<usize> = d
            .iter()
            .filter_map(|s| match s.prompt {
                PromptSpec::Diverge { at: At::Index(i), .. } => Some(i),
                _ => None,
            })
            .collect();
        assert_eq!(at, vec![30, 31, 32, 33, 34, 47, 48]);
        let s = shorter(16, 8, &mut rng);
        let cut: Vec<usize> = s
            .iter()
            .filter_map(|s| match s.prompt {
                PromptSpec::Prefix { len } => Some(len),
                _ => None,
            })
            .collect();
        assert_eq!(cut, vec![40, 33, 32, 16]);
        let r = reply(16, 8, &mut rng);
        assert_eq!(lens(&r), vec![(false, 6), (true, 8), (false, 20), (true, 8), (false, 4), (true, 8)]);
        assert_eq!(r.iter().map(|s| s.thread).collect::<Vec<_>>(), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(lens(&tiling(16, 8, &mut rng)), vec![(false, 1), (true, 8)]);
    }
}
