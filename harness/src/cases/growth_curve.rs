//! Kind `growth-curve`: one conversation of T turns, each adding a user message of fixed length and a reply of
//! fixed length (replies ignore eos), so the per-turn work a reusing engine does stays the same while the
//! transcript grows. The conversation runs `repeats` times, each pass on its own warm instance, and every turn
//! also runs `cold_repeats` times on a fresh instance given the whole transcript; per turn, the medians go into
//! the report (`report::growth`); the passes run in `runner::growth`. Requests run one at a time — the numbers are wall times — and the passes follow
//! one another, so a burst of load from another process spoils one repeat of a turn, not all of them.

use kvproof_engines::engine::EngineInfo;
use kvproof_engines::rng::SplitMix64;

use super::{plan_seed, Plan, Skipped, Step};
use crate::conversation::{random_text, Conversation, PromptSpec};
use crate::scenario::GrowthParams;

/// The conversation: one plan of `turns` compared steps. Skipped (no plan) when its last turn would not fit the
/// engine's context.
pub fn plans(p: &GrowthParams, seed: u64, info: &EngineInfo) -> (Vec<Plan>, Vec<Skipped>) {
    let seed = plan_seed(seed, 0);
    let mut rng = SplitMix64::new(seed ^ 0x6120_7754);
    let steps: Vec<Step> = (0..p.turns)
        .map(|t| {
            let len = if t == 0 { p.opening } else { p.user_len };
            let prompt = PromptSpec::User { text: random_text(&mut rng, len), audio_frames: 0 };
            Step::compared(format!("turn {}", t + 1), prompt, p.max_tokens).fixed_length()
        })
        .collect();
    let plan = Plan { name: "conversation".into(), seed, slot: p.slot, steps, stale: None, agent: None };
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
