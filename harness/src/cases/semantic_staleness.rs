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
//! of the current prompt and against what the stale context would produce (`check::staleness`).

use kvproof_engines::engine::EngineInfo;
use kvproof_engines::rng::SplitMix64;
use strum::IntoEnumIterator;

use super::{plan_seed, Plan, Skipped, StaleProbe, Step};
use crate::conversation::{random_text, PromptSpec};
use crate::scenario::corpus::CorpusStale;
use crate::scenario::params::{ContextName, StalenessParams, MAX_CASES};

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

/// The contexts the scenario asks for that the engine supports, each with its index in `ContextName::iter()`
/// (which seeds its cases, so a context draws the same cases whichever others run), and the skipped ones with
/// their reason.
fn contexts(p: &StalenessParams, info: &EngineInfo) -> (Vec<(usize, ContextName)>, Vec<Skipped>) {
    let wanted: Vec<ContextName> = p.contexts.clone().unwrap_or_else(|| ContextName::iter().collect());
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for (ci, c) in ContextName::iter().enumerate() {
        if !wanted.contains(&c) {
            continue;
        }
        match unsupported(c, p, info) {
            Some(reason) => skipped.push(Skipped { name: c.name().into(), reason }),
            None => run.push((ci, c)),
        }
    }
    (run, skipped)
}

/// Every case of the scenario, in order, and the contexts skipped with their reason.
pub fn cases(p: &StalenessParams, seed: u64, info: &EngineInfo) -> (Vec<StaleCase>, Vec<Skipped>) {
    let (contexts, skipped) = contexts(p, info);
    let mut out = Vec::new();
    let [lo, hi] = p.user_len;
    let m = p.max_tokens;
    for (ci, c) in contexts {
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

/// A case as a plan: the shared opening, the stale context X (set-up steps, the last of which is X), then the
/// current prompt, compared. The current conversation is thread 0; X's conversation is thread 1, forked from
/// thread 0 after the opening where it shares that turn's reply.
pub fn plan_of(c: StaleCase, p: &StalenessParams) -> Plan {
    let user = |text: &[u32]| PromptSpec::User { text: text.to_vec(), audio_frames: 0 };
    let m = p.max_tokens;
    let opening = Step::setup("setup 1", user(&c.opening), m).fixed_length();
    let mut steps = vec![opening];
    match c.context {
        ContextName::PreviousTurn => {
            steps.push(Step::setup("setup 2 (stale context)", user(&c.stale[0]), m).forked(1, 0));
        }
        ContextName::OtherConversation => {
            steps.push(Step::setup("setup 2", user(&c.stale[0]), m).forked(1, 0));
            steps.push(Step::setup("setup 3 (stale context)", user(&c.stale[1]), m).in_thread(1));
        }
        ContextName::OtherSlot => {
            let other = p.other_slot;
            steps.push(Step::setup("setup 2 (other slot)", user(&c.opening), m).in_thread(1).on_slot(other));
            steps.push(
                Step::setup("setup 3 (stale context, other slot)", user(&c.stale[0]), m).in_thread(1).on_slot(other),
            );
        }
    }
    let stale_step = steps.len() - 1;
    steps.push(Step::compared("current", user(&c.current), m));
    let steps = steps.into_iter().map(Step::fixed_length).collect();
    Plan {
        name: c.name,
        seed: c.seed,
        slot: p.slot,
        steps,
        stale: Some(StaleProbe { context: c.context, step: stale_step }),
        agent: None,
    }
}

/// Staleness on text: each context's cases drawn from the corpus in turn (seeded order), the opening, the stale
/// context's message(s) and the current question sent as text for the engine's own template. A case whose
/// entry has one stale message serves `other-conversation` with the opening as its first.
pub fn plans_from_text(
    p: &StalenessParams,
    seed: u64,
    info: &EngineInfo,
    entries: &[CorpusStale],
) -> (Vec<Plan>, Vec<Skipped>) {
    let (contexts, skipped) = contexts(p, info);
    let mut plans = Vec::new();
    for (ci, c) in contexts {
        let mut rng = SplitMix64::new(plan_seed(seed, ci as u64) ^ 0x7E47);
        let start = rng.below(entries.len() as u64) as usize;
        for i in 0..p.cases {
            let e = &entries[(start + i) % entries.len()];
            let say = |text: &str| PromptSpec::Say { text: text.to_string(), system: e.system.clone() };
            let m = p.max_tokens;
            let mut steps = vec![Step::setup("setup 1", say(&e.opening), m)];
            let first_stale = &e.stale[0];
            match c {
                ContextName::PreviousTurn => {
                    steps.push(Step::setup("setup 2 (stale context)", say(first_stale), m).forked(1, 0));
                }
                ContextName::OtherConversation => {
                    let (a, b) = match e.stale.as_slice() {
                        [a, b, ..] => (a.as_str(), b.as_str()),
                        _ => (e.opening.as_str(), first_stale.as_str()),
                    };
                    steps.push(Step::setup("setup 2", say(a), m).forked(1, 0));
                    steps.push(Step::setup("setup 3 (stale context)", say(b), m).in_thread(1));
                }
                ContextName::OtherSlot => {
                    let other = p.other_slot;
                    steps.push(Step::setup("setup 2 (other slot)", say(&e.opening), m).in_thread(1).on_slot(other));
                    let x = Step::setup("setup 3 (stale context, other slot)", say(first_stale), m);
                    steps.push(x.in_thread(1).on_slot(other));
                }
            }
            let stale_step = steps.len() - 1;
            steps.push(Step::compared("current", say(&e.current), m));
            let steps = steps.into_iter().map(Step::fixed_length).collect();
            plans.push(Plan {
                name: format!("{}-{i:04}-{}", c.name(), e.id),
                seed: plan_seed(seed, (ci * MAX_CASES + i) as u64),
                slot: p.slot,
                steps,
                stale: Some(StaleProbe { context: c, step: stale_step }),
                agent: None,
            });
        }
    }
    (plans, skipped)
}

/// The cases as plans, and the contexts skipped with their reason.
pub fn plans(p: &StalenessParams, seed: u64, info: &EngineInfo) -> (Vec<Plan>, Vec<Skipped>) {
    let (cases, skipped) = cases(p, seed, info);
    (cases.into_iter().map(|c| plan_of(c, p)).collect(), skipped)
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
            cost: None,
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
