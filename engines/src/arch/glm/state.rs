//! The layers of one glm slot: per layer, the MLA latent rows and rope rows (row t = position t, self-contained).

use super::model::Config;
use crate::cache::{FullCache, RowMeta};
use crate::dump::{CacheKind, DumpTensor, Writer};
use crate::engine_loop::{Layers, Slot};
use crate::fault::Fault;

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

/// The layers of one glm slot.
#[derive(Debug, Clone)]
pub struct State {
    pub kv: Vec<LatentKv>,
}

impl State {
    pub fn new(c: &Config) -> Self {
        let capacity = c.initial_capacity;
        let kv = (0..c.layers)
            .map(|_| LatentKv {
                latent: FullCache::new(capacity, c.kv_lora),
                rope: FullCache::new(capacity, c.qk_rope),
            })
            .collect();
        State { kv }
    }

    /// Copy positions `0..n` from `donor`, every row written by `writer` (a `Copied` writer).
    pub fn copy_from(&mut self, donor: &State, n: usize, writer: Writer) {
        for (dst, src) in self.kv.iter_mut().zip(&donor.kv) {
            for (d, s) in [(&mut dst.latent, &src.latent), (&mut dst.rope, &src.rope)] {
                for p in 0..n {
                    d.put(p, s.get(p), RowMeta { pos: p as i64, writer: Some(writer) });
                }
            }
        }
    }
}

impl Slot<State> {
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
        for kv in &mut self.layers.kv {
            for cache in kv.caches() {
                cache.rows.meta.iter_mut().skip(keep).for_each(|m| *m = RowMeta::EMPTY);
            }
        }
        self.len = keep;
    }
}

impl Layers for State {
    fn reset(&mut self) {
        for kv in &mut self.kv {
            for cache in kv.caches() {
                cache.rows.meta.iter_mut().for_each(|m| *m = RowMeta::EMPTY);
            }
        }
    }

    /// The valid rows are kept (position t stays at row t).
    fn grow(&mut self, capacity: usize, keep: usize, _: Option<Fault>) {
        for kv in &mut self.kv {
            for cache in kv.caches() {
                cache.grow(capacity, keep);
            }
        }
    }

    fn bytes(&self) -> usize {
        self.kv.iter().map(|kv| kv.latent.rows.bytes() + kv.rope.rows.bytes()).sum()
    }

    fn dump(&self) -> Vec<DumpTensor> {
        let mut out = Vec::with_capacity(self.kv.len() * 2);
        for (l, kv) in self.kv.iter().enumerate() {
            out.push(kv.latent.rows.dump(l, "latent", CacheKind::Latent));
            out.push(kv.rope.rows.dump(l, "rope", CacheKind::Latent));
        }
        out
    }
}
