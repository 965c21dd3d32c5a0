//! Multi-slot cases (glm): several conversations on one warm instance, each turn on a named slot. Every
//! conversation opens with the same system message, so two of them share exactly that opening; the oracle knows
//! each slot's history and, with cross-slot sharing on, what an empty slot adopts.
//!
//! What each catches: `stale-slot` (a shorter conversation landing on a slot whose longer rows it must not see),
//! `share-off-by-one` (a share that stops inside another slot's record: one row too many), the record faults
//! (each slot keeps its own record).

use kvproof_engines::rng::SplitMix64;

use super::exact::user;
use super::Step;

/// Slots `interleave` and `slot-switch` use.
pub const PAIR: usize = 2;
/// Slots `share` uses.
pub const SHARE: usize = 3;

fn turn(name: char, n: usize, slot: usize) -> String {
    format!("{name} turn {n} on slot {slot}")
}

/// Conversations A (slot 0) and B (slot 1) take turns; each reuses its own slot's whole record.
pub fn interleave(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = Vec::new();
    for n in 1..=3 {
        for (thread, name) in [(0, 'A'), (1, 'B')] {
            let label = turn(name, n, thread);
            let s = if n == 1 && thread == 0 {
                Step::setup(label, user(rng, 14), m)
            } else {
                Step::compared(label, user(rng, 6 + 2 * n), m)
            };
            steps.push(s.on_slot(thread).in_thread(thread));
        }
    }
    steps
}

/// A long conversation A on slot 0 and a short one B on slot 1; then B lands on slot 0 (only the shared opening
/// is reused, and A's later rows must not be seen), A on slot 1, and B again on slot 0 (its own record now).
pub fn switch(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = Vec::new();
    for n in 1..=3 {
        steps.push(Step::setup(turn('A', n, 0), user(rng, 20), m).on_slot(0));
    }
    steps.push(Step::setup(turn('B', 1, 1), user(rng, 6), m).on_slot(1).in_thread(1));
    steps.push(Step::compared(turn('B', 2, 0), user(rng, 6), m).on_slot(0).in_thread(1));
    steps.push(Step::compared(turn('A', 4, 1), user(rng, 6), m).on_slot(1));
    steps.push(Step::compared(turn('B', 3, 0), user(rng, 6), m).on_slot(0).in_thread(1));
    steps
}

/// Conversation A on slot 0; B's first turn on empty slot 1 (with sharing: A's opening is adopted); A moves to
/// empty slot 2 (with sharing: all A fed is adopted) and goes on there. Without sharing an empty slot reuses
/// nothing.
pub fn share(m: usize, rng: &mut SplitMix64) -> Vec<Step> {
    vec![
        Step::setup(turn('A', 1, 0), user(rng, 14), m).on_slot(0),
        Step::setup(turn('A', 2, 0), user(rng, 10), m).on_slot(0),
        Step::compared(turn('B', 1, 1), user(rng, 10), m).on_slot(1).in_thread(1),
        Step::compared(turn('A', 3, 2), user(rng, 8), m).on_slot(2),
        Step::compared(turn('A', 4, 2), user(rng, 8), m).on_slot(2),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(steps: &[Step]) -> Vec<(Option<usize>, usize, bool)> {
        steps.iter().map(|s| (s.slot, s.thread, s.compare)).collect()
    }

    #[test]
    fn slots_and_threads() {
        let mut rng = SplitMix64::new(2);
        let i = interleave(4, &mut rng);
        assert_eq!(i.len(), 6);
        assert!(i.iter().all(|s| s.slot == Some(s.thread)));
        assert_eq!(i.iter().filter(|s| s.compare).count(), 5);
        assert_eq!(
            shape(&switch(4, &mut rng))[3..],
            [(Some(1), 1, false), (Some(0), 1, true), (Some(1), 0, true), (Some(0), 1, true)]
        );
        let s = share(4, &mut rng);
        assert_eq!(s.iter().filter_map(|s| s.slot).max(), Some(SHARE - 1));
        assert_eq!(s[2].label, "B turn 1 on slot 1");
    }
}
