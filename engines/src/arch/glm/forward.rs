//! glm's forward pass over one batch of consecutive positions (a prefill segment or one decode step).
//!
//! MLA in its absorbed form, as colibri.c decodes: each head's query is mapped into latent space through its key
//! decompression (`W_uk^T q_nope`), scored against the cached latent rows plus the shared rope row, and the
//! softmax-weighted latent is decompressed through the head's value rows (`W_uv`). Only the latent and rope rows
//! are cached; every reduction runs in one fixed order, so a row's bits depend only on the ids at positions
//! 0..=t — never on the batch, nor on prefill vs decode. That is what makes truncation to any common prefix, and
//! copying rows between slots, exact.

use rayon::prelude::*;

use super::model::Model;
use super::state::LatentKv;
use crate::arch::gqa_attend::rows_per_task;
use crate::arch::moe_sublayer::add_moe_sublayer;
use crate::engine_loop::Segment;
use crate::kernels::{dot, matmul, rms_norm, Reduction, Scores};

impl Model {
    /// Feed `b`, writing every layer's latent and rope rows with `b.writer`; returns the logits of the last row.
    /// With `kv_len` (decode), each query attends to every cached position below it (the slot's kv length);
    /// prefill is causal. A correct slot's length is exactly `pos + 1` there, so it only matters when stale.
    pub fn forward(&self, kv: &mut [LatentKv], b: &Segment, kv_len: Option<usize>) -> Vec<f32> {
        let c = &self.config;
        let (h, hd, lora, rope) = (c.hidden, c.head_dim, c.kv_lora, c.qk_rope);
        let qrow = c.heads * (hd + rope);
        let (s, pos0) = (b.ids.len(), b.pos0);
        let scale = 1.0 / ((hd + rope) as f32).sqrt();
        let mut x = self.stack.embed_rows(b.ids, h);

        for (layer, cache) in self.stack.layers.iter().zip(kv.iter_mut()) {
            let mut xn = x.clone();
            rms_norm(&mut xn, &layer.attn_norm, c.norm_eps);
            let mut q = vec![0.0; s * qrow];
            let mut ckv = vec![0.0; s * (lora + rope)];
            matmul(&xn, s, &layer.attn.wq, qrow, h, &mut q);
            matmul(&xn, s, &layer.attn.wkv_a, lora + rope, h, &mut ckv);
            for i in 0..s {
                let t = pos0 + i;
                let angles = self.rope.angles(t);
                for head in q[i * qrow..(i + 1) * qrow].chunks_exact_mut(hd + rope) {
                    self.rope.rotate(&mut head[hd..], &angles);
                }
                let row = &mut ckv[i * (lora + rope)..(i + 1) * (lora + rope)];
                rms_norm(&mut row[..lora], &layer.attn.kv_norm, c.norm_eps);
                self.rope.rotate(&mut row[lora..], &angles);
                let meta = b.row(i);
                cache.latent.put(t, &row[..lora], meta);
                cache.rope.put(t, &row[lora..], meta);
            }

            let mut att = vec![0.0; s * c.heads * hd];
            {
                let (cache, q) = (&*cache, &q);
                // every head reads the same latent and rope rows: a task takes a block of rows with all their heads
                let per = rows_per_task(c.heads);
                att.par_chunks_mut(per * c.heads * hd).enumerate().for_each(|(blk, out)| {
                    let rows = blk * per..blk * per + out.len() / (c.heads * hd);
                    // queries never see past themselves in prefill; decode sees the slot's whole kv length
                    let visible = |i: usize| {
                        let t = pos0 + i;
                        0..kv_len.map_or(t + 1, |n| n.max(t + 1)).min(cache.latent.capacity())
                    };
                    let queries = rows.clone().flat_map(|i| (0..c.heads).map(move |hh| (i, hh)));
                    let (mut q_abs, mut q_rope, mut ranges) = (Vec::new(), Vec::new(), Vec::new());
                    for (i, hh) in queries {
                        let qh = &q[i * qrow + hh * (hd + rope)..i * qrow + (hh + 1) * (hd + rope)];
                        let (q_nope, qr) = qh.split_at(hd);
                        let w_uk = &layer.attn.wkv_b[hh * 2 * hd * lora..(hh * 2 * hd + hd) * lora];
                        // W_uk^T q_nope, summed over the head's key rows in order
                        let mut a = vec![0.0f32; lora];
                        for (&qd, wrow) in q_nope.iter().zip(w_uk.chunks_exact(lora)) {
                            a.iter_mut().zip(wrow).for_each(|(a, w)| *a += qd * w);
                        }
                        q_abs.push(a);
                        q_rope.push(qr);
                        ranges.push(visible(i));
                    }
                    // score = (latent part + rope part) · scale, each part a fixed-order dot
                    let q_abs: Vec<&[f32]> = q_abs.iter().map(Vec::as_slice).collect();
                    let mut scores = Scores::dots(&q_abs, &ranges, |p| cache.latent.get(p));
                    scores.add(&Scores::dots(&q_rope, &ranges, |p| cache.rope.get(p)));
                    scores.softmax(scale);
                    let mut o_lat = vec![0.0f32; ranges.len() * lora];
                    scores.weighted(|p| cache.latent.get(p), &mut o_lat);
                    for ((o, ol), hh) in
                        out.chunks_exact_mut(hd).zip(o_lat.chunks_exact(lora)).zip((0..c.heads).cycle())
                    {
                        let w_uv = &layer.attn.wkv_b[(hh * 2 * hd + hd) * lora..(hh + 1) * 2 * hd * lora];
                        for (od, vrow) in o.iter_mut().zip(w_uv.chunks_exact(lora)) {
                            *od = dot(vrow, ol);
                        }
                    }
                });
            }
            let mut o = vec![0.0; s * h];
            matmul(&att, s, &layer.attn.wo, h, c.heads * hd, &mut o);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            add_moe_sublayer(&mut x, &layer.ffn_norm, c.norm_eps, &layer.moe, Reduction::Invariant, s);
        }

        self.stack.logits(&x, s, c)
    }
}
