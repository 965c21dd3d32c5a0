//! What the runner knows about one warm instance while it runs a plan: the transcript of each conversation the
//! plan interleaves on it (each step's request is built here, on the step's slot and thread, with its cancel
//! point), the history of each slot (what the oracle's expectation depends on), and the warm state's memory
//! footprints so far.

use kvproof_engines::engine::Request;

use kvproof_engines::engine::StopReason;

use super::instances::TurnRequest;
use crate::cases::{Plan, Step};
use crate::check::memory::{Footprint, MemoryBook};
use crate::conversation::{Conversation, Pending, Prepared, PromptSpec};
use crate::driver::Generation;
use crate::oracle::{Outcome, Rule, SlotBook};
use crate::record::{CheckName, CheckResult};
use crate::text_conversation::{Reply, TextConversation};

/// A conversation a plan drives: built from ids (kvproof's own prompts, edited at exact positions), or held as
/// text for the engine to render with its own template.
#[derive(Debug, Clone)]
enum Thread {
    Ids(Conversation),
    Text(TextConversation),
}

/// A step's request, built from its thread's transcript; `finish` moves the transcript on.
#[derive(Debug)]
pub struct PreparedTurn {
    pub turn: TurnRequest,
    thread: usize,
    label: String,
    /// What the id conversation must be told to keep or undo (None for a text turn).
    ids: Option<(Prepared, Pending)>,
    /// A text turn that continues its thread on the slot that ran the thread's last turn, with nothing else run
    /// there since: any prefix cache must reuse something, whatever ids the engine made of the text.
    pub text_extends: bool,
}

pub struct PlanState {
    threads: Vec<Option<Thread>>,
    /// Per slot, the thread of the last request that completed there.
    slot_thread: Vec<Option<usize>>,
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
            slot_thread: Vec::new(),
            plan_seed: (0..threads).map(|t| plan.thread_seed(t)).collect(),
            frame_bytes,
            slots: SlotBook::new(rule),
            memory: MemoryBook::default(),
            single_slot: plan.single_slot(),
        }
    }

    /// The conversation of `thread`, started on first use: fresh (as text when `spec` is a text turn), or as a
    /// copy of the thread it forks from.
    fn thread(&mut self, thread: usize, fork_of: Option<usize>, spec: &PromptSpec) -> &mut Thread {
        while self.threads.len() <= thread {
            self.threads.push(None);
        }
        let t = match self.threads[thread].take() {
            Some(t) => t,
            None => {
                let source = fork_of.filter(|&f| f != thread).and_then(|f| self.threads.get(f).cloned().flatten());
                let seed = self.plan_seed.get(thread).copied().unwrap_or(thread as u64);
                source.unwrap_or_else(|| match spec {
                    PromptSpec::Say { system, .. } => Thread::Text(TextConversation::new(system.as_deref())),
                    _ => Thread::Ids(Conversation::new(seed, self.frame_bytes)),
                })
            }
        };
        self.threads[thread].insert(t)
    }

    /// The request of `step` (on its slot, its thread, with its cancel point).
    pub fn prepare(&mut self, plan: &Plan, step: &Step) -> Result<PreparedTurn, String> {
        let slot = step.slot_in(plan);
        let continues = self.slot_thread.get(slot).copied().flatten() == Some(step.thread);
        let base = TurnRequest {
            slot,
            prompt: Vec::new(),
            audio: Vec::new(),
            chat: None,
            max_tokens: step.max_tokens,
            ignore_eos: step.ignore_eos,
            cancel_at_poll: step.cancel_at_poll,
        };
        let label = step.label.clone();
        match (self.thread(step.thread, step.fork_of, &step.prompt), &step.prompt) {
            (Thread::Text(c), PromptSpec::Say { text, .. }) => {
                let turn = TurnRequest { chat: Some(c.prepare(text)), ..base };
                Ok(PreparedTurn { turn, thread: step.thread, label, ids: None, text_extends: continues })
            }
            (Thread::Text(c), PromptSpec::Tool { text }) => {
                let turn = TurnRequest { chat: Some(c.prepare_as("tool", text)), ..base };
                Ok(PreparedTurn { turn, thread: step.thread, label, ids: None, text_extends: continues })
            }
            (Thread::Text(_), _) => Err(format!("{}: an id edit on a conversation held as text", step.label)),
            (Thread::Ids(c), spec) => {
                let (prepared, pending) = c.prepare(spec)?;
                let turn = TurnRequest { prompt: prepared.prompt.clone(), audio: prepared.audio.clone(), ..base };
                Ok(PreparedTurn {
                    turn,
                    thread: step.thread,
                    label,
                    ids: Some((prepared, pending)),
                    text_extends: false,
                })
            }
        }
    }

    /// Whether a text turn's rendered prompt (the ids the engine reports it fed) begins with everything its
    /// thread fed last turn; when it does not, why.
    pub fn observe_prompt(&self, turn: &PreparedTurn, prompt_ids: &[u32]) -> Option<String> {
        match self.threads.get(turn.thread) {
            Some(Some(Thread::Text(c))) => c.observe(prompt_ids),
            _ => None,
        }
    }

    /// The turn is over: its thread's transcript goes on with the reply `reply` (None: the turn produced none),
    /// `prompt` being the ids the engine fed when known.
    pub fn finish(&mut self, turn: PreparedTurn, reply: Option<&Generation>, prompt: Option<&[u32]>) {
        if reply.is_some() {
            if self.slot_thread.len() <= turn.turn.slot {
                self.slot_thread.resize(turn.turn.slot + 1, None);
            }
            self.slot_thread[turn.turn.slot] = Some(turn.thread);
        }
        match (self.threads.get_mut(turn.thread), turn.ids) {
            (Some(Some(Thread::Ids(c))), Some((prepared, pending))) => {
                c.finish(&prepared, pending, reply.map(|g| g.tokens.as_slice()))
            }
            (Some(Some(Thread::Text(c))), None) => {
                let text = reply.map(reply_text);
                let ids = match (prompt, reply) {
                    (Some(p), Some(g)) => Some((p, g.tokens.as_slice())),
                    _ => None,
                };
                c.finish(&turn.label, text.as_deref().map(|text| Reply { text, ids }))
            }
            _ => {}
        }
    }

    /// The client bounds `thread`'s transcript, a text thread, to its last `keep` model turns.
    pub fn keep_turns(&mut self, thread: usize, keep: usize) {
        if let Some(Some(Thread::Text(c))) = self.threads.get_mut(thread) {
            c.keep_turns(keep);
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

/// A reply as the text a chat client puts back into the transcript: its tokens' text, without the end-of-turn
/// token a reply that stopped at eos ends with (servers strip it too).
pub fn reply_text(g: &Generation) -> String {
    let Some(pieces) = &g.pieces else { return String::new() };
    let n = if g.stop == StopReason::Eos { pieces.len().saturating_sub(1) } else { pieces.len() };
    let bytes: Vec<u8> = pieces[..n].iter().flatten().copied().collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
