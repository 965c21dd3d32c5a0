//! The warm/cold runner. A warm instance lives through each plan (conversation); every compared turn is also run
//! on a cold instance (fresh state, same weights) given that turn's prompt alone, and on a second cold instance
//! (the control). Which of warm and cold runs first alternates from pair to pair. Plans run in parallel (rayon);
//! every prompt is fixed by the scenario seed, so a run is repeatable.
//!
//! An instance that dies or hangs makes that trial an `error` (with its stderr tail); the warm instance is replaced
//! by a fresh one and the plan goes on.

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Request, Sampling};
use rayon::prelude::*;

use crate::cases::{self, Plan, Skipped, Step};
use crate::check::memory::Footprint;
use crate::check::{self, reuse, state, tokens, CheckName, CheckResult, Verdict};
use crate::driver::{self, Caps, Driver, DriverError, Generation, Launcher};
use crate::oracle::{Outcome, Rule};
use crate::plan_state::PlanState;
use crate::progress::Progress;
use crate::report::results::{TrialRecord, TrialTimings};
use crate::report::turns::TurnRow;
use crate::scenario::Scenario;

/// Where results go as they complete.
pub trait Sink: Sync {
    fn trial(&self, t: &TrialRecord);
    fn turn(&self, row: &TurnRow);
    /// Keep both dumps of a failing comparison and their diff; returns where (None: this sink keeps none).
    fn provenance(
        &self,
        _case: &str,
        _warm: &StateDump,
        _cold: &StateDump,
    ) -> Option<crate::provenance::ProvenanceRef> {
        None
    }
}

/// A sink that keeps nothing (the caller uses the returned records).
pub struct NullSink;
impl Sink for NullSink {
    fn trial(&self, _: &TrialRecord) {}
    fn turn(&self, _: &TurnRow) {}
}

/// A scenario with its engine started and its plans generated.
pub struct Prepared<'a> {
    pub scenario: &'a Scenario,
    pub launcher: Box<dyn Launcher>,
    pub plans: Vec<Plan>,
    pub skipped: Vec<Skipped>,
}

impl Prepared<'_> {
    pub fn turns(&self) -> usize {
        self.plans.iter().map(|p| p.steps.len()).sum()
    }
    pub fn compared(&self) -> usize {
        self.plans.iter().map(Plan::compared).sum()
    }
}

/// Start the scenario's engine (with `fault` overriding a bundled engine's) and generate its plans.
pub fn prepare<'a>(
    scenario: &'a Scenario,
    fault: Option<Option<kvproof_engines::fault::Fault>>,
) -> Result<Prepared<'a>, DriverError> {
    let launcher = driver::launcher_for(&scenario.engine, fault)?;
    let (plans, skipped) = cases::plans(scenario, launcher.info(), launcher.caps());
    Ok(Prepared { scenario, launcher, plans, skipped })
}

/// Run every plan of a prepared scenario; records go to `sink` as they complete and are also returned.
pub fn run(p: &Prepared<'_>, sink: &dyn Sink, progress: &Progress) -> Vec<TrialRecord> {
    // Kinds that measure rather than pair turns run their own loops.
    match p.scenario.kind {
        crate::scenario::Kind::GrowthCurve => return cases::growth_curve::run(p, sink, progress),
        crate::scenario::Kind::SemanticStaleness => return cases::semantic_staleness::run(p, sink, progress),
        _ => {}
    }
    let info = p.launcher.info();
    let rule = crate::oracle::rule_for(info, p.launcher.caps());
    let ctx = Ctx {
        scenario: p.scenario,
        launcher: p.launcher.as_ref(),
        rule,
        no_rule: format!("the harness has no reuse rule for arch `{}`", info.arch),
        caps: p.launcher.caps().clone(),
        sink,
        progress,
    };
    p.plans.par_iter().enumerate().flat_map_iter(|(i, plan)| run_plan(&ctx, i, plan)).collect()
}

struct Ctx<'a> {
    scenario: &'a Scenario,
    launcher: &'a dyn Launcher,
    rule: Option<Rule>,
    no_rule: String,
    caps: Caps,
    sink: &'a dyn Sink,
    progress: &'a Progress,
}

/// Which instance ran a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Warm = 0,
    Cold = 1,
    Control = 2,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Warm => "warm",
            Role::Cold => "cold",
            Role::Control => "control",
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Ctx<'_> {
    fn request(&self, plan_index: usize, step_index: usize, role: Role, plan: &Plan, step: &Step) -> RequestTemplate {
        // Unique per plan, step and instance, and readable in a dump's writers: plan 5, step 1, cold = 50011.
        let id = plan_index as u64 * 10_000 + step_index as u64 * 10 + role as u64 + 1;
        RequestTemplate { id, slot: step.slot_in(plan), max_tokens: step.max_tokens }
    }

    fn turn_row(&self, plan: &Plan, step: &Step, role: Role, prompt_len: usize, res: &Result<Generation, DriverError>) {
        let row = match res {
            Ok(g) => TurnRow {
                scenario: self.scenario.name.clone(),
                plan: plan.name.clone(),
                step: step.label.clone(),
                instance: role.name().into(),
                prompt_tokens: prompt_len,
                reused: g.reused,
                prefilled: g.reused.map(|r| prompt_len.saturating_sub(r)),
                emitted: g.tokens.len(),
                prefill_ms: ms(g.prefill),
                decode_ms: ms(g.decode),
                wall_ms: ms(g.wall),
                outcome: "ok".into(),
            },
            Err(e) => TurnRow {
                scenario: self.scenario.name.clone(),
                plan: plan.name.clone(),
                step: step.label.clone(),
                instance: role.name().into(),
                prompt_tokens: prompt_len,
                reused: None,
                prefilled: None,
                emitted: 0,
                prefill_ms: 0.0,
                decode_ms: 0.0,
                wall_ms: 0.0,
                outcome: e.code(),
            },
        };
        self.sink.turn(&row);
    }

    fn base_record(&self, plan: &Plan, plan_index: usize, step: &Step, step_index: usize) -> TrialRecord {
        TrialRecord::new(&self.scenario.name, self.scenario.kind, &plan.name, plan_index, &step.label, step_index)
    }

    fn emit(&self, record: TrialRecord, out: &mut Vec<TrialRecord>) {
        self.sink.trial(&record);
        out.push(record);
    }

    /// Error trials for every compared step from `from` on: the plan cannot go further.
    fn abandon(
        &self,
        plan: &Plan,
        plan_index: usize,
        from: usize,
        why: &str,
        tail: Option<String>,
        out: &mut Vec<TrialRecord>,
    ) {
        for (si, step) in plan.steps.iter().enumerate().skip(from) {
            self.progress.inc(1);
            if step.compare {
                let mut r = self.base_record(plan, plan_index, step, si);
                r.error = Some(why.to_string());
                r.stderr_tail = tail.clone();
                self.emit(r, out);
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct RequestTemplate {
    id: u64,
    slot: usize,
    max_tokens: usize,
}

impl RequestTemplate {
    fn with(self, prompt: &[u32], audio: &[Vec<u8>]) -> Request {
        Request {
            id: self.id,
            slot: self.slot,
            prompt: prompt.to_vec(),
            audio: audio.to_vec(),
            max_tokens: self.max_tokens,
            // Greedy: identity of warm and cold must not depend on a sampler's stream.
            sampling: Sampling::default(),
            logprobs: 0,
            ignore_eos: false,
        }
    }
}

/// The result of running one compared turn on one instance.
struct Run {
    result: Result<Generation, DriverError>,
    dump: Option<Result<StateDump, DriverError>>,
    /// `Driver::state_bytes` after the turn, when the driver reports them.
    bytes: Option<usize>,
}

/// The instance's state size after a completed turn, or why it is unknown.
fn footprint(r: &Run) -> Result<Footprint, String> {
    if let Err(e) = &r.result {
        return Err(format!("request refused ({})", e.code()));
    }
    let bytes = r.bytes.ok_or_else(|| "the driver reports no state bytes".to_string())?;
    match &r.dump {
        Some(Ok(d)) => Ok(Footprint { capacity: d.meta.capacity, bytes }),
        Some(Err(e)) => Err(format!("dump failed ({e}): capacity unknown")),
        None => Err("no dump taken: capacity unknown".into()),
    }
}

fn fatal_of(runs: &[(&str, &Run)]) -> Option<(String, Option<String>)> {
    for (who, r) in runs {
        // A request that could not run at all is an error; a refusal is an outcome the checks compare.
        if let Err(e) = &r.result {
            if e.is_fatal() || matches!(e, DriverError::Start { .. } | DriverError::Unsupported(_)) {
                return Some((format!("{who}: {e}"), e.stderr_tail().map(str::to_string)));
            }
        }
        if let Some(Err(e)) = &r.dump {
            if e.is_fatal() {
                return Some((format!("{who} (dump): {e}"), e.stderr_tail().map(str::to_string)));
            }
        }
    }
    None
}

fn run_plan(ctx: &Ctx<'_>, plan_index: usize, plan: &Plan) -> Vec<TrialRecord> {
    let mut out = Vec::new();
    let assertions = ctx.scenario.assertions;
    let mut warm = match ctx.launcher.launch() {
        Ok(w) => w,
        Err(e) => {
            ctx.abandon(
                plan,
                plan_index,
                0,
                &format!("warm instance: {e}"),
                e.stderr_tail().map(str::to_string),
                &mut out,
            );
            return out;
        }
    };
    let mut ps = PlanState::new(plan, ctx.rule, ctx.caps.audio_frame_bytes.unwrap_or(0));

    for (si, step) in plan.steps.iter().enumerate() {
        let (prepared, pending) = match ps.thread(step.thread).prepare(&step.prompt) {
            Ok(x) => x,
            Err(why) => {
                ctx.abandon(plan, plan_index, si, &format!("cannot build the prompt: {why}"), None, &mut out);
                return out;
            }
        };
        let tmpl = |role| ctx.request(plan_index, si, role, plan, step);
        let req = tmpl(Role::Warm).with(&prepared.prompt, &prepared.audio);
        let expected: Result<usize, String> = ps.expected(&req).ok_or_else(|| ctx.no_rule.clone());

        if !step.compare {
            let res = warm.generate(&req);
            ctx.turn_row(plan, step, Role::Warm, req.prompt.len(), &res);
            match res {
                Ok(g) => {
                    ps.after(&req, Outcome::Completed { reply: &g.tokens });
                    ps.thread(step.thread).finish(&prepared, pending, Some(&g.tokens));
                    ctx.progress.inc(1);
                }
                Err(e) => {
                    // Everything after a failed set-up turn would test a state nobody planned.
                    let why = format!("set-up {} failed on the warm instance: {e}", step.label);
                    ctx.progress.inc(1);
                    ctx.abandon(plan, plan_index, si + 1, &why, e.stderr_tail().map(str::to_string), &mut out);
                    return out;
                }
            }
            continue;
        }

        let warm_first = (plan_index + si) & 1 == 0;
        let want_dumps = ctx.caps.dumps && assertions.state;
        let run_on = |d: &mut dyn Driver, role: Role| -> Run {
            let r = tmpl(role).with(&prepared.prompt, &prepared.audio);
            let result = match step.cancel_at_poll {
                Some(poll) => d.generate_cancel_at(&r, poll),
                None => d.generate(&r),
            };
            ctx.turn_row(plan, step, role, r.prompt.len(), &result);
            let alive = !matches!(&result, Err(e) if e.is_fatal());
            let dump = (want_dumps && alive).then(|| d.dump(r.slot));
            let bytes = if alive { d.state_bytes() } else { None };
            Run { result, dump, bytes }
        };
        let cold_run = |role: Role| -> Run {
            match ctx.launcher.launch() {
                Ok(mut d) => run_on(d.as_mut(), role),
                Err(e) => Run { result: Err(e), dump: None, bytes: None },
            }
        };
        let (warm_run, cold) = if warm_first {
            let w = run_on(warm.as_mut(), Role::Warm);
            (w, cold_run(Role::Cold))
        } else {
            let c = cold_run(Role::Cold);
            (run_on(warm.as_mut(), Role::Warm), c)
        };
        let control = assertions.control.then(|| cold_run(Role::Control));

        let mut record = ctx.base_record(plan, plan_index, step, si);
        record.warm_first = warm_first;
        record.prompt_tokens = req.prompt.len();
        record.expected_reuse = expected.as_ref().ok().copied();
        record.timings = TrialTimings {
            warm_ms: warm_run.result.as_ref().ok().map(|g| ms(g.wall)),
            cold_ms: cold.result.as_ref().ok().map(|g| ms(g.wall)),
            control_ms: control.as_ref().and_then(|c| c.result.as_ref().ok()).map(|g| ms(g.wall)),
        };
        if let Ok(g) = &warm_run.result {
            record.reused = g.reused;
            record.warm_reply = g.tokens.clone();
        }
        if let Ok(g) = &cold.result {
            record.cold_reply = g.tokens.clone();
        }

        let mut instances = vec![("warm", &warm_run), ("cold", &cold)];
        if let Some(c) = &control {
            instances.push(("control", c));
        }
        if let Some((why, tail)) = fatal_of(&instances) {
            record.verdict = Verdict::Error;
            record.error = Some(why);
            record.stderr_tail = tail;
        } else {
            let (mut checks, divergence, diff) = assess(ctx, step, &req, expected, &warm_run, &cold, control.as_ref());
            checks.push(ps.memory_check(step, footprint(&warm_run), footprint(&cold)));
            record.verdict = check::verdict(&checks);
            if let (Verdict::Fail, Some(Ok(w)), Some(Ok(c))) = (record.verdict, &warm_run.dump, &cold.dump) {
                let case = crate::provenance::capture::case_dir(&[&ctx.scenario.name, &record.plan, &record.step]);
                record.provenance = ctx.sink.provenance(&case, w, c);
            }
            record.checks = checks;
            record.divergence = divergence;
            record.state = diff;
        }

        // The warm slot now holds what this turn fed, or nothing usable.
        let warm_dead = matches!(&warm_run.result, Err(e) if e.is_fatal())
            || matches!(&warm_run.dump, Some(Err(e)) if e.is_fatal());
        match &warm_run.result {
            _ if warm_dead => ps.reset(),
            Ok(g) => ps.after(&req, Outcome::Completed { reply: &g.tokens }),
            Err(e) => ps.after(&req, Outcome::Failed { code: &e.code() }),
        }
        let reply = match (&warm_run.result, &cold.result) {
            (Ok(g), _) | (Err(_), Ok(g)) => Some(g.tokens.clone()),
            _ => None,
        };
        ps.thread(step.thread).finish(&prepared, pending, reply.as_deref());
        ctx.emit(record, &mut out);
        ctx.progress.inc(1);

        if warm_dead {
            match ctx.launcher.launch() {
                Ok(w) => warm = w,
                Err(e) => {
                    let why = format!("warm instance could not be replaced: {e}");
                    ctx.abandon(plan, plan_index, si + 1, &why, e.stderr_tail().map(str::to_string), &mut out);
                    return out;
                }
            }
        }
    }
    out
}

type Assessed = (Vec<CheckResult>, Option<tokens::Divergence>, Option<state::StateDiff>);

/// Every check of one compared turn (no instance died: `fatal_of` came first).
fn assess(
    ctx: &Ctx<'_>,
    step: &Step,
    req: &Request,
    expected: Result<usize, String>,
    warm: &Run,
    cold: &Run,
    control: Option<&Run>,
) -> Assessed {
    let mut checks = Vec::new();
    let mut divergence = None;
    let mut diff = None;

    // 1. outcome: both replied, or both refused alike (and as the step expects)
    checks.push(outcome(step, &warm.result, &cold.result));

    let both = match (&warm.result, &cold.result) {
        (Ok(w), Ok(c)) => Some((w, c)),
        _ => None,
    };
    // 2. tokens and the control
    match both {
        Some((w, c)) => {
            let (r, d) = tokens::identity(w, c);
            checks.push(r);
            divergence = d;
        }
        None => checks.push(CheckResult::skipped(CheckName::Tokens, "no replies to compare (request refused)")),
    }
    match (control, &cold.result) {
        (None, _) => checks.push(CheckResult::skipped(CheckName::Control, "disabled by the scenario (assert.control)")),
        (Some(ctl), Ok(c)) => match &ctl.result {
            Ok(k) => checks.push(tokens::control(c, k)),
            Err(e) => {
                checks.push(CheckResult::fail(CheckName::Control, format!("cold replied, the control failed: {e}")))
            }
        },
        (Some(_), Err(_)) => checks.push(CheckResult::skipped(CheckName::Control, "no cold reply to compare")),
    }

    // 3. reuse
    match &warm.result {
        Ok(w) => {
            let colds: Vec<&Generation> = std::iter::once(&cold.result)
                .chain(control.map(|c| &c.result))
                .filter_map(|r| r.as_ref().ok())
                .collect();
            let expected =
                if ctx.caps.reuse_count { expected } else { Err("the driver reports no reuse count".into()) };
            checks.extend(reuse::check(expected, w, &colds));
        }
        Err(_) => checks.push(CheckResult::skipped(CheckName::Reuse, "request refused: no reuse reported")),
    }

    // 4. state, record and coverage through dumps
    let why_no_dumps = if !ctx.caps.dumps {
        Some("the engine offers no state dumps".to_string())
    } else if !ctx.scenario.assertions.state {
        Some("disabled by the scenario (assert.state)".to_string())
    } else {
        None
    };
    let dump_of = |r: &Run| -> Result<StateDump, String> {
        match &r.dump {
            Some(Ok(d)) => Ok(d.clone()),
            Some(Err(e)) => Err(format!("dump failed: {e}")),
            None => Err(why_no_dumps.clone().unwrap_or_else(|| "no dump taken".into())),
        }
    };
    let (wd, cd) = (dump_of(warm), dump_of(cold));
    let dump_skip = |check: CheckName, e: &str| CheckResult::skipped(check, e.to_string());
    match (&wd, &cd, both) {
        (Ok(w), Ok(c), Some((wg, cg))) => {
            let d = state::compare(w, c);
            checks.push(state::state_check(&d));
            diff = Some(d);
            let (wfed, cfed) = match ctx.rule {
                Some(r) => (r.expected_record(req, &wg.tokens), r.expected_record(req, &cg.tokens)),
                None => (None, None),
            };
            if ctx.rule.is_none() {
                checks.push(CheckResult::skipped(CheckName::Record, ctx.no_rule.clone()));
            } else {
                let tainted = ctx.rule.and_then(|r| r.expected_tainted(req));
                checks
                    .push(state::record_check(tainted, &[("warm", w, wfed.as_deref()), ("cold", c, cfed.as_deref())]));
            }
        }
        (Err(e), _, _) | (_, Err(e), _) => {
            checks.push(dump_skip(CheckName::State, e));
            checks.push(dump_skip(CheckName::Record, e));
        }
        (Ok(_), Ok(_), None) => {
            let why = "request refused: states after a failure are not comparable";
            checks.push(dump_skip(CheckName::State, why));
            checks.push(dump_skip(CheckName::Record, why));
        }
    }
    let mut dumped: Vec<(&str, &StateDump)> = Vec::new();
    // A request cancelled mid-prefill leaves a half-written state on purpose (its record is tainted): its rows
    // make no layout claims to check.
    let cancelled = |r: &Run| matches!(&r.result, Err(e) if e.code() == "CANCELLED");
    if let (Ok(w), false) = (&wd, cancelled(warm)) {
        dumped.push(("warm", w));
    }
    if let (Ok(c), false) = (&cd, cancelled(cold)) {
        dumped.push(("cold", c));
    }
    if dumped.is_empty() {
        let why = if cancelled(warm) {
            "request cancelled mid-prefill: the state is half-written on purpose".to_string()
        } else {
            wd.err().unwrap_or_default()
        };
        checks.push(dump_skip(CheckName::Coverage, &why));
    } else {
        checks.push(state::coverage_check(&dumped));
    }
    (checks, divergence, diff)
}

fn outcome(step: &Step, warm: &Result<Generation, DriverError>, cold: &Result<Generation, DriverError>) -> CheckResult {
    let code = |r: &Result<Generation, DriverError>| r.as_ref().err().map(DriverError::code);
    let (w, c) = (code(warm), code(cold));
    let name = CheckName::Outcome;
    match (w, c, step.expect_refusal) {
        (None, None, None) => CheckResult::pass(name, "both replied"),
        (None, None, Some(exp)) => CheckResult::fail(name, format!("both replied; expected {exp}")),
        (Some(w), Some(c), exp) if w == c => match exp {
            Some(exp) if exp == w => CheckResult::pass(name, format!("both refused with {w}, as expected")),
            Some(exp) => CheckResult::fail(name, format!("both refused with {w}; expected {exp}")),
            None => CheckResult::fail(name, format!("both refused with {w}, which this turn does not expect")),
        },
        (w, c, _) => CheckResult::fail(
            name,
            format!(
                "warm {}, cold {}",
                w.map_or_else(|| "replied".to_string(), |w| format!("refused with {w}")),
                c.map_or_else(|| "replied".to_string(), |c| format!("refused with {c}"))
            ),
        ),
    }
}
