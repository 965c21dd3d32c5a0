//! Every DeepSeek fault is caught by a warm/cold comparison (tokens, or the state row by row by absolute position)
//! or the reuse count — and the same scenario passes with the fault off.

use kvproof_engines::arch::deepseek::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::{bundled, fixture, EngineError};

fn config() -> ModelConfig {
    let mut c = ModelConfig::preset(Preset::Tiny);
    c.prefill_chunk = 8;
    c
}

fn open(fault: Option<Fault>) -> Box<dyn Engine> {
    let c = config();
    let weights = fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
    bundled::open(c.into(), weights, fault).expect("open")
}

fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn req(id: u64, prompt: Vec<u32>) -> Request {
    Request { id, prompt, max_tokens: 6, ..Default::default() }
}

/// Cancels at the `at`-th progress poll (0-based).
struct CancelAt {
    at: usize,
    polls: usize,
}
impl Observer for CancelAt {
    fn on_progress(&mut self) -> Flow {
        self.polls += 1;
        if self.polls - 1 == self.at {
            Flow::Cancel
        } else {
            Flow::Continue
        }
    }
}

/// One turn of a scenario: a request, optionally cancelled at a progress poll.
struct Turn {
    req: Request,
    cancel_at: Option<usize>,
}

fn turn(req: Request) -> Turn {
    Turn { req, cancel_at: None }
}

/// What the checks saw on the compared (last) turn.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    reuse_wrong: bool,
    tokens_differ: bool,
    state_differs: bool,
}

impl Seen {
    fn caught(&self) -> bool {
        self.reuse_wrong || self.tokens_differ || self.state_differs
    }
}

/// Rows matched by absolute position; any position both hold with different bits is a difference.
fn states_differ(a: &StateDump, b: &StateDump) -> bool {
    a.tensors.iter().zip(&b.tensors).any(|(x, y)| {
        (0..x.rows()).any(|i| {
            let p = x.positions[i];
            p >= 0
                && y.row_of_position(p)
                    .is_some_and(|j| x.row(i).iter().zip(y.row(j)).any(|(u, v)| u.to_bits() != v.to_bits()))
        })
    })
}

/// Run `turns` on a warm engine; compare the last turn with a cold engine given it alone.
fn run(fault: Option<Fault>, turns: &[Turn], expected_reuse: usize) -> Seen {
    let mut warm = open(fault);
    let mut last = None;
    for t in turns {
        last = Some(match t.cancel_at {
            Some(at) => {
                let out = warm.generate(&t.req, &mut CancelAt { at, polls: 0 });
                assert!(matches!(out, Err(EngineError::Cancelled)), "the cancel must land");
                out
            }
            None => warm.generate(&t.req, &mut NoObserver),
        });
    }
    let last_req = &turns.last().expect("a turn").req;
    let mut cold = warm.fresh();
    let c = cold.generate(last_req, &mut NoObserver);
    let (wd, cd) = (warm.dump(0).expect("dump"), cold.dump(0).expect("dump"));
    let mut seen = Seen::default();
    if let (Some(Ok(w)), Ok(c)) = (last, c) {
        seen.reuse_wrong = w.reused != expected_reuse;
        seen.tokens_differ = w.tokens != c.tokens;
        seen.state_differs = states_differ(&wd, &cd);
    }
    seen
}

/// A two-turn chat: turn 2 continues turn 1 (prompt + reply + new text). Returns the requests and the fed length.
fn chat(first: &str, second: &str) -> (Vec<Request>, usize) {
    let mut warm = open(None);
    let mut t = vec![Message::new(Role::User, text(first))];
    let p1 = render(&t, true);
    let r1 = warm.generate(&req(1, p1.clone()), &mut NoObserver).expect("turn 1");
    assert!(r1.tokens.len() > 1, "the reply must feed at least one id");
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text(second)));
    let fed = p1.len() + r1.tokens.len() - 1;
    (vec![req(1, p1), req(2, render(&t, true))], fed)
}

fn assert_caught(fault: Fault, turns: &[Turn], expected: usize) {
    let clean = run(None, turns, expected);
    assert!(!clean.caught(), "{fault}: the clean engine must pass the same scenario: {clean:?}");
    let broken = run(Some(fault), turns, expected);
    assert!(broken.caught(), "{fault} survived: {broken:?}");
    eprintln!("{fault} caught by {broken:?}");
}

#[test]
fn counter_reuse_is_caught_on_a_divergent_prompt() {
    let (turns, _) = chat("tell me about rings", "more");
    let other = render(&[Message::new(Role::User, text("a different conversation, longer than before"))], true);
    assert_caught(Fault::CounterReuse, &[turn(turns[0].clone()), turn(req(2, other))], 0);
}

#[test]
fn bulk_record_is_caught_on_a_continuation() {
    let (turns, fed) = chat("hello there", "go on");
    let turns: Vec<Turn> = turns.into_iter().map(turn).collect();
    assert_caught(Fault::BulkRecord, &turns, fed);
}

#[test]
fn record_on_failure_is_caught_when_the_conversation_goes_on_after_a_cancel() {
    // turn 2 is cancelled between two layers of its second prefill segment; turn 3 retries it with more text
    let (turns, _) = chat("a first turn of some length", "a second turn, cancelled while it is prefilled");
    let layers = config().layers;
    let mut retry = turns[1].prompt.clone();
    retry.extend(text(" (again)"));
    let scenario =
        [turn(turns[0].clone()), Turn { req: turns[1].clone(), cancel_at: Some(layers + 3) }, turn(req(3, retry))];
    assert_caught(Fault::RecordOnFailure, &scenario, 0);
}

#[test]
fn every_deepseek_fault_has_a_test_here() {
    // keep this list in step with the tests above
    let tested = [Fault::CounterReuse, Fault::BulkRecord, Fault::RecordOnFailure];
    assert_eq!(bundled::arch("deepseek").expect("deepseek").faults, &tested);
}
