//! DeepSeek (modelled on the DeepSeek V4 engine): attention over a sliding-window ring of raw k/v rows plus the
//! compressed rows of a per-layer compressor (recurrent kv_state/score_state, one row per `ratio` positions), and a
//! MoE FFN.
//!
//! Reuse is strict-prefix continuation via the record: neither the ring nor the compressor can be rewound, so a
//! prompt that extends every id the state was built from prefills only its tail, and anything else starts over.
//! Prefill runs in atomic segments of `prefill_chunk` positions, each recorded when it completes; a segment polls
//! the observer between layers and is abandoned there on a cancel. Generated ids are recorded inside the decode
//! loop as each is fed (the last one never is); every failure path taints the record.

mod forward;
mod model;
mod state;

pub use model::{Config, Model};
use state::State;

use crate::engine::EngineInfo;
use crate::engine_loop::{Arch, ArchInfo, DeclaredReuse, Progress, Segment, Slot, Step};
use crate::fault::Fault;

pub const INFO: ArchInfo = ArchInfo {
    name: "deepseek",
    modelled_on: "DeepSeek V4 engine",
    state: "sliding-window ring of raw k/v rows + compressor (recurrent kv_state/score_state, one compressed row \
            per ratio positions; ratio-4 layers overlap)",
    reuse_rule: "strict-prefix continuation via the record; prefill in atomic segments recorded as each completes; \
                 decode records each id as it is fed; every failure taints",
    declares: DeclaredReuse::Strict,
    faults: &[Fault::CounterReuse, Fault::BulkRecord, Fault::RecordOnFailure],
};

impl Arch for Model {
    crate::model_parts!(State, (), INFO);

    fn new_layers(&self) -> State {
        State::new(self)
    }

    fn info(&self, base: EngineInfo) -> EngineInfo {
        EngineInfo { window: Some(self.config.window), ..base }
    }

    /// The segment asks the observer between layers; a cancel there abandons it half-way through the layers.
    fn prefill(
        &self,
        slot: &mut Slot<State>,
        seg: &Segment,
        progress: &mut Progress,
        _: Option<Fault>,
    ) -> Option<Vec<f32>> {
        self.forward(&mut slot.layers, seg, &mut || !progress.go_on()).ok()
    }

    /// `record-on-failure`: the abandoned segment is recorded as if it had finished, and nothing is tainted.
    fn abandoned(&self, slot: &mut Slot<State>, seg: &Segment, fault: Option<Fault>) {
        if fault == Some(Fault::RecordOnFailure) {
            slot.record.record(seg.pos0, seg.ids);
            slot.len = seg.end();
        } else {
            slot.record.taint();
        }
    }

    /// `record-on-failure`: a cancel between segments leaves the record untainted.
    fn cancelled(&self, slot: &mut Slot<State>, fault: Option<Fault>) {
        if fault != Some(Fault::RecordOnFailure) {
            slot.record.taint();
        }
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, _: Option<Fault>) -> Vec<f32> {
        // a decode step is never abandoned between layers (cancel is seen between tokens)
        self.forward(&mut slot.layers, &s.segment(), &mut || false).unwrap_or_else(|_| vec![0.0; self.config.vocab])
    }
}
