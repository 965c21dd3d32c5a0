//! A check's result as records carry it: which check, whether it passed, failed or was skipped, and why; and a
//! trial's verdict.

use serde::{Deserialize, Serialize};

/// Every check by name; the mutants table and the reports key on these.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum CheckName {
    /// Warm and cold ended the same way (both replied, or both refused with the same code), as expected.
    Outcome,
    /// Warm and cold emitted the same tokens.
    Tokens,
    /// Two cold instances emitted the same tokens (otherwise the trial is noise, not a reuse bug).
    Control,
    /// The reported reuse equals the expected count; cold instances reuse nothing.
    Reuse,
    /// Reuse is non-zero where it must fire.
    ReuseFired,
    /// The record holds exactly the ids fed (and is tainted exactly when it must be).
    Record,
    /// The state after the turn, warm vs cold, row by row by absolute position.
    State,
    /// Every position the state and record claim has its row, at the place the cache kind puts it.
    Coverage,
    /// The state's bytes follow its capacity, not the turn count (no buffers leaked per turn).
    Memory,
    /// The scenario's failure-rate bound (a scenario-level check).
    Rate,
}

impl CheckName {
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Failures of these do not depend on sampling: a noisy control cannot excuse them.
    pub fn is_deterministic(self) -> bool {
        matches!(
            self,
            CheckName::Reuse | CheckName::ReuseFired | CheckName::Record | CheckName::Coverage | CheckName::Memory
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    Skipped,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub check: CheckName,
    pub status: Status,
    /// What was compared, what differed, or why the check was skipped.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl CheckResult {
    pub fn pass(check: CheckName, detail: impl Into<String>) -> Self {
        CheckResult { check, status: Status::Pass, detail: detail.into() }
    }
    pub fn fail(check: CheckName, detail: impl Into<String>) -> Self {
        CheckResult { check, status: Status::Fail, detail: detail.into() }
    }
    pub fn skipped(check: CheckName, why: impl Into<String>) -> Self {
        CheckResult { check, status: Status::Skipped, detail: why.into() }
    }
    /// Pass when `ok`, else fail with the same detail.
    pub fn from_bool(check: CheckName, ok: bool, detail: impl Into<String>) -> Self {
        if ok {
            Self::pass(check, detail)
        } else {
            Self::fail(check, detail)
        }
    }
}

/// A trial's verdict.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The cold-vs-cold control disagreed: the engine is not deterministic here, so a token or state difference
    /// says nothing about reuse.
    Inconclusive,
    /// The engine died, hung, or could not be started.
    Error,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    #[test]
    fn names_round_trip_through_json() {
        for c in CheckName::iter() {
            let json = serde_json::to_string(&c).expect("json");
            assert_eq!(json, format!("\"{}\"", c.name()));
        }
    }
}
