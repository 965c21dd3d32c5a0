//! Kind `growth-curve`: one conversation of T turns, each adding a user message of fixed length and a reply of
//! fixed length (replies ignore eos), so the per-turn work a reusing engine does stays the same while the
//! transcript grows. The conversation runs `repeats` times, each pass on its own warm instance, and every turn
//! also runs `cold_repeats` times on a fresh instance given the whole transcript; per turn, the medians go into
//! the report (`report::growth`). Requests run one at a time — the numbers are wall times — and the passes follow
//! one another, so a burst of load from another process spoils one repeat of a turn, not all of them.

use kvproof_engines::engine::{EngineInfo, Request, Sampling};
use kvproof_engines::rng::SplitMix64;

use super::{plan_seed, Plan, Skipped, Step};
use crate::check::{self, reuse, tokens, CheckName, CheckResult};
use crate::conversation::{random_text, Conversation, PromptSpec};
use crate::driver::{DriverError, Generation};
use crate::oracle::{self, fed_ids, Outcome, SlotBook};
use crate::progress::Progress;
use crate::report::growth::{GrowthTurn, Run, Timing};
use crate::report::results::{TrialRecord, TrialTimings};
use crate::report::turns::TurnRow;
use crate::runner::{Prepared, Sink};
use crate::scenario::{GrowthParams, Kind};

/// The conversation: one plan of `turns` compared steps. Skipped (no plan) when its last turn would not fit the
/// engine's context.
pub fn plans(p: &GrowthParams, seed: u64, info: &EngineInfo) -> (Vec<Plan>, Vec<Skipped>) {
    let seed = plan_seed(seed, 0);
    let mut rng = SplitMix64::new(seed ^ 0x6120_7754);
    let steps: Vec<Step> = (0..p.turns)
        .map(|t| {
            let len = if t == 0 { p.opening } else { p.user_len };
            let prompt = PromptSpec::User { text: random_text(&mut rng, len), audio_frames: 0 };
            Step::compared(format!("turn {}", t + 1), prompt, p.max_tokens)
        })
        .collect();
    let plan = Plan { name: "conversation".into(), seed, slot: p.slot, steps };
    let need = last_context(&plan, p.max_tokens) + p.max_tokens;
    if need > info.max_ctx {
        let reason = format!(
            "the last turn needs {need} positions (prompt and reply) but the engine's context is {}; use fewer \
             turns or shorter texts",
            info.max_ctx
        );
        return (Vec::new(), vec![Skipped { name: plan.name, reason }]);
    }
    (vec![plan], Vec::new())
}

/// The prompt length of the plan's last turn when every reply is `reply` plain ids (an upper bound: a reply that
/// ends in eos renders one id shorter).
fn last_context(plan: &Plan, reply: usize) -> usize {
    let mut conv = Conversation::new(plan.seed, 0);
    let dummy = vec![u32::from(b'a'); reply];
    let mut len = 0;
    for step in &plan.steps {
        match conv.prepare(&step.prompt) {
            Ok((prepared, pending)) => {
                len = prepared.prompt.len();
                conv.finish(&prepared, pending, Some(&dummy));
            }
            Err(_) => return usize::MAX,
        }
    }
    len
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run_of(g: &Generation) -> Run {
    (ms(g.prefill), ms(g.decode), ms(g.wall))
}

/// Run the growth conversation of a prepared `growth-curve` scenario.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let crate::scenario::Params::GrowthCurve(params) = &p.scenario.params else {
        return Vec::new();
    };
    let run_all = || {
        let mut out = Vec::new();
        for (i, plan) in p.plans.iter().enumerate() {
            out.extend(run_plan(p, params, i, plan, sink, progress));
        }
        out
    };
    if params.threads == 0 {
        return run_all();
    }
    // Rayon work the engine starts from inside `install` runs on this pool, not the global one.
    match rayon::ThreadPoolBuilder::new().num_threads(params.threads).build() {
        Ok(pool) => pool.install(run_all),
        Err(e) => {
            let why = format!("params.threads: cannot start a pool of {} thread(s): {e}", params.threads);
            let mut out = Vec::new();
            for (i, plan) in p.plans.iter().enumerate() {
                Turn { p, plan, plan_index: i, sink }.abandon(0, &why, None, progress, &mut out);
            }
            out
        }
    }
}

struct Turn<'a> {
    p: &'a Prepared<'a>,
    plan: &'a Plan,
    plan_index: usize,
    sink: &'a dyn Sink,
}

impl Turn<'_> {
    fn record(&self, step_index: usize) -> TrialRecord {
        let step = &self.plan.steps[step_index];
        TrialRecord::new(
            &self.p.scenario.name,
            Kind::GrowthCurve,
            &self.plan.name,
            self.plan_index,
            &step.label,
            step_index,
        )
    }

    fn row(
        &self,
        step_index: usize,
        instance: &str,
        repeat: usize,
        prompt: usize,
        res: &Result<Generation, DriverError>,
    ) {
        let step = &self.plan.steps[step_index];
        let (reused, emitted, prefill, decode, wall, outcome) = match res {
            Ok(g) => (g.reused, g.tokens.len(), ms(g.prefill), ms(g.decode), ms(g.wall), "ok".to_string()),
            Err(e) => (None, 0, 0.0, 0.0, 0.0, e.code()),
        };
        self.sink.turn(&TurnRow {
            scenario: self.p.scenario.name.clone(),
            plan: self.plan.name.clone(),
            step: format!("{} #{}", step.label, repeat + 1),
            instance: instance.into(),
            prompt_tokens: prompt,
            reused,
            prefilled: reused.map(|r| prompt.saturating_sub(r)),
            emitted,
            prefill_ms: prefill,
            decode_ms: decode,
            wall_ms: wall,
            outcome,
        });
    }

    /// Error trials for every step from `from` on.
    fn abandon(&self, from: usize, why: &str, tail: Option<&str>, progress: &Progress, out: &mut Vec<TrialRecord>) {
        for si in from..self.plan.steps.len() {
            let mut r = self.record(si);
            r.error = Some(why.to_string());
            r.stderr_tail = tail.map(str::to_string);
            self.sink.trial(&r);
            out.push(r);
            progress.inc(1);
        }
    }
}

/// One turn as pass 0 built it: the request every pass sends, and what the oracle expects of it.
struct Planned {
    req: Request,
    expected: Result<usize, String>,
    /// Prompt tokens beyond what the previous turn fed.
    new_tokens: usize,
}

fn run_plan(
    p: &Prepared<'_>,
    params: &GrowthParams,
    plan_index: usize,
    plan: &Plan,
    sink: &dyn Sink,
    progress: &Progress,
) -> Vec<TrialRecord> {
    let ctx = Turn { p, plan, plan_index, sink };
    let mut out = Vec::new();
    let launcher = p.launcher.as_ref();
    let mut book = oracle::rule_for(launcher.info(), launcher.caps()).map(SlotBook::new);
    let no_rule = format!("the harness has no reuse rule for arch `{}`", launcher.info().arch);
    let turns = plan.steps.len();
    let mut conv = Conversation::new(plan.seed, 0);
    let mut planned: Vec<Planned> = Vec::with_capacity(turns);
    let mut fed_before = 0usize;
    // runs[turn] = (warm runs, cold runs), one of each per pass
    let mut runs: Vec<(Vec<Generation>, Vec<Generation>)> = (0..turns).map(|_| (Vec::new(), Vec::new())).collect();

    // Each warm pass is a whole conversation on its own warm instance; then each cold pass runs every turn's
    // whole transcript on fresh instances. Passes follow one another, so the repeats of a turn are far apart in
    // time: a burst of load from another process slows one repeat of a turn, not all of them, and the median
    // discards it. No warm turn runs right after a cold one, whose large state would have evicted the warm
    // state from the caches.
    let schedule = (0..params.repeats).map(|p| (p, true)).chain((0..params.cold_repeats).map(|p| (p, false)));
    for (pass, is_warm) in schedule {
        let mut warm = None;
        if is_warm {
            match launcher.launch() {
                Ok(w) => warm = Some(w),
                Err(e) => {
                    ctx.abandon(0, &format!("warm instance #{}: {e}", pass + 1), e.stderr_tail(), progress, &mut out);
                    return out;
                }
            }
        }
        for si in 0..turns {
            let mut open_turn = None;
            if is_warm && pass == 0 {
                // The first warm pass builds the transcript from its own replies; every other pass sends the same
                // requests.
                let (prepared, pending) = match conv.prepare(&plan.steps[si].prompt) {
                    Ok(x) => x,
                    Err(why) => {
                        ctx.abandon(0, &format!("cannot build the prompt: {why}"), None, progress, &mut out);
                        return out;
                    }
                };
                let req = Request {
                    id: si as u64 * 100,
                    slot: plan.slot,
                    prompt: prepared.prompt.clone(),
                    audio: Vec::new(),
                    max_tokens: plan.steps[si].max_tokens,
                    sampling: Sampling::default(),
                    logprobs: 0,
                    // fixed-length replies: every turn adds the same work
                    ignore_eos: true,
                };
                let expected = book.as_ref().map(|b| b.expected(&req)).ok_or_else(|| no_rule.clone());
                let new_tokens = req.prompt.len().saturating_sub(fed_before);
                planned.push(Planned { req, expected, new_tokens });
                // the transcript goes on once this turn's warm reply is known (below)
                open_turn = Some((prepared, pending));
            }
            let req = &planned[si].req;
            let prompt_len = req.prompt.len();
            let (res, side) = match warm.as_mut() {
                Some(w) => {
                    let r = Request { id: req.id + 2 * pass as u64 + 1, ..req.clone() };
                    (w.generate(&r), "warm")
                }
                None => {
                    let r = Request { id: req.id + 2 * pass as u64 + 2, ..req.clone() };
                    (launcher.launch().and_then(|mut c| c.generate(&r)), "cold")
                }
            };
            ctx.row(si, side, pass, prompt_len, &res);
            let g = match res {
                Ok(g) => g,
                Err(e) => {
                    // A curve with a hole measures nothing: the whole conversation is reported as not run.
                    let why = format!("turn {}: {side} #{}: {e}", si + 1, pass + 1);
                    ctx.abandon(0, &why, e.stderr_tail(), progress, &mut out);
                    return out;
                }
            };
            if let Some((prepared, pending)) = open_turn {
                if let Some(b) = book.as_mut() {
                    b.after(req, Outcome::Completed { reply: &g.tokens });
                }
                fed_before = fed_ids(&req.prompt, &g.tokens).len();
                conv.finish(&prepared, pending, Some(&g.tokens));
            }
            if is_warm {
                runs[si].0.push(g);
            } else {
                runs[si].1.push(g);
            }
        }
    }

    for (si, (warm_runs, cold_runs)) in runs.iter().enumerate() {
        let pl = &planned[si];
        let prompt_len = pl.req.prompt.len();
        let w0 = &warm_runs[0];
        let reused = w0.reused.unwrap_or(0);
        let mut record = ctx.record(si);
        record.warm_first = true;
        record.prompt_tokens = prompt_len;
        record.expected_reuse = pl.expected.as_ref().ok().copied();
        record.reused = w0.reused;
        record.warm_reply = w0.tokens.clone();
        record.cold_reply = cold_runs[0].tokens.clone();
        record.checks = checks(pl.expected.clone(), warm_runs, cold_runs);
        record.divergence = tokens::first_divergence(w0, &cold_runs[0]);
        record.verdict = check::verdict(&record.checks);
        let side = |v: &[Generation]| v.iter().map(run_of).collect::<Vec<_>>();
        let warm = Timing::from_runs(prompt_len - reused.min(prompt_len), &side(warm_runs));
        let cold = Timing::from_runs(prompt_len, &side(cold_runs));
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
        });
        sink.trial(&record);
        out.push(record);
        progress.inc(1);
    }
    out
}

/// The checks of one turn: every warm repeat against the first cold run, the cold runs against each other (the
/// control), and the reuse each warm repeat reported against the oracle.
fn checks(expected: Result<usize, String>, warm: &[Generation], cold: &[Generation]) -> Vec<CheckResult> {
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
    out.extend(reuse::check(expected, &warm[0], &colds));
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
    use crate::cases::boundary_matrix::tests::tiny_info;

    #[test]
    fn one_plan_of_fixed_size_turns() {
        let p = GrowthParams { turns: 5, opening: 40, user_len: 20, ..GrowthParams::default() };
        let (plans, skipped) = plans(&p, 3, &tiny_info());
        assert!(skipped.is_empty());
        assert_eq!(plans.len(), 1);
        let steps = &plans[0].steps;
        assert_eq!(steps.len(), 5);
        assert!(steps.iter().all(|s| s.compare && s.max_tokens == 16));
        let lens: Vec<usize> = steps
            .iter()
            .map(|s| match &s.prompt {
                PromptSpec::User { text, .. } => text.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(lens, vec![40, 20, 20, 20, 20]);
        assert_eq!(plans, super::plans(&p, 3, &tiny_info()).0, "seeded");
    }

    #[test]
    fn a_conversation_past_the_context_is_skipped_with_the_reason() {
        let p = GrowthParams { turns: 40, opening: 100, user_len: 100, ..GrowthParams::default() };
        let (plans, skipped) = plans(&p, 0, &tiny_info());
        assert!(plans.is_empty());
        assert!(skipped[0].reason.contains("context is 1024"), "{}", skipped[0].reason);
    }

    #[test]
    fn the_context_estimate_is_exact_for_plain_replies() {
        let p = GrowthParams { turns: 3, opening: 10, user_len: 5, max_tokens: 4, ..GrowthParams::default() };
        let (plans, _) = plans(&p, 0, &tiny_info());
        // bos, system (marker, 8, eos), then per turn user (marker, text, eos), assistant marker; replies 4 + eos
        let t1 = 1 + 10 + (1 + 10 + 1) + 1;
        let t3 = t1 + 2 * ((4 + 1) + (1 + 5 + 1) + 1);
        assert_eq!(last_context(&plans[0], 4), t3);
    }
}
