//! The two ways a request that did not fail ends, as every arch reports them.
//!
//! Shared so that a stop during prefill and a finished decode read the same from every engine: the reply
//! fields that do not depend on the arch are filled in one place.

use std::time::Duration;

use crate::decode::Decoded;
use crate::engine::{Reply, StopReason, Timings};

/// A request a STOP ended during prefill: nothing is emitted, since there are no prompt logits to sample from
/// yet; the segments prefilled so far stay in the state.
pub fn stopped_in_prefill(reused: usize, prompt_tokens: usize, prefill: Duration, prefix_log: String) -> Reply {
    Reply {
        tokens: vec![],
        gaps: vec![],
        reused,
        prompt_tokens,
        timings: Timings { prefill, decode: Duration::default() },
        stop: StopReason::Stopped,
        prefix_log,
    }
}

/// A request that reached decode: what it emitted and why it ended (`Length` unless decode named a reason).
/// `decoded.last_logits` is not part of the reply; an arch that keeps them takes them out first.
pub fn after_decode(
    decoded: Decoded,
    reused: usize,
    prompt_tokens: usize,
    prefill: Duration,
    decode: Duration,
    prefix_log: String,
) -> Reply {
    Reply {
        tokens: decoded.tokens,
        gaps: decoded.gaps,
        reused,
        prompt_tokens,
        timings: Timings { prefill, decode },
        stop: decoded.stop.unwrap_or(StopReason::Length),
        prefix_log,
    }
}
