//! Stress pairs: seeded random conversations of 2–8 turns whose user messages are sized so conversations
//! cross the sliding window and the initial capacity. Every turn after the first is a compared pair; generation
//! stops when the scenario's pair count is reached.

use kvproof_engines::engine::EngineInfo;
use kvproof_engines::rng::SplitMix64;

use super::{plan_seed, Plan, Step};
use crate::conversation::{random_text, PromptSpec};
use crate::driver::Caps;
use crate::scenario::corpus::CorpusChat;
use crate::scenario::StressParams;

/// Ids a turn adds besides its user text and reply: role markers and end-of-turn ids.
const TURN_OVERHEAD: usize = 4;

/// The longest user text with which the longest conversation still fits the engine's context.
fn longest_fitting(p: &StressParams, info: &EngineInfo) -> usize {
    let budget = info.max_ctx.saturating_sub(64) / p.turns[1];
    budget.saturating_sub(p.max_tokens + TURN_OVERHEAD)
}

/// A user-text range the scenario gives must fit the engine's context: it is an error, never cut to fit.
pub fn check_user_len(p: &StressParams, info: &EngineInfo) -> Result<(), String> {
    let Some([lo, hi]) = p.user_len else { return Ok(()) };
    let fits = longest_fitting(p, info);
    if hi > fits {
        return Err(format!(
            "params.user_len: [{lo}, {hi}]: with {} turns of {} reply tokens, user texts of at most {fits} fit the \
             engine's context of {}",
            p.turns[1], p.max_tokens, info.max_ctx
        ));
    }
    Ok(())
}

/// The user-text length range: the scenario's (checked by `check_user_len`), or one that carries a conversation of
/// typical length past both the window and the initial capacity, while the longest conversation still fits the
/// context.
pub fn user_len_range(p: &StressParams, info: &EngineInfo) -> [usize; 2] {
    if let Some(range) = p.user_len {
        return range;
    }
    let fits = longest_fitting(p, info).max(1);
    let window = info.window.unwrap_or(0);
    // A conversation of mean length passes the initial capacity (its mean user text, replies and markers add up
    // to about 1.5x capacity), and single turns are longer than the window.
    let mean_turns = (p.turns[0] + p.turns[1]) / 2;
    let hi = (info.initial_capacity.saturating_mul(2) / mean_turns.max(1))
        .max(window.saturating_mul(2).saturating_add(1))
        .max(8);
    [1, hi.min(fits)]
}

pub fn plans(p: &StressParams, seed: u64, info: &EngineInfo, caps: &Caps) -> Vec<Plan> {
    let [lo, hi] = user_len_range(p, info);
    conversations(p, seed, 0x57E5, |index, rng, most_turns| {
        let span = (p.turns[1] - p.turns[0] + 1) as u64;
        let turns = (p.turns[0] + rng.below(span) as usize).min(most_turns);
        // Audio, where the engine takes it, only on a conversation's last turn: it ends reuse for the rest.
        let audio_last = caps.audio_frame_bytes.is_some() && rng.below(4) == 0;
        let prompts = (0..turns)
            .map(|t| {
                let len = lo + rng.below((hi - lo + 1) as u64) as usize;
                let audio_frames = if audio_last && t + 1 == turns { 1 + rng.below(3) as usize } else { 0 };
                PromptSpec::User { text: random_text(rng, len), audio_frames }
            })
            .collect();
        Some((format!("conv-{index:04}"), prompts))
    })
}

/// Conversations until `p.pairs` turns are compared. `conversation(index, rng, most_turns)` writes conversation
/// `index` (its name and the prompts of at most `most_turns` turns, at least two) from its own seeded `rng`, or
/// gives `None` when there is none at that index.
fn conversations(
    p: &StressParams,
    seed: u64,
    salt: u64,
    mut conversation: impl FnMut(u64, &mut SplitMix64, usize) -> Option<(String, Vec<PromptSpec>)>,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    let mut left = p.pairs;
    let mut index = 0u64;
    while left > 0 {
        let seed = plan_seed(seed, index);
        let mut rng = SplitMix64::new(seed ^ salt);
        if let Some((name, prompts)) = conversation(index, &mut rng, left + 1) {
            left -= prompts.len() - 1;
            let steps =
                prompts.into_iter().enumerate().map(|(t, prompt)| conversation_step(t, prompt, p.max_tokens)).collect();
            plans.push(Plan { name, seed, slot: p.slot, steps, stale: None, agent: None });
        }
        index += 1;
    }
    plans
}

/// Turn `t` (0-based) of a stress conversation: the first sets the warm state up, every later one is compared.
fn conversation_step(t: usize, prompt: PromptSpec, max_tokens: usize) -> Step {
    let label = format!("turn {}", t + 1);
    if t == 0 {
        Step::setup(label, prompt, max_tokens)
    } else {
        Step::compared(label, prompt, max_tokens)
    }
}

/// Stress pairs on chat text: the corpus's conversations as written first, then conversations mixed from its
/// messages (seeded) until the pair count is reached, every turn sent as text for the engine's own template.
pub fn plans_from_chats(p: &StressParams, seed: u64, chats: &[CorpusChat]) -> Vec<Plan> {
    let pool: Vec<&str> = chats.iter().flat_map(|c| c.turns.iter().map(String::as_str)).collect();
    conversations(p, seed, 0x7E47, |index, rng, most_turns| {
        let (name, system, texts): (String, Option<String>, Vec<&str>) = match chats.get(index as usize) {
            Some(c) if c.turns.len() >= 2 => {
                (c.id.clone(), c.system.clone(), c.turns.iter().map(String::as_str).collect())
            }
            Some(_) => return None,
            None => {
                let span = (p.turns[1] - p.turns[0] + 1) as u64;
                let n = p.turns[0] + rng.below(span) as usize;
                let texts = (0..n).map(|_| pool[rng.below(pool.len() as u64) as usize]).collect();
                let system = chats[rng.below(chats.len() as u64) as usize].system.clone();
                (format!("mix-{index:04}"), system, texts)
            }
        };
        let turns = texts.len().min(p.turns[1]).min(most_turns);
        let prompts = texts[..turns]
            .iter()
            .map(|text| PromptSpec::Say { text: text.to_string(), system: system.clone() })
            .collect();
        Some((name, prompts))
    })
}

#[cfg(test)]
mod tests {
    use super::super::boundary_matrix::tests::{caps, tiny_info};
    use super::*;

    #[test]
    fn exactly_the_requested_pairs_in_2_to_8_turns() {
        let p = StressParams { pairs: 299, ..StressParams::default() };
        let plans = plans(&p, 1, &tiny_info(), &caps(Some(8)));
        assert_eq!(plans.iter().map(Plan::compared).sum::<usize>(), 299);
        assert!(plans.iter().all(|pl| (2..=8).contains(&pl.steps.len())));
        assert!(plans.iter().any(|pl| pl.steps.len() == 8) && plans.iter().any(|pl| pl.steps.len() == 2));
    }

    #[test]
    fn seeded_and_different_per_seed() {
        let p = StressParams { pairs: 40, ..StressParams::default() };
        assert_eq!(plans(&p, 1, &tiny_info(), &caps(None)), plans(&p, 1, &tiny_info(), &caps(None)));
        assert_ne!(plans(&p, 1, &tiny_info(), &caps(None)), plans(&p, 2, &tiny_info(), &caps(None)));
    }

    #[test]
    fn lengths_cross_the_window_and_the_capacity() {
        let p = StressParams::default();
        let info = tiny_info();
        let [_, hi] = user_len_range(&p, &info);
        assert!(hi > info.window.unwrap_or(0), "single turns longer than the window");
        // an average conversation of 5 turns with average texts passes the initial capacity
        assert!(5 * (hi / 2 + TURN_OVERHEAD) > info.initial_capacity, "hi = {hi}");
        // the longest conversation still fits the context
        assert!(p.turns[1] * (hi + p.max_tokens + TURN_OVERHEAD) + 16 < info.max_ctx);
    }

    #[test]
    fn a_given_user_len_is_kept_or_refused_never_cut() {
        let info = tiny_info();
        let fits = StressParams { user_len: Some([1, 4]), ..StressParams::default() };
        assert_eq!(check_user_len(&fits, &info), Ok(()));
        assert_eq!(user_len_range(&fits, &info), [1, 4]);
        let long = StressParams { user_len: Some([1, info.max_ctx]), ..StressParams::default() };
        let e = check_user_len(&long, &info).expect_err("longer than the context");
        assert!(e.starts_with("params.user_len: ") && e.contains(&info.max_ctx.to_string()), "{e}");
    }

    #[test]
    fn chat_text_plans_use_the_corpus_then_mix_its_messages() {
        let chats = vec![
            CorpusChat {
                id: "a".into(),
                system: Some("be kind".into()),
                turns: vec!["hi".into(), "how?".into(), "ok".into()],
            },
            CorpusChat { id: "b".into(), system: None, turns: vec!["one".into()] },
        ];
        let p = StressParams { pairs: 12, ..StressParams::default() };
        let plans = plans_from_chats(&p, 3, &chats);
        assert_eq!(plans.iter().map(Plan::compared).sum::<usize>(), 12);
        assert_eq!(plans[0].name, "a");
        assert!(
            matches!(&plans[0].steps[0].prompt, PromptSpec::Say { text, system } if text == "hi" && system.as_deref() == Some("be kind"))
        );
        assert!(plans[1].name.starts_with("mix-"), "a one-turn chat has nothing to compare");
        assert_eq!(plans, plans_from_chats(&p, 3, &chats), "seeded");
    }
}
