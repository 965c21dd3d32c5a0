//! The speculative drafter (GLM's MTP layer): a small model over the main model's embeddings with its own k/v
//! rows and its own cursor — the position the next id it is fed lands at.
//!
//! It is batch-invariant, so its row at position t depends only on the ids at 0..=t. When a request reuses R
//! positions of the slot, the drafter must be *resumed* at R (seed 004's `Drafter.resume(position)`), or it
//! appends the new prompt tail after its stale end: its rows then sit at the wrong positions and its proposals
//! come from another context. Its proposals are verified exactly, so that bug does not change the tokens — it
//! shows in the drafter's rows, which the dump carries.

use super::forward::{Batch, LayerKv};
use super::model::Config;
use super::model::Model;
use crate::dump::Writer;
use crate::engine::Sampling;
use crate::tokenizer::EOS;

/// Ids the drafter proposes per verification batch.
pub const DRAFT_TOKENS: usize = 3;

#[derive(Debug, Clone)]
pub struct Drafter {
    pub kv: Vec<LayerKv>,
    /// Where the next fed id lands; rows below it are valid.
    pub cursor: usize,
    pub capacity: usize,
    /// Tests only: propose `forced[position]` instead of the model's pick (a drafter that is right, or wrong, on
    /// purpose), to exercise every acceptance path with random weights, whose drafter is almost never right.
    #[cfg(test)]
    pub forced: Option<Vec<u32>>,
}

impl Drafter {
    pub fn new(c: &Config, capacity: usize) -> Self {
        let kvd = c.kv_heads * c.head_dim;
        Drafter {
            kv: (0..c.draft_layers).map(|_| LayerKv::new(capacity, kvd)).collect(),
            cursor: 0,
            capacity,
            #[cfg(test)]
            forced: None,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.kv.is_empty()
    }

    /// Move the cursor to `pos`, forgetting every row at or past it.
    pub fn resume(&mut self, pos: usize) {
        self.cursor = pos;
        self.kv.iter_mut().for_each(|kv| kv.forget_from(pos));
    }

    pub fn grow(&mut self, capacity: usize) {
        let keep = self.cursor.min(capacity);
        self.kv.iter_mut().for_each(|kv| kv.grow(capacity, keep));
        self.capacity = capacity;
    }

    /// Feed `ids` at the cursor; returns the logits after the last one (empty without a drafter).
    pub fn feed(&mut self, model: &Model, ids: &[u32], writers: Vec<Writer>) -> Vec<f32> {
        if !self.enabled() || ids.is_empty() {
            return Vec::new();
        }
        if self.cursor + ids.len() > self.capacity {
            // only a drafter that was not resumed runs past the slot: start it over rather than overrun
            self.resume(0);
        }
        let b = Batch { ids, pos0: self.cursor, writers };
        let logits = model.draft_forward(&mut self.kv, &b);
        self.cursor += ids.len();
        logits
    }

    /// Feed `first` (written by `writer_of(0)`), then propose up to `n` ids greedily, feeding each proposal too
    /// (proposal j written by `writer_of(j + 1)`), so that after full acceptance the drafter is already in step.
    /// An eos proposal (or, with `no_eos`, none) ends the draft: eos is never fed.
    pub fn propose(
        &mut self,
        model: &Model,
        first: u32,
        n: usize,
        no_eos: bool,
        writer_of: impl Fn(usize) -> Writer,
    ) -> Vec<u32> {
        let mut logits = self.feed(model, &[first], vec![writer_of(0)]);
        let mut out = Vec::with_capacity(n);
        while out.len() < n && !logits.is_empty() {
            let mut allowed = crate::decode::mask_input_only(&logits);
            if no_eos {
                allowed[EOS as usize] = f32::NEG_INFINITY;
            }
            let d = crate::sampler::sample(&allowed, &Sampling::default(), 0, 0).id;
            #[cfg(test)]
            let d = self.forced.as_ref().and_then(|f| f.get(self.cursor).copied()).unwrap_or(d);
            if d == EOS {
                break;
            }
            out.push(d);
            logits = self.feed(model, &[d], vec![writer_of(out.len())]);
        }
        out
    }

    pub fn bytes(&self) -> usize {
        self.kv.iter().map(LayerKv::bytes).sum()
    }
}
