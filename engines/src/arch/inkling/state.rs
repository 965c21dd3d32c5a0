//! The state of one Inkling slot: per-layer k/v caches (rings on sliding layers, full on global ones), the
//! short-convolution windows, the prefix record, and the logits after the last fed position.

use crate::cache::{FullCache, RingCache, RowMeta, Rows};
use crate::config::ModelConfig;
use crate::dump::{CacheKind, DumpTensor};
use crate::fault::Fault;
use crate::prefix::PrefixRecord;

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

#[derive(Debug, Clone)]
pub struct SlotState {
    pub kv: Vec<LayerKv>,
    pub conv: Vec<ConvWindow>,
    pub record: PrefixRecord,
    /// Positions the state covers.
    pub len: usize,
    pub capacity: usize,
    /// Logits after the last fed position (what a stale sample would read).
    pub last_logits: Vec<f32>,
    /// Prompt and generated counts of the last request (what `counter-reuse` derives reuse from).
    pub last_prompt: usize,
    pub last_generated: usize,
}

impl SlotState {
    pub fn new(c: &ModelConfig, fault: Option<Fault>) -> Self {
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
        SlotState {
            kv,
            conv,
            record: PrefixRecord::with_capacity(capacity).with_fault(fault),
            len: 0,
            capacity,
            last_logits: vec![0.0; c.vocab],
            last_prompt: 0,
            last_generated: 0,
        }
    }

    /// Forget every row: the state is rebuilt from position 0.
    pub fn reset(&mut self) {
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
        self.record.clear();
        self.len = 0;
    }

    /// Grow capacity to `capacity`: global layers are copied linearly, rings kept wholesale, the record kept.
    pub fn grow(&mut self, capacity: usize, fault: Option<Fault>) {
        let keep = self.len;
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
        self.capacity = capacity;
        if fault == Some(Fault::DropGrowRecord) {
            self.record.alloc(capacity);
        } else if !self.record.grow(capacity, keep) {
            self.len = 0;
        }
    }

    pub fn bytes(&self) -> usize {
        let kv: usize = self
            .kv
            .iter()
            .map(|kv| match kv {
                LayerKv::Ring { k, v } => k.rows.bytes() + v.rows.bytes(),
                LayerKv::Full { k, v } => k.rows.bytes() + v.rows.bytes(),
            })
            .sum();
        let conv: usize = self.conv.iter().map(|c| c.k.bytes() + c.v.bytes()).sum();
        kv + conv + self.record.capacity() * 4 + self.last_logits.len() * 4
    }

    pub fn dump_tensors(&self) -> Vec<DumpTensor> {
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
