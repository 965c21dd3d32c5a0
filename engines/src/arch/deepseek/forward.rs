//! DeepSeek's forward pass over one batch of consecutive positions (a prefill segment or one decode step).
//!
//! Per layer: the compressor folds the batch's positions in order (emitting a compressed row at every block end,
//! which later queries of the same batch already see), then each query attends to every compressed row whose block
//! has ended plus the raw rows of its window, compressed rows first, each group in ascending position. Raw rows go
//! into the ring only after scoring: a batch longer than the window would otherwise overwrite rows its own earlier
//! queries still read.
//!
//! A prefill segment runs layer by layer and asks between layers whether to go on (the real engine streams each
//! layer's experts from disk, so that is where it notices a cancel). An aborted segment leaves the lower layers
//! holding its positions and the upper ones not: a state that matches neither the old ids nor the new ones.

use super::model::{Attention, Model};
use super::state::{LayerState, State};
use crate::arch::checkpoint_layout::Block;
use crate::arch::gqa_attend::{attend_rows_in_parts, KeyPart, Keys};
use crate::arch::gqa_dims::Dims;
use crate::arch::moe_sublayer::add_moe_sublayer;
use crate::engine_loop::{on_worker, Segment};
use crate::kernels::{matmul, rms_norm, Reduction};

/// The batch was abandoned between two layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted {
    /// Layers that had already taken the batch in.
    pub layers_done: usize,
}

impl Model {
    /// Feed `b` into `st`, writing every row with `b.writer`; returns the logits of the last row.
    /// `abort()` is asked before every layer but the first; `true` abandons the batch there.
    pub fn forward(&self, st: &mut State, b: &Segment, abort: &mut dyn FnMut() -> bool) -> Result<Vec<f32>, Aborted> {
        let c = &self.config;
        let s = b.ids.len();
        let mut x = self.stack.embed_rows(b.ids, Dims::of(c).h);

        for (l, layer) in self.stack.layers.iter().enumerate() {
            if l > 0 && abort() {
                return Err(Aborted { layers_done: l });
            }
            let ls = &mut st.layers[l];
            // the layer's kernels on a pool thread (one hand-off a layer), the observer asked here between them
            on_worker(|| self.layer(layer, ls, b, &mut x));
        }

        Ok(self.stack.logits(&x, s, c))
    }

    /// One layer over the batch: its attention and MoE added to `x`, its rows written into `ls`.
    fn layer(&self, layer: &Block<Attention>, ls: &mut LayerState, b: &Segment, x: &mut [f32]) {
        let c = &self.config;
        let d = Dims::of(c);
        let Dims { h, hd, qd, kvd, .. } = d;
        let s = b.ids.len();
        let pos0 = b.pos0;
        let mut xn = x.to_vec();
        rms_norm(&mut xn, &layer.attn_norm, c.norm_eps);
        let (mut q, mut k, v) = layer.attn.proj.project(&xn, s, d);
        layer.attn.proj.norm_rope(&mut q, &mut k, &self.rope, c.norm_eps, pos0, d);

        // the compressor sees positions strictly in order: its state is a recurrence
        let comp = &layer.attn.comp;
        let sw = comp.coff() * comp.width;
        let mut ckv = vec![0.0; s * sw];
        let mut csc = vec![0.0; s * sw];
        matmul(&xn, s, &comp.wkv, sw, h, &mut ckv);
        matmul(&xn, s, &comp.wgate, sw, h, &mut csc);
        for i in 0..s {
            let (kv, sc) = (&ckv[i * sw..(i + 1) * sw], &csc[i * sw..(i + 1) * sw]);
            ls.comp.fold(comp, pos0 + i, kv, sc, c.norm_eps, b.row(i));
        }

        let mut att = vec![0.0; s * qd];
        {
            let (ring_k, ring_v, comp_state) = (&ls.k, &ls.v, &ls.comp);
            let (k, v) = (&k, &v);
            let window = ring_k.window();
            let compressed = Keys {
                visible: |i: usize| 0..comp_state.visible(pos0 + i),
                // a compressed row is both key and value (V4's shared kv)
                kv: |g: usize, bi: usize| {
                    let r = &comp_state.rows.row(bi)[g * hd..(g + 1) * hd];
                    (r, r)
                },
            };
            let raw = Keys {
                visible: |i: usize| (pos0 + i + 1).saturating_sub(window)..pos0 + i + 1,
                kv: |g: usize, p: usize| {
                    let (kr, vr) = if p >= pos0 {
                        let j = p - pos0;
                        (&k[j * kvd..(j + 1) * kvd], &v[j * kvd..(j + 1) * kvd])
                    } else {
                        (ring_k.get(p), ring_v.get(p))
                    };
                    (&kr[g * hd..(g + 1) * hd], &vr[g * hd..(g + 1) * hd])
                },
            };
            let parts: [&dyn KeyPart; 2] = [&compressed, &raw];
            attend_rows_in_parts(&q, (&d).into(), &parts, &mut att);
        }
        let mut o = vec![0.0; s * h];
        matmul(&att, s, &layer.attn.proj.gqa.wo, h, qd, &mut o);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        // rows this batch would overwrite in the ring are skipped: no later query reads them
        for i in s.saturating_sub(ls.k.window())..s {
            let m = b.row(i);
            ls.k.put(pos0 + i, &k[i * kvd..(i + 1) * kvd], m);
            ls.v.put(pos0 + i, &v[i * kvd..(i + 1) * kvd], m);
        }

        add_moe_sublayer(x, &layer.ffn_norm, c.norm_eps, &layer.moe, Reduction::Invariant, s);
    }
}
