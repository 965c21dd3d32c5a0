//! A panic while one compared turn runs or is checked costs that turn (an `error` record naming the panic), not
//! the run: the boundary runner goes on with the plan's next turns on a fresh warm instance, the agentic runner
//! ends that session. No check is known to panic, so a tap (which sees every request inside the guarded part)
//! plants one.

use std::path::Path;

use kvproof::progress::Progress;
use kvproof::record::{NullSink, TrialRecord};
use kvproof::runner::instances::Sent;
use kvproof::runner::paired::{run_plan, Paired, Tap};
use kvproof::scenario::{load_file, load_str, Params};

/// Panics when step `at` sends its first request.
struct PanicAt(usize);

impl Tap for PanicAt {
    fn sent(&mut self, step_index: usize, _sent: &Sent) {
        assert_ne!(step_index, self.0, "planted panic at step {step_index}");
    }
}

fn errors(records: &[TrialRecord]) -> Vec<(usize, String)> {
    records.iter().filter_map(|r| r.error.clone().map(|e| (r.step_index, e))).collect()
}

#[test]
fn a_panic_in_a_boundary_turn_is_that_turns_error_and_the_plan_goes_on() {
    let text = r#"{"name": "guard", "engine": {"arch": "inkling", "preset": "tiny"}, "kind": "boundary-matrix",
        "params": {"max_tokens": 4}}"#;
    let scenario = load_str(Path::new("guard.json"), text).expect("scenario");
    let prepared = kvproof::runner::prepare(&scenario, None).expect("engine");
    let progress = Progress::new(0, false);
    let ctx = Paired::new(&prepared, &NullSink, &progress);
    let compared_steps = |i: usize| -> Vec<usize> {
        let steps = &prepared.plans[i].steps;
        (0..steps.len()).filter(|&s| steps[s].compare).collect()
    };
    // a case that compares two turns or more, so a turn after the panic is seen to run
    let index = (0..prepared.plans.len()).find(|&i| compared_steps(i).len() >= 2).expect("a multi-turn case");
    let compared = compared_steps(index);
    let records = run_plan(&ctx, index, &prepared.plans[index], &mut PanicAt(compared[0]));
    let errors = errors(&records);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, compared[0]);
    assert!(errors[0].1.contains("panicked") && errors[0].1.contains("planted panic"), "{errors:?}");
    assert_eq!(records.len(), compared.len(), "the later turns still ran");
}

#[test]
fn a_panic_in_an_agentic_turn_ends_that_session_with_an_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/pr/glm-agentic.json");
    let mut scenario = load_file(&path).expect("scenario");
    let Params::Agentic(params) = &mut scenario.params else { panic!("an agentic scenario") };
    params.sessions = 1;
    let params = params.clone();
    let prepared = kvproof::runner::prepare(&scenario, None).expect("engine");
    let progress = Progress::new(0, false);
    let ctx = Paired::new(&prepared, &NullSink, &progress);
    let records = kvproof::runner::agentic::run_session(&ctx, &params, 0, &prepared.plans[0], &mut PanicAt(1));
    assert_eq!(records.len(), 2, "turn 1, then the error of turn 2 and nothing after: {records:#?}");
    assert!(records[0].error.is_none(), "{:?}", records[0].error);
    let e = records[1].error.as_deref().unwrap_or_default();
    assert!(e.contains("panicked") && e.contains("planted panic"), "{e}");
}
