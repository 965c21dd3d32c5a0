//! What the runner knows about one warm instance while it runs a plan: the transcript of each conversation the
//! plan interleaves on it, the history of each slot (what the oracle's expectation depends on), and the warm
//! state's memory footprints so far.

use kvproof_engines::engine::Request;

use crate::cases::{Plan, Step};
use crate::check::memory::{Footprint, MemoryBook};
use crate::check::{CheckName, CheckResult};
use crate::conversation::Conversation;
use crate::oracle::{Outcome, Rule, SlotBook};

pub struct PlanState {
    threads: Vec<Conversation>,
    plan_seed: Vec<u64>,
    frame_bytes: usize,
    slots: Option<SlotBook>,
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
            slots: rule.map(SlotBook::new),
            memory: MemoryBook::default(),
            single_slot: plan.single_slot(),
        }
    }

    /// The conversation of `thread`, started on first use.
    pub fn thread(&mut self, thread: usize) -> &mut Conversation {
        while self.threads.len() <= thread {
            let t = self.threads.len();
            let seed = self.plan_seed.get(t).copied().unwrap_or(t as u64);
            self.threads.push(Conversation::new(seed, self.frame_bytes));
        }
        &mut self.threads[thread]
    }

    /// The oracle's reuse for `req` on its slot; `None` without a rule.
    pub fn expected(&self, req: &Request) -> Option<usize> {
        self.slots.as_ref().map(|b| b.expected(req))
    }

    /// Record how the warm instance's `req` ended.
    pub fn after(&mut self, req: &Request, outcome: Outcome<'_>) {
        if let Some(b) = &mut self.slots {
            b.after(req, outcome);
        }
    }

    /// The warm instance was replaced by a fresh one.
    pub fn reset(&mut self) {
        if let Some(b) = &mut self.slots {
            b.reset();
        }
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
