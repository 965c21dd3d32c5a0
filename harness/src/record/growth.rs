//! One turn of a growth curve as records carry it: context, reuse, and the medians of its warm and cold runs.

use serde::{Deserialize, Serialize};

/// One side (warm or cold) of one turn: medians over its repeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub repeats: usize,
    /// Prompt tokens this side prefilled (the rest it reused).
    pub prefilled: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub wall_ms: f64,
    /// The spread of the repeats' wall times.
    pub wall_min_ms: f64,
    pub wall_max_ms: f64,
}

/// One measured run: (prefill, decode, wall) in milliseconds.
pub type Run = (f64, f64, f64);

/// The median of `xs` (mean of the middle two for an even count); 0 for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Timing {
    /// Medians of `runs`: each quantity on its own, so one slow repeat moves none of them.
    pub fn from_runs(prefilled: usize, runs: &[Run]) -> Self {
        let col = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        let walls = col(|r| r.2);
        Timing {
            repeats: runs.len(),
            prefilled,
            prefill_ms: median(&col(|r| r.0)),
            decode_ms: median(&col(|r| r.1)),
            wall_ms: median(&walls),
            wall_min_ms: if walls.is_empty() { 0.0 } else { walls.iter().copied().fold(f64::INFINITY, f64::min) },
            wall_max_ms: walls.iter().copied().fold(0.0, f64::max),
        }
    }

    /// Prefilled tokens per second of prefill time.
    pub fn prefill_tok_s(&self) -> Option<f64> {
        (self.prefill_ms > 0.0).then(|| self.prefilled as f64 / (self.prefill_ms / 1000.0))
    }

    /// Decode steps per second: the first token comes out of prefill, the rest are decode steps.
    pub fn decode_tok_s(&self, emitted: usize) -> Option<f64> {
        (self.decode_ms > 0.0 && emitted > 1).then(|| (emitted - 1) as f64 / (self.decode_ms / 1000.0))
    }
}

/// One turn of a growth curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrowthTurn {
    /// 1-based.
    pub turn: usize,
    /// Prompt tokens: the whole transcript so far.
    pub context: usize,
    /// Tokens beyond what the previous turn fed (this turn's user text and markers, and the previous reply's
    /// last token, which was emitted but never fed).
    pub new_tokens: usize,
    /// Positions the warm instance reused (the first repeat; the others must agree).
    pub reused: usize,
    pub expected_reuse: Option<usize>,
    /// Reply tokens (fixed: replies ignore eos).
    pub emitted: usize,
    pub warm: Timing,
    pub cold: Timing,
}
