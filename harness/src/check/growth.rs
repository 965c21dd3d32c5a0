//! A growth curve judged: the least-squares slope of per-turn wall time against context, the warm and cold
//! last/first ratios, the share of prompt tokens reused and the prefill speedup against the ideal, each held
//! against the scenario's growth assertions. The ideal is the model's: cold / warm prefill flops of the cost the
//! engine reports (a warm position attends over the whole context, so counting tokens overstates what reuse can
//! buy); an engine that reports no cost is judged against cold / warm prefilled tokens. The warm ratio is also held
//! against the ratio the model's cost expects of a correct engine (reusing what the oracle says it must), which
//! an engine without a cost cannot be: that check is then skipped, never passed. Computed from the `growth` field
//! of the trial records alone, so a rebuilt report reaches the same verdict.

use kvproof_engines::cpu_steal::{CpuTimes, DISTURBED};

use super::{reuse, tokens};
use crate::driver::Generation;
use crate::record::{CheckName, CheckResult, GrowthStats, GrowthTurn, TrialRecord, TurnCost};
use crate::scenario::Assertions;

/// Least-squares line through `pts`: (slope, intercept); `None` with fewer than two distinct x.
pub fn least_squares(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The statistics of a scenario's growth turns and the assertions they fail; `Err` says why there are none.
pub fn analyze(turns: &[GrowthTurn], a: &Assertions) -> Result<GrowthStats, String> {
    let mut turns: Vec<&GrowthTurn> = turns.iter().collect();
    turns.sort_by_key(|t| t.turn);
    for (i, t) in turns.iter().enumerate() {
        if t.turn != i + 1 {
            return Err(format!("turn {} has no measurement (the conversation stopped early)", i + 1));
        }
    }
    if turns.len() < 3 {
        return Err(format!("{} turn(s) measured; a curve needs turn 1 and at least two turns after it", turns.len()));
    }
    let cmp = &turns[1..];
    let (first, last) = (cmp[0], cmp[cmp.len() - 1]);
    let warm_pts: Vec<(f64, f64)> = cmp.iter().map(|t| (t.context as f64, t.warm.wall_ms)).collect();
    let cold_pts: Vec<(f64, f64)> = cmp.iter().map(|t| (t.context as f64, t.cold.wall_ms)).collect();
    let fit = |pts: &[(f64, f64)]| {
        let raw = ratio(pts[pts.len() - 1].1, pts[0].1);
        let Some((slope, icpt)) = least_squares(pts) else { return (0.0, raw) };
        let at = |x: usize| icpt + slope * x as f64;
        // A line that is not positive at the first turn says nothing about a ratio: fall back to the raw one.
        let fitted = if at(first.context) > 0.0 { ratio(at(last.context), at(first.context)) } else { raw };
        (slope * 1000.0, fitted)
    };
    let (warm_slope, warm_fit) = fit(&warm_pts);
    let (cold_slope, _) = fit(&cold_pts);
    let sum = |f: fn(&GrowthTurn) -> f64| cmp.iter().map(|t| f(t)).sum::<f64>();
    let ideal = ratio(sum(|t| t.cold.prefilled as f64), sum(|t| t.warm.prefilled as f64).max(1.0));
    let prefill_speedup = ratio(sum(|t| t.cold.prefill_ms), sum(|t| t.warm.prefill_ms));
    // the model's cost, only when every turn carries it (a curve is one engine: all or none do)
    let costs: Option<Vec<TurnCost>> = cmp.iter().map(|t| t.expected).collect();
    let cost_ideal = costs.as_ref().map(|c| {
        let (cold, warm) = c.iter().fold((0.0, 0.0), |(a, b), t| (a + t.cold_prefill_flops, b + t.warm_prefill_flops));
        ratio(cold, warm)
    });
    // A warm turn's cost as a correct engine pays it: at the oracle's reuse when it counts every turn, else at the
    // reuse the engine reported (an engine reusing less than it should is then expected to grow as it does).
    let oracle: Option<Vec<f64>> = costs.as_ref().and_then(|c| c.iter().map(TurnCost::oracle_warm_flops).collect());
    let from_reported = costs.is_some() && oracle.is_none();
    let warm_cost = oracle.or_else(|| costs.as_ref().map(|c| c.iter().map(TurnCost::warm_flops).collect()));
    let expected = warm_cost.as_ref().and_then(|c| {
        // the expected warm time of each turn: its cost, scaled so turn 2 takes what it measured
        let scale = ratio(first.warm.wall_ms, c[0]);
        let pts: Vec<(f64, f64)> = cmp.iter().zip(c).map(|(t, k)| (t.context as f64, scale * k)).collect();
        (scale > 0.0).then(|| fit(&pts))
    });
    let expected_ratio = expected.map(|e| e.1).filter(|r| r.is_finite() && *r > 0.0);
    let mut s = GrowthStats {
        turns: turns.len(),
        context_first: first.context,
        context_last: last.context,
        context_growth: ratio(last.context as f64, first.context as f64),
        warm_first_ms: first.warm.wall_ms,
        warm_last_ms: last.warm.wall_ms,
        warm_ratio: warm_fit,
        warm_raw_ratio: ratio(last.warm.wall_ms, first.warm.wall_ms),
        cold_first_ms: first.cold.wall_ms,
        cold_last_ms: last.cold.wall_ms,
        cold_ratio: ratio(last.cold.wall_ms, first.cold.wall_ms),
        warm_slope_ms_per_ktok: warm_slope,
        cold_slope_ms_per_ktok: cold_slope,
        reuse_fraction: ratio(sum(|t| t.reused as f64), sum(|t| t.context as f64)),
        ideal_speedup: ideal,
        cost_ideal_speedup: cost_ideal,
        expected_warm_ratio: expected.map(|e| e.1),
        expected_warm_slope_ms_per_ktok: expected.map(|e| e.0),
        expected_from_reported_reuse: from_reported,
        warm_ratio_over_expected: expected_ratio.map(|e| warm_fit / e),
        max_warm_ratio_over_expected: a.max_warm_ratio_over_expected,
        prefill_speedup,
        wall_speedup: ratio(sum(|t| t.cold.wall_ms), sum(|t| t.warm.wall_ms)),
        speedup_of_token_ideal: ratio(prefill_speedup, ideal),
        speedup_of_ideal: ratio(prefill_speedup, cost_ideal.unwrap_or(ideal)),
        steal: steal_of(cmp),
        violations: Vec::new(),
    };
    s.violations = violations(&s, a);
    Ok(s)
}

/// The steal over the turns' warm and cold runs, their ticks added up; `None` when any side of any turn could not
/// read them.
fn steal_of(turns: &[&GrowthTurn]) -> Option<f64> {
    let sides = turns.iter().flat_map(|t| [t.warm.steal, t.cold.steal]);
    sides.sum::<Option<CpuTimes>>()?.fraction()
}

/// "from turn 2 (A tokens) to turn T (B tokens, Gx)": the stretch every ratio is over.
fn span(s: &GrowthStats) -> String {
    format!(
        "from turn 2 ({} tokens) to turn {} ({} tokens, {:.1}x)",
        s.context_first, s.turns, s.context_last, s.context_growth
    )
}

fn violations(s: &GrowthStats, a: &Assertions) -> Vec<String> {
    let mut v = timed_violations(s, a);
    if let Some(f) = s.steal.filter(|f| *f >= DISTURBED) {
        // what a maintainer reading a red curve needs first: the machine, not the engine, may have moved the times
        for why in &mut v {
            why.push_str(&format!(
                " (the hypervisor gave {:.1}% of this machine's CPU time to other guests while the curve ran: its \
                 times are disturbed)",
                100.0 * f
            ));
        }
    }
    if let Some(min) = a.min_reuse_fraction {
        if s.reuse_fraction < min {
            v.push(format!(
                "{:.1}% of prompt tokens reused over turns 2..{}; at least {:.1}% required",
                100.0 * s.reuse_fraction,
                s.turns,
                100.0 * min
            ));
        }
    }
    v
}

/// The violations of the assertions on times (ratios, slopes, speedups).
fn timed_violations(s: &GrowthStats, a: &Assertions) -> Vec<String> {
    let mut v = Vec::new();
    let span = span(s);
    if let Some(max) = a.max_warm_ratio {
        if s.warm_ratio > max {
            v.push(format!(
                "warm per-turn wall time grew {:.2}x (least-squares line; raw {:.2}x) {span}; at most {max}x allowed",
                s.warm_ratio, s.warm_raw_ratio
            ));
        }
    }
    if let Some(max) = a.max_warm_ratio_over_expected {
        if let Some((false, why)) = over_expected(s, max) {
            v.push(why);
        }
    }
    if let Some(min) = a.min_cold_ratio {
        if s.cold_ratio < min {
            v.push(format!(
                "cold per-turn wall time grew only {:.2}x {span}; at least {min}x required, or the curve cannot tell \
                 reuse from no reuse",
                s.cold_ratio
            ));
        }
    }
    if let Some(min) = a.min_speedup_of_ideal {
        if s.speedup_of_ideal < min {
            let (ideal, basis) = match s.cost_ideal_speedup {
                Some(c) => (c, "cold / warm prefill flops of the model's cost"),
                None => (s.ideal_speedup, "cold / warm prefilled tokens; the engine reports no cost"),
            };
            v.push(format!(
                "prefill speedup {:.2}x is {:.0}% of the ideal {ideal:.2}x ({basis}); at least {:.0}% required",
                s.prefill_speedup,
                100.0 * s.speedup_of_ideal,
                100.0 * min
            ));
        }
    }
    v
}

/// The warm ratio over the expected one against `max`: whether it holds and the sentence saying so; `None` when
/// there is no expected ratio (the engine reports no cost).
fn over_expected(s: &GrowthStats, max: f64) -> Option<(bool, String)> {
    let (over, expected) = (s.warm_ratio_over_expected?, s.expected_warm_ratio?);
    let basis = if s.expected_from_reported_reuse {
        "at the reuse the engine reported; the oracle has no count for it"
    } else {
        "at the reuse a correct engine takes"
    };
    // written so that a NaN fails
    let holds = over <= max;
    let why = format!(
        "warm per-turn wall time grew {:.2}x (least-squares line) {}: {over:.2} times the {expected:.2}x the model's \
         cost expects ({basis}); at most {max} times allowed",
        s.warm_ratio,
        span(s)
    );
    Some((holds, why))
}

/// The scenario-level `warm-growth` check (`assert.max_warm_ratio_over_expected`, which the statistics carry):
/// `None` when the scenario does not assert it, skipped with the reason when the engine reports no cost (never
/// passed).
pub fn warm_growth_check(s: &GrowthStats) -> Option<CheckResult> {
    let max = s.max_warm_ratio_over_expected?;
    Some(match over_expected(s, max) {
        Some((holds, why)) => CheckResult::from_bool(CheckName::WarmGrowth, holds, why),
        None => CheckResult::skipped(
            CheckName::WarmGrowth,
            "the engine reports no cost, so there is no expected warm ratio to hold the measured one against \
             (assert.max_warm_ratio_over_expected not judged)",
        ),
    })
}

/// Whether any growth assertion is set.
pub fn asserted(a: &Assertions) -> bool {
    a.max_warm_ratio.is_some()
        || a.max_warm_ratio_over_expected.is_some()
        || a.min_cold_ratio.is_some()
        || a.min_speedup_of_ideal.is_some()
        || a.min_reuse_fraction.is_some()
}

/// A scenario's growth turns, in turn order.
pub fn turns_of<'a>(trials: impl IntoIterator<Item = &'a TrialRecord>) -> Vec<GrowthTurn> {
    let mut v: Vec<GrowthTurn> = trials.into_iter().filter_map(|t| t.growth.clone()).collect();
    v.sort_by_key(|t| t.turn);
    v
}

/// The summary of a growth scenario: its statistics (or why there are none) and the reasons it fails.
pub fn assess(trials: &[&TrialRecord], a: &Assertions) -> (Option<GrowthStats>, Vec<String>) {
    match analyze(&turns_of(trials.iter().copied()), a) {
        Ok(s) => {
            let reasons = s.violations.clone();
            (Some(s), reasons)
        }
        Err(why) if asserted(a) => (None, vec![format!("growth assertions not evaluated: {why}")]),
        Err(_) => (None, Vec::new()),
    }
}

/// Whether a growth scenario's assertions failed.
pub fn failed(s: Option<&GrowthStats>) -> bool {
    s.is_some_and(|g| !g.violations.is_empty())
}

/// The checks of one turn: every warm repeat against the first cold run, the cold runs against each other (the
/// control), and the reuse each warm repeat reported against the oracle.
pub fn turn_checks(
    expected: Result<usize, String>,
    must_reuse: bool,
    warm: &[Generation],
    cold: &[Generation],
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let bad = warm.iter().enumerate().find_map(|(i, w)| tokens::first_divergence(w, &cold[0]).map(|d| (i, d)));
    out.push(match bad {
        None => CheckResult::pass(
            CheckName::Tokens,
            format!("{} tokens identical on {} warm repeat(s) and the cold run", warm[0].tokens.len(), warm.len()),
        ),
        Some((i, d)) => CheckResult::fail(CheckName::Tokens, format!("warm repeat {}: {}", i + 1, d.describe())),
    });
    out.push(match cold.get(1) {
        Some(c1) => tokens::control(&cold[0], c1),
        None => CheckResult::skipped(CheckName::Control, "one cold run per turn (params.cold_repeats = 1)"),
    });
    let colds: Vec<&Generation> = cold.iter().collect();
    out.extend(reuse::check(expected, must_reuse, &warm[0], &colds));
    if let Some((i, w)) = warm.iter().enumerate().skip(1).find(|(_, w)| w.reused != warm[0].reused) {
        out.push(CheckResult::fail(
            CheckName::Reuse,
            format!(
                "warm repeats disagree on reuse: #1 reused {:?}, #{} reused {:?} (same history)",
                warm[0].reused,
                i + 1,
                w.reused
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{median, Status, Timing};
    use kvproof_engines::model_cost::{ModelCost, Reach};

    fn turn(turn: usize, context: usize, reused: usize, warm_ms: f64, cold_ms: f64) -> GrowthTurn {
        let side = |prefilled: usize, ms: f64| Timing {
            repeats: 3,
            prefilled,
            prefill_ms: ms * 0.8,
            decode_ms: ms * 0.2,
            wall_ms: ms,
            wall_min_ms: ms,
            wall_max_ms: ms,
            steal: None,
        };
        GrowthTurn {
            turn,
            context,
            new_tokens: context - reused,
            reused,
            expected_reuse: Some(reused),
            emitted: 16,
            warm: side(context - reused, warm_ms),
            cold: side(context, cold_ms),
            expected: None,
        }
    }

    fn flat_curve() -> Vec<GrowthTurn> {
        // turn 1 prefills everything; then 250 new tokens per turn, warm flat, cold linear in the context
        let mut v = vec![turn(1, 270, 0, 900.0, 900.0)];
        for t in 2..=12 {
            let ctx = 270 + 250 * (t - 1);
            v.push(turn(t, ctx, ctx - 250, 800.0 + (t % 2) as f64 * 10.0, ctx as f64 * 3.0));
        }
        v
    }

    #[test]
    fn medians_ignore_one_slow_repeat() {
        assert_eq!(median(&[1.0, 9.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let t = Timing::from_runs(10, &[(1.0, 1.0, 2.0), (100.0, 1.0, 101.0), (2.0, 1.0, 3.0)]);
        assert_eq!((t.prefill_ms, t.wall_ms, t.wall_min_ms, t.wall_max_ms), (2.0, 3.0, 2.0, 101.0));
    }

    #[test]
    fn steal_adds_up_the_ticks_of_the_repeats_and_of_the_turns() {
        let tick = |total, steal| Some(CpuTimes { total, steal });
        let t = Timing::from_runs(10, &[(1.0, 1.0, 2.0); 3]);
        let known = t.with_steal(&[tick(100, 0), tick(100, 0), tick(200, 100)]);
        assert_eq!((known.steal, known.steal_fraction()), (tick(400, 100), Some(0.25)));
        assert_eq!(t.with_steal(&[tick(100, 0), None, tick(200, 100)]).steal, None, "a repeat that could not tell");
        assert_eq!(t.with_steal(&[tick(0, 0)]).steal_fraction(), None, "no tick passed");
        // cold runs of 30 ticks a turn that lost 6, warm runs of 10 ticks (none on some turns) that lost nothing
        let mut curve = flat_curve();
        assert_eq!(analyze(&curve, &Assertions::default()).expect("stats").steal, None, "unknown is not zero");
        for (i, t) in curve.iter_mut().enumerate() {
            t.warm.steal = tick(if i % 2 == 0 { 10 } else { 0 }, 0);
            t.cold.steal = tick(30, 6);
        }
        let s = analyze(&curve, &Assertions::default()).expect("stats");
        // turns 2..12: five warm sides of 10 ticks, eleven cold ones of 30
        assert!((s.steal.expect("known") - 66.0 / 380.0).abs() < 1e-12, "{:?}", s.steal);
        curve[5].cold.steal = None;
        assert_eq!(analyze(&curve, &Assertions::default()).expect("stats").steal, None);
    }

    #[test]
    fn a_failed_timed_assertion_says_the_hypervisor_took_cpu_time() {
        let a = Assertions { min_speedup_of_ideal: Some(0.9), min_reuse_fraction: Some(0.99), ..Assertions::default() };
        let mut curve = curve_at_cost(5.0);
        let quiet = analyze(&curve, &a).expect("stats");
        assert_eq!(quiet.violations.len(), 2, "{:?}", quiet.violations);
        assert!(quiet.violations.iter().all(|v| !v.contains("hypervisor")), "{:?}", quiet.violations);
        for t in &mut curve {
            (t.warm.steal, t.cold.steal) =
                (Some(CpuTimes { total: 10, steal: 3 }), Some(CpuTimes { total: 10, steal: 3 }));
        }
        let s = analyze(&curve, &a).expect("stats");
        assert_eq!(s.violations.len(), 2, "steal adds to a failure, it never makes one: {:?}", s.violations);
        assert!(
            s.violations[0].starts_with("prefill speedup")
                && s.violations[0].contains("30.0% of this machine's CPU time")
        );
        assert!(!s.violations[1].contains("hypervisor"), "reuse is not timed: {}", s.violations[1]);
        for t in &mut curve {
            (t.warm.steal, t.cold.steal) =
                (Some(CpuTimes { total: 100, steal: 1 }), Some(CpuTimes { total: 100, steal: 1 }));
        }
        assert!(analyze(&curve, &a).expect("stats").violations.iter().all(|v| !v.contains("hypervisor")));
    }

    #[test]
    fn least_squares_recovers_a_line() {
        let (m, b) = least_squares(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).expect("fit");
        assert!((m - 2.0).abs() < 1e-12 && (b - 1.0).abs() < 1e-12);
        assert!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn a_flat_warm_curve_passes_and_its_numbers_are_right() {
        let a = Assertions {
            max_warm_ratio: Some(1.2),
            min_cold_ratio: Some(4.0),
            min_reuse_fraction: Some(0.7),
            min_speedup_of_ideal: Some(0.5),
            ..Assertions::default()
        };
        let s = analyze(&flat_curve(), &a).expect("stats");
        assert_eq!((s.context_first, s.context_last, s.turns), (520, 3020, 12));
        assert!((s.warm_ratio - 1.0).abs() < 0.02, "{}", s.warm_ratio);
        assert!((s.cold_ratio - 3020.0 / 520.0).abs() < 1e-9);
        assert!((s.cold_slope_ms_per_ktok - 3000.0).abs() < 1e-6, "{}", s.cold_slope_ms_per_ktok);
        assert!(s.warm_slope_ms_per_ktok.abs() < 5.0);
        // ideal: sum of contexts over 11 turns of 250 prefilled each
        let ctx_sum: usize = (2..=12).map(|t| 270 + 250 * (t - 1)).sum();
        assert!((s.ideal_speedup - ctx_sum as f64 / (250.0 * 11.0)).abs() < 1e-9);
        assert!(s.violations.is_empty(), "{:?}", s.violations);
        // no cost reported: nothing expected, and the token ideal is the one judged
        assert_eq!(
            (s.cost_ideal_speedup, s.expected_warm_ratio, s.expected_warm_slope_ms_per_ktok),
            (None, None, None)
        );
        assert_eq!(s.speedup_of_ideal, s.speedup_of_token_ideal);
    }

    /// A model of 1000 flops a position plus 4 a key over the whole context.
    fn full_attention() -> ModelCost {
        let mut m = ModelCost { token_flops: 1000, attention: Vec::new() };
        m.attend(Reach::Full, 4);
        m
    }

    /// The flat curve's turns on `full_attention`, every side taking exactly its cost at 1 ms per 10⁵ flops, plus
    /// `warm_overhead_ms` on every warm prefill.
    fn curve_at_cost(warm_overhead_ms: f64) -> Vec<GrowthTurn> {
        let cost = full_attention();
        flat_curve()
            .into_iter()
            .map(|mut t| {
                let e = TurnCost::of(&cost, t.context, t.reused, t.expected_reuse, t.emitted);
                let decode_ms = e.decode_flops / 1e5;
                t.warm.prefill_ms = e.warm_prefill_flops / 1e5 + warm_overhead_ms;
                t.warm.wall_ms = t.warm.prefill_ms + decode_ms;
                t.cold.prefill_ms = e.cold_prefill_flops / 1e5;
                t.cold.wall_ms = t.cold.prefill_ms + decode_ms;
                t.expected = Some(e);
                t
            })
            .collect()
    }

    #[test]
    fn an_engine_at_the_models_cost_reaches_the_cost_ideal_not_the_token_one() {
        let a = Assertions { min_speedup_of_ideal: Some(0.9), ..Assertions::default() };
        let s = analyze(&curve_at_cost(0.0), &a).expect("stats");
        let cost = s.cost_ideal_speedup.expect("every turn carries its cost");
        // a warm position attends over the whole context: reuse buys less than the token count says
        assert!(cost < s.ideal_speedup, "{cost} vs {}", s.ideal_speedup);
        assert!((s.speedup_of_ideal - 1.0).abs() < 1e-9, "{}", s.speedup_of_ideal);
        assert!(s.speedup_of_token_ideal < 0.9, "{}", s.speedup_of_token_ideal);
        assert!(s.violations.is_empty(), "{:?}", s.violations);
        // the warm curve grows exactly as the cost does, so expected and measured agree
        let expected = s.expected_warm_ratio.expect("expected ratio");
        assert!(expected > 1.5 && (expected - s.warm_ratio).abs() < 1e-9, "{expected} vs {}", s.warm_ratio);
        let slope = s.expected_warm_slope_ms_per_ktok.expect("expected slope");
        assert!((slope - s.warm_slope_ms_per_ktok).abs() < 1e-6, "{slope} vs {}", s.warm_slope_ms_per_ktok);
    }

    #[test]
    fn waste_on_every_warm_request_fails_the_cost_ideal() {
        // 5 ms a warm request beyond the model's arithmetic (a warm prefill here takes 8 to 33 ms)
        let a = Assertions { min_speedup_of_ideal: Some(0.9), ..Assertions::default() };
        let s = analyze(&curve_at_cost(5.0), &a).expect("stats");
        assert!(s.speedup_of_ideal < 0.9, "{}", s.speedup_of_ideal);
        assert_eq!(s.violations.len(), 1, "{:?}", s.violations);
        assert!(s.violations[0].contains("(cold / warm prefill flops of the model's cost)"), "{}", s.violations[0]);
        // the expected growth does not move: it is the model's, whatever the engine wastes
        let clean = analyze(&curve_at_cost(0.0), &a).expect("stats");
        let (wasteful, exact) = (s.expected_warm_ratio.expect("ratio"), clean.expected_warm_ratio.expect("ratio"));
        assert!((wasteful - exact).abs() < 1e-9, "{wasteful} vs {exact}");
    }

    #[test]
    fn a_curve_with_a_turn_without_cost_falls_back_to_the_token_ideal() {
        let mut v = curve_at_cost(0.0);
        v[5].expected = None;
        let a = Assertions { min_speedup_of_ideal: Some(0.99), ..Assertions::default() };
        let s = analyze(&v, &a).expect("stats");
        assert_eq!((s.cost_ideal_speedup, s.expected_warm_ratio), (None, None));
        assert_eq!(s.speedup_of_ideal, s.speedup_of_token_ideal);
        assert!(
            s.violations[0].contains("cold / warm prefilled tokens; the engine reports no cost"),
            "{:?}",
            s.violations
        );
    }

    #[test]
    fn stopped_reuse_fails_the_reuse_fraction_and_the_warm_ratio() {
        // reuse silently stops from turn 8 on: warm becomes cold
        let mut v = flat_curve();
        for t in v.iter_mut().skip(7) {
            *t = turn(t.turn, t.context, 0, t.cold.wall_ms, t.cold.wall_ms);
        }
        let a = Assertions { max_warm_ratio: Some(1.2), min_reuse_fraction: Some(0.7), ..Assertions::default() };
        let s = analyze(&v, &a).expect("stats");
        assert_eq!(s.violations.len(), 2, "{:?}", s.violations);
        assert!(s.violations[0].contains("warm per-turn wall time grew"), "{}", s.violations[0]);
        assert!(s.violations[1].contains("of prompt tokens reused"), "{}", s.violations[1]);
    }

    /// `curve_at_cost`, each warm turn `per_ktok_ms` slower per 1000 tokens of context beyond its cost (attention
    /// running slower per flop than the matmuls does this).
    fn curve_growing_beyond_cost(per_ktok_ms: f64) -> Vec<GrowthTurn> {
        let mut v = curve_at_cost(0.0);
        for t in v.iter_mut() {
            t.warm.wall_ms += per_ktok_ms * t.context as f64 / 1000.0;
        }
        v
    }

    fn over_expected_bound(max: f64) -> Assertions {
        Assertions { max_warm_ratio_over_expected: Some(max), ..Assertions::default() }
    }

    #[test]
    fn the_warm_ratio_over_the_expected_one_passes_at_its_bound_and_fails_just_above() {
        let curve = curve_growing_beyond_cost(40.0);
        let s = analyze(&curve, &Assertions::default()).expect("stats");
        let (measured, expected) = (s.warm_ratio, s.expected_warm_ratio.expect("a cost"));
        let over = s.warm_ratio_over_expected.expect("an expected ratio");
        assert!((over - measured / expected).abs() < 1e-12, "{over} vs {measured} / {expected}");
        assert!(over > 1.1 && over < 2.0, "{over}");
        assert!(!s.expected_from_reported_reuse, "the oracle counts every turn");

        let at = analyze(&curve, &over_expected_bound(over)).expect("stats");
        assert!(at.violations.is_empty(), "{:?}", at.violations);
        assert_eq!(at.max_warm_ratio_over_expected, Some(over), "the bound travels with the numbers");
        let check = warm_growth_check(&at).expect("asserted");
        assert_eq!(check.status, Status::Pass, "{check:?}");

        let below = over - 1e-6;
        let above = analyze(&curve, &over_expected_bound(below)).expect("stats");
        assert_eq!(above.violations.len(), 1, "{:?}", above.violations);
        let v = &above.violations[0];
        assert!(v.contains(&format!("{over:.2} times the {expected:.2}x the model's cost expects")), "{v}");
        assert!(v.contains("at the reuse a correct engine takes") && v.contains(&format!("at most {below}")), "{v}");
        let check = warm_growth_check(&above).expect("asserted");
        assert_eq!((check.status, check.detail.as_str()), (Status::Fail, v.as_str()));

        // growth the model's cost accounts for is never held against the engine
        let exact = analyze(&curve_at_cost(0.0), &over_expected_bound(1.01)).expect("stats");
        assert!(exact.warm_ratio > 1.5, "the model itself grows a warm turn: {}", exact.warm_ratio);
        assert!(exact.violations.is_empty(), "{:?}", exact.violations);
        // and not asserted, not checked
        assert!(warm_growth_check(&s).is_none());
    }

    #[test]
    fn without_a_cost_the_warm_ratio_over_the_expected_one_is_skipped_with_the_reason() {
        let a = over_expected_bound(1.5);
        // warm turns growing 3x: whatever the bound, nothing says what the model's own growth is
        let mut curve = flat_curve();
        for t in curve.iter_mut() {
            t.warm.wall_ms = t.context as f64;
        }
        let s = analyze(&curve, &a).expect("stats");
        assert_eq!((s.expected_warm_ratio, s.warm_ratio_over_expected), (None, None));
        assert!(s.violations.is_empty(), "not judged is not failed: {:?}", s.violations);
        let check = warm_growth_check(&s).expect("asserted");
        assert_eq!(check.status, Status::Skipped, "never passed: {check:?}");
        assert!(check.detail.contains("the engine reports no cost"), "{}", check.detail);
        assert!(check.detail.contains("assert.max_warm_ratio_over_expected not judged"), "{}", check.detail);
    }

    /// `curve_at_cost`, with the warm instance reusing nothing: every warm turn prefills the whole transcript and
    /// takes what the cold one takes. `report_reuse`: what the engine says it reused (a lie when true).
    fn curve_without_reuse(report_reuse: bool, oracle: bool) -> Vec<GrowthTurn> {
        let cost = full_attention();
        curve_at_cost(0.0)
            .into_iter()
            .map(|mut t| {
                let expected_reuse = oracle.then_some(t.reused);
                if !report_reuse {
                    t.reused = 0;
                }
                t.expected_reuse = expected_reuse;
                t.warm = t.cold;
                t.expected = Some(TurnCost::of(&cost, t.context, t.reused, expected_reuse, t.emitted));
                t
            })
            .collect()
    }

    #[test]
    fn a_warm_curve_that_grows_like_the_cold_one_fails_the_bound_over_the_expected_ratio() {
        let a = over_expected_bound(1.5);
        for (report_reuse, what) in [(false, "reuse never engages"), (true, "reuse claimed, every token recomputed")] {
            let s = analyze(&curve_without_reuse(report_reuse, true), &a).expect("stats");
            let over = s.warm_ratio_over_expected.expect("expected");
            // the warm curve is the cold one: it grows with the cold ratio, far beyond what reuse leaves
            assert!((s.warm_raw_ratio - s.cold_ratio).abs() < 1e-9, "{what}");
            assert!(over > 2.5, "{what}: {over}");
            assert_eq!(s.violations.len(), 1, "{what}: {:?}", s.violations);
            assert!(s.violations[0].contains("at most 1.5 times allowed"), "{what}: {}", s.violations[0]);
            let check = warm_growth_check(&s).expect("asserted");
            assert_eq!(check.status, Status::Fail, "{what}");
            // the expected ratio is a correct engine's, whatever this one reported reusing
            let clean = analyze(&curve_at_cost(0.0), &a).expect("stats");
            assert_eq!(s.expected_warm_ratio, clean.expected_warm_ratio, "{what}");
        }
        // Without the oracle's count the expected cost can only follow the reported reuse: an engine that honestly
        // reports reusing nothing is then expected to grow as it does (the reuse checks are what catch it), and the
        // sentence says which reuse the expectation counts.
        let s = analyze(&curve_without_reuse(false, false), &a).expect("stats");
        assert!(s.expected_from_reported_reuse);
        assert!((s.warm_ratio_over_expected.expect("expected") - 1.0).abs() < 0.05, "{s:?}");
        let s = analyze(&curve_without_reuse(true, false), &a).expect("stats");
        assert_eq!(s.violations.len(), 1, "{:?}", s.violations);
        assert!(s.violations[0].contains("at the reuse the engine reported; the oracle has no count"), "{s:?}");
    }

    #[test]
    fn a_curve_with_a_gap_is_not_analyzed() {
        let mut v = flat_curve();
        v.remove(4);
        let err = analyze(&v, &Assertions::default()).expect_err("gap");
        assert!(err.contains("turn 5"), "{err}");
        assert!(analyze(&v[..2], &Assertions::default()).is_err());
    }

    #[test]
    fn a_curve_that_cannot_tell_is_flagged() {
        let mut v = flat_curve();
        for t in v.iter_mut() {
            t.cold.wall_ms = 1000.0;
        }
        let a = Assertions { min_cold_ratio: Some(3.0), ..Assertions::default() };
        let s = analyze(&v, &a).expect("stats");
        assert!(s.violations.iter().any(|x| x.contains("cannot tell")), "{:?}", s.violations);
    }
}
