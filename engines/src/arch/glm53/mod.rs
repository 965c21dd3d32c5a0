//! glm53 (modelled on the GLM-5.3 engine of seed 004): full-attention rows written by prompt chunks, kernels whose
//! reduction split follows the chunk's row count and a decode path that reduces in yet another order — NOT
//! batch-invariant, as GPU kernels are not — a MoE FFN, and a speculative MTP drafter with its own state.
//!
//! Reuse (seed 004's invariants, each of which has a fault that breaks it):
//! - prefill chunks sit on a position-fixed grid of `prompt_rows` (`chunks`), so a prefix is always written by the
//!   same chunks;
//! - reuse = min(LCP(record, prompt), canonical_end, prompt length - 1), rounded down to the grid, where
//!   canonical_end is the end of the rows the previous request's prefill wrote (its prompt length): rows past it
//!   were written by decode, and decode bits are not prefill bits;
//! - the drafter is resumed at the reuse offset.
//!
//! With `prefix_cache` off every request starts over, which reproduces the cold path bit for bit.

mod chunks;
mod drafter;
mod forward;
mod model;
mod state;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

pub use chunks::plan;
pub use model::{tensor_specs, Model};
use state::SlotState;

use crate::arch::capacity::grow_to_fit;
use crate::arch::engine_info::engine_info;
use crate::arch::reply;
use crate::arch::request_checks::check_request;
use crate::bundled::{ArchInfo, Entry};
use crate::config::{ModelConfig, Preset};
use crate::dump::{StateDump, Writer, WriterKind};
use crate::engine::{Engine, EngineInfo, Flow, Observer, Reply, Request};
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};
use forward::{prefill_reduction, Batch, DECODE_REDUCTION};

pub const ENTRY: Entry = Entry { info: INFO, tensor_specs, preset, open };

pub const INFO: ArchInfo = ArchInfo {
    name: "glm53",
    modelled_on: "the GLM-5.3 engine of seed 004",
    state: "full-attention k/v rows written by prompt chunks (tiling follows the chunk's rows; decode differs), \
            plus a speculative MTP drafter's own k/v rows",
    reuse_rule: "min(LCP, previous prompt length, prompt length - 1) rounded down to the prompt_rows grid; \
                 drafter resumed at the offset",
    faults: &[Fault::VariableChunks, Fault::NoCanonicalBound, Fault::NoGridQuantize, Fault::DrafterNotResumed],
};

/// glm53 sizes: one slot (seed 004 caches one conversation), no rings, no audio, a grid and a 1-layer drafter.
fn preset(c: &mut ModelConfig, p: Preset) {
    c.window = 0;
    c.global_every = 0;
    c.conv_kernel = 0;
    c.audio_frame_bytes = 0;
    c.slots = 1;
    c.draft_layers = 1;
    c.prompt_rows = match p {
        Preset::Tiny => 16,
        Preset::Small => 64,
        Preset::Bench => 128,
    };
    c.prefill_chunk = c.prompt_rows;
    c.prefix_cache = true;
}

fn open(config: ModelConfig, weights: &crate::weights::Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Glm53::new(Arc::new(Model::load(config, weights)?), fault)))
}

/// A glm53 engine: shared weights plus its slots' states.
pub struct Glm53 {
    model: Arc<Model>,
    fault: Option<Fault>,
    slots: Vec<SlotState>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A draft id verified by the main model: its position and the main model's logits after it.
struct Verified {
    pos: usize,
    id: u32,
    logits: Vec<f32>,
}

impl Glm53 {
    pub fn new(model: Arc<Model>, fault: Option<Fault>) -> Self {
        let slots = (0..model.config.slots).map(|_| SlotState::new(&model.config)).collect();
        Glm53 { model, fault, slots }
    }

    fn has(&self, f: Fault) -> bool {
        self.fault == Some(f)
    }

    /// How many prompt positions the slot's state stands in for.
    fn decide(&self, st: &SlotState, prompt: &[u32]) -> Decision {
        if !self.model.config.prefix_cache {
            return Decision::Fresh(NoReuse::Absent);
        }
        let rec = &st.record;
        if !rec.is_allocated() {
            return Decision::Fresh(NoReuse::Absent);
        }
        if rec.is_tainted() {
            return Decision::Fresh(NoReuse::Tainted);
        }
        if rec.is_empty() {
            return Decision::Fresh(NoReuse::Empty);
        }
        let lcp = common_prefix(rec.ids(), prompt);
        // at least one prompt id is prefilled: its logits are what the first token is sampled from
        let mut r = lcp.min(prompt.len() - 1);
        if !self.has(Fault::NoCanonicalBound) {
            r = r.min(st.canonical_end);
        }
        if !self.has(Fault::NoGridQuantize) {
            r = r / self.model.grid * self.model.grid;
        }
        if r > 0 {
            Decision::Reuse(r)
        } else if lcp < prompt.len() && lcp < rec.len() {
            Decision::Fresh(NoReuse::Diverged { at: lcp })
        } else {
            Decision::Fresh(NoReuse::Shorter)
        }
    }

    /// Grow the slot so `needed` positions fit (the shared growth policy).
    fn ensure_capacity(&mut self, slot: usize, needed: usize) {
        let st = &mut self.slots[slot];
        grow_to_fit(st.capacity, needed, self.model.config.max_ctx, |capacity| st.grow(capacity));
    }

    /// The checks every engine makes, then glm53's own: it takes no audio frames.
    fn validate(&self, req: &Request) -> Result<()> {
        check_request(req, self.slots.len(), self.model.config.vocab)?;
        if !req.audio.is_empty() {
            return Err(EngineError::BadRequest("glm53 takes no audio frames".into()));
        }
        Ok(())
    }
}

/// Feed `id` at `pos` through the main model's decode path together with the drafter's proposals after it, in
/// one verification batch; returns the logits after `id` and the verified proposals.
fn verify(
    model: &Model,
    st: &mut SlotState,
    req: &Request,
    id: u32,
    pos: usize,
    step: usize,
    want: usize,
) -> (Vec<f32>, Vec<Verified>) {
    let writer = |j: usize| Writer { request: req.id, kind: WriterKind::Decode { step: (step + j) as u32 } };
    // proposals past the slot's capacity, or past the last id this request could still feed, are never used
    let room = st.capacity.saturating_sub(pos + 1);
    let feedable = req.max_tokens.saturating_sub(step + 2);
    let n = want.min(room).min(feedable);
    st.drafter.resume(pos);
    let drafts = st.drafter.propose(model, id, n, req.ignore_eos, writer);
    let mut ids = Vec::with_capacity(1 + drafts.len());
    ids.push(id);
    ids.extend_from_slice(&drafts);
    let batch = Batch { ids: &ids, pos0: pos, writers: (0..ids.len()).map(writer).collect() };
    let logits = model.forward(&mut st.kv, &batch, DECODE_REDUCTION, ids.len());
    let vocab = model.config.vocab;
    let verified = drafts
        .iter()
        .enumerate()
        .map(|(j, &d)| Verified { pos: pos + 1 + j, id: d, logits: logits[(j + 1) * vocab..(j + 2) * vocab].to_vec() })
        .collect();
    (logits[..vocab].to_vec(), verified)
}

impl Engine for Glm53 {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            prompt_rows: Some(self.model.grid),
            ..engine_info(&self.model.config, self.fault, &self.model.hash)
        }
    }

    fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply> {
        self.validate(req)?;
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let len = req.prompt.len();
        if len > c.max_ctx {
            // a failed request leaves nothing reusable
            self.slots[req.slot].record.taint();
            return Err(EngineError::ContextExceeded { used: len, limit: c.max_ctx });
        }
        let t0 = Instant::now();
        self.ensure_capacity(req.slot, (len + req.max_tokens).min(c.max_ctx).max(len));
        let decision = self.decide(&self.slots[req.slot], &req.prompt);
        let prefix_log = self.slots[req.slot].record.log_line(len, decision);
        let fault = self.fault;
        let st = &mut self.slots[req.slot];
        let reused = decision.reused();
        if reused == 0 {
            st.reset();
        } else {
            st.truncate(reused, fault != Some(Fault::DrafterNotResumed));
        }

        // prefill the tail chunk by chunk, recording each as it completes
        let mut logits = Vec::new();
        let mut done = reused;
        for (chunk, &(a, b)) in plan(reused, len, model.grid, fault == Some(Fault::VariableChunks)).iter().enumerate() {
            let ids = &req.prompt[a..b];
            let kind = WriterKind::Prefill { chunk: chunk as u32, chunk_rows: (b - a) as u32 };
            let writers = vec![Writer { request: req.id, kind }; b - a];
            logits = model.forward(
                &mut st.kv,
                &Batch { ids, pos0: a, writers: writers.clone() },
                prefill_reduction(b - a),
                1,
            );
            st.drafter.feed(&model, ids, writers);
            st.record.record(a, ids);
            st.len = b;
            st.canonical_end = b;
            done = b;
            match observer.on_progress() {
                Flow::Continue => {}
                Flow::Stop => break,
                Flow::Cancel => {
                    st.record.taint();
                    return Err(EngineError::Cancelled);
                }
            }
        }
        let prefill = t0.elapsed();
        if done < len {
            // stopped mid-prefill: nothing to sample from
            return Ok(reply::stopped_in_prefill(reused, len, prefill, prefix_log));
        }

        let t1 = Instant::now();
        let capacity = st.capacity;
        let mut verified: VecDeque<Verified> = VecDeque::new();
        // proposals per batch adapt to the drafter's luck: as many as the last batch got accepted, plus one
        let (mut want, mut proposed) = (drafter::DRAFT_TOKENS, 0);
        let decoded = crate::decode::decode(logits, req, len, capacity, observer, |id, pos, step| {
            // a proposal the main model already verified at this position: its rows and logits are there
            let next = match verified.front() {
                Some(v) if v.pos == pos && v.id == id => {
                    st.accepted += 1;
                    verified.pop_front().map(|v| v.logits).unwrap_or_default()
                }
                _ => {
                    if proposed > 0 {
                        want = (proposed - verified.len() + 1).min(drafter::DRAFT_TOKENS);
                    }
                    let (next, more) = verify(&model, st, req, id, pos, step, want);
                    proposed = more.len();
                    st.drafted += more.len();
                    verified = more.into();
                    next
                }
            };
            st.record.record(pos, &[id]);
            st.len = pos + 1;
            next
        });
        // rows written for proposals that were never fed are not part of the state
        let fed = st.len;
        st.kv.iter_mut().for_each(|kv| kv.forget_from(fed));
        st.drafter.resume(fed);
        // a failed decode leaves a half-updated state: nothing in it may be reused
        let decoded = decoded.inspect_err(|_| st.record.taint())?;
        Ok(reply::after_decode(decoded, reused, len, prefill, t1.elapsed(), prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.dump_tensors()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = Glm53::new(Arc::clone(&self.model), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(Glm53::new(Arc::clone(&self.model), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(SlotState::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TokenEvent;

    fn engine(draft_layers: usize) -> Glm53 {
        let mut c = ModelConfig::preset("glm53", Preset::Tiny).expect("tiny");
        c.draft_layers = draft_layers;
        let w = crate::fixture::generate_weights(&c, 0).expect("fixture");
        Glm53::new(Arc::new(Model::load(c, &w).expect("load")), None)
    }

    #[derive(Default)]
    struct Logits(Vec<Vec<(u32, u32)>>);
    impl Observer for Logits {
        fn on_token(&mut self, e: &TokenEvent) -> Flow {
            self.0.push(e.top.iter().map(|&(i, l)| (i, l.to_bits())).collect());
            Flow::Continue
        }
    }

    fn run(e: &mut Glm53, r: &Request) -> (Vec<u32>, Vec<Vec<(u32, u32)>>) {
        let mut obs = Logits::default();
        let reply = e.generate(r, &mut obs).expect("generate");
        (reply.tokens, obs.0)
    }

    /// The main model's rows and the record, without the drafter's rows.
    fn main_state(e: &Glm53) -> (Vec<crate::dump::DumpTensor>, Vec<u32>) {
        let d = e.dump(0).expect("dump");
        (d.tensors.into_iter().filter(|t| !t.name.starts_with("draft")).collect(), d.record.ids)
    }

    #[test]
    fn every_acceptance_pattern_gives_the_plain_decode_bit_for_bit() {
        let prompt: Vec<u32> = (0..37u32).map(|i| (i * 29 + 5) % 256).collect();
        let r = Request { id: 1, prompt: prompt.clone(), max_tokens: 24, logprobs: 300, ..Default::default() };
        let mut plain = engine(0);
        let (tokens, logits) = run(&mut plain, &r);
        assert_eq!(tokens.len(), 24);
        let reference = main_state(&plain);
        let mut truth = prompt.clone();
        truth.extend_from_slice(&tokens);
        // a drafter that is always right, right except every third position, and always wrong
        let mut mostly = truth.clone();
        mostly.iter_mut().skip(prompt.len()).step_by(3).for_each(|t| *t = (*t + 1) % 256);
        let wrong: Vec<u32> = truth.iter().map(|t| (t + 1) % 256).collect();
        let mut rates = Vec::new();
        for forced in [truth, mostly, wrong] {
            let mut spec = engine(1);
            spec.slots[0].drafter.forced = Some(forced);
            let (t, l) = run(&mut spec, &r);
            assert_eq!(t, tokens);
            assert_eq!(l, logits, "logits after verification batches equal one-token decode logits");
            assert_eq!(main_state(&spec), reference, "the main model's rows and writers do not depend on drafting");
            let st = &spec.slots[0];
            assert!(st.drafted > 0);
            rates.push(st.accepted);
            let draft_rows = st.drafter.kv[0].k.rows.meta.iter().filter(|m| m.pos >= 0).count();
            assert_eq!(draft_rows, st.len, "no rows of rejected or unfed proposals are left");
        }
        // 23 ids are fed; with a drafter that is always right, every fourth starts a verification batch (of itself
        // and 3 proposals) and the other 17 were proposals
        assert_eq!(rates[2], 0);
        assert!(rates[0] > rates[1] && rates[1] > rates[2], "acceptance {rates:?}");
        assert_eq!(rates[0], 17, "acceptance {rates:?}");
    }
}
