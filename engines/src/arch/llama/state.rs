//! The layers of one llama slot: a full k/v cache per layer, stored kv head by kv head (`HeadMajorCache`: a long
//! decode step reads each head's rows as one run), position t at row t, every row carrying the position and the
//! writer that filled it.

use super::model::Config;
use crate::cache::HeadMajorCache;
use crate::dump::DumpTensor;
use crate::engine_loop::Layers;
use crate::fault::Fault;

/// k and v of one layer: `capacity` rows of `head_dim` per kv head (k after RoPE).
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: HeadMajorCache,
    pub v: HeadMajorCache,
}

#[derive(Debug, Clone)]
pub struct State {
    pub kv: Vec<LayerKv>,
}

impl State {
    pub fn new(c: &Config) -> Self {
        let (cap, heads, hd) = (c.initial_capacity, c.kv_heads, c.head_dim);
        let cache = || HeadMajorCache::new(cap, heads, hd);
        State { kv: (0..c.layers).map(|_| LayerKv { k: cache(), v: cache() }).collect() }
    }
}

impl Layers for State {
    fn reset(&mut self) {
        for l in &mut self.kv {
            l.k.forget();
            l.v.forget();
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
        self.kv.iter().map(|l| l.k.bytes() + l.v.bytes()).sum()
    }

    fn dump(&self) -> Vec<DumpTensor> {
        self.kv.iter().enumerate().flat_map(|(i, l)| [l.k.dump(i, "k"), l.v.dump(i, "v")]).collect()
    }
}
