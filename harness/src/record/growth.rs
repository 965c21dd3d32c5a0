//! One turn of a growth curve as records carry it: context, reuse, and the medians of its warm and cold runs.

use kvproof_engines::cpu_steal::CpuTimes;
use kvproof_engines::model_cost::ModelCost;
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
    /// The machine's CPU ticks while these repeats ran, and how many of them its hypervisor gave to other guests
    /// (`cpu_steal`): the times are low by about that share. Absent where the system does not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal: Option<CpuTimes>,
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
            steal: None,
        }
    }

    /// With the CPU ticks of `ticks`, one per repeat, added up; unknown when a repeat could not read them.
    pub fn with_steal(self, ticks: &[Option<CpuTimes>]) -> Self {
        Timing { steal: ticks.iter().copied().sum(), ..self }
    }

    /// The stolen share of the CPU ticks while these repeats ran; `None` when unknown or no tick passed.
    pub fn steal_fraction(&self) -> Option<f64> {
        self.steal?.fraction()
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
    /// What the model's cost puts on this turn; absent when the engine reports no cost (`EngineInfo::cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<TurnCost>,
}

/// The flops the model's cost puts on one turn (`ModelCost::flops`): what a turn must take, whatever the engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TurnCost {
    /// Prefilling what the warm instance prefilled: positions `reused..context`.
    pub warm_prefill_flops: f64,
    /// Prefilling the whole transcript, as a cold instance does: positions `0..context`.
    pub cold_prefill_flops: f64,
    /// The reply's decode steps: positions `context..context + emitted - 1` (the first token comes out of prefill).
    pub decode_flops: f64,
    /// Prefilling what a correct engine prefills: positions `expected_reuse..context`, the oracle's reuse count.
    /// Absent when the oracle has no count for the engine. It differs from `warm_prefill_flops` only when the
    /// engine reused other than it should: an engine whose reuse never engages pays the cold prefill, which this
    /// does not excuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_warm_prefill_flops: Option<f64>,
}

impl TurnCost {
    /// The cost of a turn of `context` prompt tokens, `reused` of them reused by the warm instance (`expected_reuse`
    /// by a correct one, when the oracle knows), `emitted` reply tokens.
    pub fn of(cost: &ModelCost, context: usize, reused: usize, expected_reuse: Option<usize>, emitted: usize) -> Self {
        let decode_end = context + emitted.saturating_sub(1);
        TurnCost {
            warm_prefill_flops: cost.flops(reused.min(context), context),
            cold_prefill_flops: cost.flops(0, context),
            decode_flops: cost.flops(context, decode_end),
            oracle_warm_prefill_flops: expected_reuse.map(|r| cost.flops(r.min(context), context)),
        }
    }

    /// The warm instance's whole turn: its prefill and the reply's decode.
    pub fn warm_flops(&self) -> f64 {
        self.warm_prefill_flops + self.decode_flops
    }

    /// A correct engine's warm turn: the prefill at the oracle's reuse count and the reply's decode; `None` when the
    /// oracle has no count.
    pub fn oracle_warm_flops(&self) -> Option<f64> {
        self.oracle_warm_prefill_flops.map(|p| p + self.decode_flops)
    }
}

/// What a growth curve adds up to. Turn 1 has nothing to reuse (warm and cold both prefill everything), so every
/// number below is over turns 2..=T.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrowthStats {
    pub turns: usize,
    pub context_first: usize,
    pub context_last: usize,
    /// context_last / context_first.
    pub context_growth: f64,
    /// Median wall time of the first and the last turn.
    pub warm_first_ms: f64,
    pub warm_last_ms: f64,
    /// The last/first ratio of the least-squares line of warm per-turn wall time against context length (flat is
    /// one). The line goes through every turn, so one turn slowed by another process moves it little; this is the
    /// ratio the assertions use.
    pub warm_ratio: f64,
    /// warm_last_ms / warm_first_ms (two single turns: noisier).
    pub warm_raw_ratio: f64,
    pub cold_first_ms: f64,
    pub cold_last_ms: f64,
    /// cold_last_ms / cold_first_ms. Cold cost is convex in the context (attention over the whole transcript) and
    /// its growth dwarfs the noise, so the turns' own medians are used rather than a line.
    pub cold_ratio: f64,
    /// Least-squares slope of per-turn wall time against context length, in ms per 1000 tokens of context.
    pub warm_slope_ms_per_ktok: f64,
    pub cold_slope_ms_per_ktok: f64,
    /// Reused / prompt tokens, summed over the turns.
    pub reuse_fraction: f64,
    /// Cold prefilled tokens / warm prefilled tokens, summed over the turns: the speedup if prefill time were
    /// proportional to prefilled tokens. It overstates what reuse can buy: a warm position attends over the whole
    /// context, a cold one on average over half of it.
    pub ideal_speedup: f64,
    /// Cold prefill flops / warm prefill flops of the model's cost, summed over the turns: the speedup reuse buys
    /// when every position costs what the model's arithmetic says. `None`: the engine reports no cost.
    #[serde(default)]
    pub cost_ideal_speedup: Option<f64>,
    /// The last/first ratio of the least-squares line of the expected warm per-turn cost (prefill and decode
    /// flops) against context: the growth the model itself puts on a correct engine's warm turn (prefilling from
    /// the oracle's reuse count), beside `warm_ratio`.
    #[serde(default)]
    pub expected_warm_ratio: Option<f64>,
    /// The slope of the expected warm per-turn time (the cost scaled so turn 2 takes its measured time), in ms per
    /// 1000 tokens of context, beside `warm_slope_ms_per_ktok`.
    #[serde(default)]
    pub expected_warm_slope_ms_per_ktok: Option<f64>,
    /// The expected ratio and slope count the reuse the engine reported rather than the oracle's (the oracle has no
    /// count for this engine): an engine that reuses less than it should is then expected to grow as it does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expected_from_reported_reuse: bool,
    /// warm_ratio / expected_warm_ratio: how much more the warm turns grew than the model's cost says they must
    /// (about one for a correct engine, the cold ratio over the expected one for an engine whose reuse never
    /// engages). `None`: the engine reports no cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_ratio_over_expected: Option<f64>,
    /// The scenario's bound on `warm_ratio_over_expected` (`assert.max_warm_ratio_over_expected`), shown beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_warm_ratio_over_expected: Option<f64>,
    /// Cold prefill time / warm prefill time, summed over the turns.
    pub prefill_speedup: f64,
    /// Cold wall time / warm wall time (prefill and decode), summed over the turns.
    pub wall_speedup: f64,
    /// prefill_speedup / ideal_speedup (the token ideal).
    #[serde(default)]
    pub speedup_of_token_ideal: f64,
    /// prefill_speedup / the ideal the assertion judges: `cost_ideal_speedup` when the engine reports its cost,
    /// else `ideal_speedup`.
    pub speedup_of_ideal: f64,
    /// The share of CPU time the hypervisor gave to other guests while turns 2..T ran, warm and cold together
    /// (their ticks added up): the times, and every ratio of them, are disturbed by about as much. Absent where the
    /// system does not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal: Option<f64>,
    /// The scenario's growth assertions that failed, each as a sentence.
    pub violations: Vec<String>,
}
