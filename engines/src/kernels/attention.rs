//! Scaled dot-product attention for one query head over keys given in ascending position order.

use super::{dot, softmax_in_place};

/// `out = softmax(q·kᵢ · scale) · vᵢ` over the (key, value) rows yielded, in the order yielded.
///
/// Callers yield keys in ascending absolute position, so the reduction order depends only on which positions are
/// visible — never on where the rows are stored (ring, scratch, full cache).
pub fn attend<'a>(
    q: &[f32],
    kv: impl Iterator<Item = (&'a [f32], &'a [f32])> + Clone,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    scores.extend(kv.clone().map(|(k, _)| dot(q, k) * scale));
    softmax_in_place(scores);
    out.iter_mut().for_each(|o| *o = 0.0);
    for (p, (_, v)) in scores.iter().zip(kv) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}
