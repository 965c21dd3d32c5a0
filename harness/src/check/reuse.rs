//! The reuse count: what the warm engine reported against what the oracle says a correct engine takes, and
//! that reuse fired where it must (an optimisation that silently never engages passes every identity test).

use crate::driver::Generation;
use crate::record::{CheckName, CheckResult};

/// `expected`: the oracle's count, or why there is none (unknown arch, driver without reuse counts).
pub fn check(expected: Result<usize, String>, warm: &Generation, colds: &[&Generation]) -> Vec<CheckResult> {
    let expected = match expected {
        Ok(e) => e,
        Err(why) => {
            return vec![
                CheckResult::skipped(CheckName::Reuse, why.clone()),
                CheckResult::skipped(CheckName::ReuseFired, why),
            ]
        }
    };
    let Some(reused) = warm.reused else {
        let why = "the engine's reply carries no reuse count".to_string();
        return vec![
            CheckResult::skipped(CheckName::Reuse, why.clone()),
            CheckResult::skipped(CheckName::ReuseFired, why),
        ];
    };
    let mut out = Vec::with_capacity(2);
    let cold_reuse: Vec<usize> = colds.iter().filter_map(|c| c.reused).filter(|&r| r != 0).collect();
    let of = warm.prompt_tokens;
    out.push(if reused != expected {
        CheckResult::fail(CheckName::Reuse, format!("reused {reused} of {of} prompt tokens, expected {expected}"))
    } else if !cold_reuse.is_empty() {
        CheckResult::fail(CheckName::Reuse, format!("a fresh cold instance reported reuse {}", cold_reuse[0]))
    } else {
        CheckResult::pass(CheckName::Reuse, format!("reused {reused} of {of} prompt tokens, as expected"))
    });
    if expected > 0 {
        out.push(CheckResult::from_bool(
            CheckName::ReuseFired,
            reused > 0,
            if reused > 0 {
                format!("reuse fired ({reused})")
            } else {
                format!("reuse never fired (expected {expected})")
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Status;
    use kvproof_engines::engine::StopReason;
    use std::time::Duration;

    fn gen(reused: Option<usize>) -> Generation {
        Generation {
            tokens: vec![1],
            gaps: None,
            reused,
            prompt_tokens: 40,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            wall: Duration::ZERO,
            stop: StopReason::Length,
        }
    }

    fn statuses(r: &[CheckResult]) -> Vec<(CheckName, Status)> {
        r.iter().map(|c| (c.check, c.status)).collect()
    }

    #[test]
    fn exact_count_passes_and_fires() {
        let r = check(Ok(30), &gen(Some(30)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Pass), (CheckName::ReuseFired, Status::Pass)]);
    }

    #[test]
    fn silent_non_reuse_fails_both() {
        let r = check(Ok(30), &gen(Some(0)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Fail), (CheckName::ReuseFired, Status::Fail)]);
        assert!(r[0].detail.contains("reused 0 of 40"), "{}", r[0].detail);
    }

    #[test]
    fn reuse_where_none_is_allowed_fails() {
        let r = check(Ok(0), &gen(Some(31)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Fail)]);
    }

    #[test]
    fn a_cold_instance_that_reuses_fails() {
        let r = check(Ok(0), &gen(Some(0)), &[&gen(Some(3))]);
        assert_eq!(r[0].status, Status::Fail);
    }

    #[test]
    fn missing_counts_are_skipped_not_passed() {
        let r = check(Ok(30), &gen(None), &[]);
        assert!(r.iter().all(|c| c.status == Status::Skipped));
        let r = check(Err("no rule for arch x".into()), &gen(Some(1)), &[]);
        assert!(r.iter().all(|c| c.status == Status::Skipped && c.detail.contains("arch x")));
    }
}
