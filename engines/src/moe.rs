//! Mixture-of-experts FFN: top-k routed experts plus shared experts, SiLU-gated.
//!
//! Each row is routed and computed independently (rows are grouped per expert only to batch the matmuls, which are
//! row-invariant), so the FFN is batch-invariant.

use crate::kernels::{matmul_with, matmul_with_tail, matmuls_invariant, silu, softmax_in_place, Reduction, TailBlocks};
use rayon::prelude::*;

/// One SiLU-gated FFN: down(silu(gate(x)) * up(x)).
#[derive(Debug, Clone)]
pub struct Expert {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
    /// The three matrices copied in the `Tiled` kernels' tail layout (`Moe::add_tail_blocks`), for an engine whose
    /// prefill reduces `Tiled` (glm53): a short chunk gives each expert a few rows, whose tail would otherwise
    /// transpose every block of the weights on every call. `None` elsewhere.
    pub tail: Option<Box<ExpertTail>>,
}

/// An expert's `TailBlocks`, one per matrix.
#[derive(Debug, Clone)]
pub struct ExpertTail {
    gate: TailBlocks,
    up: TailBlocks,
    down: TailBlocks,
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
    /// An expert without tail copies.
    pub fn new(gate: Vec<f32>, up: Vec<f32>, down: Vec<f32>) -> Expert {
        Expert { gate, up, down, tail: None }
    }

    /// Builds the tail copies (where this CPU runs a SIMD `Tiled` kernel); returns their bytes.
    fn add_tail_blocks(&mut self, hidden: usize, ffn: usize) -> usize {
        if self.gate.is_empty() {
            return 0; // a spec list (the fixture generator's view of a model) returns no data
        }
        let copies = (
            TailBlocks::of(&self.gate, ffn, hidden),
            TailBlocks::of(&self.up, ffn, hidden),
            TailBlocks::of(&self.down, hidden, ffn),
        );
        let (Some(gate), Some(up), Some(down)) = copies else { return 0 };
        let bytes = gate.bytes() + up.bytes() + down.bytes();
        self.tail = Some(Box::new(ExpertTail { gate, up, down }));
        bytes
    }

    /// `then`: the weights this thread multiplies after the expert's down (the next expert's gate), whose first
    /// lines the down asks for on its way (`matmul_with_tail`); empty if none is known.
    fn forward(&self, red: Reduction, x: &[f32], rows: usize, hidden: usize, ffn: usize, then: &[f32]) -> Vec<f32> {
        let tail = self.tail.as_deref();
        let mut g = vec![0.0; rows * ffn];
        let mut u = vec![0.0; rows * ffn];
        matmul_with_tail(red, x, rows, &self.gate, tail.map(|t| &t.gate), ffn, hidden, &mut g, &self.up);
        matmul_with_tail(red, x, rows, &self.up, tail.map(|t| &t.up), ffn, hidden, &mut u, &self.down);
        gate(&mut g, &u);
        let mut y = vec![0.0; rows * hidden];
        matmul_with_tail(red, &g, rows, &self.down, tail.map(|t| &t.down), hidden, ffn, &mut y, then);
        y
    }

    /// `forward` in `Reduction::Invariant`'s order of several experts, each over its own rows `(expert, x)`, their
    /// matmuls side by side (`matmuls_invariant`): every gate and up at once, then every down. A decode step's few
    /// rows give each active expert one or two, and one expert a thread left a thread idle while the other read a
    /// third expert (glm53's bench decode reads 3.3 routed experts a layer, plus the shared one). In one process,
    /// alternating six times (in huge pages, as the engine runs): one expert a thread 133.1-149.7 tok/s, side by
    /// side 152.2-156.7. The bits of `forward` for each.
    fn forward_many(work: &[(&Expert, &[f32])], hidden: usize, ffn: usize) -> Vec<Vec<f32>> {
        let rows: Vec<usize> = work.iter().map(|(_, x)| x.len() / hidden).collect();
        let mut g: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0; r * ffn]).collect();
        let mut u = g.clone();
        let mut jobs: Vec<(&[f32], &[f32], &mut [f32])> = Vec::with_capacity(2 * work.len());
        for (((e, x), g), u) in work.iter().zip(&mut g).zip(&mut u) {
            jobs.push((x, &e.gate, g));
            jobs.push((x, &e.up, u));
        }
        matmuls_invariant(hidden, &mut jobs);
        g.iter_mut().zip(&u).for_each(|(g, u)| gate(g, u));
        let mut y: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0; r * hidden]).collect();
        let mut jobs: Vec<(&[f32], &[f32], &mut [f32])> = work
            .iter()
            .zip(&g)
            .zip(&mut y)
            .map(|(((e, _), g), y)| (g.as_slice(), e.down.as_slice(), y.as_mut_slice()))
            .collect();
        matmuls_invariant(ffn, &mut jobs);
        y
    }
}

/// `g = silu(g) · u`, element by element: a SiLU-gated FFN's hidden activations.
fn gate(g: &mut [f32], u: &[f32]) {
    for (a, b) in g.iter_mut().zip(u) {
        *a = silu(*a) * b;
    }
}

impl Moe {
    /// Copies every expert's matrices (routed and shared) in the `Tiled` kernels' tail layout, for an engine whose
    /// prefill reduces `Tiled`; returns the copies' bytes (0 where this CPU runs no SIMD `Tiled` kernel).
    pub fn add_tail_blocks(&mut self) -> usize {
        let (h, f) = (self.hidden, self.ffn);
        self.experts.iter_mut().chain(&mut self.shared).map(|e| e.add_tail_blocks(h, f)).sum()
    }

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
        // each expert's rows, with their rank in the row's picks: each expert runs once over its rows
        let members: Vec<Vec<(usize, usize)>> = (0..e)
            .map(|ei| {
                let rank_of = |p: &Vec<(usize, f32)>| p.iter().position(|&(i, _)| i == ei);
                picks.iter().enumerate().filter_map(|(r, p)| rank_of(p).map(|rank| (r, rank))).collect()
            })
            .collect();
        // the rows of `x` routed to expert `ei`, gathered
        let gather = |ei: usize| -> Vec<f32> {
            members[ei].iter().flat_map(|&(r, _)| x[r * h..(r + 1) * h].iter().copied()).collect()
        };
        let active: Vec<usize> = (0..e).filter(|&ei| !members[ei].is_empty()).collect();
        let mut routed_out: Vec<Option<Vec<f32>>> = vec![None; e];
        let shared = if crate::decode_team::leading() && red == Reduction::Invariant {
            // a decode step's team: the active experts' (most have no rows) and the shared ones' matmuls side by side
            let gathered: Vec<Vec<f32>> = active.iter().map(|&ei| gather(ei)).collect();
            let work: Vec<(&Expert, &[f32])> = active
                .iter()
                .zip(&gathered)
                .map(|(&ei, xs)| (&self.experts[ei], xs.as_slice()))
                .chain(self.shared.iter().map(|s| (s, x)))
                .collect();
            let mut ys = Expert::forward_many(&work, h, self.ffn);
            let shared = ys.split_off(active.len());
            for (&ei, y) in active.iter().zip(ys) {
                routed_out[ei] = Some(y);
            }
            shared
        } else {
            // the experts side by side: a short segment gives each expert a few rows, too little work to split one
            // expert's matmuls. On one thread they run in order, routed then shared, and each asks for the next
            // one's first weights while its down computes: the first tile of a matrix from memory otherwise waits
            // (docs/engines.md, *A matmul asks for the first tile of the matrix its caller multiplies next*)
            let order: Vec<&Expert> = active.iter().map(|&ei| &self.experts[ei]).chain(&self.shared).collect();
            let then = |i: usize| match order.get(i + 1) {
                Some(next) if rayon::current_num_threads() == 1 => next.gate.as_slice(),
                _ => &[],
            };
            let run_expert = |(i, &ei): (usize, &usize)| {
                self.experts[ei].forward(red, &gather(ei), members[ei].len(), h, self.ffn, then(i))
            };
            let shared_from = active.len();
            let (routed, shared): (Vec<Vec<f32>>, _) = rayon::join(
                || active.par_iter().enumerate().map(run_expert).collect(),
                || {
                    let run_shared =
                        |(i, s): (usize, &Expert)| s.forward(red, x, rows, h, self.ffn, then(shared_from + i));
                    self.shared.par_iter().enumerate().map(run_shared).collect()
                },
            );
            for (&ei, y) in active.iter().zip(routed) {
                routed_out[ei] = Some(y);
            }
            shared
        };
        let mut routed: Vec<Vec<f32>> = vec![Vec::new(); rows * self.top_k];
        for (members, ys) in members.iter().zip(&routed_out) {
            let Some(ys) = ys else { continue };
            for (j, &(r, rank)) in members.iter().enumerate() {
                routed[r * self.top_k + rank] = ys[j * h..(j + 1) * h].to_vec();
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_rows::random;

    fn expert(h: usize, f: usize, seed: u64) -> Expert {
        Expert::new(random(f * h, seed), random(f * h, seed + 1), random(h * f, seed + 2))
    }

    /// Six routed experts (top 2) and one shared.
    fn six_experts(h: usize, f: usize) -> Moe {
        Moe {
            hidden: h,
            ffn: f,
            top_k: 2,
            router: random(6 * h, 1),
            experts: (0..6).map(|e| expert(h, f, 10 * e + 2)).collect(),
            shared: vec![expert(h, f, 99)],
        }
    }

    /// Each row's output is its own top-k experts, each run on that row alone, weighted in rank order, plus the
    /// shared expert: bitwise, in a batch whose rows spread over every expert (so the experts run side by side).
    #[test]
    fn each_row_gets_its_own_experts_in_rank_order() {
        let (h, f, rows) = (32, 48, 23);
        let moe = six_experts(h, f);
        let x = random(rows * h, 7);
        let y = moe.forward(Reduction::Invariant, &x, rows);
        let mut used = vec![false; moe.experts.len()];
        for r in 0..rows {
            let xr = &x[r * h..(r + 1) * h];
            let mut logits = vec![0.0; moe.experts.len()];
            matmul_with(Reduction::Invariant, xr, 1, &moe.router, moe.experts.len(), h, &mut logits);
            let mut order: Vec<usize> = (0..moe.experts.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            let mut w: Vec<f32> = order[..2].iter().map(|&i| logits[i]).collect();
            softmax_in_place(&mut w);
            let mut want = vec![0.0f32; h];
            for (&e, &wt) in order[..2].iter().zip(&w) {
                used[e] = true;
                let ye = moe.experts[e].forward(Reduction::Invariant, xr, 1, h, f, &[]);
                want.iter_mut().zip(&ye).for_each(|(a, b)| *a += wt * b);
            }
            let ys = moe.shared[0].forward(Reduction::Invariant, xr, 1, h, f, &[]);
            want.iter_mut().zip(&ys).for_each(|(a, b)| *a += b);
            let got: Vec<u32> = y[r * h..(r + 1) * h].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "row {r}");
        }
        assert!(used.iter().filter(|&&u| u).count() >= 4, "the rows reach most experts: {used:?}");
    }

    /// Inside a decode step's team the experts' matmuls run side by side (`Expert::forward_many`), outside it one
    /// expert a task: every row's output has the same bits either way, at the row counts of a decode step and its
    /// verification batches, and at a segment's.
    #[test]
    fn experts_side_by_side_in_a_step_keep_the_bits() {
        let moe = six_experts(64, 80);
        for rows in [1, 2, 3, 4, 9] {
            let x = random(rows * moe.hidden, 40 + rows as u64);
            let bits = |y: Vec<f32>| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let outside = bits(moe.forward(Reduction::Invariant, &x, rows));
            let inside = bits(crate::decode_team::run(|| moe.forward(Reduction::Invariant, &x, rows)));
            assert_eq!(inside, outside, "{rows} rows");
        }
    }

    /// On one thread each expert asks for the next one's weights while its down computes; every row's output has
    /// the bits of the same segment on several threads, where no expert asks.
    #[test]
    fn one_thread_asking_ahead_keeps_the_bits() {
        let moe = six_experts(64, 80);
        let (rows, pool) = (31, rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool"));
        let x = random(rows * moe.hidden, 77);
        let bits = |y: Vec<f32>| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let one = bits(pool.install(|| moe.forward(Reduction::Invariant, &x, rows)));
        let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        assert_eq!(one, bits(two.install(|| moe.forward(Reduction::Invariant, &x, rows))));
    }

    /// `forward_many` gives each expert the bits of its own `forward` over its own rows.
    #[test]
    fn forward_many_gives_each_expert_its_own_bits() {
        let moe = six_experts(48, 40);
        let xs: Vec<Vec<f32>> = (0..4).map(|r| random(r * 48, 60 + r as u64)).collect();
        let work: Vec<(&Expert, &[f32])> = moe.experts.iter().zip(&xs).map(|(e, x)| (e, x.as_slice())).collect();
        let many = Expert::forward_many(&work, 48, 40);
        for (r, ((e, x), y)) in work.iter().zip(&many).enumerate() {
            let alone = e.forward(Reduction::Invariant, x, r, 48, 40, &[]);
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "expert {r}"
            );
        }
    }

    /// A `Tiled` MoE whose experts read their tail copies gives the bits of one that transposes per call, at row
    /// counts that leave every expert a tail (a few rows each) and at counts with whole passes.
    #[test]
    fn tail_copies_keep_the_tiled_bits() {
        let plain = six_experts(48, 40);
        let mut copied = plain.clone();
        let bytes = copied.add_tail_blocks();
        if bytes == 0 {
            return; // no SIMD `Tiled` kernel on this CPU: nothing reads a copy
        }
        assert!(copied.experts.iter().chain(&copied.shared).all(|e| e.tail.is_some()));
        for rows in [1, 5, 13, 23, 40] {
            let x = random(rows * plain.hidden, rows as u64);
            let red = Reduction::Tiled(rows);
            let bits = |m: &Moe| m.forward(red, &x, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&copied), bits(&plain), "{rows} rows");
        }
    }
}
