//! Every check of one compared turn, composed: how warm and cold ended, their tokens, the control, the reuse
//! count, and — through dumps — the state, the record and the cache layout. The state diff is computed once here
//! and handed back, so provenance capture writes it instead of diffing again.

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::Request;
use kvproof_engines::serve::frame::printable_line;
use kvproof_engines::state_diff::{self, Incomparable, StateDiff};

use super::memory::Footprint;
use super::{reuse, state, tokens};
use crate::driver::{DriverError, Generation};
use crate::id_diff::IdDiff;
use crate::oracle::Rule;
use crate::record::{CheckName, CheckResult, Divergence};

/// What one instance did on the turn, as the checks see it.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub result: &'a Result<Generation, DriverError>,
    /// The slot's state after the turn, when a dump was taken.
    pub dump: Option<&'a Result<StateDump, DriverError>>,
    /// The engine's state bytes after the turn, when the driver reports them.
    pub bytes: Option<usize>,
}

impl Observed<'_> {
    fn cancelled(&self) -> bool {
        matches!(self.result, Err(e) if e.code() == "CANCELLED")
    }

    /// The instance's state size after a completed turn, or why it is unknown.
    pub fn footprint(&self) -> Result<Footprint, String> {
        if let Err(e) = self.result {
            return Err(format!("request refused ({})", e.code()));
        }
        let bytes = self.bytes.ok_or_else(|| "the driver reports no state bytes".to_string())?;
        match self.dump {
            Some(Ok(d)) => Ok(Footprint { capacity: d.meta.capacity, bytes }),
            Some(Err(e)) => Err(format!("dump failed ({e}): capacity unknown")),
            None => Err("no dump taken: capacity unknown".into()),
        }
    }
}

/// What the turn's checks depend on besides the instances' outcomes.
#[derive(Debug, Clone)]
pub struct TurnContext<'a> {
    pub request: &'a Request,
    /// The protocol error code the turn must fail with, if it must.
    pub expect_refusal: Option<&'static str>,
    /// The oracle's reuse for the warm request, or why there is none.
    pub expected: Result<usize, String>,
    /// The warm request strictly extends everything its slot fed: any prefix cache reuses something.
    pub must_reuse: bool,
    pub rule: Option<Rule>,
    /// Why the warm and cold dumps are absent, when they are absent by design.
    pub no_dumps: Option<String>,
    pub reuse_count: bool,
}

/// The checks of one turn, the first token divergence, and the warm-vs-cold state diff when both dumps exist.
#[derive(Debug)]
pub struct Assessed {
    pub checks: Vec<CheckResult>,
    /// The code warm and cold both refused the turn with, as it expects.
    pub refused: Option<String>,
    pub divergence: Option<Divergence>,
    pub diff: Option<Result<StateDiff, Incomparable>>,
}

/// Every check of one compared turn (no instance died: the caller checked that first).
pub fn assess(cx: &TurnContext<'_>, warm: Observed<'_>, cold: Observed<'_>, control: Option<Observed<'_>>) -> Assessed {
    let mut checks = vec![outcome(cx.expect_refusal, warm.result, cold.result)];
    if let Some(problem) = rendered_alike(warm.result, cold.result) {
        checks[0] = CheckResult::fail(CheckName::Outcome, problem);
    }
    let refused = match (warm.result, cold.result, cx.expect_refusal) {
        (Err(w), Err(c), Some(exp)) if w.code() == exp && c.code() == exp => Some(exp.to_string()),
        _ => None,
    };
    let mut divergence = None;
    let both = match (warm.result, cold.result) {
        (Ok(w), Ok(c)) => Some((w, c)),
        _ => None,
    };
    match both {
        Some((w, c)) => {
            let (r, d) = tokens::identity(w, c);
            checks.push(r);
            divergence = d;
        }
        None => checks.push(CheckResult::skipped(CheckName::Tokens, "no replies to compare (request refused)")),
    }
    checks.push(control_check(cold.result, control.map(|c| c.result)));

    match warm.result {
        Ok(w) => {
            let colds: Vec<&Generation> =
                std::iter::once(cold.result).chain(control.map(|c| c.result)).filter_map(|r| r.as_ref().ok()).collect();
            let expected =
                if cx.reuse_count { cx.expected.clone() } else { Err("the driver reports no reuse count".into()) };
            checks.extend(reuse::check(expected, cx.must_reuse, w, &colds));
        }
        Err(_) => checks.push(CheckResult::skipped(CheckName::Reuse, "request refused: no reuse reported")),
    }

    let (state_checks, diff) = state_checks(cx, warm, cold, both);
    checks.extend(state_checks);
    Assessed { checks, refused, divergence, diff }
}

fn control_check(
    cold: &Result<Generation, DriverError>,
    control: Option<&Result<Generation, DriverError>>,
) -> CheckResult {
    match (control, cold) {
        (None, _) => CheckResult::skipped(CheckName::Control, "disabled by the scenario (assert.control)"),
        (Some(Ok(k)), Ok(c)) => tokens::control(c, k),
        (Some(Err(e)), Ok(_)) => {
            CheckResult::fail(CheckName::Control, format!("cold replied, the control failed: {e}"))
        }
        (Some(_), Err(_)) => CheckResult::skipped(CheckName::Control, "no cold reply to compare"),
    }
}

/// State, record and coverage through dumps.
fn state_checks(
    cx: &TurnContext<'_>,
    warm: Observed<'_>,
    cold: Observed<'_>,
    both: Option<(&Generation, &Generation)>,
) -> (Vec<CheckResult>, Option<Result<StateDiff, Incomparable>>) {
    let mut checks = Vec::new();
    let mut diff = None;
    let dump_of = |o: Observed<'_>| -> Result<StateDump, String> {
        match o.dump {
            Some(Ok(d)) => Ok(d.clone()),
            Some(Err(e)) => Err(format!("dump failed: {e}")),
            None => Err(cx.no_dumps.clone().unwrap_or_else(|| "no dump taken".into())),
        }
    };
    let (wd, cd) = (dump_of(warm), dump_of(cold));
    let skip = |check: CheckName, why: &str| CheckResult::skipped(check, why.to_string());
    match (&wd, &cd, both) {
        (Ok(w), Ok(c), Some((wg, cg))) => {
            let d = state_diff::compare(w, c);
            checks.push(state::state_check(&d));
            diff = Some(d);
            match cx.rule {
                None => {
                    let why = cx.expected.as_ref().err().cloned().unwrap_or_else(|| "no reuse rule".into());
                    checks.push(skip(CheckName::Record, &why));
                }
                Some(r) => {
                    let (wfed, cfed) =
                        (r.expected_record(cx.request, &wg.tokens), r.expected_record(cx.request, &cg.tokens));
                    let tainted = r.expected_tainted(cx.request);
                    checks.push(state::record_check(
                        tainted,
                        &[("warm", w, wfed.as_deref()), ("cold", c, cfed.as_deref())],
                    ));
                }
            }
        }
        (Err(e), _, _) | (_, Err(e), _) => {
            checks.push(skip(CheckName::State, e));
            checks.push(skip(CheckName::Record, e));
        }
        (Ok(_), Ok(_), None) => {
            let why = "request refused: states after a failure are not comparable";
            checks.push(skip(CheckName::State, why));
            checks.push(skip(CheckName::Record, why));
        }
    }
    // A request cancelled mid-prefill leaves a half-written state on purpose (its record is tainted): its rows
    // make no layout claims to check.
    let mut dumped: Vec<(&str, &StateDump)> = Vec::new();
    if let (Ok(w), false) = (&wd, warm.cancelled()) {
        dumped.push(("warm", w));
    }
    if let (Ok(c), false) = (&cd, cold.cancelled()) {
        dumped.push(("cold", c));
    }
    if dumped.is_empty() {
        let why = if warm.cancelled() {
            "request cancelled mid-prefill: the state is half-written on purpose".to_string()
        } else {
            wd.err().unwrap_or_default()
        };
        checks.push(skip(CheckName::Coverage, &why));
    } else {
        checks.push(state::coverage_check(&dumped));
    }
    (checks, diff)
}

/// A conversation sent as text must render to the same ids on every instance; when it does not, where they part.
fn rendered_alike(warm: &Result<Generation, DriverError>, cold: &Result<Generation, DriverError>) -> Option<String> {
    let (Ok(w), Ok(c)) = (warm, cold) else { return None };
    let (Some(wp), Some(cp)) = (&w.prompt_ids, &c.prompt_ids) else { return None };
    let at = IdDiff::new(wp, cp).first_difference()?;
    Some(format!(
        "warm and cold rendered the same text to different prompt ids ({} vs {}, parting at position {at}): the \
         engine's template or tokenizer is not deterministic",
        wp.len(),
        cp.len()
    ))
}

/// Both replied, or both refused alike (and as the turn expects).
pub fn outcome(
    expect_refusal: Option<&'static str>,
    warm: &Result<Generation, DriverError>,
    cold: &Result<Generation, DriverError>,
) -> CheckResult {
    let code = |r: &Result<Generation, DriverError>| r.as_ref().err().map(DriverError::code);
    let (w, c) = (code(warm), code(cold));
    let (wd, cd) = (refusal_detail(warm), refusal_detail(cold));
    let name = CheckName::Outcome;
    match (w, c, expect_refusal) {
        (None, None, None) => CheckResult::pass(name, "both replied"),
        (None, None, Some(exp)) => CheckResult::fail(name, format!("both replied; expected {exp}")),
        (Some(w), Some(c), exp) if w == c => {
            // one detail when both said the same, else each instance's
            let said = if wd == cd { wd } else { format!(" (warm{wd}; cold{cd})") };
            match exp {
                Some(exp) if exp == w => CheckResult::pass(name, format!("both refused with {w}{said}, as expected")),
                Some(exp) => CheckResult::fail(name, format!("both refused with {w}{said}; expected {exp}")),
                None => {
                    CheckResult::fail(name, format!("both refused with {w}{said}, which this turn does not expect"))
                }
            }
        }
        (w, c, _) => CheckResult::fail(
            name,
            format!(
                "warm {}, cold {}",
                w.map_or_else(|| "replied".to_string(), |w| format!("refused with {w}{wd}")),
                c.map_or_else(|| "replied".to_string(), |c| format!("refused with {c}{cd}"))
            ),
        ),
    }
}

/// Longest engine ERROR detail a check quotes.
const MAX_REFUSAL_DETAIL: usize = 300;

/// What the engine said with its refusal (an ERROR frame's detail, an HTTP error body), as ` (detail)`; empty
/// when it said nothing.
fn refusal_detail(r: &Result<Generation, DriverError>) -> String {
    match r {
        Err(DriverError::Refused { detail, .. }) if !detail.trim().is_empty() => {
            format!(" ({})", printable_line(detail.trim(), MAX_REFUSAL_DETAIL))
        }
        _ => String::new(),
    }
}
