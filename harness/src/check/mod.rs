//! Every judgement kvproof makes. Each check yields a `CheckResult` (a record): passed, failed (with what
//! differed), or skipped (with why it could not be performed — never counted as passed).
//!
//! `turn`: all checks of one compared turn, composed. `tokens`: warm vs cold token identity, the cold-vs-cold
//! control, the first divergence and its top-2 gap. `reuse`: the reported reuse against the oracle, and that reuse
//! fired where it must. `state`: the state dumps row by row, the record, and the layout of every cache (coverage,
//! ring placement). `memory`: the state's bytes follow its capacity, not the turn count. `growth`: a growth
//! curve's slopes, ratios and speedup against its assertions. `staleness`: a warm reply classified fresh,
//! stale(X) or corrupt, and the counts per stale context. `scenario`: a scenario's verdict from its trials.

pub mod agentic;
pub mod growth;
pub mod memory;
pub mod reuse;
pub mod scenario;
pub mod staleness;
pub mod state;
pub mod tokens;
pub mod turn;

use crate::record::{CheckName, CheckResult, Status, Verdict};

/// The verdict the checks add up to (a trial with an engine error is `Error` before any check runs).
pub fn verdict(checks: &[CheckResult]) -> Verdict {
    let failed = |c: &CheckResult| c.status == Status::Fail;
    let noisy = checks.iter().any(|c| c.check == CheckName::Control && failed(c));
    if noisy {
        if checks.iter().any(|c| failed(c) && c.check.is_deterministic()) {
            return Verdict::Fail;
        }
        return Verdict::Inconclusive;
    }
    if checks.iter().any(failed) {
        Verdict::Fail
    } else {
        Verdict::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_excuses_tokens_but_not_reuse() {
        let tokens = CheckResult::fail(CheckName::Tokens, "differ");
        let control = CheckResult::fail(CheckName::Control, "cold runs differ");
        let reuse = CheckResult::fail(CheckName::Reuse, "5 != 0");
        assert_eq!(verdict(&[tokens.clone(), control.clone()]), Verdict::Inconclusive);
        assert_eq!(verdict(&[tokens.clone(), control, reuse]), Verdict::Fail);
        assert_eq!(verdict(&[tokens]), Verdict::Fail);
    }

    #[test]
    fn skipped_is_not_failed_and_not_enough_to_fail() {
        let checks = [CheckResult::pass(CheckName::Tokens, ""), CheckResult::skipped(CheckName::State, "no dumps")];
        assert_eq!(verdict(&checks), Verdict::Pass);
    }
}
