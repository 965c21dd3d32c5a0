//! Semantic staleness: does the warm reply answer the current prompt, or a stale context's? A warm reply is
//! *fresh* when it equals a cold run of the current prompt, *stale(X)* when it equals what stale context X would
//! produce (X's own reply, or a cold run of X's fed ids continued with the current prompt's tail — the state X
//! left behind, read with the new question), and *corrupt* otherwise.

use super::tokens;
use crate::driver::Generation;
use crate::record::{CheckName, CheckResult, Class, Hypothesis, StaleOutcome};

/// Classify a warm reply. `control` is a second cold run of the current prompt (when the scenario runs one).
pub fn classify(
    warm: &[u32],
    fresh: &[u32],
    control: Option<&[u32]>,
    hypotheses: &[Hypothesis],
) -> (Class, Option<String>) {
    if control.is_some_and(|c| c != fresh) {
        return (Class::Inconclusive, None);
    }
    if warm == fresh {
        return (Class::Fresh, None);
    }
    match hypotheses.iter().find(|h| h.reply == warm) {
        Some(h) => (Class::Stale, Some(h.label.clone())),
        None => (Class::Corrupt, None),
    }
}

/// The token check of a classified case: pass when fresh, fail naming what the reply answered otherwise.
pub fn tokens_check(o: &StaleOutcome, warm: &Generation, fresh: &Generation) -> CheckResult {
    let first = tokens::first_divergence(warm, fresh).map(|d| d.describe()).unwrap_or_default();
    match o.class {
        Class::Fresh => {
            CheckResult::pass(CheckName::Tokens, format!("fresh: {} tokens equal a cold run", warm.tokens.len()))
        }
        Class::Stale => {
            let what = match o.matched.as_deref() {
                Some("answer") => "the reply the stale context itself got".to_string(),
                Some(h) => format!(
                    "a cold run of the stale context's first {} fed ids continued with the current prompt",
                    h.trim_start_matches("state@")
                ),
                None => "a stale hypothesis".to_string(),
            };
            CheckResult::fail(CheckName::Tokens, format!("{}: the warm reply equals {what}; {first}", o.label()))
        }
        Class::Corrupt => CheckResult::fail(
            CheckName::Tokens,
            format!(
                "corrupt: the warm reply equals neither a cold run of the current prompt nor what the {} context \
                 produces ({} hypotheses); {first}",
                o.context,
                o.hypotheses.len()
            ),
        ),
        Class::Inconclusive => tokens::identity(warm, fresh).0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Shape;
    use crate::scenario::ContextName;

    fn hyp(label: &str, reply: &[u32], fresh: &[u32]) -> Hypothesis {
        Hypothesis { label: label.into(), splice_at: None, reply: reply.to_vec(), equals_fresh: reply == fresh }
    }

    #[test]
    fn classification_prefers_fresh_then_a_named_stale_context() {
        let fresh = [1, 2, 3];
        let hs = [hyp("answer", &[7, 7, 7], &fresh), hyp("state@40", &[1, 2, 9], &fresh)];
        assert_eq!(classify(&[1, 2, 3], &fresh, Some(&fresh), &hs), (Class::Fresh, None));
        assert_eq!(classify(&[1, 2, 9], &fresh, Some(&fresh), &hs), (Class::Stale, Some("state@40".into())));
        assert_eq!(classify(&[7, 7, 7], &fresh, None, &hs), (Class::Stale, Some("answer".into())));
        assert_eq!(classify(&[5, 5, 5], &fresh, None, &hs), (Class::Corrupt, None));
        // a disagreeing control makes nothing classifiable, not even a match
        assert_eq!(classify(&[1, 2, 9], &fresh, Some(&[1, 2, 4]), &hs), (Class::Inconclusive, None));
    }

    #[test]
    fn a_case_whose_hypotheses_all_predict_fresh_has_no_power() {
        let fresh = [1, 2];
        let o = StaleOutcome {
            context: ContextName::PreviousTurn,
            shape: Shape::CurrentLonger,
            class: Class::Fresh,
            matched: None,
            hypotheses: vec![hyp("answer", &fresh, &fresh)],
        };
        assert!(!o.distinguishable());
        assert_eq!(o.label(), "fresh");
        let o = StaleOutcome { class: Class::Stale, hypotheses: vec![hyp("answer", &[3], &fresh)], ..o };
        assert!(o.distinguishable());
        assert_eq!(o.label(), "stale(previous-turn)");
    }
}
