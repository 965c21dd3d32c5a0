//! Cost pieces the archs compose their `ModelCost` from (see `crate::model_cost`): per-position flops of
//! the layer parts most archs share, read from the base config.

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
    use crate::model_cost::{AttentionTerm, ModelCost, Reach};

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
