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

    /// The (sin, cos) of each pair's angle at position `pos`: the same for every head of every row at `pos`, so a
    /// caller rotating several rows there computes them once (the f64 `sin_cos` is the costly part).
    pub fn angles(&self, pos: usize) -> Vec<(f32, f32)> {
        angles(&self.inv_freq, pos)
    }

    /// Rotate every head of `row` (heads x head_dim) by `angles` (from `angles`).
    pub fn rotate(&self, row: &mut [f32], angles: &[(f32, f32)]) {
        let half = self.inv_freq.len();
        for head in row.chunks_exact_mut(half * 2) {
            for (i, &(s, c)) in angles.iter().enumerate() {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = a * s + b * c;
            }
        }
    }
}

/// The (sin, cos) of `pos · f` for each inverse frequency `f`, computed in f64 and rounded to f32: a position's
/// rotation angles, whatever the layout the rope pairs its elements in.
pub fn angles(inv_freq: &[f64], pos: usize) -> Vec<(f32, f32)> {
    inv_freq
        .iter()
        .map(|f| {
            let (s, c) = (pos as f64 * f).sin_cos();
            (s as f32, c as f32)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every head of a row is rotated alone, element `i` with element `i + half` of the same head, by the angle
    /// `pos · θ^(-2i/d)` computed in f64: against that formula written out, for three heads at several positions.
    #[test]
    fn each_head_rotates_its_own_halves_by_the_position_angle() {
        let (hd, heads) = (8, 3);
        let rope = Rope::new(hd, 10000.0);
        let row: Vec<f32> = (0..hd * heads).map(|i| (i as f32 * 0.37).sin()).collect();
        for pos in [0, 1, 7, 4095] {
            let mut got = row.clone();
            rope.rotate(&mut got, &rope.angles(pos));
            for (h, head) in row.chunks_exact(hd).enumerate() {
                for i in 0..hd / 2 {
                    let angle = pos as f64 * (1.0 / 10000f64.powf(2.0 * i as f64 / hd as f64));
                    let (s, c) = (angle.sin() as f32, angle.cos() as f32);
                    let (a, b) = (head[i], head[i + hd / 2]);
                    assert_eq!(got[h * hd + i].to_bits(), (a * c - b * s).to_bits(), "pos {pos} head {h} pair {i}");
                    assert_eq!(got[h * hd + i + hd / 2].to_bits(), (a * s + b * c).to_bits(), "pos {pos} head {h}");
                }
            }
        }
    }
}
