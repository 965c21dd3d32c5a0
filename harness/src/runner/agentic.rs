//! Agentic sessions: a tool loop on a warm instance, every turn also run cold on the whole transcript (and as the
//! control) and checked like any compared turn. Each turn the transcript is rendered as text by the engine's own
//! template; the warm reply's text is parsed for tool calls, the sandbox runs them, and their result goes back as
//! a `tool` message — the next turn. The session follows the warm reply.
//!
//! Until warm and cold part, the cold trajectory is the same session. At the first turn their replies differ, the
//! cold trajectory splits off: from then on it runs on fresh instances with its own transcript and sandbox, so
//! the per-turn assertions can be rated on both (a reuse bug shows as a difference between them), and its turns
//! are recorded beside the warm ones.

use kvproof_engines::chat::TextMessage;
use rayon::prelude::*;

use super::guard::catch_panic;
use super::instances::{Instances, Role, Sent, TurnRequest};
use super::paired::{run_compared, settle, NoTap, Paired, Tap};
use super::plan_state::{reply_text, PlanState};
use super::Prepared;
use crate::agent::trajectory::Trajectory;
use crate::cases::{Plan, Step};
use crate::conversation::PromptSpec;
use crate::oracle::{common_prefix, fed_ids};
use crate::progress::Progress;
use crate::record::{AgentStep, AgentTurn, RerenderReuse, Sink, TrialRecord};
use crate::scenario::params::{AgentTask, AgenticParams};
use crate::scenario::Params;
use crate::text_conversation::keep_turns;

/// Run every session of a prepared agentic scenario; records go to `sink` as they complete.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let Params::Agentic(params) = &p.scenario.params else {
        return Vec::new();
    };
    let ctx = Paired::new(p, sink, progress);
    let one = |(i, plan): (usize, &Plan)| run_session(&ctx, params, i, plan, &mut NoTap);
    if !p.launcher.parallel_plans() {
        return p.plans.iter().enumerate().flat_map(one).collect();
    }
    p.plans.par_iter().enumerate().flat_map_iter(one).collect()
}

/// The cold trajectory once it has parted from the warm session: its transcript and sandbox.
struct ColdTrajectory {
    agent: Trajectory,
    messages: Vec<TextMessage>,
    /// `params.keep_turns`: the client bounds this transcript as it bounds the warm one.
    keep_turns: Option<usize>,
    /// Whether its last turn left something for the model to answer.
    live: bool,
}

impl ColdTrajectory {
    /// Run its next turn on a fresh instance; `None` once it has ended.
    fn next(
        &mut self,
        inst: &mut Instances<'_>,
        tap: &mut dyn Tap,
        (si, label): (usize, &str),
        slot: usize,
        max_tokens: usize,
    ) -> Option<(AgentStep, Option<usize>)> {
        if !self.live {
            return None;
        }
        let turn = TurnRequest {
            slot,
            prompt: Vec::new(),
            audio: Vec::new(),
            chat: Some(self.messages.clone()),
            max_tokens,
            ignore_eos: false,
            cancel_at_poll: None,
        };
        // repeat 1: the cold run of the warm transcript at this step is repeat 0
        let sent = inst.send(Role::Cold, si, 1, &format!("{label} (cold trajectory)"), &turn, false);
        tap.sent(si, &sent);
        let tokens = prompt_tokens(&sent);
        let step = match &sent.result {
            Ok(g) => {
                let text = reply_text(g);
                let step = self.agent.step(&text);
                self.messages.push(TextMessage { role: "assistant".into(), content: text });
                if let Some(keep) = self.keep_turns {
                    keep_turns(&mut self.messages, keep);
                }
                self.push_tool(&step);
                step
            }
            Err(e) => {
                self.live = false;
                AgentStep::failed(&format!("cold trajectory: {e}"))
            }
        };
        Some((step, tokens))
    }

    fn push_tool(&mut self, step: &AgentStep) {
        match &step.tool_message {
            Some(m) => self.messages.push(TextMessage { role: "tool".into(), content: m.clone() }),
            None => self.live = false,
        }
    }
}

/// The prompt tokens of a request: the ids the engine reported it fed, or its usage count.
fn prompt_tokens(sent: &Sent) -> Option<usize> {
    match &sent.result {
        _ if sent.prompt_known => Some(sent.request.prompt.len()),
        Ok(g) => Some(g.prompt_tokens),
        Err(_) => None,
    }
}

/// Why a session must end before the turn that would begin with `tool_message`, if it must. The next prompt is
/// this one, the reply and the tool message; its byte count bounds its tokens from above for any tokenizer that
/// gives every byte at most one token, so the estimate never lets a turn overflow.
fn budget_ends(
    prompt_tokens: usize,
    reply_tokens: usize,
    tool_message: &str,
    (max_context, max_tokens): (usize, usize),
) -> Option<String> {
    let next = prompt_tokens + reply_tokens + tool_message.len() + 32;
    (next + max_tokens > max_context).then(|| {
        format!("context budget: the next turn would need up to {next} + {max_tokens} tokens of {max_context}")
    })
}

/// Run one session, showing every request to `tap` (`kvproof investigate` and `kvproof dump` replay sessions
/// through it).
pub fn run_session(
    ctx: &Paired<'_>,
    params: &AgenticParams,
    plan_index: usize,
    plan: &Plan,
    tap: &mut dyn Tap,
) -> Vec<TrialRecord> {
    let mut out = Vec::new();
    let at = (plan, plan_index);
    let (Some(session), Some(first)) = (&plan.agent, plan.steps.first()) else {
        return out;
    };
    let task: &AgentTask = &session.task;
    let mut inst = Instances::new(ctx.launcher, ctx.sink, &ctx.scenario.name, &plan.name, plan_index);
    if let Err(e) = inst.launch_warm() {
        ctx.abandon(at, 0, &format!("warm instance: {e}"), e.stderr_tail(), &mut out);
        return out;
    }
    let info = ctx.launcher.info();
    let budget = (params.max_context.unwrap_or(info.max_ctx).min(info.max_ctx), params.max_tokens);
    let mut ps = PlanState::new(plan, ctx.rule, ctx.caps.audio_frame_bytes.unwrap_or(0))
        .keeping_state_on(&ctx.caps.keeps_state_on);
    let mut warm_agent = Trajectory::new(task);
    let mut cold: Option<ColdTrajectory> = None;
    let mut parted_at: Option<usize> = None;
    let mut last_fed: Option<Vec<u32>> = None;
    let mut held: Option<TrialRecord> = None;
    let mut step: Step = first.clone();

    for turn in 1..=params.max_turns {
        let si = turn - 1;
        if tap.stop_after().is_some_and(|last| si > last) {
            break;
        }
        let prepared = match ps.prepare(plan, &step) {
            Ok(t) => t,
            Err(why) => {
                ctx.abandon(at, si, &format!("cannot build the prompt: {why}"), None, &mut out);
                break;
            }
        };
        let chat = prepared.turn.chat.clone().unwrap_or_default();
        let compared =
            catch_panic(|| run_compared(ctx, &mut inst, &mut ps, at, si, &step, &prepared, tap, |_, _, _, _| None));
        let compared = match compared {
            Ok(c) => c,
            Err(panic) => {
                // The session's state (engine, transcript, sandbox) is no longer trusted: this turn is an error
                // and the session ends here; the records before it stand.
                let mut r = ctx.base_record(plan, plan_index, &step, si);
                r.error = Some(format!("kvproof panicked while running or checking this turn: {panic}"));
                ctx.emit(r, &mut out);
                ctx.progress.inc(1);
                break;
            }
        };

        // Where the reuse went: the engine's, a token-exact transcript's, and what re-rendering kept.
        let warm = &compared.warm;
        let prompt = warm.prompt_known.then_some(warm.request.prompt.as_slice());
        let mut reuse = RerenderReuse { engine: compared.record.reused, ..RerenderReuse::default() };
        if let (Some(fed), Some(prompt)) = (&last_fed, prompt) {
            let exact = fed.len().min(prompt.len().saturating_sub(1));
            let rendered = common_prefix(fed, prompt).min(exact);
            reuse = RerenderReuse {
                token_exact: Some(exact),
                rendered: Some(rendered),
                lost: Some(exact - rendered),
                ..reuse
            };
        }

        let before = warm_agent.clone();
        let warm_step = match &warm.result {
            Ok(g) => warm_agent.step(&reply_text(g)),
            Err(e) => AgentStep::failed(&format!("warm: {e}")),
        };
        last_fed = match (&warm.result, prompt) {
            (Ok(g), Some(p)) => Some(fed_ids(p, &g.tokens)),
            _ => None,
        };
        let (cold_step, cold_prompt_tokens) = match cold.as_mut() {
            Some(c) => match c.next(&mut inst, tap, (si, &step.label), step.slot_in(plan), params.max_tokens) {
                Some((s, tokens)) => (Some(s), tokens),
                None => (None, None),
            },
            None => match &compared.cold.result {
                Ok(g) if compared.warm.result.as_ref().is_ok_and(|w| w.tokens == g.tokens) => {
                    (Some(warm_step.clone()), None)
                }
                Ok(g) => {
                    // The trajectories part here: the cold one goes on from this transcript with its own reply.
                    parted_at = Some(turn);
                    let mut agent = before;
                    let text = reply_text(g);
                    let s = agent.step(&text);
                    let mut messages = chat.clone();
                    messages.push(TextMessage { role: "assistant".into(), content: text });
                    if let Some(keep) = params.keep_turns {
                        keep_turns(&mut messages, keep);
                    }
                    let mut c = ColdTrajectory { agent, messages, keep_turns: params.keep_turns, live: true };
                    c.push_tool(&s);
                    cold = Some(c);
                    (Some(s), None)
                }
                Err(e) => (Some(AgentStep::failed(&format!("cold: {e}"))), None),
            },
        };

        let reply_tokens = warm.result.as_ref().map_or(0, |g| g.tokens.len());
        let this_prompt = compared.record.prompt_tokens;
        let ended = match &warm_step.tool_message {
            None if warm_step.answer.is_some() => Some("finish called".to_string()),
            None => Some(warm_step.call_error.clone().unwrap_or_else(|| "no reply".into())),
            Some(_) if turn == params.max_turns => Some(format!("turn budget ({} turns)", params.max_turns)),
            Some(m) => budget_ends(this_prompt, reply_tokens, m, budget),
        };
        let next_message = warm_step.tool_message.clone();

        let lost = settle(&mut ps, prepared, &compared);
        if let Some(keep) = params.keep_turns {
            ps.keep_turns(step.thread, keep);
        }
        let ended = if lost { Some("the warm instance was lost".to_string()) } else { ended };
        let mut record = compared.record;
        record.agent = Some(Box::new(AgentTurn {
            cold: cold_step,
            parted_at,
            reuse,
            cold_prompt_tokens,
            ended: ended.clone(),
            ..AgentTurn::new(&task.name, session.session, turn, warm_step)
        }));
        ctx.progress.inc(1);
        let Some(message) = next_message.filter(|_| ended.is_none()) else {
            // the session's last record waits for the cold trajectory's tail
            held = Some(record);
            break;
        };
        ctx.emit(record, &mut out);
        step = Step::compared(format!("turn {}", turn + 1), PromptSpec::Tool { text: message }, params.max_tokens)
            .on_slot(step.slot_in(plan));
    }

    // The warm session has ended; a cold trajectory that parted from it may go on to its own end.
    if let Some(mut record) = held.take() {
        if let (Some(c), Some(a)) = (cold.as_mut(), record.agent.as_mut()) {
            let mut turn = a.turn;
            let last = tap.stop_after().map_or(params.max_turns, |l| l + 1).min(params.max_turns);
            while turn < last {
                turn += 1;
                let label = format!("turn {turn}");
                let Some((s, _)) = c.next(&mut inst, tap, (turn - 1, &label), plan.slot, params.max_tokens) else {
                    break;
                };
                a.cold_tail.push(s);
            }
        }
        ctx.emit(record, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_budget_counts_every_byte_of_the_tool_message() {
        assert_eq!(budget_ends(100, 10, "ok", (1000, 64)), None);
        let why = budget_ends(900, 10, &"x".repeat(50), (1000, 64)).expect("over");
        assert!(why.contains("992 + 64 tokens of 1000"), "{why}");
    }
}
