//! Mixture-of-experts FFN: top-k routed experts plus shared experts, SiLU-gated.
//!
//! Each row is routed and computed independently (rows are grouped per expert only to batch the matmuls, which are
//! row-invariant), so the FFN is batch-invariant.

use crate::kernels::{matmul_with, silu, softmax_in_place, Reduction};

/// One SiLU-gated FFN: down(silu(gate(x)) * up(x)).
#[derive(Debug, Clone)]
pub struct Expert {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// The MoE block of one layer.
#[derive(Debug, Clone)]
pub struct Moe {
    pub hidden: usize,
    pub ffn: usize,
    pub top_k: usize,
    pub router: Vec<f32>,
    pub experts: Vec<Expert>,
    pub shared: Vec<Expert>,
}

impl Expert {
    fn forward(&self, red: Reduction, x: &[f32], rows: usize, hidden: usize, ffn: usize) -> Vec<f32> {
        let mut g = vec![0.0; rows * ffn];
        let mut u = vec![0.0; rows * ffn];
        matmul_with(red, x, rows, &self.gate, ffn, hidden, &mut g);
        matmul_with(red, x, rows, &self.up, ffn, hidden, &mut u);
        for (a, b) in g.iter_mut().zip(&u) {
            *a = silu(*a) * b;
        }
        let mut y = vec![0.0; rows * hidden];
        matmul_with(red, &g, rows, &self.down, hidden, ffn, &mut y);
        y
    }
}

impl Moe {
    /// Route and run `rows` rows of `x`; returns the FFN output (not yet added to the residual).
    pub fn forward(&self, red: Reduction, x: &[f32], rows: usize) -> Vec<f32> {
        let (h, e) = (self.hidden, self.experts.len());
        let mut logits = vec![0.0; rows * e];
        matmul_with(red, x, rows, &self.router, e, h, &mut logits);
        // per row: the top-k experts (ties to the lower index) and their softmax weights
        let mut picks: Vec<Vec<(usize, f32)>> = Vec::with_capacity(rows);
        for r in 0..rows {
            let l = &logits[r * e..(r + 1) * e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
            let mut w: Vec<f32> = order[..self.top_k].iter().map(|&i| l[i]).collect();
            softmax_in_place(&mut w);
            picks.push(order[..self.top_k].iter().copied().zip(w).collect());
        }
        // gather rows per expert, run each expert once over its rows
        let mut routed: Vec<Vec<f32>> = vec![Vec::new(); rows * self.top_k];
        for (ei, expert) in self.experts.iter().enumerate() {
            let members: Vec<(usize, usize)> = picks
                .iter()
                .enumerate()
                .filter_map(|(r, p)| p.iter().position(|&(i, _)| i == ei).map(|rank| (r, rank)))
                .collect();
            if members.is_empty() {
                continue;
            }
            let xs: Vec<f32> = members.iter().flat_map(|&(r, _)| x[r * h..(r + 1) * h].iter().copied()).collect();
            let ys = expert.forward(red, &xs, members.len(), h, self.ffn);
            for (j, &(r, rank)) in members.iter().enumerate() {
                routed[r * self.top_k + rank] = ys[j * h..(j + 1) * h].to_vec();
            }
        }
        let shared: Vec<Vec<f32>> = self.shared.iter().map(|s| s.forward(red, x, rows, h, self.ffn)).collect();
        // combine in a fixed order: routed by rank, then shared experts
        let mut out = vec![0.0; rows * h];
        for r in 0..rows {
            let o = &mut out[r * h..(r + 1) * h];
            for (rank, &(_, w)) in picks[r].iter().enumerate() {
                for (a, b) in o.iter_mut().zip(&routed[r * self.top_k + rank]) {
                    *a += w * b;
                }
            }
            for s in &shared {
                for (a, b) in o.iter_mut().zip(&s[r * h..(r + 1) * h]) {
                    *a += b;
                }
            }
        }
        out
    }
}
