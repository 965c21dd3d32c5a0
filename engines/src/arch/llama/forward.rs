//! The llama forward pass over one batch of consecutive positions (a prefill segment or one decode step).
//!
//! Per layer: `x += Wo · attend(rope(Wq · n₁(x)), cache)` with the batch's rotated k and its v written to the
//! cache first (a full cache: no row a query of the batch still needs is overwritten), then
//! `x += Wdown · (silu(Wgate · n₂(x)) ⊙ Wup · n₂(x))`. Every matmul is the invariant quantized kernel and each
//! query row attends over positions `0..=t` in ascending order, so a position's values are bitwise the same
//! whether it is fed in a long prefill, a short one, or as a decode step.

use super::model::Model;
use super::state::State;
use crate::arch::gqa_attend::attend_rows;
use crate::arch::gqa_dims::Dims;
use crate::engine_loop::Segment;
use crate::kernels::{qmatmul, qmatmul_each, rms_norm, silu};

/// Rotary embedding with adjacent pairs: `(x[2i], x[2i+1])` of each head rotated by `pos · base^(-2i/rope_dim)`
/// for `2i < rope_dim` (the "normal" rope of GGUF llama files, whose q/k rows are stored in that pair order).
#[derive(Debug, Clone)]
pub struct PairRope {
    inv_freq: Vec<f64>,
}

impl PairRope {
    pub fn new(rope_dim: usize, theta: f32) -> Self {
        let inv_freq = (0..rope_dim / 2).map(|i| (theta as f64).powf(-(2.0 * i as f64) / rope_dim as f64)).collect();
        PairRope { inv_freq }
    }

    /// Rotate every head (`head_dim` wide) of `row` for position `pos`.
    pub fn apply(&self, row: &mut [f32], head_dim: usize, pos: usize) {
        Self::rotate(row, head_dim, &self.angles(pos));
    }

    /// The (sin, cos) of each pair's angle at position `pos` (the same for every layer and head).
    pub fn angles(&self, pos: usize) -> Vec<(f32, f32)> {
        crate::kernels::rope_angles(&self.inv_freq, pos)
    }

    /// Rotate every head of `row` by `angles` (from `angles`).
    pub fn rotate(row: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(s, c)) in angles.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }
}

impl Model {
    /// Feed `b` into `st`; the logits after its last position.
    pub fn forward(&self, st: &mut State, b: &Segment) -> Vec<f32> {
        let x = self.hidden_states(st, b);
        self.logits_of(&x[(b.ids.len() - 1) * self.config.hidden..])
    }

    /// Feed `b` into `st`; the residual stream after the last layer, one row per position.
    pub fn hidden_states(&self, st: &mut State, b: &Segment) -> Vec<f32> {
        let c = &self.config;
        let dims = Dims::of(c);
        let Dims { h, hd, qd, kvd, .. } = dims;
        let f = c.ffn;
        let s = b.ids.len();
        let rope = PairRope::new(c.rope_dim, c.rope_theta);

        // each position's rotation, once for every layer
        let angles: Vec<Vec<(f32, f32)>> = (0..s).map(|i| rope.angles(b.pos0 + i)).collect();

        let mut x = vec![0.0f32; s * h];
        for (row, &id) in x.chunks_exact_mut(h).zip(b.ids) {
            self.embed.row(id as usize, row);
        }
        let mut xn = vec![0.0f32; s * h];
        let (mut q, mut k, mut v) = (vec![0.0; s * qd], vec![0.0; s * kvd], vec![0.0; s * kvd]);
        let mut att = vec![0.0f32; s * qd];
        let mut o = vec![0.0f32; s * h];
        let (mut gate, mut up) = (vec![0.0f32; s * f], vec![0.0f32; s * f]);

        for (layer, kv) in self.layers.iter().zip(&mut st.kv) {
            xn.copy_from_slice(&x);
            rms_norm(&mut xn, &layer.attn_norm, c.norm_eps);
            qmatmul_each(&xn, s, &mut [(&layer.wq, &mut q), (&layer.wk, &mut k), (&layer.wv, &mut v)]);
            for i in 0..s {
                PairRope::rotate(&mut q[i * qd..(i + 1) * qd], hd, &angles[i]);
                PairRope::rotate(&mut k[i * kvd..(i + 1) * kvd], hd, &angles[i]);
                let meta = b.row(i);
                kv.k.put(b.pos0 + i, &k[i * kvd..(i + 1) * kvd], meta);
                kv.v.put(b.pos0 + i, &v[i * kvd..(i + 1) * kvd], meta);
            }
            let cache = &*kv;
            let kv_of = |g: usize, p: usize| (cache.k.get(g, p), cache.v.get(g, p));
            attend_rows(&q, (&dims).into(), |i| 0..b.pos0 + i + 1, kv_of, &mut att);
            qmatmul(&att, s, &layer.wo, &mut o);
            x.iter_mut().zip(&o).for_each(|(a, d)| *a += d);

            xn.copy_from_slice(&x);
            rms_norm(&mut xn, &layer.ffn_norm, c.norm_eps);
            qmatmul_each(&xn, s, &mut [(&layer.gate, &mut gate), (&layer.up, &mut up)]);
            gate.iter_mut().zip(&up).for_each(|(g, u)| *g = silu(*g) * u);
            qmatmul(&gate, s, &layer.down, &mut o);
            x.iter_mut().zip(&o).for_each(|(a, d)| *a += d);
        }
        x
    }

    /// The logits of one residual row: final RMSNorm, then the output head.
    pub fn logits_of(&self, row: &[f32]) -> Vec<f32> {
        let mut last = row.to_vec();
        rms_norm(&mut last, &self.final_norm, self.config.norm_eps);
        let mut logits = vec![0.0; self.config.vocab];
        qmatmul(&last, 1, &self.output, &mut logits);
        logits
    }
}
