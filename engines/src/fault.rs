//! The fault catalog: named, deliberate bugs — the real bug classes from the prefix-reuse write-ups.
//!
//! Every fault is off unless asked for. They exist so the gate can prove it catches each one.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// Reuse length derived from the caller's counts (prompt + generated - 1), ids never compared.
    CounterReuse,
    /// Reply recorded in bulk after decode: claims the last token, which was never fed.
    BulkRecord,
    /// The id comparison stops one short: divergence at the last recorded id slips through.
    MemcmpShort,
    /// An equal or shorter prompt is "reused": the state cannot be rewound, sampling starts from stale logits.
    ReuseEqual,
    /// A record write past capacity truncates instead of dropping: claims rows that were never written.
    OverrunTruncate,
    /// Audio frames do not taint the record: two different clips with the same ids match.
    NoTaint,
    /// Growing capacity copies a wrapped ring linearly: a rotated cache.
    RingLinearCopy,
    /// Growing capacity loses the record: reuse silently stops.
    DropGrowRecord,
    /// A prefill batch is appended to the ring before scoring: with S > window it overwrites history.
    RingAppendFirst,
    /// glm: a request's slot keeps rows of its previous conversation.
    StaleSlot,
    /// glm: cross-slot share copies one row too many.
    ShareOffByOne,
    /// kimi: state buffers reallocated each turn and never freed.
    KvLeak,
    /// kimi: LCP truncation applied to a recurrent state.
    TruncateRecurrent,
    /// deepseek: a failed segment is still recorded.
    RecordOnFailure,
    /// glm53: chunk boundaries depend on the prompt length.
    VariableChunks,
    /// glm53: reuse not bounded by the previous prompt length (decode-written rows reused).
    NoCanonicalBound,
    /// glm53: reuse offset not rounded down to the chunk grid.
    NoGridQuantize,
    /// glm53: the speculative drafter is not resumed at the reuse offset.
    DrafterNotResumed,
}

impl Fault {
    pub const ALL: [Fault; 18] = [
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::OverrunTruncate,
        Fault::NoTaint,
        Fault::RingLinearCopy,
        Fault::DropGrowRecord,
        Fault::RingAppendFirst,
        Fault::StaleSlot,
        Fault::ShareOffByOne,
        Fault::KvLeak,
        Fault::TruncateRecurrent,
        Fault::RecordOnFailure,
        Fault::VariableChunks,
        Fault::NoCanonicalBound,
        Fault::NoGridQuantize,
        Fault::DrafterNotResumed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::CounterReuse => "counter-reuse",
            Fault::BulkRecord => "bulk-record",
            Fault::MemcmpShort => "memcmp-short",
            Fault::ReuseEqual => "reuse-equal",
            Fault::OverrunTruncate => "overrun-truncate",
            Fault::NoTaint => "no-taint",
            Fault::RingLinearCopy => "ring-linear-copy",
            Fault::DropGrowRecord => "drop-grow-record",
            Fault::RingAppendFirst => "ring-append-first",
            Fault::StaleSlot => "stale-slot",
            Fault::ShareOffByOne => "share-off-by-one",
            Fault::KvLeak => "kv-leak",
            Fault::TruncateRecurrent => "truncate-recurrent",
            Fault::RecordOnFailure => "record-on-failure",
            Fault::VariableChunks => "variable-chunks",
            Fault::NoCanonicalBound => "no-canonical-bound",
            Fault::NoGridQuantize => "no-grid-quantize",
            Fault::DrafterNotResumed => "drafter-not-resumed",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Fault::CounterReuse => "reuse length from prompt_count + generated - 1, ids never compared",
            Fault::BulkRecord => "reply recorded after decode, claiming the never-fed last token",
            Fault::MemcmpShort => "id comparison one short: divergence at the last recorded id slips through",
            Fault::ReuseEqual => "equal or shorter prompt reused from a state that cannot be rewound",
            Fault::OverrunTruncate => "record write past capacity truncates instead of dropping",
            Fault::NoTaint => "audio frames do not taint the record",
            Fault::RingLinearCopy => "capacity growth copies a wrapped ring linearly (rotated cache)",
            Fault::DropGrowRecord => "capacity growth loses the record (reuse silently stops)",
            Fault::RingAppendFirst => "prefill batch appended to the ring before scoring",
            Fault::StaleSlot => "a slot keeps rows of its previous conversation",
            Fault::ShareOffByOne => "cross-slot share copies one row too many",
            Fault::KvLeak => "state buffers reallocated every turn, never freed",
            Fault::TruncateRecurrent => "LCP truncation applied to a recurrent state",
            Fault::RecordOnFailure => "a failed prefill segment is still recorded",
            Fault::VariableChunks => "chunk boundaries depend on the prompt length",
            Fault::NoCanonicalBound => "reuse not bounded by the previous prompt length",
            Fault::NoGridQuantize => "reuse offset not rounded down to the chunk grid",
            Fault::DrafterNotResumed => "speculative drafter not resumed at the reuse offset",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault `{0}`")]
pub struct UnknownFault(pub String);

impl FromStr for Fault {
    type Err = UnknownFault;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| UnknownFault(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Fault::ALL {
            assert_eq!(f.name().parse::<Fault>(), Ok(f));
        }
        assert!("nope".parse::<Fault>().is_err());
    }
}
