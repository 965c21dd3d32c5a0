//! Inkling (modelled on inkling.c): sliding-window GQA layers as rings, global layers full (about 5:1), short-conv
//! states, MoE FFN, and audio frames that taint the prefix record.
//!
//! Reuse is strict-prefix via the record: a prompt that extends every id the state was built from prefills only
//! its tail; anything else starts over. Growing capacity keeps ring layers wholesale, copies global layers
//! linearly, and keeps the record. A prompt longer than `max_ctx` is not refused up front: prefill runs until a
//! segment no longer fits, and the record refuses that write (`overrun-truncate` truncates it instead).

mod forward;
mod model;
mod state;

pub use model::{Config, Model};
use state::State;

use crate::engine::{EngineInfo, Request};
use crate::engine_loop::{on_worker, Arch, ArchInfo, AudioRows, DeclaredReuse, Progress, Segment, Slot, Start, Step};
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};
use crate::tokenizer::AUDIO;

pub const INFO: ArchInfo = ArchInfo {
    name: "inkling",
    modelled_on: "inkling.c",
    state: "sliding-window GQA rings + full global layers (~5:1), short-conv windows",
    reuse_rule: "strict prefix via the record; audio taints; capacity growth keeps rings and the record",
    declares: DeclaredReuse::Strict,
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

impl Arch for Model {
    crate::model_parts!(State, (), INFO);
    const REFUSES_OVERFLOW: bool = false;

    fn new_layers(&self) -> State {
        State::new(&self.config)
    }

    fn info(&self, base: EngineInfo) -> EngineInfo {
        let c = &self.config;
        EngineInfo {
            audio: c.audio_frame_bytes > 0,
            audio_frame_bytes: c.audio_frame_bytes,
            window: (c.window > 0).then_some(c.window),
            ..base
        }
    }

    /// One frame per audio id, each `audio_frame_bytes` long.
    fn audio_rows<'r>(&self, req: &'r Request) -> Result<AudioRows<'r>> {
        let audio_ids = req.prompt.iter().filter(|&&id| id == AUDIO).count();
        if audio_ids != req.audio.len() {
            return Err(EngineError::BadRequest(format!(
                "prompt has {audio_ids} audio ids but {} audio frames",
                req.audio.len()
            )));
        }
        let fb = self.config.audio_frame_bytes;
        if let Some((i, f)) = req.audio.iter().enumerate().find(|(_, f)| f.len() != fb) {
            return Err(EngineError::BadRequest(format!("audio frame {i} has {} bytes, expected {fb}", f.len())));
        }
        let mut frames = req.audio.iter();
        Ok(req.prompt.iter().map(|&id| if id == AUDIO { frames.next().map(|f| f.as_slice()) } else { None }).collect())
    }

    fn decide(&self, slots: &[Slot<State>], req: &Request, fault: Option<Fault>) -> Start {
        let slot = &slots[req.slot];
        if fault == Some(Fault::CounterReuse) {
            return Start::Own(slot.counter_reuse(req.prompt.len()));
        }
        if !req.audio.is_empty() && fault != Some(Fault::NoTaint) {
            // a request that brings its own audio is never reused: its ids cannot describe its payload
            return Start::Own(Decision::Fresh(NoReuse::Tainted));
        }
        Start::Own(slot.record.decide(&req.prompt))
    }

    fn prefill(
        &self,
        slot: &mut Slot<State>,
        seg: &Segment,
        _: &mut Progress,
        fault: Option<Fault>,
    ) -> Option<Vec<f32>> {
        Some(on_worker(|| self.forward(&mut slot.layers, seg, fault)))
    }

    /// Audio fed into the state taints the record (`no-taint`: it does not).
    fn after_prefill(&self, slot: &mut Slot<State>, audio: &AudioRows, fault: Option<Fault>) {
        if audio.iter().any(Option::is_some) && fault != Some(Fault::NoTaint) {
            slot.record.taint();
        }
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, fault: Option<Fault>) -> Vec<f32> {
        self.forward(&mut slot.layers, &s.segment(), fault)
    }
}
