//! Paired turns (boundary matrices, stress pairs, semantic staleness): a warm instance lives through each plan;
//! every compared turn is also run on a cold instance given that turn's prompt alone, and on a second cold
//! instance (the control). Which of warm and cold runs first alternates from pair to pair. Plans run in parallel
//! (rayon) unless the instances share one server; every prompt is fixed by the scenario seed, so a run is
//! repeatable.
//!
//! An instance that dies or hangs makes that trial an `error` (with its stderr tail); the warm instance is replaced
//! by a fresh one and the plan goes on. A dump kvproof cannot read makes the trial an `error` too (the instance
//! stays), and so does a panic while a turn is run or checked (`guard`; the warm instance is then replaced).

use rayon::prelude::*;

use super::guard::catch_panic;
use super::instances::{Instances, Role, Sent};
use super::plan_state::{PlanState, PreparedTurn};
use super::staleness;
use super::Prepared;
use crate::cases::{Plan, Step};
use crate::check;
use crate::check::turn::{self, TurnContext};
use crate::driver::{Caps, Launcher};
use crate::oracle::{Outcome, Rule};
use crate::progress::Progress;
use crate::provenance::capture::case_dir;
use crate::record::{Sink, StateSummary, TrialRecord, TrialTimings, Verdict};
use crate::scenario::Scenario;

/// Looks at every request a plan sends (`kvproof investigate` and `kvproof dump` replay plans through it).
pub trait Tap {
    /// Dump the warm state after set-up turns too (compared turns are dumped whenever the engine can).
    fn dump_setup_turns(&self) -> bool {
        false
    }
    /// Request `sent` ran as part of step `step_index`.
    fn sent(&mut self, _step_index: usize, _sent: &Sent) {}
    /// Stop the plan after this step.
    fn stop_after(&self) -> Option<usize> {
        None
    }
}

/// A tap that looks at nothing.
pub struct NoTap;
impl Tap for NoTap {}

/// What every plan of one scenario shares.
pub struct Paired<'a> {
    pub scenario: &'a Scenario,
    pub launcher: &'a dyn Launcher,
    pub rule: Option<Rule>,
    pub no_rule: String,
    pub caps: Caps,
    pub sink: &'a dyn Sink,
    pub progress: &'a Progress,
}

impl<'a> Paired<'a> {
    pub fn new(p: &'a Prepared<'a>, sink: &'a dyn Sink, progress: &'a Progress) -> Self {
        let info = p.launcher.info();
        Paired {
            scenario: p.scenario,
            launcher: p.launcher.as_ref(),
            rule: crate::oracle::rule_for(info, p.launcher.caps()),
            no_rule: crate::oracle::no_rule(info),
            caps: p.launcher.caps().clone(),
            sink,
            progress,
        }
    }
}

/// Run every plan of a prepared scenario; records go to `sink` as they complete and are also returned. Plans run
/// in parallel unless the launcher's instances share one server (then one at a time, in order).
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let ctx = Paired::new(p, sink, progress);
    if !p.launcher.parallel_plans() {
        return p.plans.iter().enumerate().flat_map(|(i, plan)| run_plan(&ctx, i, plan, &mut NoTap)).collect();
    }
    p.plans.par_iter().enumerate().flat_map_iter(|(i, plan)| run_plan(&ctx, i, plan, &mut NoTap)).collect()
}

impl Paired<'_> {
    pub(super) fn base_record(&self, plan: &Plan, plan_index: usize, step: &Step, step_index: usize) -> TrialRecord {
        TrialRecord::new(&self.scenario.name, self.scenario.kind, &plan.name, plan_index, &step.label, step_index)
    }

    pub(super) fn emit(&self, record: TrialRecord, out: &mut Vec<TrialRecord>) {
        self.sink.trial(&record);
        out.push(record);
    }

    /// Error trials for every compared step from `from` on: the plan cannot go further.
    pub(super) fn abandon(
        &self,
        (plan, plan_index): (&Plan, usize),
        from: usize,
        why: &str,
        tail: Option<&str>,
        out: &mut Vec<TrialRecord>,
    ) {
        for (si, step) in plan.steps.iter().enumerate().skip(from) {
            self.progress.inc(1);
            if step.compare {
                let mut r = self.base_record(plan, plan_index, step, si);
                r.error = Some(why.to_string());
                r.stderr_tail = tail.map(str::to_string);
                self.emit(r, out);
            }
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Run one plan on its own warm instance, showing every request to `tap`.
pub fn run_plan(ctx: &Paired<'_>, plan_index: usize, plan: &Plan, tap: &mut dyn Tap) -> Vec<TrialRecord> {
    let mut out = Vec::new();
    let at = (plan, plan_index);
    let mut inst = Instances::new(ctx.launcher, ctx.sink, &ctx.scenario.name, &plan.name, plan_index);
    if let Err(e) = inst.launch_warm() {
        ctx.abandon(at, 0, &format!("warm instance: {e}"), e.stderr_tail(), &mut out);
        return out;
    }
    let mut ps = PlanState::new(plan, ctx.rule, ctx.caps.audio_frame_bytes.unwrap_or(0))
        .keeping_state_on(&ctx.caps.keeps_state_on);
    // What each warm request fed and got back (the stale context of a staleness plan is one of them).
    let mut warm_turns: Vec<Option<(Vec<u32>, Vec<u32>)>> = Vec::with_capacity(plan.steps.len());

    for (si, step) in plan.steps.iter().enumerate() {
        if tap.stop_after().is_some_and(|last| si > last) {
            break;
        }
        let prepared = match ps.prepare(plan, step) {
            Ok(t) => t,
            Err(why) => {
                ctx.abandon(at, si, &format!("cannot build the prompt: {why}"), None, &mut out);
                return out;
            }
        };
        let turn = prepared.turn.clone();

        if !step.compare {
            let sent = inst.send(Role::Warm, si, 0, &step.label, &turn, ctx.caps.dumps && tap.dump_setup_turns());
            tap.sent(si, &sent);
            ctx.progress.inc(1);
            match &sent.result {
                Ok(g) => {
                    ps.after(&sent.request, Outcome::Completed { reply: &g.tokens });
                    warm_turns.push(Some((sent.request.prompt.clone(), g.tokens.clone())));
                    ps.finish(prepared, Some(g), sent.prompt_known.then_some(sent.request.prompt.as_slice()));
                }
                Err(e) => {
                    // Everything after a failed set-up turn would test a state nobody planned.
                    let why = format!("set-up {} failed on the warm instance: {e}", step.label);
                    ctx.abandon(at, si + 1, &why, e.stderr_tail(), &mut out);
                    return out;
                }
            }
            continue;
        }

        let stale = plan.stale.map(|probe| (probe, warm_turns.get(probe.step).cloned().flatten()));
        let compared = catch_panic(|| {
            run_compared(ctx, &mut inst, &mut ps, at, si, step, &prepared, tap, |inst, warm, cold, control| {
                let (probe, stale_turn) = stale?;
                Some(staleness::classify_turn(inst, si, probe, stale_turn, warm, cold, control))
            })
        });
        let compared = match compared {
            Ok(c) => c,
            Err(panic) => {
                let mut r = ctx.base_record(plan, plan_index, step, si);
                r.error = Some(format!("kvproof panicked while running or checking this turn: {panic}"));
                ctx.emit(r, &mut out);
                ctx.progress.inc(1);
                // Nothing the panic interrupted is trusted: the warm state and the plan's view of it start over.
                warm_turns.push(None);
                ps.reset();
                ps.finish(prepared, None, None);
                if let Err(e) = inst.launch_warm() {
                    let why = format!("warm instance could not be replaced: {e}");
                    ctx.abandon(at, si + 1, &why, e.stderr_tail(), &mut out);
                    return out;
                }
                continue;
            }
        };
        warm_turns
            .push(compared.warm.result.as_ref().ok().map(|g| (compared.warm.request.prompt.clone(), g.tokens.clone())));
        let lost = settle(&mut ps, prepared, &compared);
        ctx.emit(compared.record, &mut out);
        ctx.progress.inc(1);
        if lost {
            if let Err(e) = inst.launch_warm() {
                let why = format!("warm instance could not be replaced: {e}");
                ctx.abandon(at, si + 1, &why, e.stderr_tail(), &mut out);
                return out;
            }
        }
    }
    out
}

/// What the staleness probe (or any per-turn extra) found: the outcome and the token check replacing the plain
/// one, or why the extra requests could not run.
pub type Extra = Result<Option<(crate::record::StaleOutcome, crate::record::CheckResult)>, staleness::Failure>;

/// A compared turn as run: warm, cold and the control, and the trial record with every check (not yet emitted).
pub struct Compared {
    pub record: TrialRecord,
    pub warm: Sent,
    pub cold: Sent,
    pub control: Option<Sent>,
}

/// Run compared step `si` of `plan` (its request `prepared`) on the warm instance, a cold one and the control, and
/// check it. `extra` runs after the checks with the three requests (semantic staleness classifies the warm reply
/// there); `None` when it has nothing to add.
#[allow(clippy::too_many_arguments)]
pub fn run_compared(
    ctx: &Paired<'_>,
    inst: &mut Instances<'_>,
    ps: &mut PlanState,
    (plan, plan_index): (&Plan, usize),
    si: usize,
    step: &Step,
    prepared: &PreparedTurn,
    tap: &mut dyn Tap,
    extra: impl FnOnce(&mut Instances<'_>, &Sent, &Sent, Option<&Sent>) -> Option<Extra>,
) -> Compared {
    let assertions = &ctx.scenario.assertions;
    let turn = prepared.turn.clone();
    let dumps = ctx.caps.dumps && assertions.state;
    let warm_first = (plan_index + si) & 1 == 0;
    let (warm, cold) = if warm_first {
        let w = inst.send(Role::Warm, si, 0, &step.label, &turn, dumps);
        (w, inst.send(Role::Cold, si, 0, &step.label, &turn, dumps))
    } else {
        let c = inst.send(Role::Cold, si, 0, &step.label, &turn, dumps);
        (inst.send(Role::Warm, si, 0, &step.label, &turn, dumps), c)
    };
    let control = assertions.control.then(|| inst.send(Role::Control, si, 0, &step.label, &turn, false));
    for s in std::iter::once(&warm).chain(Some(&cold)).chain(control.as_ref()) {
        tap.sent(si, s);
    }
    let (expected, must_reuse) = if warm.prompt_known {
        (ps.expected(&warm.request).ok_or_else(|| ctx.no_rule.clone()), ps.must_reuse(&warm.request))
    } else {
        let why = "the engine reported no prompt ids for the text it rendered: no exact reuse count to expect";
        (Err(why.to_string()), prepared.text_extends)
    };

    let mut record = ctx.base_record(plan, plan_index, step, si);
    record.prefix_note = warm.prompt_known.then(|| ps.observe_prompt(prepared, &warm.request.prompt)).flatten();
    record.warm_first = warm_first;
    record.prompt_tokens = match &warm.result {
        _ if warm.prompt_known => warm.request.prompt.len(),
        // a text turn without prompt ids: the length the engine reported (its usage count)
        Ok(g) => g.prompt_tokens,
        Err(_) => turn.prompt.len(),
    };
    record.expected_reuse = expected.as_ref().ok().copied();
    record.timings = TrialTimings {
        warm_ms: warm.wall().map(ms),
        cold_ms: cold.wall().map(ms),
        control_ms: control.as_ref().and_then(Sent::wall).map(ms),
    };
    if let Ok(g) = &warm.result {
        record.reused = g.reused;
        record.warm_reply = g.tokens.clone();
    }
    if let Ok(g) = &cold.result {
        record.cold_reply = g.tokens.clone();
    }
    record.keep_reply_detail(warm.result.as_ref().ok(), cold.result.as_ref().ok());

    let fatal = [Some(&warm), Some(&cold), control.as_ref()].into_iter().flatten().find_map(Sent::fatal);
    if let Some((why, tail)) = fatal {
        record.verdict = Verdict::Error;
        record.error = Some(why);
        record.stderr_tail = tail;
    } else {
        let no_dumps = if !ctx.caps.dumps {
            Some("the engine offers no state dumps".to_string())
        } else if !assertions.state {
            Some("disabled by the scenario (assert.state)".to_string())
        } else {
            None
        };
        let cx = TurnContext {
            request: &warm.request,
            expect_refusal: step.expect_refusal,
            expected: expected.clone(),
            must_reuse,
            rule: ctx.rule,
            no_dumps,
            reuse_count: ctx.caps.reuse_count,
        };
        let mut assessed = turn::assess(&cx, warm.observed(), cold.observed(), control.as_ref().map(Sent::observed));
        assessed.checks.push(ps.memory_check(step, warm.observed().footprint(), cold.observed().footprint()));
        match extra(inst, &warm, &cold, control.as_ref()) {
            Some(Ok(Some((outcome, tokens_check)))) => {
                if let Some(c) = assessed.checks.iter_mut().find(|c| c.check == tokens_check.check) {
                    *c = tokens_check;
                }
                record.staleness = Some(outcome);
            }
            Some(Ok(None)) | None => {}
            Some(Err((why, tail))) => {
                record.error = Some(why);
                record.stderr_tail = tail;
            }
        }
        record.verdict = if record.error.is_some() { Verdict::Error } else { check::verdict(&assessed.checks) };
        if let (Verdict::Fail, Some(Ok(w)), Some(Ok(c)), Some(Ok(d))) =
            (record.verdict, &warm.dump, &cold.dump, &assessed.diff)
        {
            let case = case_dir(&[&ctx.scenario.name, &record.plan, &record.step]);
            record.provenance = ctx.sink.provenance(&case, w, c, d);
        }
        record.state = assessed.diff.as_ref().and_then(|d| d.as_ref().ok()).map(StateSummary::of);
        record.checks = assessed.checks;
        record.refused = assessed.refused;
        record.divergence = assessed.divergence;
    }

    Compared { record, warm, cold, control }
}

/// After a compared turn: the plan state learns what the warm slot now holds and the thread's transcript goes on
/// (with the warm reply, or the cold one when the warm request failed). True when the warm instance is lost and
/// must be replaced.
pub fn settle(ps: &mut PlanState, prepared: PreparedTurn, c: &Compared) -> bool {
    let (warm, cold) = (&c.warm, &c.cold);
    let warm_lost = warm.instance_lost();
    match &warm.result {
        _ if warm_lost => ps.reset(),
        Ok(g) => ps.after(&warm.request, Outcome::Completed { reply: &g.tokens }),
        Err(e) => ps.after(&warm.request, Outcome::Failed { code: &e.code() }),
    }
    let (reply, fed) = match (&warm.result, &cold.result) {
        (Ok(g), _) => (Some(g), warm.prompt_known.then_some(warm.request.prompt.as_slice())),
        (Err(_), Ok(g)) => (Some(g), cold.prompt_known.then_some(cold.request.prompt.as_slice())),
        _ => (None, None),
    };
    ps.finish(prepared, reply, fed);
    warm_lost
}
