//! glm's reuse decision: truncate the slot to the longest common prefix of its record and the prompt (bounded by
//! prompt length - 1, so at least one id is prefilled and sampled from), or — with `kv_share` on and an empty
//! slot — adopt the longest matching prefix another slot holds, by copying its rows.
//!
//! Rows are position-addressed and self-contained (a row depends only on the ids at 0..=t), so both are exact.

use super::state::State;
use crate::engine_loop::Slot;
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};

pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many positions of `st` stand in for `prompt` (the rest of the slot is truncated away).
pub fn own(st: &Slot<State>, prompt: &[u32], fault: Option<Fault>) -> Decision {
    let len = prompt.len();
    let rec = &st.record;
    if fault == Some(Fault::CounterReuse) {
        return st.counter_reuse(len);
    }
    if !rec.is_allocated() {
        return Decision::Fresh(NoReuse::Absent);
    }
    if rec.is_tainted() {
        return Decision::Fresh(NoReuse::Tainted);
    }
    let ids = rec.ids();
    if ids.is_empty() {
        return Decision::Fresh(NoReuse::Empty);
    }
    let lcp = if fault == Some(Fault::MemcmpShort) {
        // the bug: the comparison stops one id short, so a divergence at the last recorded id slips through
        let compared = (ids.len() - 1).min(len);
        (0..compared).find(|&i| ids[i] != prompt[i]).unwrap_or(ids.len().min(len))
    } else {
        common_prefix(ids, prompt)
    };
    // one id is always prefilled: its logits are what the first token is sampled from (reuse-equal drops that)
    let bound = if fault == Some(Fault::ReuseEqual) { len } else { len - 1 };
    match lcp.min(bound) {
        0 if lcp == 0 => Decision::Fresh(NoReuse::Diverged { at: 0 }),
        0 => Decision::Fresh(NoReuse::Shorter),
        r => Decision::Reuse(r),
    }
}

/// With sharing on and `target` empty: the slot holding the longest prefix of `prompt` (lowest index on a tie)
/// and how many of its rows to copy, bounded by prompt length - 1.
pub fn share_source(
    slots: &[Slot<State>],
    target: usize,
    prompt: &[u32],
    fault: Option<Fault>,
) -> Option<(usize, usize)> {
    if !slots.get(target)?.is_empty() {
        return None;
    }
    let mut best: Option<(usize, usize)> = None;
    for (o, st) in slots.iter().enumerate() {
        if o == target || !st.record.is_allocated() || st.record.is_tainted() {
            continue;
        }
        let lcp = common_prefix(st.record.ids(), prompt).min(st.len);
        // share-off-by-one: the copy takes the row after the common prefix too
        let n = if fault == Some(Fault::ShareOffByOne) { lcp + 1 } else { lcp };
        let n = n.min(prompt.len() - 1).min(st.len);
        if n > best.map_or(0, |(_, b)| b) {
            best = Some((o, n));
        }
    }
    best
}
