//! DeepSeek (modelled on the DeepSeek V4 engine): attention over a sliding-window ring of raw k/v rows plus the
//! compressed rows of a per-layer compressor (recurrent kv_state/score_state, one row per `ratio` positions), and a
//! MoE FFN.
//!
//! Reuse is strict-prefix continuation via the record: neither the ring nor the compressor can be rewound, so a
//! prompt that extends every id the state was built from prefills only its tail, and anything else starts over.
//! Prefill runs in atomic segments of `prefill_chunk` positions, each recorded when it completes; generated ids are
//! recorded inside the decode loop as each is fed (the last one never is); every failure path taints the record.

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
    name: "deepseek",
    modelled_on: "DeepSeek V4 engine",
    state: "sliding-window ring of raw k/v rows + compressor (recurrent kv_state/score_state, one compressed row \
            per ratio positions; ratio-4 layers overlap)",
    reuse_rule: "strict-prefix continuation via the record; prefill in atomic segments recorded as each completes; \
                 decode records each id as it is fed; every failure taints",
    faults: &[Fault::CounterReuse, Fault::BulkRecord, Fault::RecordOnFailure],
};

/// No audio, no global layers: every layer is window + compressor, ratio 4 (and 16 on odd layers).
fn preset(c: &mut ModelConfig, _: Preset) {
    c.audio_frame_bytes = 0;
    c.global_every = 0;
    c.conv_kernel = 0;
    c.compress_ratio = 4;
    c.kv_lora = 0;
    c.qk_rope = 0;
    c.mla_every = 0;
}

fn open(config: ModelConfig, weights: &crate::weights::Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    Ok(Box::new(DeepSeek::new(Arc::new(Model::load(config, weights)?), fault)))
}

/// A DeepSeek engine: shared weights plus its slots' states.
pub struct DeepSeek {
    model: Arc<Model>,
    fault: Option<Fault>,
    slots: Vec<SlotState>,
}

impl DeepSeek {
    pub fn new(model: Arc<Model>, fault: Option<Fault>) -> Self {
        let slots = (0..model.config.slots).map(|_| SlotState::new(&model, fault)).collect();
        DeepSeek { model, fault, slots }
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
        let st = &self.slots[slot];
        if self.has(Fault::CounterReuse) {
            // the bug: the reusable length derived from the previous request's counts, ids never compared
            if st.len == 0 || st.record.is_tainted() {
                return Decision::Fresh(NoReuse::Empty);
            }
            let n = (st.last_prompt + st.last_generated).saturating_sub(1).min(req.prompt.len() - 1);
            return if n > 0 { Decision::Reuse(n) } else { Decision::Fresh(NoReuse::Empty) };
        }
        st.record.decide(&req.prompt)
    }

    /// The checks every engine makes, then deepseek's own: it takes no audio frames.
    fn validate(&self, req: &Request) -> Result<()> {
        check_request(req, self.slots.len(), self.model.config.vocab)?;
        if !req.audio.is_empty() {
            return Err(EngineError::BadRequest(format!("deepseek takes no audio frames ({} given)", req.audio.len())));
        }
        Ok(())
    }
}

impl Engine for DeepSeek {
    fn info(&self) -> EngineInfo {
        let c = &self.model.config;
        EngineInfo { window: Some(c.window), ..engine_info(c, self.fault, &self.model.hash) }
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
        let t0 = Instant::now();
        self.ensure_capacity(req.slot, req.prompt.len().saturating_add(req.max_tokens).min(c.max_ctx));
        let decision = self.decide(req.slot, req);
        let reused = decision.reused();
        let st = &mut self.slots[req.slot];
        let prefix_log = st.record.log_line(req.prompt.len(), decision);
        if reused == 0 {
            st.reset();
        } else {
            st.len = reused;
        }
        st.last_prompt = req.prompt.len();
        st.last_generated = 0;

        // prefill the tail in atomic segments, recording each as it completes
        let mut logits = st.last_logits.clone();
        let mut pos = reused;
        let mut chunk = 0u32;
        let mut stop = false;
        while pos < req.prompt.len() && !stop {
            let end = (pos + c.prefill_chunk).min(req.prompt.len());
            let ids = &req.prompt[pos..end];
            let writer = Writer { request: req.id, kind: WriterKind::Prefill { chunk, chunk_rows: ids.len() as u32 } };
            let batch = Batch { ids, pos0: pos, writer };
            let mut abort = || match observer.on_progress() {
                Flow::Continue => false,
                // a stop lets the segment finish: it is atomic
                Flow::Stop => {
                    stop = true;
                    false
                }
                Flow::Cancel => true,
            };
            match model.forward(st, &batch, &mut abort) {
                Ok(l) => logits = l,
                Err(_) => {
                    if fault == Some(Fault::RecordOnFailure) {
                        // the bug: the abandoned segment is recorded as if it had finished, and nothing is tainted
                        st.record.record(pos, ids);
                        st.len = end;
                    } else {
                        st.record.taint();
                    }
                    return Err(EngineError::Cancelled);
                }
            }
            st.len = end;
            st.record.record(pos, ids);
            pos = end;
            chunk += 1;
            match observer.on_progress() {
                Flow::Continue => {}
                Flow::Stop => stop = true,
                Flow::Cancel => {
                    if fault != Some(Fault::RecordOnFailure) {
                        st.record.taint();
                    }
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
            let batch = Batch { ids: std::slice::from_ref(&id), pos0: pos, writer };
            // a decode step is never abandoned between layers (cancel is seen between tokens)
            let next = model.forward(st, &batch, &mut || false).unwrap_or_else(|_| vec![0.0; c.vocab]);
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
        Ok(reply::after_decode(decoded, reused, req.prompt.len(), prefill, t1.elapsed(), prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.dump_tensors()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = DeepSeek::new(Arc::clone(&self.model), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(DeepSeek::new(Arc::clone(&self.model), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(SlotState::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }
}
