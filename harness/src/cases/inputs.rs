//! Scenario values that cannot run on the engine that was started: a slot it does not report, user texts longer
//! than its context holds. Checked before any trial runs, as input errors naming the field; never cut to fit.

use kvproof_engines::engine::EngineInfo;

use crate::scenario::{Params, Scenario};

/// Whether `scenario`'s values fit the engine `info` describes; else why not, led by the field.
pub fn check(scenario: &Scenario, info: &EngineInfo) -> Result<(), String> {
    scenario.params.check_slots(info.slots, "the engine")?;
    if let Params::StressPairs(p) = &scenario.params {
        // text from a corpus is sized by its file, not by `user_len`
        if scenario.corpus.is_none() {
            super::stress_pairs::check_user_len(p, info)?;
        }
    }
    Ok(())
}
