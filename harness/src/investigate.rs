//! Investigating one case: replay it through the runner (`runner::paired::run_plan`, so every request — slot,
//! thread, cancel point, id — is the one a run sends), dump the warm state after every turn and the cold state
//! after every compared turn, diff them, and tell the story: the turn where the states first part, the first
//! divergent row with both writers, and whether the tokens diverged and at what top-2 gap. `kvproof dump` uses the
//! same replay to save one turn's state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kvproof_engines::dump::StateDump;
use kvproof_engines::fault::Fault;
use kvproof_engines::state_diff;

use crate::cases::Plan;
use crate::check::tokens::first_divergence;
use crate::driver::{DriverError, Generation};
use crate::progress::Progress;
use crate::provenance::{render, ProvenanceError};
use crate::record::{NullSink, TrialRecord};
use crate::runner::instances::{Role, Sent};
use crate::runner::paired::{self, Paired, Tap};
use crate::runner::{self, Prepared};
use crate::scenario::Scenario;

#[derive(Debug, thiserror::Error)]
pub enum InvestigateError {
    #[error("{path}: scenario `{scenario}`: no case `{case}` (cases: {known})")]
    NoCase { path: PathBuf, scenario: String, case: String, known: String },
    #[error("{path}: scenario `{scenario}`: case `{case}` has {turns} turns, not {asked}")]
    NoTurn { path: PathBuf, scenario: String, case: String, turns: usize, asked: usize },
    // `error` is no `source`: the message carries it already, and a chain printer would repeat it
    #[error("{path}: scenario `{scenario}`: {error}")]
    Engine { path: PathBuf, scenario: String, error: DriverError },
    #[error("{path}: scenario `{scenario}`: case `{case}`, {turn}: {message}")]
    Turn { path: PathBuf, scenario: String, case: String, turn: String, message: String },
    #[error(transparent)]
    Provenance(#[from] ProvenanceError),
}

/// One turn of a replay: what the warm instance and (on compared turns) the cold one did.
#[derive(Debug)]
pub struct TurnStates {
    pub label: String,
    pub compared: bool,
    pub prompt_tokens: usize,
    pub warm: Option<Sent>,
    pub cold: Option<Sent>,
}

impl TurnStates {
    fn dump_of(s: &Option<Sent>) -> Option<&StateDump> {
        s.as_ref().and_then(|s| s.dump.as_ref()).and_then(|d| d.as_ref().ok())
    }
    pub fn warm_dump(&self) -> Option<&StateDump> {
        Self::dump_of(&self.warm)
    }
    pub fn cold_dump(&self) -> Option<&StateDump> {
        Self::dump_of(&self.cold)
    }
}

/// Keeps every warm and cold request of a replay, up to a last step.
struct Recorder {
    last: Option<usize>,
    turns: Vec<TurnStates>,
    plan: Plan,
}

impl Tap for Recorder {
    fn dump_setup_turns(&self) -> bool {
        true
    }
    fn sent(&mut self, step_index: usize, sent: &Sent) {
        while self.turns.len() <= step_index {
            // an agentic session's later turns are built as it runs: compared turns named like its first
            let n = self.turns.len();
            let (label, compared) = self
                .plan
                .steps
                .get(n)
                .map_or_else(|| (format!("turn {}", n + 1), true), |s| (s.label.clone(), s.compare));
            self.turns.push(TurnStates { label, compared, prompt_tokens: 0, warm: None, cold: None });
        }
        let t = &mut self.turns[step_index];
        let copy = sent.clone();
        match sent.role {
            Role::Warm => {
                t.prompt_tokens = sent.request.prompt.len();
                t.warm = Some(copy);
            }
            // the first cold request of a step is the comparison's (an agentic cold trajectory's comes after it)
            Role::Cold if t.cold.is_none() => t.cold = Some(copy),
            Role::Cold => {}
            Role::Control | Role::Probe => {}
        }
    }
    fn stop_after(&self) -> Option<usize> {
        self.last
    }
}

fn find_plan<'a>(scenario: &Scenario, plans: &'a [Plan], case: &str) -> Result<(usize, &'a Plan), InvestigateError> {
    plans.iter().enumerate().find(|(_, p)| p.name == case).ok_or_else(|| InvestigateError::NoCase {
        path: scenario.path.clone(),
        scenario: scenario.name.clone(),
        case: case.to_string(),
        known: plans.iter().map(|p| p.name.as_str()).take(40).collect::<Vec<_>>().join(", "),
    })
}

/// Replay `case` of a prepared scenario through the runner for `turns` turns (all when None): every turn's warm
/// and cold requests with their dumps, and the trial records the run would have written.
pub fn replay(
    prepared: &Prepared<'_>,
    case: &str,
    turns: Option<usize>,
) -> Result<(Vec<TurnStates>, Vec<TrialRecord>), InvestigateError> {
    let scenario = prepared.scenario;
    let (plan_index, plan) = find_plan(scenario, &prepared.plans, case)?;
    // an agentic session has as many turns as it runs, at most its budget
    let agentic = match &scenario.params {
        crate::scenario::Params::Agentic(p) => Some(p),
        _ => None,
    };
    let most = agentic.map_or(plan.steps.len(), |p| p.max_turns);
    let upto = turns.unwrap_or(most);
    if upto == 0 || upto > most {
        return Err(InvestigateError::NoTurn {
            path: scenario.path.clone(),
            scenario: scenario.name.clone(),
            case: case.into(),
            turns: most,
            asked: upto,
        });
    }
    let progress = Progress::new(0, false);
    let ctx = Paired::new(prepared, &NullSink, &progress);
    let mut recorder = Recorder { last: Some(upto - 1), turns: Vec::new(), plan: plan.clone() };
    let records = match agentic {
        Some(p) => runner::agentic::run_session(&ctx, p, plan_index, plan, &mut recorder),
        None => paired::run_plan(&ctx, plan_index, plan, &mut recorder),
    };
    Ok((recorder.turns, records))
}

fn prepare<'a>(scenario: &'a Scenario, fault: Option<Option<Fault>>) -> Result<Prepared<'a>, InvestigateError> {
    runner::prepare(scenario, fault).map_err(|error| InvestigateError::Engine {
        path: scenario.path.clone(),
        scenario: scenario.name.clone(),
        error,
    })
}

/// The state after turn `turn` (1-based) of `case`: the warm instance's, or with `cold` the cold one's.
pub fn dump_turn(
    scenario: &Scenario,
    case: &str,
    fault: Option<Option<Fault>>,
    turn: Option<usize>,
    cold: bool,
) -> Result<StateDump, InvestigateError> {
    let prepared = prepare(scenario, fault)?;
    let (turns, _) = replay(&prepared, case, turn)?;
    let last = turns.last().ok_or_else(|| InvestigateError::NoTurn {
        path: scenario.path.clone(),
        scenario: scenario.name.clone(),
        case: case.into(),
        turns: 0,
        asked: turn.unwrap_or(0),
    })?;
    let turn_err = |message: String| InvestigateError::Turn {
        path: scenario.path.clone(),
        scenario: scenario.name.clone(),
        case: case.into(),
        turn: last.label.clone(),
        message,
    };
    let side = if cold { &last.cold } else { &last.warm };
    let sent = side.as_ref().ok_or_else(|| {
        turn_err(if cold {
            "a set-up turn runs on the warm instance only: no cold state to dump".into()
        } else {
            "the turn did not run (the plan stopped before it)".into()
        })
    })?;
    match &sent.dump {
        Some(Ok(d)) => Ok(d.clone()),
        Some(Err(e)) => Err(turn_err(format!("dump failed: {e}"))),
        None if !prepared.launcher.caps().dumps => Err(turn_err("the engine offers no state dumps".into())),
        None => Err(turn_err(format!(
            "no dump: the request failed ({})",
            sent.result.as_ref().err().map(DriverError::code).unwrap_or_default()
        ))),
    }
}

fn tokens_line(w: &Result<Generation, DriverError>, c: Option<&Result<Generation, DriverError>>) -> String {
    match (w, c) {
        (Ok(w), None) => format!("{} tokens (set-up turn: warm only)", w.tokens.len()),
        (Err(e), None) => format!("warm failed: {}", e.code()),
        (Ok(w), Some(Ok(c))) => match first_divergence(w, c) {
            None => format!("tokens identical ({})", w.tokens.len()),
            Some(d) => format!(
                "tokens diverge at token {}{}",
                d.index,
                d.warm_gap.map(|g| format!(" (warm top-2 gap {g:.4})")).unwrap_or_default()
            ),
        },
        (Err(w), Some(Err(c))) if w.code() == c.code() => format!("both refused: {}", w.code()),
        (w, Some(c)) => format!(
            "outcomes differ: warm {}, cold {}",
            w.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.code()),
            c.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.code())
        ),
    }
}

/// Rerun `case`, writing every compared turn's dumps and diff under `out`, and return the story as text.
pub fn investigate(
    scenario: &Scenario,
    case: &str,
    fault: Option<Option<Fault>>,
    out: &Path,
) -> Result<String, InvestigateError> {
    let prepared = prepare(scenario, fault)?;
    let (turns, _) = replay(&prepared, case, None)?;
    tell(scenario, case, &prepared, &turns, out)
}

/// The story of a replay, with every turn's dumps and diff written under `out`.
pub fn tell(
    scenario: &Scenario,
    case: &str,
    prepared: &Prepared<'_>,
    turns: &[TurnStates],
    out: &Path,
) -> Result<String, InvestigateError> {
    let mut story = String::new();
    let mut parted: Option<String> = None;
    let mut compared_states = 0usize;
    let mut why_not: Option<String> = None;
    let _ = writeln!(
        story,
        "case `{case}` of scenario `{}` ({}), turn by turn, warm vs cold:",
        scenario.name,
        scenario.path.display()
    );
    for (i, t) in turns.iter().enumerate() {
        let Some(warm) = &t.warm else { continue };
        let dir = out.join(format!("turn-{}", i + 1));
        std::fs::create_dir_all(&dir).map_err(|source| ProvenanceError::Io { path: dir.clone(), source })?;
        let write = |d: &StateDump, name: &str| {
            let p = dir.join(name);
            kvproof_engines::dump::write_file(d, &p)
                .map(|_| p.display().to_string())
                .map_err(|e| ProvenanceError::Write { path: p.clone(), message: e.to_string() })
        };
        let reuse = match &warm.result {
            Ok(g) => g.reused.map(|r| format!("reused {r}")).unwrap_or_else(|| "reuse not reported".into()),
            Err(e) => format!("warm failed: {}", e.code()),
        };
        let tokens = tokens_line(&warm.result, t.cold.as_ref().map(|c| &c.result));
        let state = match (t.warm_dump(), t.cold_dump()) {
            (Some(w), Some(c)) => {
                let (wp, cp) = (write(w, "warm.safetensors")?, write(c, "cold.safetensors")?);
                let d = state_diff::compare(w, c).map_err(ProvenanceError::from)?;
                compared_states += 1;
                render::write_all(&d, &dir, (&wp, &cp))?;
                let headline = d.headline("warm", "cold");
                if !d.identical() && parted.is_none() {
                    parted = Some(format!("{} ({})", t.label, headline));
                    let heat = dir.join("heatmap.svg");
                    crate::plot::heatmap::draw(&d, &heat, &format!("{case}, {}: warm vs cold", t.label))
                        .map_err(|e| ProvenanceError::Write { path: heat, message: e.to_string() })?;
                }
                headline
            }
            (Some(w), None) => {
                write(w, "warm.safetensors")?;
                "warm state saved (no cold run on a set-up turn)".into()
            }
            _ => {
                let why = if prepared.launcher.caps().dumps {
                    "a request failed, so no dump was taken"
                } else {
                    "the engine offers no state dumps"
                };
                why_not.get_or_insert_with(|| why.to_string());
                format!("not compared ({why})")
            }
        };
        let _ = writeln!(
            story,
            "  {:<8} slot {} prompt {:>5}  {reuse:<14} {tokens}; state: {state}",
            t.label, warm.request.slot, t.prompt_tokens
        );
    }
    match (parted, compared_states) {
        (Some(p), _) => {
            let _ = writeln!(story, "states first part at {p}");
        }
        (None, 0) => {
            let _ = writeln!(
                story,
                "no state was compared ({}): whether the warm and cold states match is unknown",
                why_not.unwrap_or_else(|| "no compared turn ran".into())
            );
        }
        (None, n) => {
            let _ = writeln!(story, "warm and cold states agree after every compared turn ({n})");
        }
    }
    let _ = writeln!(story, "dumps and diffs: {}", out.display());
    Ok(story)
}
