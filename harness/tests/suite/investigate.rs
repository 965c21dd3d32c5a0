//! `kvproof investigate` and `kvproof dump` replay a case through the runner itself: every warm request they send
//! is the request a run sends (same id, slot and prompt), on the cases that use several slots and conversations.
//! The story names the first divergent row a failing run names, and says so when it compared no state.

use std::sync::{Arc, Mutex};

use kvproof::driver::{Caps, Driver, DriverError, Generation, Launcher, Profile};
use kvproof::investigate;
use kvproof::progress::Progress;
use kvproof::record::NullSink;
use kvproof::runner;
use kvproof::scenario::{load_file, CaseName, Params, Scenario};
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::Request;
use kvproof_engines::fault::Fault;

use crate::support;
use support::{repo, ScratchDir};

/// (id, slot, prompt) of a request.
type Sent = (u64, usize, Vec<u32>);
/// Every request any instance ran.
type Log = Arc<Mutex<Vec<Sent>>>;

struct Recording {
    inner: Box<dyn Launcher>,
    log: Log,
}

struct RecordingDriver {
    inner: Box<dyn Driver>,
    log: Log,
}

impl Launcher for Recording {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        Ok(Box::new(RecordingDriver { inner: self.inner.launch()?, log: Arc::clone(&self.log) }))
    }
    fn profile(&self) -> &Profile {
        self.inner.profile()
    }
}

impl RecordingDriver {
    fn note(&self, req: &Request) {
        self.log.lock().expect("log").push((req.id, req.slot, req.prompt.clone()));
    }
}

impl Driver for RecordingDriver {
    fn profile(&self) -> &Profile {
        self.inner.profile()
    }
    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        self.note(req);
        self.inner.generate(req)
    }
    fn generate_cancel_at(&mut self, req: &Request, poll: usize) -> Result<Generation, DriverError> {
        self.note(req);
        self.inner.generate_cancel_at(req, poll)
    }
    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError> {
        self.inner.dump(slot)
    }
    fn state_bytes(&mut self) -> Option<usize> {
        self.inner.state_bytes()
    }
}

fn glm_boundary(cases: &[CaseName]) -> Scenario {
    let mut s = load_file(&repo().join("scenarios/pr/glm-boundary.json")).expect("glm-boundary");
    if let Params::BoundaryMatrix(p) = &mut s.params {
        p.cases = Some(cases.to_vec());
    }
    s
}

/// The warm requests (id, slot, prompt) of `case` when the whole scenario runs, and when investigate replays it.
fn warm_requests(scenario: &Scenario, case: &str) -> (Vec<Sent>, Vec<Sent>) {
    let warm = |log: &Log, plan_index: usize| -> Vec<Sent> {
        let mut v: Vec<_> = log
            .lock()
            .expect("log")
            .iter()
            .filter(|(id, _, _)| id / 1_000_000 == plan_index as u64 && (id / 100) % 10 == 1)
            .cloned()
            .collect();
        v.sort_by_key(|r| r.0);
        v
    };
    let mut prepared = runner::prepare(scenario, None).expect("prepare");
    let plan_index = prepared.plans.iter().position(|p| p.name == case).expect("case planned");
    let run_log = Log::default();
    prepared.launcher = Box::new(Recording { inner: prepared.launcher, log: Arc::clone(&run_log) });
    let records = runner::run(&prepared, &NullSink, &Progress::new(0, false));
    assert!(records.iter().all(|t| t.verdict == kvproof::record::Verdict::Pass), "the clean run passes");

    let mut replayed = runner::prepare(scenario, None).expect("prepare");
    let replay_log = Log::default();
    replayed.launcher = Box::new(Recording { inner: replayed.launcher, log: Arc::clone(&replay_log) });
    let (turns, replay_records) = investigate::replay(&replayed, case, None).expect("replay");
    assert_eq!(turns.len(), prepared.plans[plan_index].steps.len());
    let same: Vec<_> = records.iter().filter(|t| t.plan == case).map(|t| (t.step.clone(), t.reused)).collect();
    let again: Vec<_> = replay_records.iter().map(|t| (t.step.clone(), t.reused)).collect();
    assert_eq!(same, again, "the replay's records equal the run's");
    (warm(&run_log, plan_index), warm(&replay_log, plan_index))
}

#[test]
fn investigate_replays_exactly_the_requests_the_run_sends_on_interleave_and_share() {
    let scenario = glm_boundary(&[CaseName::Extend, CaseName::Interleave, CaseName::Share]);
    for case in ["interleave", "share"] {
        let (run, replay) = warm_requests(&scenario, case);
        assert!(run.len() >= 4, "{case}: {} warm requests", run.len());
        assert!(run.iter().any(|r| r.1 != run[0].1), "{case} uses more than one slot");
        assert_eq!(run, replay, "{case}: investigate must send exactly the run's warm requests");
    }
}

#[test]
fn the_story_tells_slot_prompt_and_reuse_as_the_run_had_them() {
    let scenario = glm_boundary(&[CaseName::Interleave]);
    let scratch = ScratchDir::new(&format!("investigate-{}", std::process::id()));
    let out = scratch.join("run");
    let story = investigate::investigate(&scenario, "interleave", None, &out).expect("investigate");
    // the run's turn rows for the same case: (step, prompt tokens, reused) on the warm instance
    let mut prepared = runner::prepare(&scenario, None).expect("prepare");
    let log = Log::default();
    prepared.launcher = Box::new(Recording { inner: prepared.launcher, log: Arc::clone(&log) });
    let records = runner::run(&prepared, &NullSink, &Progress::new(0, false));
    for t in records.iter().filter(|t| t.plan == "interleave") {
        let line = story
            .lines()
            .find(|l| l.trim_start().starts_with(&t.step))
            .unwrap_or_else(|| panic!("no line for {}:\n{story}", t.step));
        assert!(line.contains(&format!("prompt {:>5}", t.prompt_tokens)), "{line} vs {t:?}");
        assert!(line.contains(&format!("reused {}", t.reused.expect("reused"))), "{line}");
    }
    assert!(story.contains("warm and cold states agree after every compared turn"), "{story}");
    assert!(out.join("turn-2").join("diff.txt").is_file());
}

#[test]
fn a_failing_case_names_the_same_first_divergent_row_as_the_run_and_dump_saves_that_state() {
    let mut scenario =
        load_file(&repo().join("scenarios/examples/inkling-memcmp-short.json")).expect("memcmp-short example");
    if let Params::BoundaryMatrix(p) = &mut scenario.params {
        p.cases = Some(vec![CaseName::DivergeLast]);
    }
    let prepared = runner::prepare(&scenario, None).expect("prepare");
    let records = runner::run(&prepared, &NullSink, &Progress::new(0, false));
    let failing = records.iter().find(|t| t.plan == "diverge-last").expect("diverge-last ran");
    let first = failing.state.as_ref().and_then(|s| s.first.clone()).expect("the run names a first divergent row");

    let scratch = ScratchDir::new(&format!("investigate-memcmp-{}", std::process::id()));
    let out = scratch.join("run");
    let story = investigate::investigate(&scenario, "diverge-last", None, &out).expect("investigate");
    let described = first.describe("warm", "cold");
    assert!(story.contains(&format!("states first part at {} ({described})", failing.step)), "{story}\n{described}");
    let txt = std::fs::read_to_string(out.join("turn-2").join("diff.txt")).expect("diff.txt");
    assert!(txt.contains(&format!("first divergent row: {described}")), "{txt}");

    let warm = investigate::dump_turn(&scenario, "diverge-last", None, Some(2), false).expect("warm dump");
    let cold = investigate::dump_turn(&scenario, "diverge-last", None, Some(2), true).expect("cold dump");
    let d = kvproof_engines::state_diff::compare(&warm, &cold).expect("comparable");
    assert_eq!(d.first.as_ref(), Some(&first));
    let e = investigate::dump_turn(&scenario, "diverge-last", None, Some(1), true).expect_err("set-up turn");
    assert!(e.to_string().contains("warm instance only"), "{e}");
    let e = investigate::dump_turn(&scenario, "diverge-last", None, Some(9), false).expect_err("no such turn");
    assert!(e.to_string().contains("has 2 turns, not 9"), "{e}");
}

#[test]
fn without_dumps_investigate_says_it_compared_no_state() {
    let mut scenario = glm_boundary(&[CaseName::Extend]);
    scenario.assertions.state = false;
    // a fault the state would show: with no state compared, the story must not claim agreement
    let scratch = ScratchDir::new(&format!("investigate-nodumps-{}", std::process::id()));
    let out = scratch.join("run");
    let prepared = runner::prepare(&scenario, Some(Some(Fault::BulkRecord))).expect("prepare");
    let no_dumps = Box::new(NoDumps(prepared.launcher));
    let prepared = runner::Prepared { launcher: no_dumps, ..prepared };
    let (turns, _) = investigate::replay(&prepared, "extend", None).expect("replay");
    assert!(turns.iter().all(|t| t.warm_dump().is_none()));
    let story = investigate::tell(&scenario, "extend", &prepared, &turns, &out).expect("story");
    assert!(story.contains("no state was compared"), "{story}");
    assert!(!story.contains("agree"), "{story}");
}

/// A launcher whose engine offers no dumps (as many a foreign engine).
struct NoDumps(Box<dyn Launcher>);

impl Launcher for NoDumps {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        self.0.launch()
    }
    fn profile(&self) -> &Profile {
        static PROFILE: std::sync::OnceLock<Profile> = std::sync::OnceLock::new();
        PROFILE.get_or_init(|| {
            let inner = self.0.profile();
            Profile { caps: Caps { dumps: false, ..inner.caps.clone() }, ..inner.clone() }
        })
    }
}
