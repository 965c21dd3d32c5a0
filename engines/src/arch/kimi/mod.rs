//! Kimi (modelled on kimi_k3.c): about 3 of 4 layers are KDA — gated delta-rule linear attention with a
//! per-channel decay and a matrix state per head, short convolutions on q/k/v — and every `mla_every`-th layer and
//! the last are gated MLA (NoPE) caching one latent row per position. MoE FFN.
//!
//! Reuse is strict-prefix via the record: a recurrent state cannot be rewound, so a prompt that extends every id the
//! state was built from prefills only its tail, and anything else starts over. The state's buffers live as long as
//! the slot (reset in place, grown with the context), so the bytes it holds follow the context, not the turn count.

mod forward;
mod model;
mod state;

use std::sync::Arc;
use std::time::Instant;

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
use forward::Batch;

pub const ENTRY: Entry = Entry { info: INFO, tensor_specs, preset, open };

pub const INFO: ArchInfo = ArchInfo {
    name: "kimi",
    modelled_on: "kimi_k3.c",
    state: "KDA matrix states (heads x hd x hd, f32) + q/k/v short-conv windows on ~3 of 4 layers; gated MLA \
            (NoPE) latent rows on every mla_every-th layer and the last",
    reuse_rule: "strict prefix via the record (a recurrent state cannot be rewound); buffers kept across turns and \
                 grown with the context, never leaked",
    faults: &[Fault::KvLeak, Fault::TruncateRecurrent],
};

/// No audio, no sliding window: KDA + MLA (NoPE) with a latent of half the hidden width, MLA every 4th layer.
fn preset(c: &mut ModelConfig, _: Preset) {
    c.audio_frame_bytes = 0;
    c.window = 0;
    c.global_every = 0;
    c.conv_kernel = 4;
    c.kv_heads = c.heads;
    c.kv_lora = c.hidden / 2;
    c.qk_rope = 0;
    c.mla_every = 4;
    c.compress_ratio = 0;
}

fn open(config: ModelConfig, weights: &crate::weights::Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Kimi::new(Arc::new(Model::load(config, weights)?), fault)))
}

/// A Kimi engine: shared weights plus its slots' states.
pub struct Kimi {
    model: Arc<Model>,
    fault: Option<Fault>,
    slots: Vec<SlotState>,
}

impl Kimi {
    pub fn new(model: Arc<Model>, fault: Option<Fault>) -> Self {
        let slots = (0..model.config.slots).map(|_| SlotState::new(&model, fault)).collect();
        Kimi { model, fault, slots }
    }

    fn has(&self, f: Fault) -> bool {
        self.fault == Some(f)
    }

    /// Grow the slot so `needed` positions fit (the shared growth policy).
    fn ensure_capacity(&mut self, slot: usize, needed: usize) {
        let st = &mut self.slots[slot];
        grow_to_fit(st.capacity, needed, self.model.config.max_ctx, |capacity| st.grow(capacity));
    }

    /// How many prompt positions the state stands in for.
    fn decide(&self, slot: usize, req: &Request) -> Decision {
        let record = &self.slots[slot].record;
        let decision = record.decide(&req.prompt);
        if self.has(Fault::TruncateRecurrent) {
            if let Decision::Fresh(NoReuse::Diverged { .. } | NoReuse::Shorter) = decision {
                // the bug: LCP truncation, as position-addressed caches allow, applied to recurrent states too
                let lcp = record.ids().iter().zip(&req.prompt).take_while(|(a, b)| a == b).count();
                let n = lcp.min(req.prompt.len() - 1);
                if n > 0 {
                    return Decision::Reuse(n);
                }
            }
        }
        decision
    }

    /// The checks every engine makes, then kimi's own: it takes no audio frames.
    fn validate(&self, req: &Request) -> Result<()> {
        check_request(req, self.slots.len(), self.model.config.vocab)?;
        if !req.audio.is_empty() {
            return Err(EngineError::BadRequest(format!("kimi takes no audio frames ({} given)", req.audio.len())));
        }
        Ok(())
    }
}

impl Engine for Kimi {
    fn info(&self) -> EngineInfo {
        engine_info(&self.model.config, self.fault, &self.model.hash)
    }

    fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply> {
        self.validate(req)?;
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let fault = self.fault;
        if req.prompt.len() > c.max_ctx {
            // a failure path: whatever the state holds, a failed request leaves nothing to match
            self.slots[req.slot].record.taint();
            return Err(EngineError::ContextExceeded { used: req.prompt.len(), limit: c.max_ctx });
        }
        if fault == Some(Fault::KvLeak) {
            // the bug (kimi_k3.c's per-turn kv_alloc): fresh buffers every request — a copy, so this turn still
            // answers right — and the old ones kept alive, never freed
            let st = &mut self.slots[req.slot];
            let copy = st.layers.clone();
            st.leaked.push(std::mem::replace(&mut st.layers, copy));
        }
        let t0 = Instant::now();
        self.ensure_capacity(req.slot, req.prompt.len().saturating_add(req.max_tokens).min(c.max_ctx));
        let decision = self.decide(req.slot, req);
        let reused = decision.reused();
        let st = &mut self.slots[req.slot];
        let prefix_log = st.record.log_line(req.prompt.len(), decision);
        if reused == 0 {
            st.reset();
        } else if reused < st.len {
            // only reachable under truncate-recurrent
            st.truncate_latent(reused);
        }

        // prefill the tail in segments, recording each as it completes
        let mut logits = st.last_logits.clone();
        let mut pos = reused;
        let mut chunk = 0u32;
        while pos < req.prompt.len() {
            let end = (pos + c.prefill_chunk).min(req.prompt.len());
            let ids = &req.prompt[pos..end];
            let writer = Writer { request: req.id, kind: WriterKind::Prefill { chunk, chunk_rows: ids.len() as u32 } };
            logits = model.forward(st, &Batch { ids, pos0: pos, writer });
            st.len = end;
            st.record.record(pos, ids);
            pos = end;
            chunk += 1;
            match observer.on_progress() {
                Flow::Continue => {}
                Flow::Stop => break,
                Flow::Cancel => {
                    st.record.taint();
                    return Err(EngineError::Cancelled);
                }
            }
        }
        if pos < req.prompt.len() {
            // stopped mid-prefill: the completed segments stay recorded, there is nothing to sample from
            st.last_logits = logits;
            return Ok(reply::stopped_in_prefill(reused, req.prompt.len(), t0.elapsed(), prefix_log));
        }
        let prefill = t0.elapsed();
        let t1 = Instant::now();

        let limit = st.capacity;
        let decoded = crate::decode::decode(logits, req, st.len, limit, observer, |id, pos, step| {
            let writer = Writer { request: req.id, kind: WriterKind::Decode { step: step as u32 } };
            let next = model.forward(st, &Batch { ids: std::slice::from_ref(&id), pos0: pos, writer });
            st.record.record(pos, &[id]);
            st.len = pos + 1;
            next
        });
        // a failed decode leaves a half-updated state: nothing in it may be reused
        let mut decoded = decoded.inspect_err(|_| st.record.taint())?;
        st.last_logits = std::mem::take(&mut decoded.last_logits);
        Ok(reply::after_decode(decoded, reused, req.prompt.len(), prefill, t1.elapsed(), prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.dump_tensors()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = Kimi::new(Arc::clone(&self.model), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(Kimi::new(Arc::clone(&self.model), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(SlotState::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }
}
