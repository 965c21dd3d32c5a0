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

pub use chunks::plan;
pub use model::{Config, Model};
use state::State;

use crate::dump::{Writer, WriterKind};
use crate::engine::{EngineInfo, Request};
use crate::engine_loop::{on_worker, Arch, ArchInfo, DeclaredReuse, Progress, Segment, Slot, Start, Step};
use crate::error::Result;
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};
use forward::{prefill_reduction, Batch, DECODE_REDUCTION};

pub const INFO: ArchInfo = ArchInfo {
    name: "glm53",
    modelled_on: "the GLM-5.3 engine of seed 004",
    state: "full-attention k/v rows written by prompt chunks (tiling follows the chunk's rows; decode differs), \
            plus a speculative MTP drafter's own k/v rows",
    reuse_rule: "min(LCP, previous prompt length, prompt length - 1) rounded down to the prompt_rows grid; \
                 drafter resumed at the offset",
    declares: DeclaredReuse::Grid,
    faults: &[Fault::VariableChunks, Fault::NoCanonicalBound, Fault::NoGridQuantize, Fault::DrafterNotResumed],
};

/// The writer of a segment's `k`-th chunk, of `rows` rows: the segment's first chunk is the one the engine loop
/// numbered.
fn nth_chunk(writer: Writer, k: usize, rows: usize) -> Writer {
    match writer.kind {
        WriterKind::Prefill { chunk, .. } => {
            Writer { kind: WriterKind::Prefill { chunk: chunk + k as u32, chunk_rows: rows as u32 }, ..writer }
        }
        _ => writer,
    }
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

/// What one request's decode carries from step to step: the proposals verified ahead of the ids fed, and how
/// many to ask for next (as many as the last batch got accepted, plus one).
pub struct Decoding {
    verified: VecDeque<Verified>,
    want: usize,
    proposed: usize,
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding { verified: VecDeque::new(), want: drafter::DRAFT_TOKENS, proposed: 0 }
    }
}

/// Feed `id` at `pos` through the main model's decode path together with the drafter's proposals after it, in
/// one verification batch; returns the logits after `id` and the verified proposals.
fn verify(model: &Model, st: &mut Slot<State>, s: &Step, want: usize) -> (Vec<f32>, Vec<Verified>) {
    let (req, id, pos, step) = (s.req, s.id, s.pos, s.index);
    let writer = |j: usize| Writer { request: req.id, kind: WriterKind::Decode { step: (step + j) as u32 } };
    // proposals past the slot's capacity, or past the last id this request could still feed, are never used
    let room = st.capacity.saturating_sub(pos + 1);
    let feedable = req.max_tokens.saturating_sub(step + 2);
    let n = want.min(room).min(feedable);
    let st = &mut st.layers;
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

impl Arch for Model {
    crate::model_parts!(State, Decoding, INFO);
    /// Reuse never reaches the whole prompt (it is bounded by prompt length - 1): no logits are kept.
    const KEEPS_LOGITS: bool = false;

    fn new_layers(&self) -> State {
        State::new(&self.config)
    }

    fn info(&self, base: EngineInfo) -> EngineInfo {
        EngineInfo { prompt_rows: Some(self.grid), ..base }
    }

    /// glm53 takes no audio frames (its refusal does not count them).
    fn audio_rows<'r>(&self, req: &'r Request) -> Result<crate::engine_loop::AudioRows<'r>> {
        if !req.audio.is_empty() {
            return Err(crate::error::EngineError::BadRequest("glm53 takes no audio frames".into()));
        }
        Ok(Vec::new())
    }

    /// min(LCP, canonical end, prompt length - 1) rounded down to the grid (`no-canonical-bound`,
    /// `no-grid-quantize`: without the bound, without the rounding); with `prefix_cache` off, nothing.
    fn decide(&self, slots: &[Slot<State>], req: &Request, fault: Option<Fault>) -> Start {
        let (st, prompt) = (&slots[req.slot], &req.prompt);
        if !self.config.prefix_cache {
            return Start::Own(Decision::Fresh(NoReuse::Absent));
        }
        let rec = &st.record;
        if !rec.is_allocated() {
            return Start::Own(Decision::Fresh(NoReuse::Absent));
        }
        if rec.is_tainted() {
            return Start::Own(Decision::Fresh(NoReuse::Tainted));
        }
        if rec.is_empty() {
            return Start::Own(Decision::Fresh(NoReuse::Empty));
        }
        let lcp = common_prefix(rec.ids(), prompt);
        // at least one prompt id is prefilled: its logits are what the first token is sampled from
        let mut r = lcp.min(prompt.len() - 1);
        if fault != Some(Fault::NoCanonicalBound) {
            r = r.min(st.layers.canonical_end);
        }
        if fault != Some(Fault::NoGridQuantize) {
            r = r / self.grid * self.grid;
        }
        Start::Own(if r > 0 {
            Decision::Reuse(r)
        } else if lcp < prompt.len() && lcp < rec.len() {
            Decision::Fresh(NoReuse::Diverged { at: lcp })
        } else {
            Decision::Fresh(NoReuse::Shorter)
        })
    }

    /// Keep the reused positions and resume the drafter there (`drafter-not-resumed`: it is not).
    fn resume(&self, slots: &mut [Slot<State>], req: &Request, start: Start, fault: Option<Fault>) {
        let st = &mut slots[req.slot];
        match start.decision().reused() {
            0 => st.reset(),
            keep => {
                st.layers.truncate(keep, fault != Some(Fault::DrafterNotResumed));
                st.record.record(keep, &[]);
                st.len = keep;
            }
        }
    }

    /// Chunks on the position-fixed grid (`variable-chunks`: sized from the prompt's length), a remainder joined
    /// to the full chunk before it.
    fn segments(&self, from: usize, to: usize, fault: Option<Fault>) -> Vec<(usize, usize)> {
        chunks::segments(from, to, self.grid, fault == Some(Fault::VariableChunks))
    }

    /// A segment's chunks through the main model together (each tiled by its own row count, written by its own
    /// chunk), then through the drafter one by one.
    fn prefill(&self, slot: &mut Slot<State>, seg: &Segment, _: &mut Progress, _: Option<Fault>) -> Option<Vec<f32>> {
        let st = &mut slot.layers;
        let batches: Vec<Batch> = chunks::split(seg.pos0, seg.end(), self.grid)
            .into_iter()
            .enumerate()
            .map(|(k, (a, b))| Batch {
                ids: &seg.ids[a - seg.pos0..b - seg.pos0],
                pos0: a,
                writers: vec![nth_chunk(seg.writer, k, b - a); b - a],
            })
            .collect();
        // the drafter's kernels on the pool too: from outside it each one was a hand-off to a sleeping worker
        let logits = on_worker(|| {
            let fed: Vec<_> = batches.iter().map(|b| (b, prefill_reduction(b.ids.len()))).collect();
            let logits = self.forward_together(&mut st.kv, &fed, 1);
            for b in &batches {
                st.drafter.feed(self, b.ids, b.writers.clone());
            }
            logits
        });
        st.canonical_end = seg.end();
        Some(logits)
    }

    /// A proposal the main model already verified at this position is taken as it is; otherwise `id` starts a
    /// new verification batch.
    fn decode_step(&self, slot: &mut Slot<State>, d: &mut Decoding, s: &Step, _: Option<Fault>) -> Vec<f32> {
        match d.verified.front() {
            Some(v) if v.pos == s.pos && v.id == s.id => {
                slot.layers.accepted += 1;
                d.verified.pop_front().map(|v| v.logits).unwrap_or_default()
            }
            _ => {
                if d.proposed > 0 {
                    d.want = (d.proposed - d.verified.len() + 1).min(drafter::DRAFT_TOKENS);
                }
                let (next, more) = verify(self, slot, s, d.want);
                d.proposed = more.len();
                slot.layers.drafted += more.len();
                d.verified = more.into();
                next
            }
        }
    }

    /// Rows written for proposals that were never fed are not part of the state.
    fn after_decode(&self, slot: &mut Slot<State>) {
        let fed = slot.len;
        slot.layers.kv.iter_mut().for_each(|kv| kv.forget_from(fed));
        slot.layers.drafter.resume(fed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TokenEvent;

    use crate::engine::{Flow, Observer};

    use crate::config::{ArchConfig, Preset};
    use crate::engine::Engine;
    use crate::engine_loop::BundledEngine;
    use std::sync::Arc;

    type Glm53 = BundledEngine<Model>;

    fn engine(draft_layers: usize) -> Glm53 {
        let c = Config { draft_layers, ..Config::preset(Preset::Tiny) };
        let w = crate::fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
        let hash = crate::arch::model_hash::model_hash(&c, &w);
        BundledEngine::new(Arc::new(Model::build(c, &mut crate::tensors::Load(&w), hash).expect("load")), None)
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
            spec.slots_mut()[0].layers.drafter.forced = Some(forced);
            let (t, l) = run(&mut spec, &r);
            assert_eq!(t, tokens);
            assert_eq!(l, logits, "logits after verification batches equal one-token decode logits");
            assert_eq!(main_state(&spec), reference, "the main model's rows and writers do not depend on drafting");
            let st = &spec.slots()[0];
            assert!(st.layers.drafted > 0);
            rates.push(st.layers.accepted);
            let draft_rows = st.layers.drafter.kv[0].k.rows.meta.iter().filter(|m| m.pos >= 0).count();
            assert_eq!(draft_rows, st.len, "no rows of rejected or unfed proposals are left");
        }
        // 23 ids are fed; with a drafter that is always right, every fourth starts a verification batch (of itself
        // and 3 proposals) and the other 17 were proposals
        assert_eq!(rates[2], 0);
        assert!(rates[0] > rates[1] && rates[1] > rates[2], "acceptance {rates:?}");
        assert_eq!(rates[0], 17, "acceptance {rates:?}");
    }
}
