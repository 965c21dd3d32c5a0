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
}
