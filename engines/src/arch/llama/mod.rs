//! Llama (modelled on llama.cpp serving a GGUF file, e.g. SmolLM2-135M-Instruct in Q4_1): GQA attention with
//! RoPE over a full k/v cache, SwiGLU FFN, weights kept in their GGUF blocks.
//!
//! Reuse is strict-prefix via the record: a prompt that extends every id the state was built from prefills only
//! its tail; anything else starts over. Growing capacity copies every layer linearly and keeps the record. A
//! prompt longer than `max_ctx` is refused up front.

mod forward;
mod model;
mod state;

use std::path::Path;
use std::sync::Arc;

pub use forward::{Batch, PairRope};
pub use model::{Config, Layer, Model};
pub use state::State;

use crate::decode::Generable;
use crate::engine::Engine;
use crate::engine_loop::{Arch, ArchInfo, BundledEngine, Progress, Segment, Slot, Step};
use crate::error::Result;
use crate::fault::Fault;
use crate::gguf::Gguf;

pub const INFO: ArchInfo = ArchInfo {
    name: "llama",
    modelled_on: "llama.cpp (GGUF)",
    state: "full GQA k/v cache per layer (rows carry position and writer)",
    reuse_rule: "strict prefix via the record; capacity growth copies every layer and keeps the record",
    faults: &[],
};

impl Arch for Model {
    crate::model_parts!(State, (), INFO);

    fn new_layers(&self) -> State {
        State::new(&self.config)
    }

    /// Every id of the model's own vocabulary; its eos ends a reply.
    fn generable(&self) -> Generable {
        Generable { eos: self.eos, bytes_only: false }
    }

    fn prefill(&self, slot: &mut Slot<State>, seg: &Segment, _: &mut Progress, _: Option<Fault>) -> Option<Vec<f32>> {
        Some(self.forward(&mut slot.layers, &Batch { ids: seg.ids, pos0: seg.pos0, writer: seg.writer }))
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, _: Option<Fault>) -> Vec<f32> {
        self.forward(&mut slot.layers, &Batch { ids: s.ids(), pos0: s.pos, writer: s.writer })
    }
}

/// The model a GGUF file holds.
pub fn load(path: &Path) -> Result<Model> {
    Model::from_gguf(Arc::new(Gguf::open(path)?))
}

/// An engine serving the GGUF model at `path`, with `fault` on.
pub fn open_gguf(path: &Path, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    Ok(Box::new(BundledEngine::new(Arc::new(load(path)?), fault)))
}
