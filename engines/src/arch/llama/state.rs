//! The layers of one llama slot: a full k/v cache per layer, position t at row t, every row carrying the
//! position and the writer that filled it.

use super::model::Config;
use crate::cache::FullCache;
use crate::dump::DumpTensor;
use crate::engine_loop::Layers;
use crate::fault::Fault;

/// k and v of one layer: `capacity` rows of `kv_heads · head_dim` (k after RoPE).
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: FullCache,
    pub v: FullCache,
}

#[derive(Debug, Clone)]
pub struct State {
    pub kv: Vec<LayerKv>,
}

impl State {
    pub fn new(c: &Config) -> Self {
        let kvd = c.kv_heads * c.head_dim;
        let cap = c.initial_capacity;
        State {
            kv: (0..c.layers).map(|_| LayerKv { k: FullCache::new(cap, kvd), v: FullCache::new(cap, kvd) }).collect(),
        }
    }
}

impl Layers for State {
    fn reset(&mut self) {
        for l in &mut self.kv {
            l.k.rows.forget();
            l.v.rows.forget();
        }
    }

    /// Every layer copied linearly: position t stays at row t.
    fn grow(&mut self, capacity: usize, keep: usize, _fault: Option<Fault>) {
        for l in &mut self.kv {
            l.k.grow(capacity, keep);
            l.v.grow(capacity, keep);
        }
    }

    fn bytes(&self) -> usize {
        self.kv.iter().map(|l| l.k.rows.bytes() + l.v.rows.bytes()).sum()
    }

    fn dump(&self) -> Vec<DumpTensor> {
        self.kv.iter().enumerate().flat_map(|(i, l)| [l.k.dump(i, "k"), l.v.dump(i, "v")]).collect()
    }
}
