//! The dimensions a GQA forward pass derives from the shared config, derived in one place so every arch's
//! attention slices heads and scales scores the same way.

use crate::config::BaseConfig;

/// The attention dimensions a forward pass works in.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub h: usize,
    pub hd: usize,
    pub qd: usize,
    pub kvd: usize,
    /// Query heads per kv head.
    pub group: usize,
    /// The score scale, `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl Dims {
    pub fn of(c: &BaseConfig) -> Dims {
        let (h, hd) = (c.hidden, c.head_dim);
        Dims {
            h,
            hd,
            qd: c.heads * hd,
            kvd: c.kv_heads * hd,
            group: c.heads / c.kv_heads,
            scale: 1.0 / (hd as f32).sqrt(),
        }
    }
}
