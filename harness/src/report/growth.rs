//! Growth-curve numbers. Per turn of a growing conversation: what the warm instance (reusing its state) and a cold
//! one (given the whole transcript) prefilled, and how long each took (medians over repeats). Over the turns: the
//! least-squares slope of per-turn wall time against context length, the last/first ratio beside the one the
//! model's cost expects, the share of prompt tokens reused, and the speedup reuse bought against the ideal (cold /
//! warm prefill flops of the model's cost, and cold / warm prefilled tokens). Everything is derived from the
//! `growth` field of results.jsonl, so a rebuilt report has the same numbers and the same verdict.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::ReportError;
use crate::check::growth::ratio;
use crate::record::GrowthStats;
use crate::record::GrowthTurn;
use crate::record::TrialRecord;

pub const GROWTH_CSV: &str = "growth.csv";

#[derive(Serialize)]
struct CsvRow<'a> {
    scenario: &'a str,
    turn: usize,
    context: usize,
    new_tokens: usize,
    reused: usize,
    expected_reuse: Option<usize>,
    reuse_fraction: f64,
    emitted: usize,
    warm_repeats: usize,
    warm_prefilled: usize,
    warm_prefill_ms: f64,
    warm_decode_ms: f64,
    warm_wall_ms: f64,
    warm_wall_min_ms: f64,
    warm_wall_max_ms: f64,
    warm_prefill_tok_s: Option<f64>,
    warm_decode_tok_s: Option<f64>,
    /// CPU steal while the warm repeats ran (empty where the system does not tell).
    warm_steal: Option<f64>,
    cold_repeats: usize,
    cold_prefilled: usize,
    cold_prefill_ms: f64,
    cold_decode_ms: f64,
    cold_wall_ms: f64,
    cold_wall_min_ms: f64,
    cold_wall_max_ms: f64,
    cold_prefill_tok_s: Option<f64>,
    cold_decode_tok_s: Option<f64>,
    cold_steal: Option<f64>,
    /// The model's cost of the turn in flops (empty when the engine reports none).
    expected_warm_prefill_flops: Option<f64>,
    expected_cold_prefill_flops: Option<f64>,
    expected_decode_flops: Option<f64>,
    /// The warm prefill a correct engine pays (from the oracle's reuse count), which the expected warm ratio counts.
    expected_oracle_warm_prefill_flops: Option<f64>,
}

/// Write `growth.csv` (one row per turn of every growth scenario); no file when the run has none.
pub fn write_csv(dir: &Path, trials: &[TrialRecord]) -> Result<bool, ReportError> {
    let rows = trials.iter().filter_map(|t| t.growth.as_ref().map(|g| (t.scenario.as_str(), g)));
    let rows: Vec<CsvRow> = rows
        .map(|(scenario, g): (&str, &GrowthTurn)| CsvRow {
            scenario,
            turn: g.turn,
            context: g.context,
            new_tokens: g.new_tokens,
            reused: g.reused,
            expected_reuse: g.expected_reuse,
            reuse_fraction: ratio(g.reused as f64, g.context as f64),
            emitted: g.emitted,
            warm_repeats: g.warm.repeats,
            warm_prefilled: g.warm.prefilled,
            warm_prefill_ms: g.warm.prefill_ms,
            warm_decode_ms: g.warm.decode_ms,
            warm_wall_ms: g.warm.wall_ms,
            warm_wall_min_ms: g.warm.wall_min_ms,
            warm_wall_max_ms: g.warm.wall_max_ms,
            warm_prefill_tok_s: g.warm.prefill_tok_s(),
            warm_decode_tok_s: g.warm.decode_tok_s(g.emitted),
            warm_steal: g.warm.steal_fraction(),
            cold_repeats: g.cold.repeats,
            cold_prefilled: g.cold.prefilled,
            cold_prefill_ms: g.cold.prefill_ms,
            cold_decode_ms: g.cold.decode_ms,
            cold_wall_ms: g.cold.wall_ms,
            cold_wall_min_ms: g.cold.wall_min_ms,
            cold_wall_max_ms: g.cold.wall_max_ms,
            cold_prefill_tok_s: g.cold.prefill_tok_s(),
            cold_decode_tok_s: g.cold.decode_tok_s(g.emitted),
            cold_steal: g.cold.steal_fraction(),
            expected_warm_prefill_flops: g.expected.map(|e| e.warm_prefill_flops),
            expected_cold_prefill_flops: g.expected.map(|e| e.cold_prefill_flops),
            expected_decode_flops: g.expected.map(|e| e.decode_flops),
            expected_oracle_warm_prefill_flops: g.expected.and_then(|e| e.oracle_warm_prefill_flops),
        })
        .collect();
    super::write_csv_rows(dir, GROWTH_CSV, rows)
}

/// `x` with `digits` decimals and `unit`, or "unknown" (the engine reports no cost).
pub fn or_unknown(x: Option<f64>, digits: usize, unit: &str) -> String {
    x.map_or_else(|| "unknown".to_string(), |v| format!("{v:.digits$}{unit}"))
}

/// The warm ratio over the expected one, beside its bound (`assert.max_warm_ratio_over_expected`) when the scenario
/// sets one; "unknown" when the engine reports no cost (the bound is then not judged). `strong` wraps the ratio.
pub fn over_expected_cell(s: &GrowthStats, strong: (&str, &str)) -> String {
    let (open, close) = strong;
    match (s.warm_ratio_over_expected, s.max_warm_ratio_over_expected) {
        (Some(r), Some(max)) => format!("{open}{r:.2}x{close} (≤ {max}x)"),
        (Some(r), None) => format!("{r:.2}x"),
        (None, Some(max)) => format!("unknown (≤ {max}x not judged)"),
        (None, None) => "unknown".to_string(),
    }
}

/// The CPU steal of a curve as a percentage, "unknown" where the system did not tell.
pub fn steal_cell(steal: Option<f64>) -> String {
    or_unknown(steal.map(|f| 100.0 * f), 1, "%")
}

/// The growth section of summary.md: one row per growth scenario.
pub fn markdown(rows: &[(&str, &GrowthStats)]) -> String {
    let mut md = String::new();
    if rows.is_empty() {
        return md;
    }
    md.push_str(
        "\n## Growth curves\n\nPer-turn wall time (median of repeats) from turn 2, the first turn with something to \
         reuse, to the last. The warm ratio is last/first of the least-squares line of wall time against context \
         (raw last/first of the two turns' medians in brackets); the cold ratio is last/first of the medians. \
         *Expected* is what the model's own cost (flops of its weights and of attention over the context the engine \
         reports) puts on a warm turn of an engine reusing what it should: growth up to it is the model's, growth \
         beyond it is the engine's; *warm / expected* is the measured ratio over it, with its bound \
         (`assert.max_warm_ratio_over_expected`). The prefill speedup is held against the model-cost ideal (cold / \
         warm prefill flops) when the engine reports its cost, else against the token ideal (cold / warm prefilled \
         tokens), which overstates what reuse can buy. *CPU steal* is the share of the machine's CPU time its \
         hypervisor gave to other guests while the curve ran: every time, and so every ratio, is disturbed by about \
         as much.\n\n\
         | scenario | context (tokens) | warm ms, ratio | expected warm ratio | warm / expected | cold ms, ratio | \
         slope warm / expected / cold (ms per 1k tokens) | reused | prefill speedup | ideal: model cost / tokens | \
         of ideal | CPU steal | assertions |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, s) in rows {
        let verdict = if s.violations.is_empty() { "pass".to_string() } else { "**FAIL**".to_string() };
        let _ = writeln!(
            md,
            "| {name} | {} → {} ({:.1}x) | {:.0} → {:.0}, **{:.2}x** ({:.2}x) | {} | {} | {:.0} → {:.0}, **{:.2}x** | \
             {:.1} / {} / {:.1} | {:.1}% | {:.2}x | {} / {:.2}x | **{:.0}%** | {} | {verdict} |",
            s.context_first,
            s.context_last,
            s.context_growth,
            s.warm_first_ms,
            s.warm_last_ms,
            s.warm_ratio,
            s.warm_raw_ratio,
            or_unknown(s.expected_warm_ratio, 2, "x"),
            over_expected_cell(s, ("**", "**")),
            s.cold_first_ms,
            s.cold_last_ms,
            s.cold_ratio,
            s.warm_slope_ms_per_ktok,
            or_unknown(s.expected_warm_slope_ms_per_ktok, 1, ""),
            s.cold_slope_ms_per_ktok,
            100.0 * s.reuse_fraction,
            s.prefill_speedup,
            or_unknown(s.cost_ideal_speedup, 2, "x"),
            s.ideal_speedup,
            100.0 * s.speedup_of_ideal,
            steal_cell(s.steal),
        );
    }
    for (name, s) in rows {
        for v in &s.violations {
            let _ = writeln!(md, "\n- **{name}**: {v}");
        }
    }
    md
}
