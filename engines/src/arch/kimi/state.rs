//! The layers of one Kimi slot: per KDA layer a matrix state per head (f32) and the short-convolution windows of
//! q/k/v, per MLA layer the latent rows.
//!
//! Buffers live as long as the slot: a new request resets them in place and capacity growth re-allocates only the
//! position-addressed latent rows. So the bytes the state holds follow the context length, never the turn count.

use super::model::Config;
use super::model::{Mixer, Model};
use crate::cache::{FullCache, RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};
use crate::engine_loop::Layers;
use crate::fault::Fault;

/// A KDA layer's recurrent state.
#[derive(Debug, Clone)]
pub struct KdaState {
    /// `heads × head_dim × head_dim` (per head: row = key channel, column = value channel).
    pub s: Vec<f32>,
    /// The last position folded in (and who fed it).
    pub folded: RowMeta,
    /// The raw (pre-convolution) q/k/v of the last `conv_kernel - 1` positions, at row pos % (kernel - 1).
    pub conv_q: Rows,
    pub conv_k: Rows,
    pub conv_v: Rows,
}

impl KdaState {
    fn new(c: &Config) -> Self {
        let qd = c.heads * c.head_dim;
        let taps = c.conv_kernel.saturating_sub(1);
        KdaState {
            s: vec![0.0; c.heads * c.head_dim * c.head_dim],
            folded: RowMeta::EMPTY,
            conv_q: Rows::new(taps, qd),
            conv_k: Rows::new(taps, qd),
            conv_v: Rows::new(taps, qd),
        }
    }

    fn reset(&mut self) {
        self.s.iter_mut().for_each(|x| *x = 0.0);
        self.folded = RowMeta::EMPTY;
        for w in [&mut self.conv_q, &mut self.conv_k, &mut self.conv_v] {
            w.forget();
            w.data.iter_mut().for_each(|x| *x = 0.0);
        }
    }

    fn bytes(&self) -> usize {
        self.s.len() * 4 + self.conv_q.bytes() + self.conv_k.bytes() + self.conv_v.bytes()
    }
}

/// The cached state of one layer.
#[derive(Debug, Clone)]
pub enum LayerState {
    Kda(KdaState),
    /// One latent row (`kv_lora`) per position.
    Mla(FullCache),
}

impl LayerState {
    fn bytes(&self) -> usize {
        match self {
            LayerState::Kda(k) => k.bytes(),
            LayerState::Mla(latent) => latent.rows.bytes(),
        }
    }
}

/// The layers of one Kimi slot.
#[derive(Debug, Clone)]
pub struct State {
    pub layers: Vec<LayerState>,
    /// Buffers the `kv-leak` fault re-allocated away from and never freed (always empty otherwise).
    pub leaked: Vec<Vec<LayerState>>,
}

impl State {
    pub fn new(model: &Model) -> Self {
        let c = &model.config;
        let layers = model
            .stack
            .layers
            .iter()
            .map(|l| match l.attn {
                Mixer::Kda(_) => LayerState::Kda(KdaState::new(c)),
                Mixer::Mla(_) => LayerState::Mla(FullCache::new(c.initial_capacity, c.kv_lora)),
            })
            .collect();
        State { layers, leaked: Vec::new() }
    }

    /// Cut the latent rows back to positions `0..len` (what LCP truncation does right for position-addressed rows;
    /// only the `truncate-recurrent` fault calls it, leaving the recurrent states as they are).
    pub fn truncate_latent(&mut self, len: usize) {
        for l in &mut self.layers {
            if let LayerState::Mla(latent) = l {
                for i in len..latent.capacity() {
                    latent.rows.meta[i] = RowMeta::EMPTY;
                }
            }
        }
    }
}

impl Layers for State {
    /// Forget everything, in place: the state is rebuilt from position 0 in the same buffers.
    fn reset(&mut self) {
        for l in &mut self.layers {
            match l {
                LayerState::Kda(k) => k.reset(),
                LayerState::Mla(latent) => {
                    latent.rows.forget();
                    latent.rows.data.iter_mut().for_each(|x| *x = 0.0);
                }
            }
        }
    }

    /// Latent rows are copied (position t stays at row t); recurrent states and conv windows do not depend on
    /// capacity.
    fn grow(&mut self, capacity: usize, keep: usize, _: Option<Fault>) {
        for l in &mut self.layers {
            if let LayerState::Mla(latent) = l {
                latent.grow(capacity, keep);
            }
        }
    }

    /// Every byte the slot holds, leaked buffers included.
    fn bytes(&self) -> usize {
        let live: usize = self.layers.iter().map(LayerState::bytes).sum();
        let leaked: usize = self.leaked.iter().flatten().map(LayerState::bytes).sum();
        live + leaked
    }

    fn dump(&self) -> Vec<DumpTensor> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            match l {
                LayerState::Kda(k) => {
                    out.push(DumpTensor {
                        layer: i,
                        name: "state".into(),
                        kind: CacheKind::Recurrent,
                        width: k.s.len(),
                        data: k.s.clone(),
                        positions: vec![k.folded.pos],
                        writers: vec![k.folded.writer],
                    });
                    if !k.conv_q.is_empty() {
                        out.push(k.conv_q.dump(i, "conv_q", CacheKind::Conv));
                        out.push(k.conv_k.dump(i, "conv_k", CacheKind::Conv));
                        out.push(k.conv_v.dump(i, "conv_v", CacheKind::Conv));
                    }
                }
                LayerState::Mla(latent) => out.push(latent.rows.dump(i, "latent", CacheKind::Latent)),
            }
        }
        out
    }
}
