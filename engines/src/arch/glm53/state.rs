//! The state of one glm53 slot: every layer's k/v rows (full caches, row t = position t), the drafter's state,
//! the prefix record, and the canonical prefill frontier.

use super::drafter::Drafter;
use super::forward::LayerKv;
use crate::config::ModelConfig;
use crate::dump::DumpTensor;
use crate::prefix::PrefixRecord;

#[derive(Debug, Clone)]
pub struct SlotState {
    pub kv: Vec<LayerKv>,
    pub drafter: Drafter,
    /// Every id fed, where it was fed (prompt chunks and decoded ids).
    pub record: PrefixRecord,
    /// Positions the state covers.
    pub len: usize,
    /// End of the rows prefill wrote in the last request (its prompt length when it completed): rows past it
    /// were written by decode, whose bits are not prefill bits, so reuse never reaches past it.
    pub canonical_end: usize,
    pub capacity: usize,
    /// Drafter proposals verified, and those the decode loop then fed as they were (statistics).
    pub drafted: usize,
    pub accepted: usize,
}

impl SlotState {
    pub fn new(c: &ModelConfig) -> Self {
        let capacity = c.initial_capacity;
        let kvd = c.kv_heads * c.head_dim;
        SlotState {
            kv: (0..c.layers).map(|_| LayerKv::new(capacity, kvd)).collect(),
            drafter: Drafter::new(c, capacity),
            record: PrefixRecord::with_capacity(capacity),
            len: 0,
            canonical_end: 0,
            capacity,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Forget every row: the state is rebuilt from position 0.
    pub fn reset(&mut self) {
        self.kv.iter_mut().for_each(|kv| kv.forget_from(0));
        self.drafter.resume(0);
        self.record.clear();
        self.len = 0;
        self.canonical_end = 0;
    }

    /// Keep positions `0..keep` (keep <= the record's length), resuming the drafter there when `resume_drafter`.
    pub fn truncate(&mut self, keep: usize, resume_drafter: bool) {
        self.kv.iter_mut().for_each(|kv| kv.forget_from(keep));
        self.record.record(keep, &[]);
        if resume_drafter {
            self.drafter.resume(keep);
        }
        self.len = keep;
        self.canonical_end = self.canonical_end.min(keep);
    }

    /// Grow capacity to `capacity`, keeping every valid row and the record.
    pub fn grow(&mut self, capacity: usize) {
        let keep = self.len;
        self.kv.iter_mut().for_each(|kv| kv.grow(capacity, keep));
        self.drafter.grow(capacity);
        self.capacity = capacity;
        if !self.record.grow(capacity, keep) {
            self.len = 0;
        }
    }

    pub fn bytes(&self) -> usize {
        self.kv.iter().map(LayerKv::bytes).sum::<usize>() + self.drafter.bytes() + self.record.capacity() * 4
    }

    /// Main layers as "k"/"v" at their layer index; drafter layers as "draft_k"/"draft_v" after them.
    pub fn dump_tensors(&self) -> Vec<DumpTensor> {
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
