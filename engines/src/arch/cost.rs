//! What feeding positions through a model costs, in floating-point operations: the model's own arithmetic, so a
//! report can tell time a turn must take (attention over a longer context) from time an engine wastes.
//!
//! A position costs its weight matmuls (the same at every position) plus, per attention term, a fixed amount per
//! key it attends to; how many keys a query at position `p` reads depends on the term's reach (the whole context,
//! a sliding window, or one compressed row per block). Norms, rope, softmax and other element-wise work are left
//! out: they are linear in the positions fed and small beside the matmuls.

use serde::{Deserialize, Serialize};

/// How many keys a query of one attention term reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Every position up to and including its own: `p + 1`.
    Full,
    /// The last `window` positions up to its own: `min(p + 1, window)`.
    Window(usize),
    /// One compressed row per completed block of `ratio` positions: `(p + 1) / ratio`.
    Compressed(usize),
}

impl Reach {
    /// Keys read by the queries at positions `0..n`, summed (exact, in closed form).
    fn keys_below(self, n: u128) -> u128 {
        match self {
            Reach::Full => n * (n + 1) / 2,
            Reach::Window(w) => {
                let w = w as u128;
                if n <= w {
                    n * (n + 1) / 2
                } else {
                    w * (w + 1) / 2 + (n - w) * w
                }
            }
            Reach::Compressed(0) => 0,
            Reach::Compressed(r) => {
                // sum over m = 1..=n of m / r: q full blocks of r values 0..q-1, then rem + 1 values of q
                let r = r as u128;
                let (q, rem) = (n / r, n % r);
                r * q * q.saturating_sub(1) / 2 + q * (rem + 1)
            }
        }
    }

    /// Keys read by the queries at positions `a..b`.
    pub fn keys(self, a: usize, b: usize) -> u128 {
        if b <= a {
            return 0;
        }
        self.keys_below(b as u128) - self.keys_below(a as u128)
    }
}

/// One attention term: what each (query, key) pair costs and how far a query reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionTerm {
    pub reach: Reach,
    /// Flops per (query, key) pair, over every head of every layer the term covers.
    pub flops_per_key: u64,
}

/// A model's cost per position fed (prefill or decode alike).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModelCost {
    /// Flops every position costs whatever its context: the weight matmuls, and attention work done once per
    /// query (a latent query's absorption, a linear-attention state update).
    pub token_flops: u64,
    /// Attention work that grows with the keys a query reads, one term per (reach, cost) pair; layers of the
    /// same reach may share a term.
    pub attention: Vec<AttentionTerm>,
}

impl ModelCost {
    /// Flops of feeding positions `a..b` (a query at position `p` attends to the positions its terms reach).
    pub fn flops(&self, a: usize, b: usize) -> f64 {
        let n = b.saturating_sub(a) as f64;
        let attention: f64 = self.attention.iter().map(|t| t.flops_per_key as f64 * t.reach.keys(a, b) as f64).sum();
        self.token_flops as f64 * n + attention
    }

    /// Adds `flops_per_key` to the term of `reach` (a new term if there is none).
    pub fn attend(&mut self, reach: Reach, flops_per_key: u64) {
        match self.attention.iter_mut().find(|t| t.reach == reach) {
            Some(t) => t.flops_per_key += flops_per_key,
            None => self.attention.push(AttentionTerm { reach, flops_per_key }),
        }
    }
}

/// Flops of a `[rows × inner] · [inner × out]` matmul per row: one multiply and one add per weight.
pub fn matmul(inner: usize, out: usize) -> u64 {
    2 * (inner as u64) * (out as u64)
}

/// GQA projections q, k, v, o of one layer, per position.
pub fn gqa_proj(c: &crate::config::BaseConfig) -> u64 {
    let (h, qd, kvd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    matmul(h, qd) + 2 * matmul(h, kvd) + matmul(qd, h)
}

/// GQA attention per (query, key) pair of one layer: a score and a weighted value row per head.
pub fn gqa_key(c: &crate::config::BaseConfig) -> u64 {
    2 * matmul(c.head_dim, c.heads)
}

/// A MoE FFN of one layer, per position: the router and every expert a row runs (routed and shared).
pub fn moe(c: &crate::config::BaseConfig) -> u64 {
    matmul(c.hidden, c.experts) + (c.top_k + c.shared_experts) as u64 * dense_ffn(c)
}

/// One SiLU-gated FFN (gate, up, down), per position.
pub fn dense_ffn(c: &crate::config::BaseConfig) -> u64 {
    3 * matmul(c.hidden, c.ffn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys counted one query at a time, the definition the closed forms must match.
    fn keys_by_hand(reach: Reach, a: usize, b: usize) -> u128 {
        (a..b)
            .map(|p| match reach {
                Reach::Full => p + 1,
                Reach::Window(w) => (p + 1).min(w),
                Reach::Compressed(r) => (p + 1) / r,
            } as u128)
            .sum()
    }

    #[test]
    fn closed_forms_match_counting_each_query() {
        for reach in [Reach::Full, Reach::Window(1), Reach::Window(5), Reach::Compressed(1), Reach::Compressed(4)] {
            for a in 0..20 {
                for b in a..40 {
                    assert_eq!(reach.keys(a, b), keys_by_hand(reach, a, b), "{reach:?} {a}..{b}");
                }
            }
        }
        assert_eq!(Reach::Full.keys(5, 3), 0);
    }

    #[test]
    fn a_tiny_model_costs_what_is_counted_by_hand() {
        // 10 flops a position, 3 a key over the whole context, 2 a key in a window of 2
        let mut cost = ModelCost { token_flops: 10, attention: Vec::new() };
        cost.attend(Reach::Full, 1);
        cost.attend(Reach::Window(2), 2);
        cost.attend(Reach::Full, 2);
        assert_eq!(cost.attention.len(), 2, "layers of one reach share a term");
        // positions 3, 4: full keys 4 + 5, window keys 2 + 2
        assert_eq!(cost.flops(3, 5), 2.0 * 10.0 + 3.0 * 9.0 + 2.0 * 4.0);
        // positions 0..3: full keys 1 + 2 + 3, window keys 1 + 2 + 2
        assert_eq!(cost.flops(0, 3), 30.0 + 3.0 * 6.0 + 2.0 * 5.0);
        assert_eq!(cost.flops(4, 4), 0.0);
    }

    #[test]
    fn layer_pieces_count_one_multiply_add_per_weight() {
        let c = crate::config::BaseConfig::preset("x", crate::config::Preset::Tiny);
        // hidden 64, heads 4 × 16 = 64, kv 2 × 16 = 32, ffn 64, 4 experts, top 2 + 1 shared
        assert_eq!(gqa_proj(&c), 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64));
        assert_eq!(gqa_key(&c), 4 * 16 * 4);
        assert_eq!(dense_ffn(&c), 2 * 3 * 64 * 64);
        assert_eq!(moe(&c), 2 * 64 * 4 + 3 * 2 * 3 * 64 * 64);
    }

    fn term(cost: &ModelCost, reach: Reach) -> u64 {
        cost.attention.iter().find(|t| t.reach == reach).map_or(0, |t| t.flops_per_key)
    }

    // The tiny preset: hidden 64, 8 layers, 4 heads of 16 (2 kv heads: kv width 32), FFN 64, 4 experts, top 2 and
    // 1 shared. Per layer, GQA projections 2·(64·64 + 2·64·32 + 64·64) = 24576; MoE 2·64·4 + 3·(3·2·64·64) = 74240;
    // one key, every head: 2·(2·16·4) = 256.

    #[test]
    fn inkling_tiny_by_hand() {
        use crate::config::{ArchConfig, Preset};
        let c = crate::arch::inkling::Config::preset(Preset::Tiny);
        assert_eq!((c.layers, c.window, c.global_every), (8, 8, 8), "the preset the numbers below assume");
        let cost = c.cost();
        assert_eq!(cost.token_flops, 8 * (24576 + 74240));
        // layer 8 is global, layers 1..7 slide over 8 positions
        assert_eq!(term(&cost, Reach::Full), 256);
        assert_eq!(term(&cost, Reach::Window(8)), 7 * 256);
        assert_eq!(cost.attention.len(), 2);
    }

    #[test]
    fn glm_tiny_by_hand() {
        use crate::config::{ArchConfig, Preset};
        let c = crate::arch::glm::Config::preset(Preset::Tiny);
        assert_eq!((c.kv_lora, c.qk_rope, c.heads, c.head_dim), (32, 8, 4, 16), "the preset the numbers below assume");
        let cost = c.cost();
        // q 2·64·(4·24) + latent and rope 2·64·40 + o 2·64·64 + absorb and decompress 4·2·(2·16·32) + MoE
        assert_eq!(cost.token_flops, 8 * (12288 + 5120 + 8192 + 8192 + 74240));
        // per key and head: a latent and a rope dot 2·40, the latent weighted 2·32; every layer attends to all
        assert_eq!(cost.attention, vec![AttentionTerm { reach: Reach::Full, flops_per_key: 8 * 4 * (80 + 64) }]);
    }

    #[test]
    fn deepseek_tiny_by_hand() {
        use crate::config::{ArchConfig, Preset};
        let c = crate::arch::deepseek::Config::preset(Preset::Tiny);
        assert_eq!((c.window, c.compress_ratio), (8, 4), "the preset the numbers below assume");
        let cost = c.cost();
        // the compressor's two projections: 2·(2·64·64) on the 4 overlapping ratio-4 layers, 2·(2·64·32) on the rest
        assert_eq!(cost.token_flops, 8 * (24576 + 74240) + 4 * 16384 + 4 * 8192);
        assert_eq!(term(&cost, Reach::Window(8)), 8 * 256);
        assert_eq!(term(&cost, Reach::Compressed(4)), 4 * 256);
        assert_eq!(term(&cost, Reach::Compressed(16)), 4 * 256);
        // a query at position 40 reads 8 raw rows, 41 / 4 = 10 and 41 / 16 = 2 compressed ones on each layer
        let one = cost.flops(40, 41);
        assert_eq!(one, (cost.token_flops + 8 * 256 * 8 + 4 * 256 * 10 + 4 * 256 * 2) as f64);
    }
}
