//! The boundary matrix: one short conversation per edge case of the reuse decision, sized from the engine's
//! description (window, initial capacity, context limit). Each probe turn's expected reuse comes from the oracle;
//! the comment on each case says what a correct engine does and which bug class it catches.

use kvproof_engines::engine::EngineInfo;
use kvproof_engines::rng::SplitMix64;
use strum::IntoEnumIterator;

use super::{continuation, grid, plan_seed, slots, Plan, Skipped, Step};
use crate::conversation::{random_text, At, PromptSpec, Tail};
use crate::driver::Caps;
use crate::scenario::{BoundaryParams, CaseName};

/// Contexts larger than this make the overflow case prefill too much to stay quick.
pub const OVERFLOW_CTX_LIMIT: usize = 16_384;

/// Why `case` cannot run on this engine, if it cannot.
pub fn unavailable(case: CaseName, p: &BoundaryParams, info: &EngineInfo, caps: &Caps) -> Option<String> {
    let room = info.max_ctx.saturating_sub(p.max_tokens);
    match case {
        CaseName::WindowWrap if info.window.is_none() => Some("the engine has no sliding window".into()),
        CaseName::WindowWrap
            if info.window.is_some_and(|w| w.saturating_mul(6).saturating_add(4 * p.max_tokens + 64) > room) =>
        {
            Some("the window is too close to the context limit for three turns past it".into())
        }
        CaseName::CapacityGrowth
            if info.initial_capacity.saturating_mul(3).saturating_add(4 * p.max_tokens + 64) > room =>
        {
            Some(format!(
                "initial capacity {} leaves no room to grow within max_ctx {}",
                info.initial_capacity, info.max_ctx
            ))
        }
        CaseName::AudioTaint if caps.audio_frame_bytes.is_none() => Some("the engine takes no audio".into()),
        CaseName::ContextOverflow if info.max_ctx > OVERFLOW_CTX_LIMIT => {
            Some(format!("max_ctx {} is too large to overflow quickly (limit {OVERFLOW_CTX_LIMIT})", info.max_ctx))
        }
        CaseName::CancelRetry if !caps.cancel_at_poll => {
            // over stdio the engine's CAPS lack cancel_at=1 (a CANCEL frame would race the engine); an HTTP API has no
            // prefill polls at all
            Some("the driver cannot cancel a request at a given prefill poll".into())
        }
        CaseName::GrowingConversation if continuation::growing_span(p.max_tokens) > room => {
            Some(format!("{} turns do not fit max_ctx {}", continuation::GROWING_TURNS, info.max_ctx))
        }
        CaseName::BlockEdges if continuation::block_span(p.max_tokens) > room => {
            Some(format!("four blocks of {} do not fit max_ctx {}", continuation::BLOCK, info.max_ctx))
        }
        CaseName::GridDiverge
        | CaseName::GridRepeat
        | CaseName::GridShorter
        | CaseName::GridReply
        | CaseName::GridTiling => match info.prompt_rows {
            None | Some(0..=2) => Some("the engine has no prefill chunk grid (prompt_rows)".into()),
            Some(g) if grid::span(g, p.max_tokens.max(20)) > room => {
                Some(format!("four chunks of {g} do not fit max_ctx {}", info.max_ctx))
            }
            Some(_) => None,
        },
        CaseName::Interleave | CaseName::SlotSwitch if info.slots < slots::PAIR => {
            Some(format!("the engine has {} slot(s); the case needs {}", info.slots, slots::PAIR))
        }
        CaseName::Share if info.slots < slots::SHARE => {
            Some(format!("the engine has {} slot(s); the case needs {}", info.slots, slots::SHARE))
        }
        _ if p.slot >= info.slots => Some(format!("slot {} out of range (engine has {})", p.slot, info.slots)),
        _ => None,
    }
}

pub fn plans(p: &BoundaryParams, seed: u64, info: &EngineInfo, caps: &Caps) -> (Vec<Plan>, Vec<Skipped>) {
    let cases: Vec<CaseName> = p.cases.clone().unwrap_or_else(|| CaseName::iter().collect());
    let mut plans = Vec::new();
    let mut skipped = Vec::new();
    for (i, case) in cases.into_iter().enumerate() {
        if let Some(reason) = unavailable(case, p, info, caps) {
            skipped.push(Skipped { name: case.name().to_string(), reason });
            continue;
        }
        let seed = plan_seed(seed, i as u64);
        plans.push(Plan {
            name: case.name().to_string(),
            seed,
            slot: p.slot,
            steps: steps(case, p, seed, info),
            stale: None,
            agent: None,
        });
    }
    (plans, skipped)
}

fn user(rng: &mut SplitMix64, len: usize) -> PromptSpec {
    PromptSpec::User { text: random_text(rng, len), audio_frames: 0 }
}

fn steps(case: CaseName, p: &BoundaryParams, seed: u64, info: &EngineInfo) -> Vec<Step> {
    // Texts are drawn here (not in the conversation) so a case's prompts are fixed by the scenario seed alone.
    let mut rng = SplitMix64::new(seed ^ 0xB0DA);
    let m = p.max_tokens;
    let setup = |rng: &mut SplitMix64| Step::setup("turn 1", user(rng, 12), m);
    let short_tail = |rng: &mut SplitMix64| Tail::Ids(random_text(rng, 6));
    match case {
        // The next chat turn: every fed id is reused.
        CaseName::Extend => vec![setup(&mut rng), Step::compared("turn 2", user(&mut rng, 10), m)],
        // Same prompt again: nothing left to prefill, nothing to sample from: 0 (reuse-equal, counter-reuse).
        CaseName::ExactRepeat => vec![setup(&mut rng), Step::compared("turn 2", PromptSpec::Repeat, m)],
        // One id short of what was fed: the state cannot be rewound: 0 (reuse-equal).
        CaseName::Shorter => vec![setup(&mut rng), Step::compared("turn 2", PromptSpec::Shorter { by: 1 }, m)],
        // Longer prompts that differ at one fed id: 0 (counter-reuse; memcmp-short at the last id).
        CaseName::DivergeFirst => vec![
            setup(&mut rng),
            Step::compared("turn 2", PromptSpec::Diverge { at: At::First, tail: short_tail(&mut rng) }, m),
        ],
        CaseName::DivergeMiddle => vec![
            setup(&mut rng),
            Step::compared("turn 2", PromptSpec::Diverge { at: At::Middle, tail: short_tail(&mut rng) }, m),
        ],
        CaseName::DivergeLast => vec![
            setup(&mut rng),
            Step::compared("turn 2", PromptSpec::Diverge { at: At::Last, tail: short_tail(&mut rng) }, m),
        ],
        // Prompt + the whole reply: the last reply id was never fed, so it is the one id prefilled (bulk-record).
        CaseName::PromptReply => vec![setup(&mut rng), Step::compared("turn 2", PromptSpec::PromptReply, m)],
        // Conversations past the window, each new tail longer than the window (ring-append-first).
        CaseName::WindowWrap => {
            let w = info.window.unwrap_or(1);
            vec![
                Step::setup("turn 1", user(&mut rng, 2 * w + 3), m),
                Step::compared("turn 2", user(&mut rng, 2 * w + 5), m),
                Step::compared("turn 3", user(&mut rng, 3), m),
            ]
        }
        // Turn 2 grows the slot past its initial capacity, turn 3 past twice that, both with a wrapped ring; the
        // record must survive each growth (drop-grow-record) and the ring must not rotate (ring-linear-copy).
        CaseName::CapacityGrowth => {
            let cap = info.initial_capacity;
            let first = (cap / 2).saturating_sub(m + 8).max(1);
            vec![
                Step::setup("turn 1", user(&mut rng, first), m),
                Step::compared("turn 2", user(&mut rng, cap / 2 + 8), m),
                Step::compared("turn 3", user(&mut rng, cap + 8), m),
            ]
        }
        // A turn carrying audio is never reused; the turn after it brings a different clip under the same ids
        // and must not match the tainted state (no-taint).
        CaseName::AudioTaint => vec![
            setup(&mut rng),
            Step::compared("turn 2", PromptSpec::User { text: random_text(&mut rng, 6), audio_frames: 3 }, m),
            Step::compared("turn 3", PromptSpec::Reclip { text: random_text(&mut rng, 5) }, m),
        ],
        // A prompt past the context limit fails on warm and cold alike; the half-written state must claim
        // nothing it did not write (overrun-truncate) and is never reused. The overflow is tried from two
        // different fed lengths so its last segment straddles the limit.
        CaseName::ContextOverflow => {
            let over = |extra: usize| Step {
                expect_refusal: Some("CONTEXT_EXCEEDED"),
                ..Step::compared("", PromptSpec::Extend { tail: Tail::ToLength(info.max_ctx + extra) }, m)
            };
            vec![
                setup(&mut rng),
                Step { label: "turn 2".into(), ..over(3) },
                Step::compared("turn 3", PromptSpec::Extend { tail: short_tail(&mut rng) }, m),
                Step { label: "turn 4".into(), ..over(5) },
            ]
        }
        CaseName::CancelRetry => continuation::cancel_retry(m, &mut rng),
        CaseName::GrowingConversation => continuation::growing(m, &mut rng),
        CaseName::BlockEdges => continuation::block_edges(m, &mut rng),
        CaseName::GridDiverge => grid::diverge(grid_rows(info), m, &mut rng),
        CaseName::GridRepeat => grid::repeat(grid_rows(info), m, &mut rng),
        CaseName::GridShorter => grid::shorter(grid_rows(info), m, &mut rng),
        CaseName::GridReply => grid::reply(grid_rows(info), m, &mut rng),
        CaseName::GridTiling => grid::tiling(grid_rows(info), m, &mut rng),
        CaseName::Interleave => slots::interleave(m, &mut rng),
        CaseName::SlotSwitch => slots::switch(m, &mut rng),
        CaseName::Share => slots::share(m, &mut rng),
    }
}

/// The grid of a grid case (`unavailable` has ruled out engines without one).
fn grid_rows(info: &EngineInfo) -> usize {
    info.prompt_rows.unwrap_or(continuation::BLOCK).max(3)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bundled tiny inkling's limits (one slot, audio, an 8-row window).
    pub(crate) fn tiny_info() -> EngineInfo {
        EngineInfo::tiny_inkling()
    }

    pub(crate) fn caps(audio: Option<usize>) -> Caps {
        Caps::in_process(audio)
    }

    const GRID_AND_SLOTS: [&str; 8] = [
        "grid-diverge",
        "grid-repeat",
        "grid-shorter",
        "grid-reply",
        "grid-tiling",
        "interleave",
        "slot-switch",
        "share",
    ];

    #[test]
    fn every_general_case_runs_on_tiny_inkling() {
        let (plans, skipped) = plans(&BoundaryParams::default(), 0, &tiny_info(), &caps(Some(8)));
        let names: Vec<&str> = skipped.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, GRID_AND_SLOTS, "{skipped:?}");
        assert_eq!(plans.len(), CaseName::iter().count() - GRID_AND_SLOTS.len());
        assert!(plans.iter().all(|p| p.compared() >= 1 && !p.steps[0].compare));
    }

    #[test]
    fn grid_cases_need_a_grid_and_slot_cases_need_slots() {
        let mut info = tiny_info();
        info.prompt_rows = Some(16);
        info.slots = 4;
        let (plans, skipped) = plans(&BoundaryParams::default(), 0, &info, &caps(None));
        assert_eq!(skipped.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["audio-taint"]);
        let share = plans.iter().find(|p| p.name == "share").expect("share");
        assert!(!share.single_slot());
        info.slots = 2;
        let (_, skipped) = super::plans(&BoundaryParams::default(), 0, &info, &caps(None));
        assert!(skipped.iter().any(|s| s.name == "share" && s.reason.contains("needs 3")), "{skipped:?}");
        // a driver that cannot cancel at a poll skips the cancel case
        let mut stdio = caps(None);
        stdio.cancel_at_poll = false;
        let (_, skipped) = super::plans(&BoundaryParams::default(), 0, &info, &stdio);
        assert!(skipped.iter().any(|s| s.name == "cancel-retry"), "{skipped:?}");
    }

    #[test]
    fn cases_the_engine_cannot_run_are_skipped_with_a_reason() {
        let mut info = tiny_info();
        info.window = None;
        info.max_ctx = 1 << 20;
        let (plans, skipped) = plans(&BoundaryParams::default(), 0, &info, &caps(None));
        let names: Vec<&str> = skipped.iter().map(|s| s.name.as_str()).collect();
        let mut expected = vec!["window-wrap", "audio-taint", "context-overflow"];
        expected.extend(GRID_AND_SLOTS);
        assert_eq!(names, expected);
        assert_eq!(plans.len(), CaseName::iter().count() - expected.len());
        // an engine that declares no sizes at all (CAPS without them) gets no arithmetic overflow
        info.max_ctx = usize::MAX;
        info.initial_capacity = usize::MAX;
        info.window = Some(usize::MAX);
        let (_, skipped) = super::plans(&BoundaryParams::default(), 0, &info, &caps(None));
        assert!(skipped.iter().any(|s| s.name == "capacity-growth"), "{skipped:?}");
    }

    #[test]
    fn a_restricted_matrix_runs_only_its_cases_and_is_repeatable() {
        let p = BoundaryParams { cases: Some(vec![CaseName::DivergeLast]), ..BoundaryParams::default() };
        let (a, _) = plans(&p, 5, &tiny_info(), &caps(Some(8)));
        let (b, _) = plans(&p, 5, &tiny_info(), &caps(Some(8)));
        assert_eq!(a, b);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].name, "diverge-last");
    }
}
