//! Investigating one case: rerun it turn by turn, dump warm and cold after every turn, diff them, and tell the
//! story — the turn where the states first part, the first divergent layer and position, both writers, and whether
//! the tokens diverged and at what top-2 gap. `kvproof dump` uses the same walk to save one turn's state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Request, Sampling};
use kvproof_engines::fault::Fault;

use crate::cases::Plan;
use crate::conversation::Conversation;
use crate::driver::{DriverError, Generation};
use crate::provenance::{diff, MappedDump, ProvenanceError};
use crate::runner;
use crate::scenario::Scenario;

#[derive(Debug, thiserror::Error)]
pub enum InvestigateError {
    #[error("{path}: scenario `{scenario}`: no case `{case}` (cases: {known})")]
    NoCase { path: PathBuf, scenario: String, case: String, known: String },
    #[error("{path}: scenario `{scenario}`: case `{case}` has {turns} turns, not {asked}")]
    NoTurn { path: PathBuf, scenario: String, case: String, turns: usize, asked: usize },
    #[error("{path}: scenario `{scenario}`: {source}")]
    Engine { path: PathBuf, scenario: String, source: DriverError },
    #[error("{path}: scenario `{scenario}`, case `{case}`, {turn}: {message}")]
    Turn { path: PathBuf, scenario: String, case: String, turn: String, message: String },
    #[error(transparent)]
    Provenance(#[from] ProvenanceError),
}

/// One turn of the walk, warm and cold.
#[derive(Debug)]
pub struct TurnStates {
    pub label: String,
    pub prompt_tokens: usize,
    pub warm: Result<Generation, DriverError>,
    pub cold: Result<Generation, DriverError>,
    pub warm_dump: Option<StateDump>,
    pub cold_dump: Option<StateDump>,
}

fn find_plan<'a>(scenario: &Scenario, plans: &'a [Plan], case: &str) -> Result<&'a Plan, InvestigateError> {
    plans.iter().find(|p| p.name == case).ok_or_else(|| InvestigateError::NoCase {
        path: scenario.path.clone(),
        scenario: scenario.name.clone(),
        case: case.to_string(),
        known: plans.iter().map(|p| p.name.as_str()).take(40).collect::<Vec<_>>().join(", "),
    })
}

/// Walk `case` of `scenario` for `turns` turns (all when None), running each turn warm (one instance through the
/// conversation) and cold (a fresh instance given that turn's prompt alone), dumping both after each turn.
pub fn walk(
    scenario: &Scenario,
    case: &str,
    fault: Option<Option<Fault>>,
    turns: Option<usize>,
    mut on_turn: impl FnMut(usize, &TurnStates) -> Result<(), InvestigateError>,
) -> Result<(), InvestigateError> {
    let engine_err =
        |source| InvestigateError::Engine { path: scenario.path.clone(), scenario: scenario.name.clone(), source };
    let prepared = runner::prepare(scenario, fault).map_err(engine_err)?;
    let plan = find_plan(scenario, &prepared.plans, case)?;
    let upto = turns.unwrap_or(plan.steps.len());
    if upto == 0 || upto > plan.steps.len() {
        return Err(InvestigateError::NoTurn {
            path: scenario.path.clone(),
            scenario: scenario.name.clone(),
            case: case.into(),
            turns: plan.steps.len(),
            asked: upto,
        });
    }
    let launcher = prepared.launcher.as_ref();
    let mut warm = launcher.launch().map_err(engine_err)?;
    let mut conv = Conversation::new(plan.seed, launcher.caps().audio_frame_bytes.unwrap_or(0));
    for (i, step) in plan.steps.iter().take(upto).enumerate() {
        let turn_err = |message: String| InvestigateError::Turn {
            path: scenario.path.clone(),
            scenario: scenario.name.clone(),
            case: case.into(),
            turn: step.label.clone(),
            message,
        };
        let (p, pending) = conv.prepare(&step.prompt).map_err(turn_err)?;
        let req = |id: u64| Request {
            id,
            slot: plan.slot,
            prompt: p.prompt.clone(),
            audio: p.audio.clone(),
            max_tokens: step.max_tokens,
            sampling: Sampling::default(),
            logprobs: 0,
            ignore_eos: false,
        };
        let w = warm.generate(&req(i as u64 * 10 + 1));
        let warm_dump = warm.dump(plan.slot).ok();
        let mut cold = launcher.launch().map_err(engine_err)?;
        let c = cold.generate(&req(i as u64 * 10 + 2));
        let cold_dump = cold.dump(plan.slot).ok();
        let reply = w.as_ref().ok().map(|g| g.tokens.clone());
        let states = TurnStates {
            label: step.label.clone(),
            prompt_tokens: p.prompt.len(),
            warm: w,
            cold: c,
            warm_dump,
            cold_dump,
        };
        on_turn(i, &states)?;
        if matches!(&states.warm, Err(e) if e.is_fatal()) {
            warm = launcher.launch().map_err(engine_err)?;
        }
        conv.finish(&p, pending, reply.as_deref());
    }
    Ok(())
}

/// The first differing token and the warm top-2 gap there.
fn token_divergence(w: &Generation, c: &Generation) -> Option<(usize, Option<f32>)> {
    let at = w
        .tokens
        .iter()
        .zip(&c.tokens)
        .position(|(a, b)| a != b)
        .or_else(|| (w.tokens.len() != c.tokens.len()).then(|| w.tokens.len().min(c.tokens.len())))?;
    Some((at, w.gaps.as_ref().and_then(|g| g.get(at).copied())))
}

/// Rerun `case`, writing every turn's dumps and diff under `out`, and return the story as text.
pub fn investigate(
    scenario: &Scenario,
    case: &str,
    fault: Option<Option<Fault>>,
    out: &Path,
) -> Result<String, InvestigateError> {
    let mut story = String::new();
    let mut parted: Option<String> = None;
    let _ = writeln!(
        story,
        "case `{case}` of scenario `{}` ({}), turn by turn, warm vs cold:",
        scenario.name,
        scenario.path.display()
    );
    walk(scenario, case, fault, None, |i, t| {
        let dir = out.join(format!("turn-{}", i + 1));
        std::fs::create_dir_all(&dir).map_err(|source| ProvenanceError::Io { path: dir.clone(), source })?;
        let reuse = match &t.warm {
            Ok(g) => g.reused.map(|r| format!("reused {r}")).unwrap_or_else(|| "reuse not reported".into()),
            Err(e) => format!("warm failed: {e}"),
        };
        let tokens = match (&t.warm, &t.cold) {
            (Ok(w), Ok(c)) => match token_divergence(w, c) {
                None => format!("tokens identical ({})", w.tokens.len()),
                Some((at, gap)) => format!(
                    "tokens diverge at token {at}{}",
                    gap.map(|g| format!(" (warm top-2 gap {g:.4})")).unwrap_or_default()
                ),
            },
            (Err(w), Err(c)) if w.code() == c.code() => format!("both refused: {}", w.code()),
            (w, c) => format!(
                "outcomes differ: warm {}, cold {}",
                w.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.code()),
                c.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.code())
            ),
        };
        let state = match (&t.warm_dump, &t.cold_dump) {
            (Some(w), Some(c)) => {
                let (wp, cp) = (dir.join("warm.safetensors"), dir.join("cold.safetensors"));
                let write = |d: &StateDump, p: &Path| {
                    kvproof_engines::dump::write_file(d, p)
                        .map_err(|e| ProvenanceError::Write { path: p.into(), message: e.to_string() })
                };
                write(w, &wp)?;
                write(c, &cp)?;
                let d = diff(&MappedDump::open(&wp)?, &MappedDump::open(&cp)?)?;
                std::fs::write(dir.join("diff.txt"), crate::provenance::render::table(&d, "warm", "cold"))
                    .map_err(|source| ProvenanceError::Io { path: dir.join("diff.txt"), source })?;
                let headline = d.headline("warm", "cold");
                if !d.identical() && parted.is_none() {
                    parted = Some(format!("{} ({})", t.label, headline));
                    let heat = dir.join("heatmap.svg");
                    crate::plot::heatmap::draw(&d, &heat, &format!("{case}, {}: warm vs cold", t.label))
                        .map_err(|e| ProvenanceError::Write { path: heat, message: e.to_string() })?;
                }
                headline
            }
            _ => "no dumps (the engine offers none, or a request failed)".into(),
        };
        let _ = writeln!(story, "  {:<8} prompt {:>5}  {reuse:<14} {tokens}; state: {state}", t.label, t.prompt_tokens);
        Ok(())
    })?;
    match parted {
        Some(p) => {
            let _ = writeln!(story, "states first part at {p}");
        }
        None => {
            let _ = writeln!(story, "warm and cold states agree after every turn");
        }
    }
    let _ = writeln!(story, "dumps and diffs: {}", out.display());
    Ok(story)
}
