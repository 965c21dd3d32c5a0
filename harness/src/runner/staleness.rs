//! The extra runs a semantic-staleness turn needs: what the stale context X would produce. Its own reply is known
//! (X was a set-up turn of the plan); the state X left behind, read with the current prompt, is a cold run of X's
//! first N fed ids continued with the current prompt from N on — at N = the reuse the warm instance reported, and
//! at N = everything X fed. The warm reply is then classified fresh, stale(X) or corrupt (`check::staleness`).

use super::instances::{Instances, Role, Sent, TurnRequest};
use crate::cases::StaleProbe;
use crate::check::staleness::{classify, tokens_check};
use crate::oracle::fed_ids;
use crate::record::{CheckResult, Hypothesis, Shape, StaleOutcome};

/// A request that could not run: what to report and the engine's stderr tail.
pub type Failure = (String, Option<String>);

/// Classify the warm reply of the compared step `step_index`; `stale_turn` is what X's warm request fed and got.
/// `Ok(None)` when warm or cold refused the turn (nothing to classify).
pub fn classify_turn(
    inst: &mut Instances<'_>,
    step_index: usize,
    probe: StaleProbe,
    stale_turn: Option<(Vec<u32>, Vec<u32>)>,
    warm: &Sent,
    cold: &Sent,
    control: Option<&Sent>,
) -> Result<Option<(StaleOutcome, CheckResult)>, Failure> {
    let (Ok(wg), Ok(fresh), Some((x_prompt, x_reply))) = (&warm.result, &cold.result, stale_turn) else {
        return Ok(None);
    };
    let current = &warm.request.prompt;
    let fed_x = fed_ids(&x_prompt, &x_reply);
    let mut hypotheses = vec![Hypothesis {
        label: "answer".into(),
        splice_at: None,
        equals_fresh: x_reply == fresh.tokens,
        reply: x_reply,
    }];
    // Without the ids X fed (a driver that reports none for text), only X's own reply is a hypothesis.
    let known = !x_prompt.is_empty() && warm.prompt_known;
    let mut points: Vec<usize> = [wg.reused.unwrap_or(0), fed_x.len()]
        .into_iter()
        .map(|n| n.min(fed_x.len()).min(current.len() - 1))
        .filter(|&n| known && n > 0 && fed_x[..n] != current[..n])
        .collect();
    points.dedup();
    for (k, n) in points.into_iter().enumerate() {
        let mut prompt = fed_x[..n].to_vec();
        prompt.extend_from_slice(&current[n..]);
        let label = format!("state@{n}");
        let turn = TurnRequest {
            slot: warm.request.slot,
            prompt,
            audio: Vec::new(),
            chat: None,
            max_tokens: warm.request.max_tokens,
            ignore_eos: warm.request.ignore_eos,
            cancel_at_poll: None,
        };
        let sent = inst.send(Role::Probe, step_index, k, &label, &turn, false);
        let g = sent.result.map_err(|e| (format!("probe {label}: {e}"), e.stderr_tail().map(str::to_string)))?;
        hypotheses.push(Hypothesis {
            label,
            splice_at: Some(n),
            equals_fresh: g.tokens == fresh.tokens,
            reply: g.tokens,
        });
    }
    let control_tokens = control.and_then(|c| c.result.as_ref().ok()).map(|g| g.tokens.as_slice());
    let (class, matched) = classify(&wg.tokens, &fresh.tokens, control_tokens, &hypotheses);
    let shape = if current.len() > fed_x.len() { Shape::CurrentLonger } else { Shape::CurrentShorter };
    let outcome = StaleOutcome { context: probe.context, shape, class, matched, hypotheses };
    let check = tokens_check(&outcome, wg, fresh);
    Ok(Some((outcome, check)))
}
