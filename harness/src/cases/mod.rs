//! What a scenario runs: plans of turns, generated from the scenario's parameters and the engine's
//! description. `boundary_matrix` builds one short conversation per edge case of the reuse decision (the
//! engine-specific ones in `grid` for chunk grids, `slots` for several slots, `continuation` for cancels, block
//! edges and long conversations; `exact` sizes prompts); `stress_pairs` builds seeded random conversations.

pub mod agentic;
pub mod boundary_matrix;
pub mod continuation;
pub mod exact;
pub mod grid;
pub mod growth_curve;
pub mod inputs;
pub mod semantic_staleness;
pub mod slots;
pub mod stress_pairs;

use kvproof_engines::engine::EngineInfo;

use crate::conversation::PromptSpec;
use crate::driver::Caps;
use crate::scenario::corpus::Corpus;
use crate::scenario::{Params, Scenario};

/// One turn of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// e.g. "turn 2"; with the plan's name it identifies the trial.
    pub label: String,
    pub prompt: PromptSpec,
    pub max_tokens: usize,
    /// Compared turns are also run cold (and as the control) and checked; the others only set up the warm state.
    pub compare: bool,
    /// The protocol error code the turn must fail with (on warm and cold alike).
    pub expect_refusal: Option<&'static str>,
    /// The slot this turn runs on; `None`: the plan's.
    pub slot: Option<usize>,
    /// Which of the plan's conversations the turn belongs to (0: the first). Each has its own transcript, so
    /// conversations can interleave on one warm instance.
    pub thread: usize,
    /// Cancel the request at this prefill poll (on warm and cold alike): a deterministic mid-prefill failure.
    pub cancel_at_poll: Option<usize>,
    /// Generate past eos, so every reply has `max_tokens` tokens (growth curves and staleness compare fixed-length
    /// replies).
    pub ignore_eos: bool,
    /// A thread this step's thread starts as a copy of (its transcript so far), when the step is the thread's
    /// first: two conversations that share an opening and then part.
    pub fork_of: Option<usize>,
}

impl Step {
    pub fn setup(label: impl Into<String>, prompt: PromptSpec, max_tokens: usize) -> Self {
        Step {
            label: label.into(),
            prompt,
            max_tokens,
            compare: false,
            expect_refusal: None,
            slot: None,
            thread: 0,
            cancel_at_poll: None,
            ignore_eos: false,
            fork_of: None,
        }
    }
    pub fn compared(label: impl Into<String>, prompt: PromptSpec, max_tokens: usize) -> Self {
        Step { compare: true, ..Step::setup(label, prompt, max_tokens) }
    }
    /// Run on `slot` instead of the plan's.
    pub fn on_slot(self, slot: usize) -> Self {
        Step { slot: Some(slot), ..self }
    }
    /// Belong to conversation `thread`.
    pub fn in_thread(self, thread: usize) -> Self {
        Step { thread, ..self }
    }
    /// Cancel at prefill poll `poll`; the turn must then fail with CANCELLED.
    pub fn cancelled_at(self, poll: usize) -> Self {
        Step { cancel_at_poll: Some(poll), expect_refusal: Some("CANCELLED"), ..self }
    }
    /// Belong to conversation `thread`, which starts as a copy of conversation `of`.
    pub fn forked(self, thread: usize, of: usize) -> Self {
        Step { thread, fork_of: Some(of), ..self }
    }
    /// Generate past eos: a reply of exactly `max_tokens` tokens.
    pub fn fixed_length(self) -> Self {
        Step { ignore_eos: true, ..self }
    }
    /// The slot the turn runs on in `plan`.
    pub fn slot_in(&self, plan: &Plan) -> usize {
        self.slot.unwrap_or(plan.slot)
    }
}

/// One conversation on one warm instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The case or conversation name, e.g. "diverge-last" or "conv-0007".
    pub name: String,
    /// Seeds the conversation's texts and audio payloads.
    pub seed: u64,
    pub slot: usize,
    pub steps: Vec<Step>,
    /// semantic-staleness: the stale context this plan puts in the warm instance's way.
    pub stale: Option<StaleProbe>,
    /// agentic: the session this plan runs (its steps after the first are built from the warm replies).
    pub agent: Option<agentic::AgentSession>,
}

/// The stale context of a semantic-staleness plan: what kind, and the set-up step whose request and reply are
/// that context (the hypotheses are built from what it fed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleProbe {
    pub context: crate::scenario::ContextName,
    pub step: usize,
}

impl Plan {
    pub fn compared(&self) -> usize {
        self.steps.iter().filter(|s| s.compare).count()
    }

    /// Whether every turn runs on the plan's own slot.
    pub fn single_slot(&self) -> bool {
        self.steps.iter().all(|s| s.slot_in(self) == self.slot)
    }

    /// The seed of conversation `thread` (thread 0 keeps the plan's seed).
    pub fn thread_seed(&self, thread: usize) -> u64 {
        if thread == 0 {
            self.seed
        } else {
            plan_seed(self.seed, thread as u64)
        }
    }
}

/// A case the engine cannot run, and why (reported, never passed).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

/// The plans of a scenario for an engine.
pub fn plans(scenario: &Scenario, info: &EngineInfo, caps: &Caps) -> (Vec<Plan>, Vec<Skipped>) {
    match &scenario.params {
        Params::BoundaryMatrix(p) => boundary_matrix::plans(p, scenario.seed, info, caps),
        Params::StressPairs(p) => match scenario.corpus.as_deref().map(|c| &c.corpus) {
            Some(Corpus::Chats(chats)) => (stress_pairs::plans_from_chats(p, scenario.seed, chats), Vec::new()),
            _ => (stress_pairs::plans(p, scenario.seed, info, caps), Vec::new()),
        },
        Params::GrowthCurve(p) => growth_curve::plans(p, scenario.seed, info),
        Params::SemanticStaleness(p) => match scenario.corpus.as_deref().map(|c| &c.corpus) {
            Some(Corpus::Stale(cases)) => semantic_staleness::plans_from_text(p, scenario.seed, info, cases),
            _ => semantic_staleness::plans(p, scenario.seed, info),
        },
        Params::Agentic(p) => (agentic::plans(p, scenario.seed), Vec::new()),
    }
}

/// A per-plan seed from the scenario seed and the plan's index (SplitMix64's increment spreads neighbours apart).
pub fn plan_seed(scenario_seed: u64, index: u64) -> u64 {
    let mut rng = kvproof_engines::rng::SplitMix64::new(scenario_seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.next_u64()
}
