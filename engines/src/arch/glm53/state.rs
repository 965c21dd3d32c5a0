//! The layers of one glm53 slot: every layer's k/v rows (full caches, row t = position t), the drafter's state,
//! and the canonical prefill frontier.

use super::drafter::Drafter;
use super::forward::LayerKv;
use super::model::Config;
use crate::dump::DumpTensor;
use crate::engine_loop::Layers;
use crate::fault::Fault;

#[derive(Debug, Clone)]
pub struct State {
    /// Per layer: k and v rows, `kv_heads * head_dim` wide, one per position up to the slot's capacity.
    pub kv: Vec<LayerKv>,
    pub drafter: Drafter,
    /// End of the rows prefill wrote in the last request (its prompt length when it completed): rows past it
    /// were written by decode, whose bits are not prefill bits, so reuse never reaches past it.
    pub canonical_end: usize,
    /// Drafter proposals verified, and those the decode loop then fed as they were (statistics).
    pub drafted: usize,
    pub accepted: usize,
}

impl State {
    pub fn new(c: &Config) -> Self {
        let capacity = c.initial_capacity;
        let kvd = c.kv_heads * c.head_dim;
        State {
            kv: (0..c.layers).map(|_| LayerKv::new(capacity, kvd)).collect(),
            drafter: Drafter::new(c, capacity),
            canonical_end: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Keep positions `0..keep`, resuming the drafter there when `resume_drafter`.
    pub fn truncate(&mut self, keep: usize, resume_drafter: bool) {
        self.kv.iter_mut().for_each(|kv| kv.forget_from(keep));
        if resume_drafter {
            self.drafter.resume(keep);
        }
        self.canonical_end = self.canonical_end.min(keep);
    }
}

impl Layers for State {
    fn reset(&mut self) {
        self.kv.iter_mut().for_each(|kv| kv.forget_from(0));
        self.drafter.resume(0);
        self.canonical_end = 0;
    }

    /// Every valid row is kept, the drafter's too.
    fn grow(&mut self, capacity: usize, keep: usize, _: Option<Fault>) {
        self.kv.iter_mut().for_each(|kv| kv.grow(capacity, keep));
        self.drafter.grow(capacity);
    }

    fn bytes(&self) -> usize {
        self.kv.iter().map(LayerKv::bytes).sum::<usize>() + self.drafter.bytes()
    }

    /// Main layers as "k"/"v" at their layer index; drafter layers as "draft_k"/"draft_v" after them.
    fn dump(&self) -> Vec<DumpTensor> {
        let mut out = Vec::new();
        for (l, kv) in self.kv.iter().enumerate() {
            out.push(kv.k.dump(l, "k"));
            out.push(kv.v.dump(l, "v"));
        }
        let base = self.kv.len();
        for (j, kv) in self.drafter.kv.iter().enumerate() {
            out.push(kv.k.dump(base + j, "draft_k"));
            out.push(kv.v.dump(base + j, "draft_v"));
        }
        out
    }
}
