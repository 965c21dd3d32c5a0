//! The state of one glm slot: per layer, the MLA latent rows and rope rows (row t = position t, self-contained),
//! the prefix record, and the logits after the last fed position.

use crate::cache::{FullCache, RowMeta};
use crate::config::ModelConfig;
use crate::dump::{CacheKind, DumpTensor, Writer};
use crate::fault::Fault;
use crate::prefix::PrefixRecord;

/// One layer's cached MLA rows: the normalised latent (`kv_lora`) and the rotated shared key (`qk_rope`).
#[derive(Debug, Clone)]
pub struct LatentKv {
    pub latent: FullCache,
    pub rope: FullCache,
}

impl LatentKv {
    fn caches(&mut self) -> [&mut FullCache; 2] {
        [&mut self.latent, &mut self.rope]
    }
}

#[derive(Debug, Clone)]
pub struct SlotState {
    pub kv: Vec<LatentKv>,
    pub record: PrefixRecord,
    /// The kv length: positions 0..len are valid.
    pub len: usize,
    pub capacity: usize,
    /// Logits after the last fed position (what a reuse of the whole prompt would sample from).
    pub last_logits: Vec<f32>,
    /// Prompt and generated counts of the last request (what `counter-reuse` derives reuse from).
    pub last_prompt: usize,
    pub last_generated: usize,
}

impl SlotState {
    pub fn new(c: &ModelConfig) -> Self {
        let capacity = c.initial_capacity;
        let kv = (0..c.layers)
            .map(|_| LatentKv {
                latent: FullCache::new(capacity, c.kv_lora),
                rope: FullCache::new(capacity, c.qk_rope),
            })
            .collect();
        SlotState {
            kv,
            record: PrefixRecord::with_capacity(capacity),
            len: 0,
            capacity,
            last_logits: vec![0.0; c.vocab],
            last_prompt: 0,
            last_generated: 0,
        }
    }

    /// A slot holding nothing: what cross-slot sharing may fill.
    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.record.is_empty() && !self.record.is_tainted()
    }

    /// Keep positions `0..keep` and invalidate the rest (`keep` = 0 starts over). With `stale-slot`, the kv
    /// length is never lowered and nothing is invalidated: the rows of the slot's previous conversation stay
    /// visible to decode.
    pub fn truncate(&mut self, keep: usize, fault: Option<Fault>) {
        if keep == 0 {
            self.record.clear();
        } else {
            self.record.record(keep, &[]);
        }
        if fault == Some(Fault::StaleSlot) {
            self.len = self.len.max(keep);
            return;
        }
        for kv in &mut self.kv {
            for cache in kv.caches() {
                cache.rows.meta.iter_mut().skip(keep).for_each(|m| *m = RowMeta::EMPTY);
            }
        }
        self.len = keep;
    }

    /// Copy positions `0..n` from `donor`, every row written by `writer` (a `Copied` writer).
    pub fn copy_from(&mut self, donor: &SlotState, n: usize, writer: Writer) {
        for (dst, src) in self.kv.iter_mut().zip(&donor.kv) {
            for (d, s) in [(&mut dst.latent, &src.latent), (&mut dst.rope, &src.rope)] {
                for p in 0..n {
                    d.put(p, s.get(p), RowMeta { pos: p as i64, writer: Some(writer) });
                }
            }
        }
        self.len = n;
    }

    /// Grow capacity to `capacity`, keeping the valid rows and the record.
    pub fn grow(&mut self, capacity: usize, fault: Option<Fault>) {
        let keep = self.len;
        for kv in &mut self.kv {
            for cache in kv.caches() {
                cache.grow(capacity, keep);
            }
        }
        self.capacity = capacity;
        if fault == Some(Fault::DropGrowRecord) {
            self.record.alloc(capacity);
        } else if !self.record.grow(capacity, keep) {
            self.len = 0;
        }
    }

    pub fn bytes(&self) -> usize {
        let rows: usize = self.kv.iter().map(|kv| kv.latent.rows.bytes() + kv.rope.rows.bytes()).sum();
        rows + self.record.capacity() * 4 + self.last_logits.len() * 4
    }

    pub fn dump_tensors(&self) -> Vec<DumpTensor> {
        let mut out = Vec::with_capacity(self.kv.len() * 2);
        for (l, kv) in self.kv.iter().enumerate() {
            out.push(kv.latent.rows.dump(l, "latent", CacheKind::Latent));
            out.push(kv.rope.rows.dump(l, "rope", CacheKind::Latent));
        }
        out
    }
}
