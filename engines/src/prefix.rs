//! The prefix record: the ids a slot's state was built from, recorded *where they are fed*.
//!
//! It is the only description of the state anyone consults when deciding reuse; nothing derives a reusable
//! length from a caller's counts. The rules (seed 000, `kv_prefix.h`):
//! - `reuse(prompt)` is the whole recorded length or 0. It is 0 with no record, a tainted record, an empty
//!   record, a prompt not longer than the record (nothing left to prefill), or any differing id.
//! - `record(pos0, ids)` past capacity drops the whole record; it never truncates.
//! - `taint()`: the state consumed input ids cannot describe; a tainted record never matches.
//! - `grow(cap, keep)` keeps `min(keep, len, cap)` ids; failure leaves the record empty, never stale.

use std::fmt;

use crate::fault::Fault;

/// Why a prompt was not reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReuse {
    /// No record allocated.
    Absent,
    Empty,
    Tainted,
    /// The prompt is not longer than the record (equal or shorter).
    Shorter,
    /// The first differing position.
    Diverged {
        at: usize,
    },
}

impl NoReuse {
    pub fn label(self) -> &'static str {
        match self {
            NoReuse::Absent | NoReuse::Empty => "empty",
            NoReuse::Tainted => "tainted",
            NoReuse::Shorter => "shorter",
            NoReuse::Diverged { .. } => "diverged",
        }
    }
}

/// The decision for one prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Reuse(usize),
    Fresh(NoReuse),
}

impl Decision {
    pub fn reused(self) -> usize {
        match self {
            Decision::Reuse(n) => n,
            Decision::Fresh(_) => 0,
        }
    }
}

/// The record of one slot.
#[derive(Clone, Default)]
pub struct PrefixRecord {
    ids: Vec<u32>,
    cap: usize,
    allocated: bool,
    tainted: bool,
    /// A record-level fault (memcmp-short, reuse-equal, overrun-truncate); other faults are ignored here.
    fault: Option<Fault>,
}

impl fmt::Debug for PrefixRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixRecord")
            .field("len", &self.ids.len())
            .field("cap", &self.cap)
            .field("allocated", &self.allocated)
            .field("tainted", &self.tainted)
            .finish()
    }
}

impl PrefixRecord {
    /// An absent record (never allocated): it matches nothing.
    pub fn absent() -> Self {
        PrefixRecord::default()
    }

    /// A fresh, empty record able to hold `cap` ids.
    pub fn with_capacity(cap: usize) -> Self {
        let mut r = PrefixRecord::default();
        r.alloc(cap);
        r
    }

    /// Carry a record-level fault (used by the fault catalog).
    pub fn with_fault(mut self, fault: Option<Fault>) -> Self {
        self.fault = fault;
        self
    }

    /// (Re-)allocate: the record becomes empty and untainted with capacity `cap`.
    pub fn alloc(&mut self, cap: usize) {
        self.ids.clear();
        self.cap = cap;
        self.allocated = true;
        self.tainted = false;
    }

    /// Release the record: it becomes absent.
    pub fn free(&mut self) {
        self.ids = Vec::new();
        self.cap = 0;
        self.allocated = false;
        self.tainted = false;
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn is_tainted(&self) -> bool {
        self.tainted
    }

    pub fn is_allocated(&self) -> bool {
        self.allocated
    }

    /// How much of `prompt` the state may stand in for, and why not when it may not.
    pub fn decide(&self, prompt: &[u32]) -> Decision {
        if !self.allocated {
            return Decision::Fresh(NoReuse::Absent);
        }
        if self.tainted {
            return Decision::Fresh(NoReuse::Tainted);
        }
        let len = self.ids.len();
        if len == 0 {
            return Decision::Fresh(NoReuse::Empty);
        }
        let reuse_equal = self.fault == Some(Fault::ReuseEqual);
        if prompt.len() <= len && !reuse_equal {
            return Decision::Fresh(NoReuse::Shorter);
        }
        // memcmp-short compares one id too few: the last recorded id is never looked at.
        let compared = if self.fault == Some(Fault::MemcmpShort) { len - 1 } else { len };
        let compared = compared.min(prompt.len());
        if let Some(at) = (0..compared).find(|&i| self.ids[i] != prompt[i]) {
            return Decision::Fresh(NoReuse::Diverged { at });
        }
        if prompt.len() <= len {
            // Only reachable under reuse-equal: claims the prompt from a state that cannot be rewound.
            return Decision::Reuse(prompt.len());
        }
        Decision::Reuse(len)
    }

    /// The whole recorded length, or 0.
    pub fn reuse(&self, prompt: &[u32]) -> usize {
        self.decide(prompt).reused()
    }

    /// Record `ids` as fed at positions `pos0..pos0 + ids.len()`.
    ///
    /// Returns false when the record was dropped: a write past capacity, or a write that leaves a hole.
    pub fn record(&mut self, pos0: usize, ids: &[u32]) -> bool {
        if !self.allocated {
            return false;
        }
        if pos0 > self.ids.len() {
            // A hole: the record could no longer describe the state position by position.
            self.ids.clear();
            return false;
        }
        let end = pos0 + ids.len();
        if end > self.cap {
            if self.fault == Some(Fault::OverrunTruncate) {
                self.ids.truncate(pos0);
                let fit = self.cap.saturating_sub(pos0);
                self.ids.extend_from_slice(&ids[..fit.min(ids.len())]);
                return true;
            }
            self.ids.clear();
            return false;
        }
        self.ids.truncate(pos0);
        self.ids.extend_from_slice(ids);
        true
    }

    /// The state consumed input ids cannot describe.
    pub fn taint(&mut self) {
        self.tainted = true;
    }

    /// Forget the recorded ids (the state is being rebuilt from position 0).
    pub fn clear(&mut self) {
        self.ids.clear();
        self.tainted = false;
    }

    /// Change capacity to `cap`, keeping `min(keep, len, cap)` ids. Growing to 0 fails and leaves the record empty.
    pub fn grow(&mut self, cap: usize, keep: usize) -> bool {
        if cap == 0 || !self.allocated {
            self.ids.clear();
            self.cap = cap;
            self.allocated = cap > 0;
            return false;
        }
        let keep = keep.min(self.ids.len()).min(cap);
        self.ids.truncate(keep);
        self.cap = cap;
        true
    }

    /// The line `KVPROOF_PREFIX_LOG=1` prints for a decision.
    pub fn log_line(&self, prompt_len: usize, decision: Decision) -> String {
        match decision {
            Decision::Reuse(r) => {
                let pct = if prompt_len == 0 { 0.0 } else { 100.0 * r as f64 / prompt_len as f64 };
                format!("[PREFIX] reusing {r} of {prompt_len} prompt tokens ({pct:.0}%)")
            }
            Decision::Fresh(why) => {
                format!("[PREFIX] no reuse: held={} prompt={prompt_len} ({})", self.ids.len(), why.label())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(ids: &[u32]) -> PrefixRecord {
        let mut r = PrefixRecord::with_capacity(64);
        assert!(r.record(0, ids));
        r
    }

    #[test]
    fn empty_record_never_matches() {
        let r = PrefixRecord::with_capacity(16);
        assert_eq!(r.decide(&[1, 2, 3]), Decision::Fresh(NoReuse::Empty));
    }

    #[test]
    fn absent_record_never_matches() {
        let r = PrefixRecord::absent();
        assert_eq!(r.decide(&[1, 2, 3]), Decision::Fresh(NoReuse::Absent));
        let mut r = r;
        assert!(!r.record(0, &[1]), "an absent record accepts nothing");
        assert_eq!(r.reuse(&[1, 2]), 0);
    }

    #[test]
    fn extend_reuses_whole_record() {
        assert_eq!(rec(&[1, 2, 3]).reuse(&[1, 2, 3, 4, 5]), 3);
    }

    #[test]
    fn divergence_in_the_middle() {
        assert_eq!(rec(&[1, 2, 3, 4]).decide(&[1, 2, 9, 4, 5]), Decision::Fresh(NoReuse::Diverged { at: 2 }));
    }

    #[test]
    fn divergence_at_the_first_id() {
        assert_eq!(rec(&[1, 2, 3]).decide(&[9, 2, 3, 4]), Decision::Fresh(NoReuse::Diverged { at: 0 }));
    }

    #[test]
    fn divergence_at_the_last_recorded_id() {
        assert_eq!(rec(&[1, 2, 3]).decide(&[1, 2, 9, 4]), Decision::Fresh(NoReuse::Diverged { at: 2 }));
    }

    #[test]
    fn equal_length_prompt_is_not_reused() {
        assert_eq!(rec(&[1, 2, 3]).decide(&[1, 2, 3]), Decision::Fresh(NoReuse::Shorter));
    }

    #[test]
    fn shorter_prompt_is_not_reused() {
        assert_eq!(rec(&[1, 2, 3]).decide(&[1, 2]), Decision::Fresh(NoReuse::Shorter));
    }

    #[test]
    fn appending_the_reply_extends_the_record() {
        let mut r = rec(&[1, 2, 3]);
        // decode feeds each generated id (but the last) at its position
        assert!(r.record(3, &[7]));
        assert!(r.record(4, &[8]));
        assert_eq!(r.ids(), &[1, 2, 3, 7, 8]);
        assert_eq!(r.reuse(&[1, 2, 3, 7, 8, 9, 10]), 5);
    }

    #[test]
    fn taint_blocks_reuse_until_cleared() {
        let mut r = rec(&[1, 2, 3]);
        r.taint();
        assert_eq!(r.decide(&[1, 2, 3, 4]), Decision::Fresh(NoReuse::Tainted));
        r.clear();
        assert!(!r.is_tainted());
        assert!(r.is_empty());
    }

    #[test]
    fn clear_empties_the_record() {
        let mut r = rec(&[1, 2, 3]);
        r.clear();
        assert_eq!(r.reuse(&[1, 2, 3, 4]), 0);
    }

    #[test]
    fn overrun_drops_the_record() {
        let mut r = PrefixRecord::with_capacity(4);
        assert!(r.record(0, &[1, 2, 3]));
        assert!(!r.record(3, &[4, 5]), "a write past capacity is refused");
        assert_eq!(r.len(), 0, "and drops the whole record, never truncating");
    }

    #[test]
    fn overrun_truncate_fault_claims_unwritten_rows() {
        let mut r = PrefixRecord::with_capacity(4).with_fault(Some(Fault::OverrunTruncate));
        assert!(r.record(0, &[1, 2, 3]));
        assert!(r.record(3, &[4, 5]));
        assert_eq!(r.ids(), &[1, 2, 3, 4]);
    }

    #[test]
    fn a_hole_drops_the_record() {
        let mut r = rec(&[1, 2]);
        assert!(!r.record(5, &[3]));
        assert!(r.is_empty());
    }

    #[test]
    fn realloc_starts_empty() {
        let mut r = rec(&[1, 2, 3]);
        r.taint();
        r.alloc(32);
        assert!(r.is_empty());
        assert!(!r.is_tainted());
        assert_eq!(r.capacity(), 32);
    }

    #[test]
    fn grow_keeps_the_record() {
        let mut r = rec(&[1, 2, 3]);
        assert!(r.grow(128, 3));
        assert_eq!(r.ids(), &[1, 2, 3]);
        assert_eq!(r.capacity(), 128);
    }

    #[test]
    fn grow_clamps_keep_to_len_and_cap() {
        let mut r = rec(&[1, 2, 3, 4, 5]);
        assert!(r.grow(128, 99));
        assert_eq!(r.len(), 5, "keep clamps to len");
        assert!(r.grow(3, 5));
        assert_eq!(r.ids(), &[1, 2, 3], "keep clamps to cap");
        assert!(r.grow(8, 2));
        assert_eq!(r.ids(), &[1, 2], "keep itself");
    }

    #[test]
    fn grow_to_zero_fails_empty() {
        let mut r = rec(&[1, 2, 3]);
        assert!(!r.grow(0, 3));
        assert!(r.is_empty());
        assert_eq!(r.reuse(&[1, 2, 3, 4]), 0);
    }

    #[test]
    fn shrink_keeps_what_fits() {
        let mut r = rec(&[1, 2, 3, 4]);
        assert!(r.grow(2, 4));
        assert_eq!(r.ids(), &[1, 2]);
        assert!(!r.record(2, &[3, 4, 5]), "capacity is the new, smaller one");
    }

    #[test]
    fn free_makes_the_record_absent() {
        let mut r = rec(&[1, 2, 3]);
        r.free();
        assert!(!r.is_allocated());
        assert_eq!(r.decide(&[1, 2, 3, 4]), Decision::Fresh(NoReuse::Absent));
    }

    #[test]
    fn memcmp_short_fault_misses_last_id_divergence() {
        let r = rec(&[1, 2, 3]).with_fault(Some(Fault::MemcmpShort));
        assert_eq!(r.reuse(&[1, 2, 9, 4]), 3);
    }

    #[test]
    fn reuse_equal_fault_reuses_equal_prompt() {
        let r = rec(&[1, 2, 3]).with_fault(Some(Fault::ReuseEqual));
        assert_eq!(r.reuse(&[1, 2, 3]), 3);
        assert_eq!(r.reuse(&[1, 2]), 2);
    }

    #[test]
    fn log_lines() {
        let r = rec(&[1, 2, 3]);
        assert_eq!(r.log_line(4, r.decide(&[1, 2, 3, 4])), "[PREFIX] reusing 3 of 4 prompt tokens (75%)");
        assert_eq!(r.log_line(2, r.decide(&[1, 2])), "[PREFIX] no reuse: held=3 prompt=2 (shorter)");
    }

    proptest! {
        #[test]
        fn reuse_is_all_or_nothing_and_implies_strict_prefix(
            recorded in proptest::collection::vec(0u32..4, 0..12),
            prompt in proptest::collection::vec(0u32..4, 0..16),
            tainted in any::<bool>(),
        ) {
            let mut r = PrefixRecord::with_capacity(32);
            prop_assert!(r.record(0, &recorded));
            if tainted { r.taint(); }
            let n = r.reuse(&prompt);
            prop_assert!(n == 0 || n == recorded.len());
            if n > 0 {
                prop_assert!(!tainted);
                prop_assert!(prompt.len() > recorded.len());
                prop_assert_eq!(&prompt[..recorded.len()], &recorded[..]);
            }
        }

        #[test]
        fn strict_extension_is_always_reused(
            recorded in proptest::collection::vec(0u32..300, 1..20),
            tail in proptest::collection::vec(0u32..300, 1..8),
        ) {
            let mut r = PrefixRecord::with_capacity(64);
            prop_assert!(r.record(0, &recorded));
            let prompt: Vec<u32> = recorded.iter().chain(tail.iter()).copied().collect();
            prop_assert_eq!(r.reuse(&prompt), recorded.len());
        }
    }
}
