//! Kimi's forward pass over one batch of consecutive positions (a prefill segment or one decode step).
//!
//! KDA folds positions into its matrix state strictly in order, one position at a time (heads in parallel), so a
//! position's result never depends on how the prompt was cut into batches. MLA reads older latent rows from the
//! cache and the batch's own from scratch, in ascending position order, and caches them after scoring.

use rayon::prelude::*;

use super::model::{Kda, Mixer, Mla, Model};
use super::state::{KdaState, LayerState, State};
use crate::arch::gqa_attend::{attend_rows, Heads};
use crate::arch::moe_sublayer::add_moe_sublayer;
use crate::arch::short_conv::short_conv;
use crate::cache::{FullCache, RowMeta, Rows};
use crate::engine_loop::Segment;
use crate::kernels::{dot, exp, matmul, rms_norm, silu, softplus, Reduction};

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / ‖x‖` for every `width`-wide piece of `x`.
fn l2_norm(x: &mut [f32], width: usize) {
    for piece in x.chunks_exact_mut(width) {
        let inv = 1.0 / (dot(piece, piece) + 1e-6).sqrt();
        piece.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Keep the raw inputs of the batch's last `taps` positions in the window (row pos % taps).
fn keep_window(window: &mut Rows, raw: &[f32], pos0: usize, meta: RowMeta) {
    let (taps, width) = (window.len(), window.width);
    if taps == 0 {
        return;
    }
    let rows = raw.len() / width;
    for i in rows.saturating_sub(taps)..rows {
        let p = pos0 + i;
        window.write(p % taps, &raw[i * width..(i + 1) * width], RowMeta { pos: p as i64, ..meta });
    }
}

impl Model {
    /// Feed `b` into `st`, writing every row with `b.writer`; returns the logits of the last row.
    pub fn forward(&self, st: &mut State, b: &Segment) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden;
        let s = b.ids.len();
        let meta = RowMeta { pos: 0, writer: Some(b.writer) };
        let mut x = self.stack.embed_rows(b.ids, h);
        for (layer, ls) in self.stack.layers.iter().zip(st.layers.iter_mut()) {
            let mut xn = x.clone();
            rms_norm(&mut xn, &layer.attn_norm, c.norm_eps);
            let o = match (&layer.attn, ls) {
                (Mixer::Kda(w), LayerState::Kda(state)) => self.kda(w, state, &xn, b.pos0, meta),
                (Mixer::Mla(w), LayerState::Mla(latent)) => self.mla(w, latent, &xn, b.pos0, meta),
                // the state is built from the model's layers: the kinds always pair up
                _ => unreachable!("layer state does not match its mixer"),
            };
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            add_moe_sublayer(&mut x, &layer.ffn_norm, c.norm_eps, &layer.moe, Reduction::Invariant, s);
        }
        self.stack.logits(&x, s, c)
    }

    /// Gated delta-rule linear attention over the batch; returns the layer output (`s × hidden`).
    fn kda(&self, w: &Kda, st: &mut KdaState, xn: &[f32], pos0: usize, meta: RowMeta) -> Vec<f32> {
        let c = &self.config;
        let (h, hd, heads) = (c.hidden, c.head_dim, c.heads);
        let qd = heads * hd;
        let s = xn.len() / h;
        let proj = |m: &[f32], out: usize| {
            let mut y = vec![0.0; s * out];
            matmul(xn, s, m, out, h, &mut y);
            y
        };
        let (q_raw, k_raw, v_raw) = (proj(&w.wq, qd), proj(&w.wk, qd), proj(&w.wv, qd));
        let (f, beta, gate) = (proj(&w.wf, qd), proj(&w.wb, heads), proj(&w.wg, qd));
        let conv = |raw: &[f32], weight: &[f32], window: &Rows| {
            let mut y = short_conv(raw, weight, c.conv_kernel, window, pos0);
            y.iter_mut().for_each(|v| *v = silu(*v));
            y
        };
        let mut q = conv(&q_raw, &w.conv_q, &st.conv_q);
        let mut k = conv(&k_raw, &w.conv_k, &st.conv_k);
        let v = conv(&v_raw, &w.conv_v, &st.conv_v);
        l2_norm(&mut q, hd);
        l2_norm(&mut k, hd);
        let scale = 1.0 / (hd as f32).sqrt();
        // every key channel's decay at every position, `exp(-a · softplus(f))` with the head's `a`, in one pass the
        // compiler vectorizes (the kernels' `exp` and `softplus`): with libm's calls inside the state loop below
        // they were about 6% of the bench preset's prefill
        let rates: Vec<f32> = w.a_log.iter().map(|l| 0.1 * l.exp()).collect();
        let mut decay = f;
        for (n, row) in decay.chunks_exact_mut(hd).enumerate() {
            let a = rates[n % heads];
            row.iter_mut().for_each(|x| *x = exp(-a * softplus(*x)));
        }

        // heads are independent: each walks the batch's positions in order through its own state
        let per_head: Vec<Vec<f32>> =
            st.s.par_chunks_mut(hd * hd)
                .enumerate()
                .map(|(head, sm)| {
                    let mut out = vec![0.0; s * hd];
                    let mut ks = vec![0.0; hd];
                    for i in 0..s {
                        let at = i * qd + head * hd;
                        let (qh, kh, vh) = (&q[at..at + hd], &k[at..at + hd], &v[at..at + hd]);
                        let b = sigmoid(beta[i * heads + head]);
                        // decay each key channel's row, then write the delta the state failed to predict
                        for (r, row) in sm.chunks_exact_mut(hd).enumerate() {
                            let alpha = decay[at + r];
                            row.iter_mut().for_each(|x| *x *= alpha);
                        }
                        ks.iter_mut().for_each(|x| *x = 0.0);
                        for (row, &kr) in sm.chunks_exact(hd).zip(kh) {
                            for (acc, x) in ks.iter_mut().zip(row) {
                                *acc += kr * x;
                            }
                        }
                        for (row, &kr) in sm.chunks_exact_mut(hd).zip(kh) {
                            for ((x, vj), kj) in row.iter_mut().zip(vh).zip(&ks) {
                                *x += kr * b * (vj - kj);
                            }
                        }
                        let o = &mut out[i * hd..(i + 1) * hd];
                        for (row, &qr) in sm.chunks_exact(hd).zip(qh) {
                            for (acc, x) in o.iter_mut().zip(row) {
                                *acc += qr * x;
                            }
                        }
                        o.iter_mut().for_each(|x| *x *= scale);
                    }
                    out
                })
                .collect();
        let mut att = vec![0.0; s * qd];
        for (head, out) in per_head.iter().enumerate() {
            for i in 0..s {
                att[i * qd + head * hd..i * qd + (head + 1) * hd].copy_from_slice(&out[i * hd..(i + 1) * hd]);
            }
        }
        rms_norm(&mut att, &w.o_norm, c.norm_eps);
        att.iter_mut().zip(&gate).for_each(|(a, g)| *a *= sigmoid(*g));

        keep_window(&mut st.conv_q, &q_raw, pos0, meta);
        keep_window(&mut st.conv_k, &k_raw, pos0, meta);
        keep_window(&mut st.conv_v, &v_raw, pos0, meta);
        st.folded = RowMeta { pos: (pos0 + s - 1) as i64, ..meta };

        let mut o = vec![0.0; s * h];
        matmul(&att, s, &w.wo, h, qd, &mut o);
        o
    }

    /// Gated MLA over the cached latent rows (NoPE); returns the layer output (`s × hidden`).
    fn mla(&self, w: &Mla, latent: &mut FullCache, xn: &[f32], pos0: usize, meta: RowMeta) -> Vec<f32> {
        let c = &self.config;
        let (h, hd, heads, kvl) = (c.hidden, c.head_dim, c.heads, c.kv_lora);
        let qd = heads * hd;
        let s = xn.len() / h;
        let mut q = vec![0.0; s * qd];
        let mut lat = vec![0.0; s * kvl];
        let mut gate = vec![0.0; s * qd];
        matmul(xn, s, &w.wq, qd, h, &mut q);
        matmul(xn, s, &w.w_dkv, kvl, h, &mut lat);
        matmul(xn, s, &w.wg, qd, h, &mut gate);
        rms_norm(&mut lat, &w.kv_norm, c.norm_eps);
        let scale = 1.0 / (hd as f32).sqrt();

        // absorb each head's key up-projection into its queries: the scores read latent rows directly
        let mut q_abs = vec![0.0; s * heads * kvl];
        let (mut qh, mut qa) = (vec![0.0; s * hd], vec![0.0; s * kvl]);
        for head in 0..heads {
            for (dst, src) in qh.chunks_exact_mut(hd).zip(q.chunks_exact(qd)) {
                dst.copy_from_slice(&src[head * hd..(head + 1) * hd]);
            }
            matmul(&qh, s, &w.k_up_t[head], kvl, hd, &mut qa);
            for (i, row) in qa.chunks_exact(kvl).enumerate() {
                q_abs[(i * heads + head) * kvl..][..kvl].copy_from_slice(row);
            }
        }
        // every head reads the same latent rows (key and value alike): one kv head for all of them
        let mut pooled = vec![0.0; s * heads * kvl];
        {
            let (cache, lat) = (&*latent, &lat);
            let row = |_: usize, p: usize| {
                let r = if p >= pos0 { &lat[(p - pos0) * kvl..(p - pos0 + 1) * kvl] } else { cache.get(p) };
                (r, r)
            };
            let shape = Heads { width: kvl, heads, group: heads, scale };
            attend_rows(&q_abs, shape, |i| 0..pos0 + i + 1, row, &mut pooled);
        }
        let mut att = vec![0.0; s * qd];
        let (mut ph, mut oh) = (vec![0.0; s * kvl], vec![0.0; s * hd]);
        for head in 0..heads {
            for (i, dst) in ph.chunks_exact_mut(kvl).enumerate() {
                dst.copy_from_slice(&pooled[(i * heads + head) * kvl..][..kvl]);
            }
            matmul(&ph, s, &w.v_up[head], hd, kvl, &mut oh);
            for (i, o) in oh.chunks_exact(hd).enumerate() {
                let g = &gate[i * qd + head * hd..i * qd + (head + 1) * hd];
                for ((a, x), g) in att[i * qd + head * hd..][..hd].iter_mut().zip(o).zip(g) {
                    *a = x * sigmoid(*g);
                }
            }
        }
        for i in 0..s {
            let m = RowMeta { pos: (pos0 + i) as i64, ..meta };
            latent.put(pos0 + i, &lat[i * kvl..(i + 1) * kvl], m);
        }
        let mut o = vec![0.0; s * h];
        matmul(&att, s, &w.wo, h, qd, &mut o);
        o
    }
}
