//! The decode loop every engine shares: sample, emit, and feed each token back — except the last one emitted,
//! which is never fed (so it is never recorded either).

use crate::engine::{Flow, Observer, Request, StopReason, TokenEvent};
use crate::error::{EngineError, Result};
use crate::tokenizer::EOS;

/// The emitted tokens and why decoding ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    pub tokens: Vec<u32>,
    pub gaps: Vec<f32>,
    pub stop: Option<StopReason>,
    /// Logits after the last fed position.
    pub last_logits: Vec<f32>,
}

/// Which ids a model may generate, and which one ends a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generable {
    pub eos: u32,
    /// Only byte ids and eos (the bundled byte tokenizer: role markers, audio and padding are input-only ids);
    /// false: every id of the vocabulary.
    pub bytes_only: bool,
}

impl Generable {
    /// The bundled byte tokenizer's rule.
    pub const BYTES: Generable = Generable { eos: EOS, bytes_only: true };
}

/// Only byte ids and eos may be generated: role markers, audio and padding are input-only ids.
pub fn mask_input_only(logits: &[f32]) -> Vec<f32> {
    logits.iter().enumerate().map(|(i, &l)| if i < 256 || i == EOS as usize { l } else { f32::NEG_INFINITY }).collect()
}

/// Decode from `logits` (those after the prompt's last position), feeding tokens at `pos0, pos0 + 1, ...`
/// while `pos < limit`. `feed(id, pos, step)` feeds one token into the state (and records it where the engine
/// records) and returns the next logits. On `Flow::Cancel` returns `EngineError::Cancelled`; the caller taints.
pub fn decode(
    logits: Vec<f32>,
    req: &Request,
    pos0: usize,
    limit: usize,
    observer: &mut dyn Observer,
    feed: impl FnMut(u32, usize, usize) -> Vec<f32>,
) -> Result<Decoded> {
    decode_with(Generable::BYTES, logits, req, pos0, limit, observer, feed)
}

/// `decode` for a model whose generable ids and eos are `gen`.
pub fn decode_with(
    gen: Generable,
    logits: Vec<f32>,
    req: &Request,
    pos0: usize,
    limit: usize,
    observer: &mut dyn Observer,
    mut feed: impl FnMut(u32, usize, usize) -> Vec<f32>,
) -> Result<Decoded> {
    let eos = gen.eos;
    let mut out = Decoded { last_logits: logits, ..Default::default() };
    for (step, pos) in (0..req.max_tokens).zip(pos0..) {
        let mut allowed = if gen.bytes_only { mask_input_only(&out.last_logits) } else { out.last_logits.clone() };
        if req.ignore_eos {
            if let Some(l) = allowed.get_mut(eos as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let pick = crate::sampler::sample(&allowed, &req.sampling, step, req.logprobs);
        out.tokens.push(pick.id);
        out.gaps.push(pick.gap);
        let flow = observer.on_token(&TokenEvent { id: pick.id, gap: pick.gap, top: pick.top });
        if flow == Flow::Cancel {
            return Err(EngineError::Cancelled);
        }
        if pick.id == eos {
            out.stop = Some(StopReason::Eos);
            return Ok(out);
        }
        if flow == Flow::Stop {
            out.stop = Some(StopReason::Stopped);
            return Ok(out);
        }
        if step + 1 == req.max_tokens || pos >= limit {
            break;
        }
        out.last_logits = feed(pick.id, pos, step);
    }
    out.stop = Some(StopReason::Length);
    Ok(out)
}
