//! Every glm fault is caught by a warm/cold comparison (tokens, or the dumps matched row by row by absolute
//! position) or by the reuse count — and the same scenario passes with the fault off.

use kvproof_engines::arch::glm::Config as ModelConfig;
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{DumpTensor, StateDump};
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::{bundled, fixture};

fn config() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

fn open(c: ModelConfig, fault: Option<Fault>) -> Box<dyn Engine> {
    let weights = fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
    bundled::open(c.into(), weights, fault).expect("open")
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt.wrapping_mul(97)) >> 9) % 256).collect()
}

fn req(id: u64, slot: usize, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, slot, prompt, max_tokens, ignore_eos: true, ..Default::default() }
}

/// The first row both dumps hold at the same position with different bits, with both writers.
fn first_difference(a: &StateDump, b: &StateDump) -> Option<String> {
    let writer = |t: &DumpTensor, r: usize| t.writers[r].map(|w| w.to_string()).unwrap_or_else(|| "nobody".into());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        for i in 0..x.rows() {
            let p = x.positions[i];
            let Some(j) = (p >= 0).then(|| y.row_of_position(p)).flatten() else { continue };
            if x.row(i).iter().zip(y.row(j)).any(|(u, v)| u.to_bits() != v.to_bits()) {
                return Some(format!(
                    "layer {} {} position {p}: warm row by {}, cold row by {}",
                    x.layer,
                    x.name,
                    writer(x, i),
                    writer(y, j)
                ));
            }
        }
    }
    None
}

/// What the checks saw on the compared turn.
#[derive(Debug, Default)]
struct Seen {
    reused: usize,
    reuse_wrong: bool,
    tokens_differ: bool,
    state_differs: Option<String>,
}

impl Seen {
    fn caught(&self) -> bool {
        self.reuse_wrong || self.tokens_differ || self.state_differs.is_some()
    }
}

/// The ids turn 1 fed: its prompt and its reply but the last id.
fn fed(prompt: &[u32], reply: &[u32]) -> Vec<u32> {
    let mut f = prompt.to_vec();
    f.extend_from_slice(&reply[..reply.len() - 1]);
    f
}

/// One turn, built from the replies of the turns before it.
type Turn = Box<dyn Fn(&[Vec<u32>]) -> Request>;

/// Run every turn but the last on a warm engine; compare the last with a cold engine given it alone.
fn run(c: &ModelConfig, fault: Option<Fault>, turns: &[Turn], expected: usize) -> Seen {
    let mut warm = open(c.clone(), fault);
    let mut replies: Vec<Vec<u32>> = Vec::new();
    let (last, before) = turns.split_last().expect("a compared turn");
    for t in before {
        let r = warm.generate(&t(&replies), &mut NoObserver).expect("earlier turn");
        replies.push(r.tokens);
    }
    let last = last(&replies);
    let w = warm.generate(&last, &mut NoObserver).expect("warm");
    let mut cold = warm.fresh();
    let cr = cold.generate(&last, &mut NoObserver).expect("cold");
    Seen {
        reused: w.reused,
        reuse_wrong: w.reused != expected,
        tokens_differ: w.tokens != cr.tokens,
        state_differs: first_difference(&warm.dump(last.slot).expect("dump"), &cold.dump(last.slot).expect("dump")),
    }
}

fn assert_caught(c: ModelConfig, fault: Fault, turns: &[Turn], expected: usize) -> Seen {
    let clean = run(&c, None, turns, expected);
    assert!(!clean.caught(), "{fault}: the clean engine must pass the same scenario: {clean:?}");
    let broken = run(&c, Some(fault), turns, expected);
    assert!(broken.caught(), "{fault} survived: {broken:?}");
    broken
}

/// A fixed request, whatever came before.
fn fixed(r: Request) -> Turn {
    Box::new(move |_| r.clone())
}

/// Turn 2 on `slot`: `head(turn 1's reply)` followed by `tail`.
fn then(slot: usize, head: impl Fn(&[u32]) -> Vec<u32> + 'static, tail: Vec<u32>) -> Turn {
    Box::new(move |replies| {
        let mut p = head(&replies[0]);
        p.extend_from_slice(&tail);
        req(2, slot, p, 5)
    })
}

#[test]
fn counter_reuse_is_caught_on_another_conversation() {
    let mut other = ids(60, 2);
    other[0] = 200;
    let seen =
        assert_caught(config(), Fault::CounterReuse, &[fixed(req(1, 0, ids(30, 1), 5)), fixed(req(2, 0, other, 5))], 0);
    assert_eq!(seen.reused, 34, "30 + 5 - 1, ids never compared");
}

#[test]
fn bulk_record_is_caught_when_the_next_turn_carries_the_whole_reply() {
    let first = ids(30, 3);
    let p = first.clone();
    let whole = move |reply: &[u32]| p.iter().chain(reply).copied().collect::<Vec<u32>>();
    let seen = assert_caught(config(), Fault::BulkRecord, &[fixed(req(1, 0, first, 5)), then(0, whole, ids(6, 4))], 34);
    assert_eq!(seen.reused, 35, "the never-fed last reply id was claimed");
}

#[test]
fn memcmp_short_is_caught_at_the_last_recorded_id() {
    let first = ids(30, 5);
    let p = first.clone();
    let diverge_last = move |reply: &[u32]| {
        let mut f = fed(&p, reply);
        let last = f.len() - 1;
        f[last] = (f[last] + 1) % 256;
        f
    };
    let seen = assert_caught(
        config(),
        Fault::MemcmpShort,
        &[fixed(req(1, 0, first, 5)), then(0, diverge_last, ids(6, 6))],
        33,
    );
    assert_eq!(seen.reused, 34);
}

#[test]
fn reuse_equal_is_caught_on_an_exact_repeat() {
    let turns = [fixed(req(1, 0, ids(30, 7), 5)), fixed(req(2, 0, ids(30, 7), 5))];
    let seen = assert_caught(config(), Fault::ReuseEqual, &turns, 29);
    assert_eq!(seen.reused, 30);
    assert!(seen.tokens_differ, "sampled from the stale logits after the last reply id");
}

#[test]
fn drop_grow_record_is_caught_by_the_reuse_count() {
    let mut c = config();
    c.initial_capacity = 32;
    let first = ids(20, 8);
    let p = first.clone();
    let whole = move |reply: &[u32]| p.iter().chain(reply).copied().collect::<Vec<u32>>();
    // turn 2 (55 ids + 5) grows the slot past 32
    let seen = assert_caught(c, Fault::DropGrowRecord, &[fixed(req(1, 0, first, 5)), then(0, whole, ids(30, 9))], 24);
    assert_eq!(seen.reused, 0);
}

#[test]
fn stale_slot_is_caught_when_a_shorter_conversation_lands_on_a_used_slot() {
    // a long conversation on slot 0, then another, shorter one on the same slot: its decode must not see the
    // rows of positions past its own
    let mut other = ids(20, 11);
    other[0] = 200;
    let turns = [fixed(req(1, 0, ids(60, 10), 8)), fixed(req(2, 0, other, 8))];
    let seen = assert_caught(config(), Fault::StaleSlot, &turns, 0);
    assert!(seen.tokens_differ || seen.state_differs.is_some(), "{seen:?}");
}

#[test]
fn share_off_by_one_is_caught_on_an_empty_slot() {
    let c = ModelConfig { kv_share: true, ..config() };
    let a = ids(40, 12);
    // slot 1 (empty) gets a prompt sharing exactly 25 ids with slot 0's conversation
    let mut p = a[..25].to_vec();
    p.extend(ids(20, 13));
    if p[25] == a[25] {
        p[25] = (p[25] + 1) % 256;
    }
    let seen = assert_caught(c, Fault::ShareOffByOne, &[fixed(req(1, 0, a, 5)), fixed(req(2, 1, p, 5))], 25);
    assert_eq!(seen.reused, 26);
}

#[test]
fn every_glm_fault_has_a_test_here() {
    let tested = [
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::DropGrowRecord,
        Fault::StaleSlot,
        Fault::ShareOffByOne,
    ];
    assert_eq!(bundled::arch("glm").expect("glm").faults, &tested);
}
