//! The checks kvproof makes, by name: results carry them, reports and the mutants table key on them, and a
//! scenario names the ones it requires (`assert.require`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every check by name; the mutants table and the reports key on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
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
    /// growth-curve: the warm ratio over the ratio the model's cost expects of a correct engine is within
    /// `assert.max_warm_ratio_over_expected` (a scenario-level check; skipped when the engine reports no cost).
    WarmGrowth,
    /// The scenario's failure-rate bound (a scenario-level check).
    Rate,
}

impl CheckName {
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Judged once on the scenario as a whole, never on a trial.
    pub fn is_scenario_level(self) -> bool {
        matches!(self, CheckName::WarmGrowth | CheckName::Rate)
    }

    /// Failures of these do not depend on sampling: a noisy control cannot excuse them.
    pub fn is_deterministic(self) -> bool {
        matches!(
            self,
            CheckName::Reuse | CheckName::ReuseFired | CheckName::Record | CheckName::Coverage | CheckName::Memory
        )
    }
}
