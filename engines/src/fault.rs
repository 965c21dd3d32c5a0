//! The fault catalog: named, deliberate bugs — the real bug classes from the prefix-reuse write-ups.
//!
//! Every fault is off unless asked for. They exist so the gate can prove it catches each one.

use std::str::FromStr;

use strum::IntoEnumIterator;

/// Each fault's name is its variant in kebab-case (`CounterReuse` is `counter-reuse`); `Fault::iter()` lists them
/// in declaration order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::EnumIter, strum::IntoStaticStr, strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
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
    pub fn name(self) -> &'static str {
        self.into()
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

/// A name that is not in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault `{0}`")]
pub struct UnknownFault(pub String);

impl FromStr for Fault {
    type Err = UnknownFault;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::iter().find(|f| f.name() == s).ok_or_else(|| UnknownFault(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Fault::iter() {
            assert_eq!(f.name().parse::<Fault>(), Ok(f));
        }
        assert_eq!(
            (Fault::CounterReuse.name(), Fault::ShareOffByOne.to_string()),
            ("counter-reuse", "share-off-by-one".into())
        );
        assert_eq!(Fault::iter().count(), 18);
        assert!("nope".parse::<Fault>().is_err());
    }
}
