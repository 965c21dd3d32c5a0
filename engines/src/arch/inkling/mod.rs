//! Inkling (modelled on inkling.c): sliding-window GQA layers as rings, global layers full (about 5:1), short-conv
//! states, MoE FFN, and audio frames that taint the prefix record.
//!
//! Reuse is strict-prefix via the record: a prompt that extends every id the state was built from prefills only
//! its tail; anything else starts over. Growing capacity keeps ring layers wholesale, copies global layers
//! linearly, and keeps the record.

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
use crate::dump::{StateDump, Writer, WriterKind};
use crate::engine::{Engine, EngineInfo, Flow, Observer, Reply, Request};
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};
use crate::tokenizer::AUDIO;
use forward::Batch;

pub const ENTRY: Entry = Entry { info: INFO, tensor_specs, preset, open };

/// Inkling is the base preset as it is: audio on, window and global layers from the base.
fn preset(_: &mut crate::config::ModelConfig, _: crate::config::Preset) {}

fn open(
    config: crate::config::ModelConfig,
    weights: &crate::weights::Weights,
    fault: Option<Fault>,
) -> Result<Box<dyn Engine>> {
    Ok(Box::new(Inkling::new(Arc::new(Model::load(config, weights)?), fault)))
}

pub const INFO: ArchInfo = ArchInfo {
    name: "inkling",
    modelled_on: "inkling.c",
    state: "sliding-window GQA rings + full global layers (~5:1), short-conv windows",
    reuse_rule: "strict prefix via the record; audio taints; capacity growth keeps rings and the record",
    faults: &[
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::OverrunTruncate,
        Fault::NoTaint,
        Fault::RingLinearCopy,
        Fault::DropGrowRecord,
        Fault::RingAppendFirst,
    ],
};

/// An Inkling engine: shared weights plus its slots' states.
pub struct Inkling {
    model: Arc<Model>,
    fault: Option<Fault>,
    slots: Vec<SlotState>,
}

impl Inkling {
    pub fn new(model: Arc<Model>, fault: Option<Fault>) -> Self {
        let slots = (0..model.config.slots).map(|_| SlotState::new(&model.config, fault)).collect();
        Inkling { model, fault, slots }
    }

    fn has(&self, f: Fault) -> bool {
        self.fault == Some(f)
    }

    /// Check the request's audio frames against its audio ids; returns the audio payload for each prompt position.
    fn audio_rows<'a>(&self, req: &'a Request) -> Result<Vec<Option<&'a [u8]>>> {
        let c = &self.model.config;
        let audio_ids = req.prompt.iter().filter(|&&id| id == AUDIO).count();
        if audio_ids != req.audio.len() {
            return Err(EngineError::BadRequest(format!(
                "prompt has {audio_ids} audio ids but {} audio frames",
                req.audio.len()
            )));
        }
        if let Some((i, f)) = req.audio.iter().enumerate().find(|(_, f)| f.len() != c.audio_frame_bytes) {
            return Err(EngineError::BadRequest(format!(
                "audio frame {i} has {} bytes, expected {}",
                f.len(),
                c.audio_frame_bytes
            )));
        }
        let mut frames = req.audio.iter();
        Ok(req.prompt.iter().map(|&id| if id == AUDIO { frames.next().map(|f| f.as_slice()) } else { None }).collect())
    }

    /// Grow the slot so `needed` positions fit (the shared growth policy).
    fn ensure_capacity(&mut self, slot: usize, needed: usize) {
        let st = &mut self.slots[slot];
        grow_to_fit(st.capacity, needed, self.model.config.max_ctx, |capacity| st.grow(capacity, self.fault));
    }

    /// How many prompt positions the state stands in for.
    fn decide(&self, slot: usize, req: &Request) -> Decision {
        let st = &self.slots[slot];
        let carries_audio = !req.audio.is_empty();
        if self.has(Fault::CounterReuse) {
            // the bug: the reusable length derived from the previous request's counts, ids never compared
            if st.len == 0 || st.record.is_tainted() {
                return Decision::Fresh(NoReuse::Empty);
            }
            let n = (st.last_prompt + st.last_generated).saturating_sub(1).min(req.prompt.len() - 1);
            return if n > 0 { Decision::Reuse(n) } else { Decision::Fresh(NoReuse::Empty) };
        }
        if carries_audio && !self.has(Fault::NoTaint) {
            // a request that brings its own audio is never reused: its ids cannot describe its payload
            return Decision::Fresh(NoReuse::Tainted);
        }
        st.record.decide(&req.prompt)
    }
}

impl Engine for Inkling {
    fn info(&self) -> EngineInfo {
        let c = &self.model.config;
        EngineInfo {
            audio: c.audio_frame_bytes > 0,
            audio_frame_bytes: c.audio_frame_bytes,
            window: (c.window > 0).then_some(c.window),
            ..engine_info(c, self.fault, &self.model.hash)
        }
    }

    fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply> {
        check_request(req, self.slots.len(), self.model.config.vocab)?;
        let audio = self.audio_rows(req)?;
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let t0 = Instant::now();

        let needed = (req.prompt.len() + req.max_tokens).min(c.max_ctx);
        self.ensure_capacity(req.slot, needed.max(req.prompt.len().min(c.max_ctx)));
        let decision = self.decide(req.slot, req);
        let prefix_log = self.slots[req.slot].record.log_line(req.prompt.len(), decision);
        let fault = self.fault;
        let st = &mut self.slots[req.slot];
        let mut reused = decision.reused();
        if reused == 0 {
            st.reset();
        } else {
            st.len = reused;
        }
        st.last_prompt = req.prompt.len();
        st.last_generated = 0;

        // prefill the tail in segments, recording each as it completes
        let mut logits = st.last_logits.clone();
        let mut pos = reused;
        let mut chunk = 0u32;
        while pos < req.prompt.len() {
            let end = (pos + c.prefill_chunk).min(req.prompt.len());
            let ids = &req.prompt[pos..end];
            if end > st.capacity {
                // the state cannot hold this segment: the record refuses the write (and drops itself)
                st.record.record(pos, ids);
                return Err(EngineError::ContextExceeded { used: req.prompt.len(), limit: c.max_ctx });
            }
            let writer = Writer { request: req.id, kind: WriterKind::Prefill { chunk, chunk_rows: ids.len() as u32 } };
            let batch = Batch { ids, audio: audio[pos..end].to_vec(), pos0: pos, writer };
            logits = model.forward(st, &batch, fault);
            st.len = end;
            st.record.record(pos, ids);
            pos = end;
            chunk += 1;
            if observer.on_progress() == Flow::Cancel {
                st.record.taint();
                return Err(EngineError::Cancelled);
            }
        }
        if !audio.iter().all(Option::is_none) && fault != Some(Fault::NoTaint) {
            st.record.taint();
        }
        let prefill = t0.elapsed();
        let t1 = Instant::now();

        let capacity = st.capacity;
        let decoded = crate::decode::decode(logits, req, st.len, capacity, observer, |id, pos, step| {
            let writer = Writer { request: req.id, kind: WriterKind::Decode { step: step as u32 } };
            let batch = Batch { ids: std::slice::from_ref(&id), audio: vec![None], pos0: pos, writer };
            let next = model.forward(st, &batch, fault);
            if fault != Some(Fault::BulkRecord) {
                st.record.record(pos, &[id]);
            }
            st.len = pos + 1;
            next
        });
        // a failed decode leaves a half-updated state: nothing in it may be reused
        let mut decoded = decoded.inspect_err(|_| st.record.taint())?;
        if fault == Some(Fault::BulkRecord) {
            // the bug: the whole reply recorded after decode, claiming the never-fed last token
            st.record.record(req.prompt.len(), &decoded.tokens);
        }
        st.last_logits = std::mem::take(&mut decoded.last_logits);
        st.last_generated = decoded.tokens.len();
        if reused > st.len {
            reused = st.len;
        }
        Ok(reply::after_decode(decoded, reused, req.prompt.len(), prefill, t1.elapsed(), prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.dump_tensors()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = Inkling::new(Arc::clone(&self.model), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(Inkling::new(Arc::clone(&self.model), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(SlotState::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }
}
