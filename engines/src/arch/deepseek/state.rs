//! The layers of one DeepSeek slot: per layer a sliding-window ring of raw k/v rows and a compressor (recurrent
//! kv_state/score_state plus the compressed rows emitted so far).
//!
//! None of it can be rewound: the ring has overwritten old rows and the compressor state has folded them in. So the
//! only reuse is continuation of exactly the ids the record holds.

use super::model::{Compressor, Model};
use crate::cache::{RingCache, RowMeta, Rows};
use crate::dump::{CacheKind, DumpTensor};
use crate::engine_loop::Layers;
use crate::fault::Fault;
use crate::kernels::rms_norm;

/// The recurrent part of a compressor and the rows it has emitted.
#[derive(Debug, Clone)]
pub struct CompressorState {
    pub ratio: usize,
    pub overlap: bool,
    /// Width of one compressed row.
    pub width: usize,
    /// `coff · ratio` rows of `coff · width`: with overlap, rows `0..ratio` hold the previous block and rows
    /// `ratio..` the current one; without, row `pos % ratio` holds position `pos` of the current block.
    pub kv_state: Vec<f32>,
    /// Same shape; starts at -inf so slots no position has filled get no weight in the softmax.
    pub score_state: Vec<f32>,
    /// The last position folded in (and who fed it).
    pub folded: RowMeta,
    /// Compressed row of block b at row b; its position is the block's last position.
    pub rows: Rows,
}

impl CompressorState {
    pub fn new(comp: &Compressor, capacity: usize) -> Self {
        let coff = comp.coff();
        let n = coff * comp.ratio * coff * comp.width;
        CompressorState {
            ratio: comp.ratio,
            overlap: comp.overlap,
            width: comp.width,
            kv_state: vec![0.0; n],
            score_state: vec![f32::NEG_INFINITY; n],
            folded: RowMeta::EMPTY,
            rows: Rows::new(capacity / comp.ratio, comp.width),
        }
    }

    fn coff(&self) -> usize {
        1 + usize::from(self.overlap)
    }

    /// Width of one state row.
    fn state_width(&self) -> usize {
        self.coff() * self.width
    }

    /// Compressed rows whose block ends at or before position `t` (what a query at `t` sees).
    pub fn visible(&self, t: usize) -> usize {
        (t + 1) / self.ratio
    }

    /// Back to the state before position 0, in place (the buffers are kept).
    pub fn reset(&mut self) {
        self.kv_state.iter_mut().for_each(|x| *x = 0.0);
        self.score_state.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        self.folded = RowMeta::EMPTY;
        self.rows.forget();
        self.rows.data.iter_mut().for_each(|x| *x = 0.0);
    }

    /// Fold position `t` in (`kv` and `score` rows as projected, `coff · width` wide); at the end of a block,
    /// pool the state rows (softmax-gated, per channel), normalise, and store the compressed row.
    pub fn fold(&mut self, comp: &Compressor, t: usize, kv: &[f32], score: &[f32], eps: f32, meta: RowMeta) {
        let (r, d, sw) = (self.ratio, self.width, self.state_width());
        let slot = t % r;
        let row = if self.overlap { r + slot } else { slot };
        self.kv_state[row * sw..(row + 1) * sw].copy_from_slice(kv);
        let ape = &comp.ape[slot * sw..(slot + 1) * sw];
        for ((s, x), a) in self.score_state[row * sw..(row + 1) * sw].iter_mut().zip(score).zip(ape) {
            *s = x + a;
        }
        self.folded = RowMeta { pos: t as i64, ..meta };
        if !(t + 1).is_multiple_of(r) {
            return;
        }
        // (state row, column) pairs pooled for channel c: with overlap the previous block's first half and the
        // current block's second half, in that order
        let sources = |c: usize| -> Vec<(usize, usize)> {
            if self.overlap {
                (0..r).map(|i| (i, c)).chain((r..2 * r).map(|i| (i, d + c))).collect()
            } else {
                (0..r).map(|i| (i, c)).collect()
            }
        };
        let mut pooled = vec![0.0f32; d];
        for (c, out) in pooled.iter_mut().enumerate() {
            let src = sources(c);
            let max = src.iter().map(|&(i, j)| self.score_state[i * sw + j]).fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            let mut acc = 0.0f32;
            for &(i, j) in &src {
                let w = (self.score_state[i * sw + j] - max).exp();
                sum += w;
                acc += w * self.kv_state[i * sw + j];
            }
            *out = acc / sum;
        }
        if self.overlap {
            // the current block becomes the previous one
            self.kv_state.copy_within(r * sw..2 * r * sw, 0);
            self.score_state.copy_within(r * sw..2 * r * sw, 0);
        }
        rms_norm(&mut pooled, &comp.norm, eps);
        self.rows.write(t / r, &pooled, RowMeta { pos: t as i64, ..meta });
    }

    /// Change the compressed rows to `capacity` positions, keeping the blocks of positions `0..len`.
    pub fn grow(&mut self, capacity: usize, len: usize) {
        self.rows.grow(capacity / self.ratio, len / self.ratio);
    }

    pub fn bytes(&self) -> usize {
        (self.kv_state.len() + self.score_state.len()) * 4 + self.rows.bytes()
    }

    fn recurrent(&self, layer: usize, name: &str, data: Vec<f32>) -> DumpTensor {
        DumpTensor {
            layer,
            name: name.into(),
            kind: CacheKind::Recurrent,
            width: data.len(),
            data,
            positions: vec![self.folded.pos],
            writers: vec![self.folded.writer],
        }
    }

    pub fn dump(&self, layer: usize, out: &mut Vec<DumpTensor>) {
        out.push(self.rows.dump(layer, "compressed", CacheKind::Compressed));
        out.push(self.recurrent(layer, "kv_state", self.kv_state.clone()));
        // unfilled slots stay -inf in the dump (the dump file stores raw f32)
        out.push(self.recurrent(layer, "score_state", self.score_state.clone()));
    }
}

/// The cached state of one layer.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// The raw k and v rows of the last `window` positions, `kv_heads · head_dim` wide, position t at row t % window.
    pub k: RingCache,
    pub v: RingCache,
    pub comp: CompressorState,
}

/// The layers of one DeepSeek slot.
#[derive(Debug, Clone)]
pub struct State {
    pub layers: Vec<LayerState>,
}

impl State {
    pub fn new(model: &Model) -> Self {
        let c = &model.config;
        let kvd = c.kv_heads * c.head_dim;
        let window = c.window.min(c.max_ctx);
        let layers = model
            .stack
            .layers
            .iter()
            .map(|l| LayerState {
                k: RingCache::new(window, kvd),
                v: RingCache::new(window, kvd),
                comp: CompressorState::new(&l.attn.comp, c.initial_capacity),
            })
            .collect();
        State { layers }
    }
}

impl Layers for State {
    fn reset(&mut self) {
        for l in &mut self.layers {
            for ring in [&mut l.k, &mut l.v] {
                ring.rows.forget();
                ring.rows.data.iter_mut().for_each(|x| *x = 0.0);
            }
            l.comp.reset();
        }
    }

    /// Rings are kept wholesale (their size does not depend on capacity), compressed rows copied.
    fn grow(&mut self, capacity: usize, keep: usize, _: Option<Fault>) {
        for l in &mut self.layers {
            l.comp.grow(capacity, keep);
        }
    }

    fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.rows.bytes() + l.v.rows.bytes() + l.comp.bytes()).sum()
    }

    fn dump(&self) -> Vec<DumpTensor> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            out.push(l.k.dump(i, "k"));
            out.push(l.v.dump(i, "v"));
            l.comp.dump(i, &mut out);
        }
        out
    }
}
