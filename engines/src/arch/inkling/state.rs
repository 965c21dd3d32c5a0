//! The layers of one Inkling slot: per-layer k/v caches (rings on sliding layers, full on global ones) and the
//! short-convolution windows.

use super::model::Config;
use crate::cache::{FullCache, RingCache, RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};
use crate::engine_loop::Layers;
use crate::fault::Fault;

/// k and v of one layer.
#[derive(Debug, Clone)]
pub enum LayerKv {
    Ring { k: RingCache, v: RingCache },
    Full { k: FullCache, v: FullCache },
}

impl LayerKv {
    pub fn k(&self, pos: usize) -> &[f32] {
        match self {
            LayerKv::Ring { k, .. } => k.get(pos),
            LayerKv::Full { k, .. } => k.get(pos),
        }
    }

    pub fn v(&self, pos: usize) -> &[f32] {
        match self {
            LayerKv::Ring { v, .. } => v.get(pos),
            LayerKv::Full { v, .. } => v.get(pos),
        }
    }

    pub fn put(&mut self, pos: usize, kr: &[f32], vr: &[f32], meta: RowMeta) {
        match self {
            LayerKv::Ring { k, v } => {
                k.put(pos, kr, meta);
                v.put(pos, vr, meta);
            }
            LayerKv::Full { k, v } => {
                k.put(pos, kr, meta);
                v.put(pos, vr, meta);
            }
        }
    }
}

/// The raw (pre-convolution) k/v inputs of the last `conv_kernel - 1` positions, at row pos % (kernel - 1).
#[derive(Debug, Clone)]
pub struct ConvWindow {
    pub k: Rows,
    pub v: Rows,
}

impl ConvWindow {
    pub fn taps(&self) -> usize {
        self.k.len()
    }
}

/// The layers of one Inkling slot.
#[derive(Debug, Clone)]
pub struct State {
    /// Per layer: a ring of `window` rows on sliding layers, a full cache of `capacity` rows on global ones;
    /// `kv_heads * head_dim` wide.
    pub kv: Vec<LayerKv>,
    /// Per layer: the short convolution's window, `conv_kernel - 1` rows of `kv_heads * head_dim`.
    pub conv: Vec<ConvWindow>,
}

impl State {
    pub fn new(c: &Config) -> Self {
        let kvd = c.kv_heads * c.head_dim;
        let capacity = c.initial_capacity;
        let kv = (0..c.layers)
            .map(|l| {
                if c.is_global(l) || !c.ring_kv {
                    LayerKv::Full { k: FullCache::new(capacity, kvd), v: FullCache::new(capacity, kvd) }
                } else {
                    let w = c.window.min(c.max_ctx);
                    LayerKv::Ring { k: RingCache::new(w, kvd), v: RingCache::new(w, kvd) }
                }
            })
            .collect();
        let taps = c.conv_kernel.saturating_sub(1);
        let conv = (0..c.layers).map(|_| ConvWindow { k: Rows::new(taps, kvd), v: Rows::new(taps, kvd) }).collect();
        State { kv, conv }
    }
}

impl Layers for State {
    fn reset(&mut self) {
        for kv in &mut self.kv {
            match kv {
                LayerKv::Ring { k, v } => {
                    k.rows.forget();
                    v.rows.forget();
                }
                LayerKv::Full { k, v } => {
                    k.rows.forget();
                    v.rows.forget();
                }
            }
        }
        for c in &mut self.conv {
            c.k.forget();
            c.v.forget();
            c.k.data.iter_mut().for_each(|x| *x = 0.0);
            c.v.data.iter_mut().for_each(|x| *x = 0.0);
        }
    }

    /// Global layers are copied linearly, rings kept wholesale (`ring-linear-copy`: a wrapped ring is copied
    /// linearly, rotating it).
    fn grow(&mut self, capacity: usize, keep: usize, fault: Option<Fault>) {
        for kv in &mut self.kv {
            match kv {
                LayerKv::Full { k, v } => {
                    k.grow(capacity, keep);
                    v.grow(capacity, keep);
                }
                LayerKv::Ring { k, v } => {
                    if fault == Some(Fault::RingLinearCopy) {
                        k.linearize_faulty(keep);
                        v.linearize_faulty(keep);
                    }
                }
            }
        }
    }

    fn bytes(&self) -> usize {
        let kv: usize = self
            .kv
            .iter()
            .map(|kv| match kv {
                LayerKv::Ring { k, v } => k.rows.bytes() + v.rows.bytes(),
                LayerKv::Full { k, v } => k.rows.bytes() + v.rows.bytes(),
            })
            .sum();
        let conv: usize = self.conv.iter().map(|c| c.k.bytes() + c.v.bytes()).sum();
        kv + conv
    }

    fn dump(&self) -> Vec<DumpTensor> {
        let mut out = Vec::new();
        for (l, kv) in self.kv.iter().enumerate() {
            match kv {
                LayerKv::Ring { k, v } => {
                    out.push(k.dump(l, "k"));
                    out.push(v.dump(l, "v"));
                }
                LayerKv::Full { k, v } => {
                    out.push(k.dump(l, "k"));
                    out.push(v.dump(l, "v"));
                }
            }
            let c = &self.conv[l];
            if c.taps() > 0 {
                out.push(c.k.dump(l, "conv_k", CacheKind::Conv));
                out.push(c.v.dump(l, "conv_v", CacheKind::Conv));
            }
        }
        out
    }
}
