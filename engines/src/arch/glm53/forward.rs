//! glm53's forward pass over one batch of consecutive positions: a prefill chunk, a decode verification batch, or
//! a drafter step.
//!
//! The kernels are deliberately NOT batch-invariant, as GPU kernels are not: a prefill chunk reduces every matmul
//! (and the MoE) in `Reduction::Tiled(rows)` — a partial-sum split picked from the chunk's row count — while the
//! decode path reduces in the fixed 8-lane order. So a row's bits depend on the chunk that wrote it and on whether
//! prefill or decode wrote it; only the position-fixed grid and the canonical bound keep warm equal to cold.
//! Attention itself reads keys in ascending position order: cached rows below the batch, then the batch's own.

use super::model::Model;
use crate::arch::gqa_attend::attend_rows;
use crate::arch::gqa_dims::Dims;
use crate::arch::gqa_proj::GqaProj;
use crate::arch::moe_sublayer::add_moe_sublayer;
use crate::cache::{FullCache, RowMeta};
use crate::dump::Writer;
use crate::kernels::{matmul_with, rms_norm, silu, Reduction};
use crate::moe::Expert;

/// k and v rows of one layer (`kv_heads · head_dim` wide, one per position up to the capacity), row t holding
/// position t.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: FullCache,
    pub v: FullCache,
}

impl LayerKv {
    pub fn new(capacity: usize, width: usize) -> Self {
        LayerKv { k: FullCache::new(capacity, width), v: FullCache::new(capacity, width) }
    }

    /// Mark every row at or past `pos` empty.
    pub fn forget_from(&mut self, pos: usize) {
        for rows in [&mut self.k.rows, &mut self.v.rows] {
            rows.meta.iter_mut().skip(pos).for_each(|m| *m = RowMeta::EMPTY);
        }
    }

    pub fn grow(&mut self, capacity: usize, keep: usize) {
        self.k.grow(capacity, keep);
        self.v.grow(capacity, keep);
    }

    pub fn bytes(&self) -> usize {
        self.k.rows.bytes() + self.v.rows.bytes()
    }
}

/// One batch to feed: `ids` at positions `pos0..`, row i written by `writers[i]`.
pub struct Batch<'a> {
    pub ids: &'a [u32],
    pub pos0: usize,
    pub writers: Vec<Writer>,
}

/// The reduction a prefill chunk of `rows` rows runs with: the number of partial sums follows the row count,
/// as a GPU kernel picks its split from the problem shape.
pub fn prefill_reduction(rows: usize) -> Reduction {
    Reduction::Tiled(rows.max(1))
}

/// The decode path (one token, or a speculative verification batch) reduces in yet another order: the fixed
/// 8-lane split. It is batch-invariant among decode batches, which is what makes verification exact.
pub const DECODE_REDUCTION: Reduction = Reduction::Invariant;

impl Model {
    /// x += wo · attention(rms_norm(x, norm)); writes the batch's k/v rows into `kv` after every query has read
    /// them.
    fn attention(&self, norm: &[f32], a: &GqaProj, kv: &mut LayerKv, x: &mut [f32], b: &Batch, red: Reduction) {
        let c = &self.config;
        let d = Dims::of(c);
        let Dims { h, hd, qd, kvd, .. } = d;
        let (s, pos0) = (b.ids.len(), b.pos0);
        let mut xn = x.to_vec();
        rms_norm(&mut xn, norm, c.norm_eps);
        let (mut q, mut k, v) = a.project(red, &xn, s, d);
        for i in 0..s {
            let angles = self.rope.angles(pos0 + i);
            self.rope.rotate(&mut q[i * qd..(i + 1) * qd], &angles);
            self.rope.rotate(&mut k[i * kvd..(i + 1) * kvd], &angles);
        }
        let mut att = vec![0.0; s * qd];
        {
            let (cache, k, v) = (&*kv, &k, &v);
            let row = |g: usize, p: usize| -> (&[f32], &[f32]) {
                let (kr, vr) = if p >= pos0 {
                    (&k[(p - pos0) * kvd..(p - pos0 + 1) * kvd], &v[(p - pos0) * kvd..(p - pos0 + 1) * kvd])
                } else {
                    (cache.k.get(p), cache.v.get(p))
                };
                (&kr[g * hd..(g + 1) * hd], &vr[g * hd..(g + 1) * hd])
            };
            attend_rows(&q, (&d).into(), |i| 0..pos0 + i + 1, row, &mut att);
        }
        let mut o = vec![0.0; s * h];
        matmul_with(red, &att, s, &a.wo, h, qd, &mut o);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        for i in 0..s {
            let meta = RowMeta { pos: (pos0 + i) as i64, writer: Some(b.writers[i]) };
            kv.k.put(pos0 + i, &k[i * kvd..(i + 1) * kvd], meta);
            kv.v.put(pos0 + i, &v[i * kvd..(i + 1) * kvd], meta);
        }
    }

    /// Logits of the last `rows` rows of `x`, row-major.
    fn logits(&self, x: &[f32], rows: usize, norm: &[f32], red: Reduction) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden;
        let mut last = x[x.len() - rows * h..].to_vec();
        rms_norm(&mut last, norm, c.norm_eps);
        let mut logits = vec![0.0; rows * c.vocab];
        matmul_with(red, &last, rows, &self.stack.lm_head, c.vocab, h, &mut logits);
        logits
    }

    /// Feed `b` through the main model with reduction `red`; returns the logits of its last `logits_rows` rows.
    pub fn forward(&self, kv: &mut [LayerKv], b: &Batch, red: Reduction, logits_rows: usize) -> Vec<f32> {
        self.forward_together(kv, &[(b, red)], logits_rows)
    }

    /// Feed consecutive batches through the main model layer by layer, each with its own reduction: every batch
    /// passes layer l before any enters layer l + 1. A batch reads at layer l only the rows earlier batches wrote
    /// at layer l, so each row gets the bits it gets from batches fed one after another; but each layer's weights
    /// come from memory once for all of them. Returns the logits of the last batch's last `logits_rows` rows.
    pub fn forward_together(
        &self,
        kv: &mut [LayerKv],
        batches: &[(&Batch, Reduction)],
        logits_rows: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let Some(&(last, last_red)) = batches.last() else {
            return Vec::new();
        };
        let mut xs: Vec<Vec<f32>> = batches.iter().map(|(b, _)| self.stack.embed_rows(b.ids, c.hidden)).collect();
        for (layer, cache) in self.stack.layers.iter().zip(kv.iter_mut()) {
            for (&(b, red), x) in batches.iter().zip(&mut xs) {
                self.attention(&layer.attn_norm, &layer.attn, cache, x, b, red);
                add_moe_sublayer(x, &layer.ffn_norm, c.norm_eps, &layer.moe, red, b.ids.len());
            }
        }
        let x = xs.last().map(Vec::as_slice).unwrap_or_default();
        self.logits(x, logits_rows.clamp(1, last.ids.len()), &self.stack.final_norm, last_red)
    }

    /// Feed `b` through the drafter (batch-invariant: its rows depend only on the ids and their positions);
    /// returns the logits of the last row.
    pub fn draft_forward(&self, kv: &mut [LayerKv], b: &Batch) -> Vec<f32> {
        let c = &self.config;
        let s = b.ids.len();
        let red = Reduction::Invariant;
        let mut x = self.stack.embed_rows(b.ids, c.hidden);
        for (layer, cache) in self.draft.iter().zip(kv.iter_mut()) {
            self.attention(&layer.attn_norm, &layer.attn, cache, &mut x, b, red);
            let mut xn = x.clone();
            rms_norm(&mut xn, &layer.ffn_norm, c.norm_eps);
            let f = dense(&layer.ffn, &xn, s, c.hidden, c.ffn);
            x.iter_mut().zip(&f).for_each(|(a, b)| *a += b);
        }
        self.logits(&x, 1, &self.draft_norm, red)
    }
}

/// A dense SiLU-gated FFN: down(silu(gate(x)) * up(x)).
fn dense(e: &Expert, x: &[f32], rows: usize, hidden: usize, ffn: usize) -> Vec<f32> {
    let red = Reduction::Invariant;
    let mut g = vec![0.0; rows * ffn];
    let mut u = vec![0.0; rows * ffn];
    matmul_with(red, x, rows, &e.gate, ffn, hidden, &mut g);
    matmul_with(red, x, rows, &e.up, ffn, hidden, &mut u);
    g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
    let mut y = vec![0.0; rows * hidden];
    matmul_with(red, &g, rows, &e.down, hidden, ffn, &mut y);
    y
}
