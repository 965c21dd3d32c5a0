//! What the runner knows about one warm instance while it runs a plan: the transcript of each conversation the
//! plan interleaves on it (each step's request is built here, on the step's slot and thread, with its cancel
//! point), the history of each slot (what the oracle's expectation depends on), and the warm state's memory
//! footprints so far.

use kvproof_engines::engine::Request;

use super::instances::TurnRequest;
use crate::cases::{Plan, Step};
use crate::check::memory::{Footprint, MemoryBook};
use crate::conversation::{Conversation, Pending, Prepared};
use crate::oracle::{Outcome, Rule, SlotBook};
use crate::record::{CheckName, CheckResult};

/// A step's request, built from its thread's transcript; `finish` moves the transcript on.
#[derive(Debug)]
pub struct PreparedTurn {
    pub turn: TurnRequest,
    thread: usize,
    prepared: Prepared,
    pending: Pending,
}

pub struct PlanState {
    threads: Vec<Option<Conversation>>,
    plan_seed: Vec<u64>,
    frame_bytes: usize,
    slots: SlotBook,
    memory: MemoryBook,
    single_slot: bool,
}

impl PlanState {
    pub fn new(plan: &Plan, rule: Option<Rule>, frame_bytes: usize) -> Self {
        let threads = plan.steps.iter().map(|s| s.thread).max().unwrap_or(0) + 1;
        PlanState {
            threads: Vec::new(),
            plan_seed: (0..threads).map(|t| plan.thread_seed(t)).collect(),
            frame_bytes,
            slots: SlotBook::new(rule),
            memory: MemoryBook::default(),
            single_slot: plan.single_slot(),
        }
    }

    /// The conversation of `thread`, started on first use: fresh, or as a copy of the thread it forks from.
    fn thread(&mut self, thread: usize, fork_of: Option<usize>) -> &mut Conversation {
        while self.threads.len() <= thread {
            self.threads.push(None);
        }
        let conversation = match self.threads[thread].take() {
            Some(c) => c,
            None => {
                let source = fork_of.filter(|&f| f != thread).and_then(|f| self.threads.get(f).cloned().flatten());
                let seed = self.plan_seed.get(thread).copied().unwrap_or(thread as u64);
                source.unwrap_or_else(|| Conversation::new(seed, self.frame_bytes))
            }
        };
        self.threads[thread].insert(conversation)
    }

    /// The request of `step` (on its slot, its thread, with its cancel point).
    pub fn prepare(&mut self, plan: &Plan, step: &Step) -> Result<PreparedTurn, String> {
        let (prepared, pending) = self.thread(step.thread, step.fork_of).prepare(&step.prompt)?;
        let turn = TurnRequest {
            slot: step.slot_in(plan),
            prompt: prepared.prompt.clone(),
            audio: prepared.audio.clone(),
            max_tokens: step.max_tokens,
            ignore_eos: step.ignore_eos,
            cancel_at_poll: step.cancel_at_poll,
        };
        Ok(PreparedTurn { turn, thread: step.thread, prepared, pending })
    }

    /// The turn is over: its thread's transcript goes on with `reply` (None: the turn produced none).
    pub fn finish(&mut self, turn: PreparedTurn, reply: Option<&[u32]>) {
        if let Some(Some(c)) = self.threads.get_mut(turn.thread) {
            c.finish(&turn.prepared, turn.pending, reply);
        }
    }

    /// The oracle's reuse for `req` on its slot; `None` without a rule.
    pub fn expected(&self, req: &Request) -> Option<usize> {
        self.slots.expected(req)
    }

    /// Whether any prefix cache must reuse something for `req` (it strictly extends what its slot fed).
    pub fn must_reuse(&self, req: &Request) -> bool {
        self.slots.must_reuse(req)
    }

    /// Record how the warm instance's `req` ended.
    pub fn after(&mut self, req: &Request, outcome: Outcome<'_>) {
        self.slots.after(req, outcome);
    }

    /// The engine declares that failures with these codes leave the slot as it was (CAPS `keeps_state_on=`).
    pub fn keeping_state_on(mut self, codes: &[String]) -> Self {
        self.slots = self.slots.keeping_state_on(codes);
        self
    }

    /// The warm instance was replaced by a fresh one.
    pub fn reset(&mut self) {
        self.slots.reset();
        self.memory.reset();
    }

    /// The memory check of a compared turn: `warm` and `cold` footprints after it (`Err`: why unknown).
    pub fn memory_check(
        &mut self,
        step: &Step,
        warm: Result<Footprint, String>,
        cold: Result<Footprint, String>,
    ) -> CheckResult {
        if !self.single_slot {
            return CheckResult::skipped(
                CheckName::Memory,
                "the plan uses several slots: state bytes span slots a fresh instance does not hold",
            );
        }
        self.memory.check(&step.label, warm, cold)
    }
}
