//! Growth-curve passes. The conversation runs `repeats` times, each pass a whole conversation on its own warm
//! instance, then `cold_repeats` cold passes run every turn's whole transcript on fresh instances. The first warm
//! pass builds the transcript from its own replies; every other pass sends the same requests. Passes follow one
//! another, so the repeats of a turn are far apart in time: a burst of load from another process slows one repeat
//! of a turn, not all of them, and the median discards it. The cold passes are spread among the warm ones
//! (`schedule`), so a slow drift of the machine's speed moves both sides alike. Within a warm pass no turn runs
//! right after a cold one, whose large state would have evicted the warm state from the caches (a cold pass only
//! ever precedes a warm pass's first turn, which has nothing to reuse and is not compared). A panic while a curve
//! is run or checked makes each of its turns an error trial (`guard`) and the other curves go on.

use super::guard::catch_panic;
use super::instances::{Instances, Role, TurnRequest};
use super::plan_state::PlanState;
use super::Prepared;
use crate::cases::Plan;
use crate::check::{self, growth::turn_checks, tokens};
use crate::driver::Generation;
use crate::oracle::{fed_ids, Outcome};
use crate::progress::Progress;
use crate::record::{GrowthTurn, Run, Sink, Timing, TrialRecord, TrialTimings, TurnCost};
use crate::scenario::{GrowthParams, Params};
use kvproof_engines::cpu_steal::{CpuTimes, StealMeter};

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run_of(g: &Generation) -> Run {
    (ms(g.prefill), ms(g.decode), ms(g.wall))
}

/// Run the growth conversation of a prepared `growth-curve` scenario.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    (0..p.plans.len()).flat_map(|i| run_one(p, i, sink, progress)).collect()
}

/// Run curve `plan_index` of a prepared `growth-curve` scenario, all its passes.
pub fn run_one(p: &Prepared<'_>, plan_index: usize, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let (Params::GrowthCurve(params), Some(plan)) = (&p.scenario.params, p.plans.get(plan_index)) else {
        return Vec::new();
    };
    let curve = || match catch_panic(|| run_plan(p, params, plan_index, plan, sink, progress)) {
        Ok(records) => records,
        // a plan emits its records only once every pass ran and was checked: none of this one are out
        Err(panic) => {
            let why = format!("kvproof panicked while running or checking this curve: {panic}");
            let mut out = Vec::new();
            abandon(p, (plan, plan_index), &why, None, sink, progress, &mut out);
            out
        }
    };
    if params.threads == 0 {
        return curve();
    }
    // Rayon work the engine starts from inside `install` runs on this pool, not the global one.
    match rayon::ThreadPoolBuilder::new().num_threads(params.threads).build() {
        Ok(pool) => pool.install(curve),
        Err(e) => {
            let why = format!("params.threads: cannot start a pool of {} thread(s): {e}", params.threads);
            let mut out = Vec::new();
            abandon(p, (plan, plan_index), &why, None, sink, progress, &mut out);
            out
        }
    }
}

fn record(p: &Prepared<'_>, (plan, plan_index): (&Plan, usize), step_index: usize) -> TrialRecord {
    let step = &plan.steps[step_index];
    TrialRecord::new(&p.scenario.name, p.scenario.kind, &plan.name, plan_index, &step.label, step_index)
}

/// Error trials for every step: a curve with a hole measures nothing.
fn abandon(
    p: &Prepared<'_>,
    at: (&Plan, usize),
    why: &str,
    tail: Option<&str>,
    sink: &dyn Sink,
    progress: &Progress,
    out: &mut Vec<TrialRecord>,
) {
    for si in 0..at.0.steps.len() {
        let mut r = record(p, at, si);
        r.error = Some(why.to_string());
        r.stderr_tail = tail.map(str::to_string);
        sink.trial(&r);
        out.push(r);
        progress.inc(1);
    }
}

/// One side (warm or cold) of a turn over the passes: each run, and the CPU ticks the machine counted while it ran
/// (the share stolen by the hypervisor goes into the record beside the times).
#[derive(Default)]
struct Side {
    runs: Vec<Generation>,
    ticks: Vec<Option<CpuTimes>>,
}

impl Side {
    fn push(&mut self, run: Generation, ticks: Option<CpuTimes>) {
        self.runs.push(run);
        self.ticks.push(ticks);
    }
}

/// One turn as the first warm pass built it: the request every pass sends, and what the oracle expects of it.
struct Planned {
    turn: TurnRequest,
    expected: Result<usize, String>,
    /// The turn strictly extends what the conversation fed: any prefix cache reuses something.
    must_reuse: bool,
    /// Prompt tokens beyond what the previous turn fed.
    new_tokens: usize,
}

/// The order of a curve's passes: the first warm pass (it builds the transcript), then the cold passes spread
/// evenly among the other warm ones, cold pass `k` after warm pass `⌈(k + 1) · warm / cold⌉` (the last cold pass
/// last). Run in two blocks, a drift of the machine's speed over the curve's minutes (another guest's load coming
/// or going) moved one side and not the other, and with it every warm / cold ratio: the same binary's speedup
/// read 78-95% of the ideal from one run to the next.
fn schedule(warm: usize, cold: usize) -> Vec<(usize, Role)> {
    let mut order = Vec::with_capacity(warm + cold);
    let mut next_cold = 0;
    for w in 0..warm {
        order.push((w, Role::Warm));
        while next_cold < cold && (w + 1) * cold >= (next_cold + 1) * warm {
            order.push((next_cold, Role::Cold));
            next_cold += 1;
        }
    }
    order.extend((next_cold..cold).map(|c| (c, Role::Cold)));
    order
}

fn run_plan(
    p: &Prepared<'_>,
    params: &GrowthParams,
    plan_index: usize,
    plan: &Plan,
    sink: &dyn Sink,
    progress: &Progress,
) -> Vec<TrialRecord> {
    let at = (plan, plan_index);
    let mut out = Vec::new();
    let launcher = p.launcher.as_ref();
    let rule = crate::oracle::rule_for(launcher.info(), launcher.caps());
    let no_rule = crate::oracle::no_rule(launcher.info());
    let cost = launcher.info().cost.clone();
    let mut inst = Instances::new(launcher, sink, &p.scenario.name, &plan.name, plan_index);
    let mut ps = PlanState::new(plan, rule, 0);
    let turns = plan.steps.len();
    let mut planned: Vec<Planned> = Vec::with_capacity(turns);
    let mut fed_before = 0usize;
    // runs[turn] = (warm side, cold side), one run of each per pass
    let mut runs: Vec<(Side, Side)> = (0..turns).map(|_| Default::default()).collect();

    for (pass, role) in schedule(params.repeats, params.cold_repeats) {
        if role == Role::Warm {
            if let Err(e) = inst.launch_warm() {
                let why = format!("warm instance #{}: {e}", pass + 1);
                abandon(p, at, &why, e.stderr_tail(), sink, progress, &mut out);
                return out;
            }
        }
        for (si, step) in plan.steps.iter().enumerate() {
            let building = role == Role::Warm && pass == 0;
            let mut open_turn = None;
            if building {
                let prepared = match ps.prepare(plan, step) {
                    Ok(t) => t,
                    Err(why) => {
                        abandon(p, at, &format!("cannot build the prompt: {why}"), None, sink, progress, &mut out);
                        return out;
                    }
                };
                let turn = prepared.turn.clone();
                let request = turn.with_id(0);
                let expected = ps.expected(&request).ok_or_else(|| no_rule.clone());
                let must_reuse = ps.must_reuse(&request);
                let new_tokens = turn.prompt.len().saturating_sub(fed_before);
                planned.push(Planned { turn, expected, must_reuse, new_tokens });
                // the transcript goes on once this turn's warm reply is known (below)
                open_turn = Some(prepared);
            }
            let turn = &planned[si].turn;
            let meter = StealMeter::start();
            let sent = inst.send(role, si, pass, &format!("{} #{}", step.label, pass + 1), turn, false);
            let stolen = meter.ticks();
            let g = match sent.result {
                Ok(g) => g,
                Err(e) => {
                    let why = format!("turn {}: {} #{}: {e}", si + 1, role.name(), pass + 1);
                    abandon(p, at, &why, e.stderr_tail(), sink, progress, &mut out);
                    return out;
                }
            };
            if let Some(prepared) = open_turn {
                ps.after(&sent.request, Outcome::Completed { reply: &g.tokens });
                fed_before = fed_ids(&sent.request.prompt, &g.tokens).len();
                ps.finish(prepared, Some(&g), sent.prompt_known.then_some(sent.request.prompt.as_slice()));
            }
            match role {
                Role::Warm => runs[si].0.push(g, stolen),
                _ => runs[si].1.push(g, stolen),
            }
        }
    }

    // Every record is built before any is emitted, so a panic while checking leaves none of this plan's out.
    let mut records = Vec::with_capacity(turns);
    for (si, (warm_side, cold_side)) in runs.iter().enumerate() {
        let (warm_runs, cold_runs) = (&warm_side.runs, &cold_side.runs);
        let pl = &planned[si];
        let prompt_len = pl.turn.prompt.len();
        let w0 = &warm_runs[0];
        let reused = w0.reused.unwrap_or(0);
        let mut record = record(p, at, si);
        record.warm_first = true;
        record.prompt_tokens = prompt_len;
        record.expected_reuse = pl.expected.as_ref().ok().copied();
        record.reused = w0.reused;
        record.warm_reply = w0.tokens.clone();
        record.cold_reply = cold_runs[0].tokens.clone();
        record.keep_reply_detail(Some(w0), Some(&cold_runs[0]));
        record.checks = turn_checks(pl.expected.clone(), pl.must_reuse, warm_runs, cold_runs);
        record.divergence = tokens::first_divergence(w0, &cold_runs[0]);
        record.verdict = check::verdict(&record.checks);
        let side = |v: &[Generation]| v.iter().map(run_of).collect::<Vec<_>>();
        let warm =
            Timing::from_runs(prompt_len - reused.min(prompt_len), &side(warm_runs)).with_steal(&warm_side.ticks);
        let cold = Timing::from_runs(prompt_len, &side(cold_runs)).with_steal(&cold_side.ticks);
        record.timings = TrialTimings { warm_ms: Some(warm.wall_ms), cold_ms: Some(cold.wall_ms), control_ms: None };
        record.growth = Some(GrowthTurn {
            turn: si + 1,
            context: prompt_len,
            new_tokens: pl.new_tokens,
            reused,
            expected_reuse: record.expected_reuse,
            emitted: w0.tokens.len(),
            warm,
            cold,
            expected: cost
                .as_ref()
                .map(|c| TurnCost::of(c, prompt_len, reused, record.expected_reuse, w0.tokens.len())),
        });
        records.push(record);
    }
    for record in records {
        sink.trial(&record);
        out.push(record);
        progress.inc(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(warm: usize, cold: usize) -> String {
        schedule(warm, cold).iter().map(|(_, r)| if *r == Role::Warm { 'W' } else { 'C' }).collect()
    }

    #[test]
    fn cold_passes_are_spread_among_the_warm_ones_after_the_first() {
        assert_eq!(letters(15, 3), "WWWWWCWWWWWCWWWWWC");
        assert_eq!(letters(4, 3), "WWCWCWC");
        assert_eq!(letters(1, 3), "WCCC");
        assert_eq!(letters(3, 1), "WWWC");
        assert_eq!(letters(2, 0), "WW");
        // every pass once, each side's passes in order
        let order = schedule(7, 5);
        for role in [Role::Warm, Role::Cold] {
            let passes: Vec<usize> = order.iter().filter(|(_, r)| *r == role).map(|(p, _)| *p).collect();
            assert_eq!(passes, (0..if role == Role::Warm { 7 } else { 5 }).collect::<Vec<_>>());
        }
        assert_eq!(order[0], (0, Role::Warm));
    }
}
