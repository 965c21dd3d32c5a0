//! Every Kimi fault is caught — truncate-recurrent by a warm/cold comparison (tokens, or the state row by row by
//! absolute position) or the reuse count, kv-leak by the memory check — and the same scenario passes with the fault
//! off.

use kvproof_engines::arch::kimi::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::{bundled, fixture};

fn config() -> ModelConfig {
    let mut c = ModelConfig::preset(Preset::Tiny);
    c.initial_capacity = 32;
    c
}

fn open_with(c: ModelConfig, fault: Option<Fault>) -> Box<dyn Engine> {
    let weights = fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
    bundled::open(c.into(), weights, fault).expect("open")
}

fn open(fault: Option<Fault>) -> Box<dyn Engine> {
    open_with(config(), fault)
}

fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn req(id: u64, prompt: Vec<u32>) -> Request {
    Request { id, prompt, max_tokens: 6, ..Default::default() }
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
fn run(fault: Option<Fault>, turns: &[Request], expected_reuse: usize) -> Seen {
    let mut warm = open(fault);
    let mut last = None;
    for r in turns {
        last = Some(warm.generate(r, &mut NoObserver));
    }
    let last_req = turns.last().expect("a turn");
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

/// The memory check: over a conversation of `turns` turns, every turn's state bytes must be those of a fresh slot
/// of the same capacity (bytes follow the context, not the turn count). Returns the turns that broke it.
fn memory_check(fault: Option<Fault>, growing: bool, turns: u64) -> Vec<(u64, usize, usize)> {
    let mut warm = open(fault);
    let mut transcript = vec![Message::new(Role::System, text("be brief"))];
    let mut broken = Vec::new();
    for turn in 0..turns {
        let question = Message::new(Role::User, text(&format!("turn {turn}: go on")));
        let prompt = if growing {
            transcript.push(question);
            render(&transcript, true)
        } else {
            render(&[question], true)
        };
        let r = warm.generate(&req(turn, prompt), &mut NoObserver).expect("turn");
        if growing {
            transcript.push(Message::from_reply(&r.tokens));
        }
        let mut at_cap = config();
        at_cap.initial_capacity = warm.dump(0).expect("dump").meta.capacity;
        let expected = open_with(at_cap, None).state_bytes();
        if warm.state_bytes() != expected {
            broken.push((turn, warm.state_bytes(), expected));
        }
    }
    broken
}

/// A two-turn chat: turn 2 continues turn 1 (prompt + reply + new text).
fn chat(first: &str, second: &str) -> Vec<Request> {
    let mut warm = open(None);
    let mut t = vec![Message::new(Role::User, text(first))];
    let p1 = render(&t, true);
    let r1 = warm.generate(&req(1, p1.clone()), &mut NoObserver).expect("turn 1");
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text(second)));
    vec![req(1, p1), req(2, render(&t, true))]
}

fn assert_caught(fault: Fault, turns: &[Request], expected: usize) {
    let clean = run(None, turns, expected);
    assert!(!clean.caught(), "{fault}: the clean engine must pass the same scenario: {clean:?}");
    let broken = run(Some(fault), turns, expected);
    assert!(broken.caught(), "{fault} survived: {broken:?}");
    eprintln!("{fault} caught by {broken:?}");
}

#[test]
fn truncate_recurrent_is_caught_when_a_prompt_diverges_after_a_shared_prefix() {
    let turns = chat("tell me about recurrent states", "and more");
    // the same conversation, edited: turn 1's user text changes near its end (a long shared prefix)
    let mut edited = turns[1].prompt.clone();
    edited[20] = b'#' as u32;
    assert_caught(Fault::TruncateRecurrent, &[turns[0].clone(), req(2, edited)], 0);
}

#[test]
fn truncate_recurrent_is_caught_on_a_shorter_prompt() {
    let turns = chat("tell me about recurrent states", "and more");
    // turn 1's prompt cut short: a strict prefix of what the state was built from
    let shorter = turns[0].prompt[..turns[0].prompt.len() - 4].to_vec();
    assert_caught(Fault::TruncateRecurrent, &[turns[0].clone(), req(2, shorter)], 0);
}

#[test]
fn kv_leak_is_caught_by_the_memory_check_on_a_growing_conversation() {
    assert_eq!(memory_check(None, true, 20), vec![], "clean: bytes follow capacity");
    let broken = memory_check(Some(Fault::KvLeak), true, 20);
    assert!(!broken.is_empty(), "kv-leak survived the memory check");
    eprintln!("kv-leak caught on {} of 20 turns, first {:?}", broken.len(), broken[0]);
}

#[test]
fn kv_leak_is_caught_by_the_memory_check_on_a_conversation_that_does_not_grow() {
    assert_eq!(memory_check(None, false, 10), vec![]);
    let broken = memory_check(Some(Fault::KvLeak), false, 10);
    assert!(broken.len() >= 9, "leaks every turn: {broken:?}");
}

#[test]
fn kv_leak_is_invisible_to_warm_cold_comparison() {
    // why the memory check exists: the leak answers right and reuses right
    let turns = chat("hello there", "go on");
    let mut warm = open(None);
    let r1 = warm.generate(&turns[0], &mut NoObserver).expect("turn 1");
    let fed = turns[0].prompt.len() + r1.tokens.len() - 1;
    assert!(!run(Some(Fault::KvLeak), &turns, fed).caught());
}

#[test]
fn every_kimi_fault_has_a_test_here() {
    // keep this list in step with the tests above
    let tested = [Fault::KvLeak, Fault::TruncateRecurrent];
    assert_eq!(bundled::arch("kimi").expect("kimi").faults, &tested);
}
