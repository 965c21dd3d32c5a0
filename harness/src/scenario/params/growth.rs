//! `params` of kind `growth-curve`: the conversation whose per-turn cost is measured.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_in, check_max_tokens, MAX_TOKENS, MAX_TURNS, MAX_USER_LEN};

/// `kind: growth-curve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
// A missing field takes its value from `Default`, the one place the defaults are written.
#[serde(deny_unknown_fields, default)]
pub struct GrowthParams {
    /// Turns of the conversation (at least 3: turn 1 has nothing to reuse).
    #[schemars(range(min = 3, max = MAX_TURNS))]
    pub turns: usize,
    /// User-text tokens of the first turn (sets where the curve starts).
    #[schemars(range(min = 1, max = MAX_USER_LEN))]
    pub opening: usize,
    /// User-text tokens of every later turn.
    #[schemars(range(min = 1, max = MAX_USER_LEN))]
    pub user_len: usize,
    /// Reply tokens per turn (generated past eos, so every reply has this length).
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// Warm instances, each living through the whole conversation; each turn's warm time is their median.
    #[schemars(range(min = 1, max = MAX_REPEATS))]
    pub repeats: usize,
    /// Cold runs per turn; the cold time is their median.
    #[schemars(range(min = 1, max = MAX_REPEATS))]
    pub cold_repeats: usize,
    /// The slot the conversation runs on.
    pub slot: usize,
    /// Threads a bundled engine computes with during the curve (0: all cores). One thread by default: a curve
    /// measures how a turn's cost scales with the context, and a single thread shares the cores with other
    /// processes evenly, while a fork-join over every core waits at each join for whichever thread the scheduler
    /// preempted — under load that noise, not the context, decides the ratio. Engines behind a command are not
    /// affected.
    #[schemars(range(max = MAX_THREADS))]
    pub threads: usize,
}

impl Default for GrowthParams {
    fn default() -> Self {
        GrowthParams {
            turns: 12,
            opening: 256,
            user_len: 200,
            max_tokens: 16,
            repeats: 3,
            cold_repeats: 1,
            slot: 0,
            threads: 1,
        }
    }
}

pub const MAX_REPEATS: usize = 99;
pub const MAX_THREADS: usize = 256;

impl GrowthParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        let p = self;
        check_in("turns", p.turns, 3..=MAX_TURNS)?;
        check_in("opening", p.opening, 1..=MAX_USER_LEN)?;
        check_in("user_len", p.user_len, 1..=MAX_USER_LEN)?;
        check_max_tokens(p.max_tokens)?;
        check_in("repeats", p.repeats, 1..=MAX_REPEATS)?;
        check_in("cold_repeats", p.cold_repeats, 1..=MAX_REPEATS)?;
        check_in("threads", p.threads, 0..=MAX_THREADS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        assert!((GrowthParams::default()).validate().is_ok());
        let e = (GrowthParams { turns: 2, ..GrowthParams::default() }).validate().expect_err("turns");
        assert!(e.contains("params.turns"), "{e}");
        let e = (GrowthParams { repeats: 0, ..GrowthParams::default() }).validate().expect_err("repeats");
        assert!(e.contains("params.repeats"), "{e}");
        let e = (GrowthParams { user_len: 0, ..GrowthParams::default() }).validate().expect_err("user_len");
        assert!(e.contains("params.user_len"), "{e}");
        let e = (GrowthParams { threads: 1000, ..GrowthParams::default() }).validate().expect_err("threads");
        assert!(e.contains("params.threads"), "{e}");
        assert!((GrowthParams { threads: 0, ..GrowthParams::default() }).validate().is_ok(), "0 = all cores");
    }
}
