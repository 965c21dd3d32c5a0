//! Kind `semantic-staleness` (seed 004's test_semantic, generalised): the reused reply must answer the *current*
//! prompt, not a stale context's. Every case puts a stale context in the warm instance's way, then sends the
//! current prompt:
//!
//! - `previous-turn`: the slot's last request was the same conversation with another last question (the user
//!   edited it and re-sent);
//! - `other-conversation`: the slot last served another conversation with the same opening, one turn further;
//! - `other-slot`: another slot holds a conversation with the same opening (engines with two or more slots).
//!
//! Half of the cases make the current prompt longer than what the stale context fed (it overwrites every stale
//! position), half shorter (stale positions remain past its end). Each warm reply is classified against a cold run
//! of the current prompt and against what the stale context would produce (`report::staleness`).

use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::engine::{EngineInfo, Request, Sampling};
use kvproof_engines::rng::SplitMix64;
use rayon::prelude::*;

use super::{plan_seed, Plan, Skipped, Step};
use crate::check::{self, reuse, tokens, CheckName, CheckResult};
use crate::conversation::{random_text, PromptSpec};
use crate::driver::{Driver, DriverError, Generation, Launcher};
use crate::oracle::{self, fed_ids, Outcome, Rule, SlotBook};
use crate::progress::Progress;
use crate::report::results::{TrialRecord, TrialTimings};
use crate::report::staleness::{classify, Class, Hypothesis, Shape, StaleOutcome};
use crate::report::turns::TurnRow;
use crate::runner::{Prepared, Sink};
use crate::scenario::params::{ContextName, StalenessParams, MAX_CASES};
use crate::scenario::{Kind, Params};

/// One case: the texts of a stale context and of the current prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCase {
    pub name: String,
    pub context: ContextName,
    pub seed: u64,
    /// Whether the current prompt was made longer than what the stale context feeds.
    pub longer: bool,
    /// The first user message, shared by the stale context and the current prompt.
    pub opening: Vec<u32>,
    /// The stale conversation's user messages after the opening.
    pub stale: Vec<Vec<u32>>,
    /// The current prompt's last user message.
    pub current: Vec<u32>,
}

impl StaleCase {
    /// Warm requests the case sends: set-up turns, then the current prompt.
    pub fn requests(&self) -> usize {
        match self.context {
            ContextName::PreviousTurn => 3,
            ContextName::OtherConversation | ContextName::OtherSlot => 4,
        }
    }
}

/// Why a context cannot run on this engine, if it cannot.
fn unsupported(c: ContextName, p: &StalenessParams, info: &EngineInfo) -> Option<String> {
    if p.slot >= info.slots {
        return Some(format!("params.slot {} is not a slot of the engine ({} slot(s))", p.slot, info.slots));
    }
    match c {
        ContextName::OtherSlot if info.slots < 2 => Some(format!("the engine has {} slot", info.slots)),
        ContextName::OtherSlot if p.other_slot >= info.slots => {
            Some(format!("params.other_slot {} is not a slot of the engine ({} slots)", p.other_slot, info.slots))
        }
        _ => None,
    }
}

/// Every case of the scenario, in order, and the contexts skipped with their reason.
pub fn cases(p: &StalenessParams, seed: u64, info: &EngineInfo) -> (Vec<StaleCase>, Vec<Skipped>) {
    let wanted: Vec<ContextName> = p.contexts.clone().unwrap_or_else(|| ContextName::ALL.to_vec());
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let [lo, hi] = p.user_len;
    let m = p.max_tokens;
    for (ci, c) in ContextName::ALL.into_iter().enumerate() {
        if !wanted.contains(&c) {
            continue;
        }
        if let Some(reason) = unsupported(c, p, info) {
            skipped.push(Skipped { name: c.name().into(), reason });
            continue;
        }
        for i in 0..p.cases {
            let seed = plan_seed(seed, (ci * MAX_CASES + i) as u64);
            let mut rng = SplitMix64::new(seed ^ 0x57A1_E000);
            let mut len = || lo + rng.below((hi - lo + 1) as u64) as usize;
            let opening_len = len();
            let stale_lens: Vec<usize> = match c {
                ContextName::OtherConversation => vec![len(), len()],
                _ => vec![len()],
            };
            let longer = i % 2 == 0;
            let extra = len();
            // What the stale context feeds beyond the shared part: its messages, its replies and their markers.
            let stale_extent: usize = stale_lens.iter().sum::<usize>() + (stale_lens.len() - 1) * (m + 4) + m;
            let current_len = if longer {
                stale_extent + extra
            } else {
                // no longer than the stale context's last message: every stale position outlives the prompt
                (extra % stale_lens[0]).max(1)
            };
            let mut rng = SplitMix64::new(seed);
            let opening = random_text(&mut rng, opening_len);
            let stale = stale_lens.iter().map(|&n| random_text(&mut rng, n)).collect();
            let current = random_text(&mut rng, current_len);
            out.push(StaleCase {
                name: format!("{}-{i:04}", c.name()),
                context: c,
                seed,
                longer,
                opening,
                stale,
                current,
            });
        }
    }
    (out, skipped)
}

/// The cases as plans (what the manifest counts and the progress bar shows): set-up steps, then the compared one.
pub fn plans(p: &StalenessParams, seed: u64, info: &EngineInfo) -> (Vec<Plan>, Vec<Skipped>) {
    let (cases, skipped) = cases(p, seed, info);
    let plans = cases
        .into_iter()
        .map(|c| {
            let user = |text: &[u32]| PromptSpec::User { text: text.to_vec(), audio_frames: 0 };
            let mut steps: Vec<Step> =
                (1..c.requests()).map(|i| Step::setup(format!("setup {i}"), user(&c.opening), p.max_tokens)).collect();
            steps.push(Step::compared("current", user(&c.current), p.max_tokens));
            Plan { name: c.name, seed: c.seed, slot: p.slot, steps }
        })
        .collect();
    (plans, skipped)
}

fn system() -> Message {
    Message::new(Role::System, b"be brief".iter().map(|&b| u32::from(b)).collect())
}

fn user(text: &[u32]) -> Message {
    Message::new(Role::User, text.to_vec())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Run every case of a prepared `semantic-staleness` scenario (cases in parallel, each on its own warm instance).
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    let Params::SemanticStaleness(params) = &p.scenario.params else {
        return Vec::new();
    };
    let (cases, _) = cases(params, p.scenario.seed, p.launcher.info());
    let ctx = Ctx {
        p,
        params,
        launcher: p.launcher.as_ref(),
        rule: oracle::rule_for(p.launcher.info(), p.launcher.caps()),
        control: p.scenario.assertions.control,
        sink,
    };
    cases
        .par_iter()
        .enumerate()
        .map(|(i, c)| {
            let r = ctx.run_case(i, c);
            sink.trial(&r);
            progress.inc(c.requests() as u64);
            r
        })
        .collect()
}

struct Ctx<'a> {
    p: &'a Prepared<'a>,
    params: &'a StalenessParams,
    launcher: &'a dyn Launcher,
    rule: Option<Rule>,
    control: bool,
    sink: &'a dyn Sink,
}

/// A failed request: what to report and the engine's stderr tail.
type Failure = (String, Option<String>);

impl Ctx<'_> {
    fn request(&self, id: u64, slot: usize, prompt: Vec<u32>) -> Request {
        Request {
            id,
            slot,
            prompt,
            audio: Vec::new(),
            max_tokens: self.params.max_tokens,
            sampling: Sampling::default(),
            logprobs: 0,
            // fixed-length replies: a stale and a fresh reply are compared token for token
            ignore_eos: true,
        }
    }

    fn row(&self, case: &str, step: &str, instance: &str, req: &Request, res: &Result<Generation, DriverError>) {
        let (reused, emitted, prefill, decode, wall, outcome) = match res {
            Ok(g) => (g.reused, g.tokens.len(), ms(g.prefill), ms(g.decode), ms(g.wall), "ok".to_string()),
            Err(e) => (None, 0, 0.0, 0.0, 0.0, e.code()),
        };
        self.sink.turn(&TurnRow {
            scenario: self.p.scenario.name.clone(),
            plan: case.into(),
            step: step.into(),
            instance: instance.into(),
            prompt_tokens: req.prompt.len(),
            reused,
            prefilled: reused.map(|r| req.prompt.len().saturating_sub(r)),
            emitted,
            prefill_ms: prefill,
            decode_ms: decode,
            wall_ms: wall,
            outcome,
        });
    }

    fn fail(e: &DriverError, who: &str) -> Failure {
        (format!("{who}: {e}"), e.stderr_tail().map(str::to_string))
    }

    /// A warm request; updates the slot's history as the oracle sees it.
    fn warm(
        &self,
        d: &mut dyn Driver,
        book: &mut Option<SlotBook>,
        case: &str,
        step: &str,
        req: &Request,
    ) -> Result<Generation, Failure> {
        let res = d.generate(req);
        self.row(case, step, "warm", req, &res);
        let g = res.map_err(|e| Self::fail(&e, &format!("warm {step}")))?;
        if let Some(b) = book.as_mut() {
            b.after(req, Outcome::Completed { reply: &g.tokens });
        }
        Ok(g)
    }

    fn cold(&self, case: &str, step: &str, instance: &str, req: &Request) -> Result<Generation, Failure> {
        let res = self.launcher.launch().and_then(|mut c| c.generate(req));
        self.row(case, step, instance, req, &res);
        res.map_err(|e| Self::fail(&e, &format!("{instance} {step}")))
    }

    fn run_case(&self, index: usize, c: &StaleCase) -> TrialRecord {
        let step_index = c.requests() - 1;
        let mut r =
            TrialRecord::new(&self.p.scenario.name, Kind::SemanticStaleness, &c.name, index, "current", step_index);
        if let Err((why, tail)) = self.classify_case(index, c, &mut r) {
            r.verdict = check::Verdict::Error;
            r.error = Some(why);
            r.stderr_tail = tail;
        }
        r
    }

    fn classify_case(&self, index: usize, c: &StaleCase, r: &mut TrialRecord) -> Result<(), Failure> {
        let mut warm = self.launcher.launch().map_err(|e| Self::fail(&e, "warm instance"))?;
        let w = warm.as_mut();
        let mut book = self.rule.map(SlotBook::new);
        let id = |k: u64| index as u64 * 100 + k;
        let (slot, other) = (self.params.slot, self.params.other_slot);
        let name = c.name.as_str();
        let opening = vec![system(), user(&c.opening)];
        let with = |base: &[Message], more: &[Message]| -> Vec<u32> {
            let mut m = base.to_vec();
            m.extend_from_slice(more);
            render(&m, true)
        };

        // The stale context X (its request and reply), and the current prompt's messages.
        let r1 = self.warm(w, &mut book, name, "setup 1", &self.request(id(1), slot, render(&opening, true)))?;
        let mut convo = opening.clone();
        convo.push(Message::from_reply(&r1.tokens));
        let (x_req, x_reply) = match c.context {
            ContextName::PreviousTurn => {
                let x = self.request(id(2), slot, with(&convo, &[user(&c.stale[0])]));
                let g = self.warm(w, &mut book, name, "setup 2 (stale context)", &x)?;
                (x, g.tokens)
            }
            ContextName::OtherConversation => {
                let b2 = self.request(id(2), slot, with(&convo, &[user(&c.stale[0])]));
                let g2 = self.warm(w, &mut book, name, "setup 2", &b2)?;
                let x = self.request(
                    id(3),
                    slot,
                    with(&convo, &[user(&c.stale[0]), Message::from_reply(&g2.tokens), user(&c.stale[1])]),
                );
                let g = self.warm(w, &mut book, name, "setup 3 (stale context)", &x)?;
                (x, g.tokens)
            }
            ContextName::OtherSlot => {
                let b1 = self.request(id(2), other, render(&opening, true));
                let gb = self.warm(w, &mut book, name, "setup 2 (other slot)", &b1)?;
                let mut other_convo = opening.clone();
                other_convo.push(Message::from_reply(&gb.tokens));
                let x = self.request(id(3), other, with(&other_convo, &[user(&c.stale[0])]));
                let g = self.warm(w, &mut book, name, "setup 3 (stale context, other slot)", &x)?;
                (x, g.tokens)
            }
        };
        let cur = self.request(id(10), slot, with(&convo, &[user(&c.current)]));
        let expected: Result<usize, String> = match &book {
            Some(b) => Ok(b.expected(&cur)),
            None => Err(format!("the harness has no reuse rule for arch `{}`", self.launcher.info().arch)),
        };
        let wg = {
            let res = w.generate(&cur);
            self.row(name, "current", "warm", &cur, &res);
            res.map_err(|e| Self::fail(&e, "warm current"))?
        };
        let fresh = self.cold(name, "current", "cold", &self.request(id(11), slot, cur.prompt.clone()))?;
        let control = if self.control {
            Some(self.cold(name, "current", "control", &self.request(id(12), slot, cur.prompt.clone()))?)
        } else {
            None
        };

        // What X would produce: its own reply, and its state read with the current prompt's tail.
        let fed_x = fed_ids(&x_req.prompt, &x_reply);
        let mut hypotheses = vec![Hypothesis {
            label: "answer".into(),
            splice_at: None,
            equals_fresh: x_reply == fresh.tokens,
            reply: x_reply,
        }];
        let mut points: Vec<usize> = [wg.reused.unwrap_or(0), fed_x.len()]
            .into_iter()
            .map(|n| n.min(fed_x.len()).min(cur.prompt.len() - 1))
            .filter(|&n| n > 0 && fed_x[..n] != cur.prompt[..n])
            .collect();
        points.dedup();
        for (k, n) in points.into_iter().enumerate() {
            let mut prompt = fed_x[..n].to_vec();
            prompt.extend_from_slice(&cur.prompt[n..]);
            let label = format!("state@{n}");
            let g = self.cold(name, &label, "cold", &self.request(id(20 + k as u64), slot, prompt))?;
            hypotheses.push(Hypothesis {
                label,
                splice_at: Some(n),
                equals_fresh: g.tokens == fresh.tokens,
                reply: g.tokens,
            });
        }
        let (class, matched) =
            classify(&wg.tokens, &fresh.tokens, control.as_ref().map(|g| g.tokens.as_slice()), &hypotheses);
        let shape = if cur.prompt.len() > fed_x.len() { Shape::CurrentLonger } else { Shape::CurrentShorter };
        let outcome = StaleOutcome { context: c.context, shape, class, matched, hypotheses };

        let mut checks = vec![tokens_check(&outcome, &wg, &fresh)];
        checks.push(match &control {
            Some(k) => tokens::control(&fresh, k),
            None => CheckResult::skipped(CheckName::Control, "disabled by the scenario (assert.control)"),
        });
        let colds: Vec<&Generation> = std::iter::once(&fresh).chain(control.as_ref()).collect();
        checks.extend(reuse::check(expected.clone(), &wg, &colds));

        r.verdict = check::verdict(&checks);
        r.checks = checks;
        r.prompt_tokens = cur.prompt.len();
        r.expected_reuse = expected.ok();
        r.reused = wg.reused;
        r.divergence = tokens::first_divergence(&wg, &fresh);
        r.warm_reply = wg.tokens.clone();
        r.cold_reply = fresh.tokens.clone();
        r.timings = TrialTimings {
            warm_ms: Some(ms(wg.wall)),
            cold_ms: Some(ms(fresh.wall)),
            control_ms: control.as_ref().map(|g| ms(g.wall)),
        };
        r.staleness = Some(outcome);
        Ok(())
    }
}

/// The token check of a classified case: pass when fresh, fail naming what the reply answered otherwise.
fn tokens_check(o: &StaleOutcome, warm: &Generation, fresh: &Generation) -> CheckResult {
    let first = tokens::first_divergence(warm, fresh).map(|d| d.describe()).unwrap_or_default();
    match o.class {
        Class::Fresh => {
            CheckResult::pass(CheckName::Tokens, format!("fresh: {} tokens equal a cold run", warm.tokens.len()))
        }
        Class::Stale => {
            let what = match o.matched.as_deref() {
                Some("answer") => "the reply the stale context itself got".to_string(),
                Some(h) => format!(
                    "a cold run of the stale context's first {} fed ids continued with the current prompt",
                    h.trim_start_matches("state@")
                ),
                None => "a stale hypothesis".to_string(),
            };
            CheckResult::fail(CheckName::Tokens, format!("{}: the warm reply equals {what}; {first}", o.label()))
        }
        Class::Corrupt => CheckResult::fail(
            CheckName::Tokens,
            format!(
                "corrupt: the warm reply equals neither a cold run of the current prompt nor what the {} context \
                 produces ({} hypotheses); {first}",
                o.context,
                o.hypotheses.len()
            ),
        ),
        Class::Inconclusive => tokens::identity(warm, fresh).0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(slots: usize) -> EngineInfo {
        EngineInfo {
            arch: "glm".into(),
            preset: Some("tiny".into()),
            slots,
            max_ctx: 1024,
            vocab: 264,
            audio: false,
            audio_frame_bytes: 0,
            window: None,
            prompt_rows: None,
            initial_capacity: 64,
            fault: None,
            model_hash: "test".into(),
        }
    }

    #[test]
    fn cases_per_context_alternate_longer_and_shorter() {
        let p = StalenessParams { cases: 4, ..StalenessParams::default() };
        let (cases, skipped) = cases(&p, 1, &info(4));
        assert!(skipped.is_empty());
        assert_eq!(cases.len(), 12);
        for c in &cases {
            if c.longer {
                assert!(c.current.len() > c.stale.iter().map(Vec::len).sum::<usize>() + p.max_tokens, "{c:?}");
            } else {
                assert!(c.current.len() <= c.stale[0].len(), "{c:?}");
            }
        }
        assert_eq!(cases, super::cases(&p, 1, &info(4)).0, "seeded");
        assert_ne!(cases, super::cases(&p, 2, &info(4)).0);
    }

    #[test]
    fn a_single_slot_engine_skips_other_slot_with_the_reason() {
        let p = StalenessParams { cases: 2, ..StalenessParams::default() };
        let (cases, skipped) = cases(&p, 1, &info(1));
        assert_eq!(cases.len(), 4);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].name, "other-slot");
        assert!(skipped[0].reason.contains("1 slot"), "{}", skipped[0].reason);
        let (plans, _) = plans(&p, 1, &info(1));
        assert_eq!(plans.iter().map(Plan::compared).sum::<usize>(), 4);
        assert_eq!(plans[0].steps.len(), 3);
    }
}
