//! The reuse count: what the warm engine reported against what the oracle says a correct engine takes, and
//! that reuse fired where it must (an optimisation that silently never engages passes every identity test).

use crate::driver::Generation;
use crate::record::{CheckName, CheckResult};

/// `expected`: the oracle's count, or why there is none (no rule for the engine, driver without reuse counts).
/// `must_reuse`: the turn strictly extends everything its slot fed, so any prefix cache reuses something — what
/// `reuse-fired` holds an engine to when there is no rule to give an exact count.
pub fn check(
    expected: Result<usize, String>,
    must_reuse: bool,
    warm: &Generation,
    colds: &[&Generation],
) -> Vec<CheckResult> {
    let Some(reused) = warm.reused else {
        let why = match &expected {
            Err(why) if why.contains("no reuse count") => why.clone(),
            _ => "the engine's reply carries no reuse count".to_string(),
        };
        return vec![
            CheckResult::skipped(CheckName::Reuse, why.clone()),
            CheckResult::skipped(CheckName::ReuseFired, why),
        ];
    };
    let cold_reuse: Vec<usize> = colds.iter().filter_map(|c| c.reused).filter(|&r| r != 0).collect();
    let expected = match expected {
        Ok(e) => e,
        Err(why) => {
            let reuse = match cold_reuse.first() {
                Some(r) => CheckResult::fail(CheckName::Reuse, format!("a fresh cold instance reported reuse {r}")),
                None => CheckResult::skipped(CheckName::Reuse, why.clone()),
            };
            let fired = if must_reuse {
                fired_check(reused, "the prompt strictly extends everything the slot fed")
            } else {
                CheckResult::skipped(CheckName::ReuseFired, format!("{why}; the turn does not strictly extend"))
            };
            return vec![reuse, fired];
        }
    };
    let mut out = Vec::with_capacity(2);
    let of = warm.prompt_tokens;
    out.push(if reused != expected {
        CheckResult::fail(CheckName::Reuse, format!("reused {reused} of {of} prompt tokens, expected {expected}"))
    } else if !cold_reuse.is_empty() {
        CheckResult::fail(CheckName::Reuse, format!("a fresh cold instance reported reuse {}", cold_reuse[0]))
    } else {
        CheckResult::pass(CheckName::Reuse, format!("reused {reused} of {of} prompt tokens, as expected"))
    });
    if expected > 0 {
        out.push(fired_check(reused, &format!("expected {expected}")));
    }
    out
}

fn fired_check(reused: usize, why_it_must: &str) -> CheckResult {
    if reused > 0 {
        CheckResult::pass(CheckName::ReuseFired, format!("reuse fired ({reused})"))
    } else {
        CheckResult::fail(CheckName::ReuseFired, format!("reuse never fired ({why_it_must})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Status;

    fn gen(reused: Option<usize>) -> Generation {
        Generation { reused, ..Generation::for_test(vec![1], 40) }
    }

    fn statuses(r: &[CheckResult]) -> Vec<(CheckName, Status)> {
        r.iter().map(|c| (c.check, c.status)).collect()
    }

    #[test]
    fn exact_count_passes_and_fires() {
        let r = check(Ok(30), false, &gen(Some(30)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Pass), (CheckName::ReuseFired, Status::Pass)]);
    }

    #[test]
    fn silent_non_reuse_fails_both() {
        let r = check(Ok(30), false, &gen(Some(0)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Fail), (CheckName::ReuseFired, Status::Fail)]);
        assert!(r[0].detail.contains("reused 0 of 40"), "{}", r[0].detail);
    }

    #[test]
    fn reuse_where_none_is_allowed_fails() {
        let r = check(Ok(0), false, &gen(Some(31)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Fail)]);
    }

    #[test]
    fn a_cold_instance_that_reuses_fails() {
        let r = check(Ok(0), false, &gen(Some(0)), &[&gen(Some(3))]);
        assert_eq!(r[0].status, Status::Fail);
    }

    #[test]
    fn missing_counts_are_skipped_not_passed() {
        let r = check(Ok(30), false, &gen(None), &[]);
        assert!(r.iter().all(|c| c.status == Status::Skipped));
        let r = check(Err("no rule for arch x".into()), false, &gen(Some(1)), &[]);
        assert!(r.iter().all(|c| c.status == Status::Skipped && c.detail.contains("arch x")));
    }

    #[test]
    fn without_a_rule_a_strict_extension_must_still_reuse() {
        let no_rule = || Err("no rule for arch x".to_string());
        let r = check(no_rule(), true, &gen(Some(0)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Skipped), (CheckName::ReuseFired, Status::Fail)]);
        assert!(r[1].detail.contains("strictly extends"), "{}", r[1].detail);
        let r = check(no_rule(), true, &gen(Some(12)), &[&gen(Some(0))]);
        assert_eq!(statuses(&r), vec![(CheckName::Reuse, Status::Skipped), (CheckName::ReuseFired, Status::Pass)]);
        // a cold instance reporting reuse is wrong under any rule
        let r = check(no_rule(), false, &gen(Some(0)), &[&gen(Some(5))]);
        assert_eq!(r[0].status, Status::Fail);
    }
}
