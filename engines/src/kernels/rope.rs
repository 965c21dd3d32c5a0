//! Rotary position embedding (rotate-half layout), with the angle table computed once.

/// Precomputed inverse frequencies for one head dimension.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f32) -> Self {
        let half = head_dim / 2;
        let inv_freq = (0..half).map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64)).collect();
        Rope { inv_freq }
    }

    /// Rotate every head of `row` (heads x head_dim) for absolute position `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        let hd = half * 2;
        for head in row.chunks_exact_mut(hd) {
            for (i, f) in self.inv_freq.iter().enumerate() {
                let (s, c) = (pos as f64 * f).sin_cos();
                let (s, c) = (s as f32, c as f32);
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = a * s + b * c;
            }
        }
    }
}
