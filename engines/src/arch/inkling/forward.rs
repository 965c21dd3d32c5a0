//! Inkling's forward pass over one batch of consecutive positions (a prefill segment or one decode step).
//!
//! Rows are appended to the caches *after* scoring: with a ring, appending a batch longer than the window first
//! would overwrite history that earlier queries of the same batch still read. The current batch is read from the
//! scratch buffers, older positions from the caches, always in ascending position order.

use super::model::Model;
use super::state::{LayerKv, State};
use crate::arch::gqa_attend::attend_rows;
use crate::arch::gqa_dims::Dims;
use crate::arch::moe_sublayer::add_moe_sublayer;
use crate::arch::short_conv::short_conv;
use crate::engine_loop::Segment;
use crate::fault::Fault;
use crate::kernels::{matmul, rms_norm};
use crate::tokenizer::AUDIO;

impl Model {
    fn embed_rows(&self, b: &Segment) -> Vec<f32> {
        let h = self.config.hidden;
        let mut x = Vec::with_capacity(b.ids.len() * h);
        for (i, &id) in b.ids.iter().enumerate() {
            let start = x.len();
            x.extend_from_slice(&self.stack.embed[id as usize * h..(id as usize + 1) * h]);
            if let (AUDIO, Some(Some(payload))) = (id, b.audio.get(i)) {
                let fb = self.config.audio_frame_bytes;
                let frame: Vec<f32> = payload.iter().map(|&v| v as f32 / 127.5 - 1.0).collect();
                for (o, w) in x[start..].iter_mut().zip(self.audio_proj.chunks_exact(fb)) {
                    *o += crate::kernels::dot(w, &frame);
                }
            }
        }
        x
    }

    /// The short convolution of `raw` over time; without a kernel (`conv_kernel` 0) the rows pass unchanged.
    fn conv_over_time(&self, raw: &[f32], weight: &[f32], window: &crate::cache::Rows, pos0: usize) -> Vec<f32> {
        let kernel = self.config.conv_kernel;
        if kernel == 0 {
            return raw.to_vec();
        }
        short_conv(raw, weight, kernel, window, pos0)
    }

    /// Feed `b` into `st`, writing every cache row with `b.writer`; returns the logits of the last row.
    pub fn forward(&self, st: &mut State, b: &Segment, fault: Option<Fault>) -> Vec<f32> {
        let c = &self.config;
        let d = Dims::of(c);
        let Dims { h, hd, qd, kvd, .. } = d;
        let s = b.ids.len();
        let pos0 = b.pos0;
        let mut x = self.embed_rows(b);

        for (l, layer) in self.stack.layers.iter().enumerate() {
            let mut xn = x.clone();
            rms_norm(&mut xn, &layer.attn_norm, c.norm_eps);
            let (mut q, kraw, vraw) = layer.attn.proj.project(&xn, s, d);
            let mut k = self.conv_over_time(&kraw, &layer.attn.conv_k, &st.conv[l].k, pos0);
            let v = self.conv_over_time(&vraw, &layer.attn.conv_v, &st.conv[l].v, pos0);
            layer.attn.proj.norm_rope(&mut q, &mut k, &self.rope, c.norm_eps, pos0, d);

            let sliding = !layer.attn.global;
            let ring = matches!(st.kv[l], LayerKv::Ring { .. });
            let append_first = ring && fault == Some(Fault::RingAppendFirst);
            if append_first {
                // the fault: the whole batch goes into the ring before anyone scores against it
                for i in 0..s {
                    let m = b.row(i);
                    st.kv[l].put(pos0 + i, &k[i * kvd..(i + 1) * kvd], &v[i * kvd..(i + 1) * kvd], m);
                }
            }

            let mut att = vec![0.0; s * qd];
            {
                let cache = &st.kv[l];
                let (k, v) = (&k, &v);
                let visible = |i: usize| {
                    let t = pos0 + i;
                    let lo = if sliding { (t + 1).saturating_sub(c.window) } else { 0 };
                    lo..t + 1
                };
                let row = |g: usize, p: usize| -> (&[f32], &[f32]) {
                    let (kr, vr) = if p >= pos0 && !append_first {
                        (&k[(p - pos0) * kvd..(p - pos0 + 1) * kvd], &v[(p - pos0) * kvd..(p - pos0 + 1) * kvd])
                    } else {
                        (cache.k(p), cache.v(p))
                    };
                    (&kr[g * hd..(g + 1) * hd], &vr[g * hd..(g + 1) * hd])
                };
                attend_rows(&q, (&d).into(), visible, row, &mut att);
            }
            let mut o = vec![0.0; s * h];
            matmul(&att, s, &layer.attn.proj.gqa.wo, h, qd, &mut o);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            if !append_first {
                // rows the same batch would overwrite in a ring are skipped: no later query reads them
                let first = if ring { s.saturating_sub(c.window) } else { 0 };
                for i in first..s {
                    let m = b.row(i);
                    st.kv[l].put(pos0 + i, &k[i * kvd..(i + 1) * kvd], &v[i * kvd..(i + 1) * kvd], m);
                }
            }
            let window = &mut st.conv[l];
            let taps = window.taps();
            if taps > 0 {
                for i in s.saturating_sub(taps)..s {
                    let p = pos0 + i;
                    let m = b.row(i);
                    window.k.write(p % taps, &kraw[i * kvd..(i + 1) * kvd], m);
                    window.v.write(p % taps, &vraw[i * kvd..(i + 1) * kvd], m);
                }
            }

            add_moe_sublayer(&mut x, &layer.ffn_norm, c.norm_eps, &layer.moe, crate::kernels::Reduction::Invariant, s);
        }

        self.stack.logits(&x, s, c)
    }
}
