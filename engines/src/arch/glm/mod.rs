//! glm (modelled on colibri.c, GLM-5.2): MLA attention caching the latent per position (a `kv_lora` row and a
//! `qk_rope` row), a MoE FFN, and several slots, each pinned to its conversation.
//!
//! Reuse: a request on slot s truncates s to the longest common prefix of s's record and the prompt, bounded by
//! prompt length - 1, and extends it — so an exact repeat or a shorter prompt reuses too. With `kv_share` on, a
//! request on an empty slot adopts the longest matching prefix another slot holds by copying its rows (writer
//! `Copied{from_slot}`). Both are exact because the rows are position-addressed and batch-invariant.

mod forward;
mod model;
mod reuse;
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
use crate::prefix::Decision;
use forward::Batch;

pub const ENTRY: Entry = Entry { info: INFO, tensor_specs, preset, open };

pub const INFO: ArchInfo = ArchInfo {
    name: "glm",
    modelled_on: "colibri.c (GLM-5.2)",
    state: "MLA latent rows (kv_lora + qk_rope per position, position-addressed) in several pinned slots",
    reuse_rule: "truncate the slot to the longest common prefix with its record, bounded by prompt length - 1, \
                 and extend; with kv_share, an empty slot copies the longest matching prefix of another slot",
    faults: &[
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::DropGrowRecord,
        Fault::StaleSlot,
        Fault::ShareOffByOne,
    ],
};

/// glm sizes: four slots, MLA widths, no rings, no audio; sharing off.
fn preset(c: &mut ModelConfig, p: Preset) {
    c.window = 0;
    c.global_every = 0;
    c.conv_kernel = 0;
    c.audio_frame_bytes = 0;
    c.slots = 4;
    c.kv_share = false;
    // MLA has no kv heads: the latent is shared by every head
    c.kv_heads = c.heads;
    (c.kv_lora, c.qk_rope) = match p {
        Preset::Tiny => (32, 8),
        Preset::Small => (64, 16),
        Preset::Bench => (128, 32),
    };
}

fn open(config: ModelConfig, weights: &crate::weights::Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Glm::new(Arc::new(Model::load(config, weights)?), fault)))
}

/// A glm engine: shared weights plus its slots' states.
pub struct Glm {
    model: Arc<Model>,
    fault: Option<Fault>,
    slots: Vec<SlotState>,
}

/// What a request starts from.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Keep the slot's first n positions (0: start over).
    Own(Decision),
    /// Copy the first n positions of another slot into this empty one.
    Share { from: usize, n: usize },
}

impl Glm {
    pub fn new(model: Arc<Model>, fault: Option<Fault>) -> Self {
        let slots = (0..model.config.slots).map(|_| SlotState::new(&model.config)).collect();
        Glm { model, fault, slots }
    }

    /// The checks every engine makes, then glm's own: it takes no audio frames.
    fn validate(&self, req: &Request) -> Result<()> {
        check_request(req, self.slots.len(), self.model.config.vocab)?;
        if !req.audio.is_empty() {
            return Err(EngineError::BadRequest("glm takes no audio frames".into()));
        }
        Ok(())
    }

    /// Grow the slot so `needed` positions fit (the shared growth policy).
    fn ensure_capacity(&mut self, slot: usize, needed: usize) {
        let st = &mut self.slots[slot];
        grow_to_fit(st.capacity, needed, self.model.config.max_ctx, |capacity| st.grow(capacity, self.fault));
    }

    fn start(&self, req: &Request) -> Start {
        if self.model.config.kv_share {
            if let Some((from, n)) = reuse::share_source(&self.slots, req.slot, &req.prompt, self.fault) {
                return Start::Share { from, n };
            }
        }
        Start::Own(reuse::own(&self.slots[req.slot], &req.prompt, self.fault))
    }

    /// Copy `n` rows of slot `from` into the (empty) slot `to`; the record then holds the prompt's first n ids.
    fn share(&mut self, from: usize, to: usize, n: usize, req: &Request) {
        let writer = Writer { request: req.id, kind: WriterKind::Copied { from_slot: from as u32 } };
        let (donor, target) = if from < to {
            let (a, b) = self.slots.split_at_mut(to);
            (&a[from], &mut b[0])
        } else {
            let (a, b) = self.slots.split_at_mut(from);
            (&b[0], &mut a[to])
        };
        target.truncate(0, self.fault);
        target.copy_from(donor, n, writer);
        target.record.record(0, &req.prompt[..n]);
    }
}

impl Engine for Glm {
    fn info(&self) -> EngineInfo {
        engine_info(&self.model.config, self.fault, &self.model.hash)
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
        let fault = self.fault;
        let start = self.start(req);
        let decision = match start {
            Start::Share { n, .. } => Decision::Reuse(n),
            Start::Own(d) => d,
        };
        let prefix_log = self.slots[req.slot].record.log_line(len, decision);
        let reused = decision.reused();
        match start {
            Start::Share { from, n } => self.share(from, req.slot, n, req),
            Start::Own(_) => self.slots[req.slot].truncate(reused, fault),
        }
        let st = &mut self.slots[req.slot];
        st.last_prompt = len;
        st.last_generated = 0;
        let stale = fault == Some(Fault::StaleSlot);

        // prefill the tail in segments, recording each as it completes
        let mut logits = st.last_logits.clone();
        let mut pos = reused;
        let mut chunk = 0u32;
        while pos < len {
            let end = (pos + c.prefill_chunk).min(len);
            let ids = &req.prompt[pos..end];
            let writer = Writer { request: req.id, kind: WriterKind::Prefill { chunk, chunk_rows: ids.len() as u32 } };
            logits = model.forward(&mut st.kv, &Batch { ids, pos0: pos, writer, kv_len: None });
            st.len = if stale { st.len.max(end) } else { end };
            st.record.record(pos, ids);
            st.last_logits.clone_from(&logits);
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
        let prefill = t0.elapsed();
        if pos < len {
            // stopped mid-prefill: nothing to sample from
            return Ok(reply::stopped_in_prefill(reused, len, prefill, prefix_log));
        }

        let t1 = Instant::now();
        let capacity = st.capacity;
        let decoded = crate::decode::decode(logits, req, len, capacity, observer, |id, pos, step| {
            let writer = Writer { request: req.id, kind: WriterKind::Decode { step: step as u32 } };
            // the slot's kv length after this id: decode attends to all of it
            let kv_len = if stale { st.len.max(pos + 1) } else { pos + 1 };
            let next = model.forward(
                &mut st.kv,
                &Batch { ids: std::slice::from_ref(&id), pos0: pos, writer, kv_len: Some(kv_len) },
            );
            if fault != Some(Fault::BulkRecord) {
                st.record.record(pos, &[id]);
            }
            st.len = kv_len;
            st.last_logits.clone_from(&next);
            next
        });
        // a failed decode leaves a half-updated state: nothing in it may be reused
        let decoded = decoded.inspect_err(|_| st.record.taint())?;
        if fault == Some(Fault::BulkRecord) {
            // the bug: the whole reply recorded after decode, claiming the never-fed last token
            st.record.record(len, &decoded.tokens);
        }
        st.last_generated = decoded.tokens.len();
        Ok(reply::after_decode(decoded, reused, len, prefill, t1.elapsed(), prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.dump_tensors()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = Glm::new(Arc::clone(&self.model), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(Glm::new(Arc::clone(&self.model), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(SlotState::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }
}
