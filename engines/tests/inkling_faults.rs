//! Every Inkling fault is caught by a warm/cold comparison, the reuse count, or the state's own consistency —
//! and the same scenario passes with the fault off.

use kvproof_engines::arch::inkling::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{CacheKind, StateDump};
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::tokenizer::AUDIO;
use kvproof_engines::{bundled, fixture};

fn open(fault: Option<Fault>) -> Box<dyn Engine> {
    let mut c = ModelConfig::preset(Preset::Tiny);
    c.initial_capacity = 32;
    let weights = fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
    bundled::open(c.into(), weights, fault).expect("open")
}

fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn req(id: u64, prompt: Vec<u32>) -> Request {
    Request { id, prompt, max_tokens: 6, ..Default::default() }
}

/// What the checks saw on the compared turn.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    reuse_wrong: bool,
    tokens_differ: bool,
    state_differs: bool,
    record_overclaims: bool,
}

impl Seen {
    fn caught(&self) -> bool {
        self.reuse_wrong || self.tokens_differ || self.state_differs || self.record_overclaims
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

/// The record claims positions no full layer holds a row for.
fn record_overclaims(d: &StateDump) -> bool {
    d.tensors
        .iter()
        .filter(|t| t.kind == CacheKind::Full)
        .any(|t| (0..d.record.ids.len() as i64).any(|p| t.row_of_position(p).is_none()))
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
    let mut seen = Seen { record_overclaims: record_overclaims(&wd), ..Default::default() };
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
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text(second)));
    let fed = p1.len() + r1.tokens.len() - 1;
    (vec![req(1, p1), req(2, render(&t, true))], fed)
}

fn assert_caught(fault: Fault, turns: &[Request], expected: usize) {
    let clean = run(None, turns, expected);
    assert!(!clean.caught(), "{fault}: the clean engine must pass the same scenario: {clean:?}");
    let broken = run(Some(fault), turns, expected);
    assert!(broken.caught(), "{fault} survived: {broken:?}");
}

#[test]
fn counter_reuse_is_caught_on_a_divergent_prompt() {
    let (mut turns, _) = chat("tell me about rings", "more");
    turns[1] = req(2, render(&[Message::new(Role::User, text("a different conversation, longer than before"))], true));
    assert_caught(Fault::CounterReuse, &turns, 0);
}

#[test]
fn bulk_record_is_caught_on_a_continuation() {
    let (turns, fed) = chat("hello there", "go on");
    assert_caught(Fault::BulkRecord, &turns, fed);
}

#[test]
fn memcmp_short_is_caught_at_the_last_recorded_id() {
    let (turns, fed) = chat("hello there", "go on");
    let mut p = turns[1].prompt.clone();
    p[fed - 1] = if p[fed - 1] == 66 { 67 } else { 66 };
    assert_caught(Fault::MemcmpShort, &[turns[0].clone(), req(2, p)], 0);
}

#[test]
fn reuse_equal_is_caught_on_a_shorter_prompt() {
    let (turns, _) = chat("hello there", "go on");
    // the first prompt again: shorter than what the state recorded
    assert_caught(Fault::ReuseEqual, &[turns[0].clone(), turns[0].clone()], 0);
}

#[test]
fn overrun_truncate_is_caught_by_the_record_claiming_unwritten_rows() {
    let (turns, _) = chat("hello there", "go on");
    // turn 2 continues turn 1 but runs past max_ctx: context exceeded mid-prefill
    let mut long = turns[1].prompt.clone();
    long.extend(std::iter::repeat_n(65u32, 1100));
    assert_caught(Fault::OverrunTruncate, &[turns[0].clone(), req(2, long)], 0);
}

#[test]
fn no_taint_is_caught_when_a_different_clip_shares_the_ids() {
    let mut content = text("listen ");
    content.extend([AUDIO, AUDIO]);
    let p1 = render(&[Message::new(Role::User, content)], true);
    let t1 = Request { audio: vec![vec![10; 8], vec![250; 8]], ..req(1, p1.clone()) };
    let reply = open(None).generate(&t1, &mut NoObserver).expect("turn 1").tokens;
    let mut p2 = p1;
    p2.extend(&reply);
    p2.extend(text("and?"));
    let t2 = Request { audio: vec![vec![99; 8], vec![3; 8]], ..req(2, p2) };
    assert_caught(Fault::NoTaint, &[t1, t2], 0);
}

#[test]
fn ring_linear_copy_is_caught_across_a_capacity_growth() {
    // turn 1 wraps the window of 8 and stays under 32 positions; turn 2 grows the slot past 32
    let (turns, fed) = chat("wrap the ring", "now grow the state well past its first capacity, please");
    assert!(fed % 8 != 0, "a ring whose length is a multiple of the window shows no rotation; pick other text");
    assert_caught(Fault::RingLinearCopy, &turns, fed);
}

#[test]
fn drop_grow_record_is_caught_by_the_reuse_count() {
    let (turns, fed) = chat("wrap the ring", "now grow the state well past its first capacity, please");
    assert_caught(Fault::DropGrowRecord, &turns, fed);
}

#[test]
fn ring_append_first_is_caught_when_a_batch_outruns_the_window() {
    let (turns, fed) = chat("a first turn", "a second turn whose tail is longer than the window");
    assert_caught(Fault::RingAppendFirst, &turns, fed);
}

#[test]
fn every_inkling_fault_has_a_test_here() {
    // keep this list in step with the tests above
    let tested = [
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::OverrunTruncate,
        Fault::NoTaint,
        Fault::RingLinearCopy,
        Fault::DropGrowRecord,
        Fault::RingAppendFirst,
    ];
    assert_eq!(bundled::arch("inkling").expect("inkling").faults, &tested);
}
