//! Every fault of every bundled arch, as `bundled::arches()` lists them, is caught by the scenario mapped to it
//! below — and the same scenario passes with the fault off. A fault an arch gains without a catching scenario
//! fails `every_fault_of_every_arch_is_caught` by name.
//!
//! A warm scenario runs its turns on a warm engine and compares the last with a cold engine given it alone:
//! the reuse count against the rule's, the tokens, the state row by row by absolute position (and, for the
//! record, the rows it claims). A memory scenario runs a conversation and compares the state's bytes each turn
//! with those of a fresh slot of the same capacity.

use crate::common;

use common::{exact_on, fed, first_difference, ids, open, req, text, CancelAt};
use kvproof_engines::bundled;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::dump::{CacheKind, StateDump};
use kvproof_engines::engine::{NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::tokenizer::AUDIO;
use kvproof_engines::EngineError;
use strum::IntoEnumIterator;

/// Builds a request from the replies of the turns before it.
type Build = Box<dyn Fn(&[Vec<u32>]) -> Request>;

/// One turn, built from the replies of the turns before it, optionally cancelled at a prefill poll.
struct Turn {
    build: Build,
    cancel_at: Option<usize>,
}

/// A fixed request, whatever came before.
fn fixed(r: Request) -> Turn {
    Turn { build: Box::new(move |_| r.clone()), cancel_at: None }
}

/// A request built from the earlier replies.
fn after(build: impl Fn(&[Vec<u32>]) -> Request + 'static) -> Turn {
    Turn { build: Box::new(build), cancel_at: None }
}

/// What the checks saw on the compared (last) turn.
#[derive(Debug, Default)]
struct Seen {
    reused: usize,
    reuse_wrong: bool,
    tokens_differ: bool,
    /// The first row both states hold with different bits, with the writers of both.
    state_differs: Option<String>,
    record_overclaims: bool,
}

impl Seen {
    fn caught(&self) -> bool {
        self.reuse_wrong || self.tokens_differ || self.state_differs.is_some() || self.record_overclaims
    }
}

/// How a scenario catches a fault.
enum Check {
    /// Warm vs cold on the last turn, with the reuse the rule gives; `then` asserts more on what the fault did.
    Warm { overrides: &'static str, turns: Vec<Turn>, expected: usize, then: Box<dyn Fn(&Seen)> },
    /// Bytes held each turn vs a fresh slot of the same capacity, over `turns` turns of a growing conversation
    /// (or of unrelated prompts); with the fault, at least `min_broken` turns break it.
    Memory { growing: bool, turns: u64, min_broken: usize },
}

fn warm(overrides: &'static str, turns: Vec<Turn>, expected: usize) -> Check {
    Check::Warm { overrides, turns, expected, then: Box::new(|_| {}) }
}

fn warm_then(overrides: &'static str, turns: Vec<Turn>, expected: usize, then: impl Fn(&Seen) + 'static) -> Check {
    Check::Warm { overrides, turns, expected, then: Box::new(then) }
}

/// The record claims positions no full layer holds a row for.
fn record_overclaims(d: &StateDump) -> bool {
    d.tensors
        .iter()
        .filter(|t| t.kind == CacheKind::Full)
        .any(|t| (0..d.record.ids.len() as i64).any(|p| t.row_of_position(p).is_none()))
}

fn run_warm(arch: &str, overrides: &str, fault: Option<Fault>, turns: &[Turn], expected: usize) -> Seen {
    let mut warm = open(arch, overrides, fault);
    let mut replies: Vec<Vec<u32>> = Vec::new();
    let mut last = None;
    for t in turns {
        let r = (t.build)(&replies);
        let out = match t.cancel_at {
            Some(at) => {
                let out = warm.generate(&r, &mut CancelAt::new(at));
                assert!(matches!(out, Err(EngineError::Cancelled)), "the cancel must land");
                out
            }
            None => warm.generate(&r, &mut NoObserver),
        };
        replies.push(out.as_ref().map(|o| o.tokens.clone()).unwrap_or_default());
        last = Some((r, out));
    }
    let (r, w) = last.expect("a compared turn");
    let mut cold = warm.fresh();
    let c = cold.generate(&r, &mut NoObserver);
    let (wd, cd) = (warm.dump(r.slot).expect("dump"), cold.dump(r.slot).expect("dump"));
    let mut seen = Seen { record_overclaims: record_overclaims(&wd), ..Default::default() };
    if let (Ok(w), Ok(c)) = (w, c) {
        seen.reused = w.reused;
        seen.reuse_wrong = w.reused != expected;
        seen.tokens_differ = w.tokens != c.tokens;
        seen.state_differs = first_difference(&wd, &cd);
    }
    seen
}

/// The turns whose state bytes differ from a fresh slot's at the same capacity: (turn, held, expected).
fn memory_broken(arch: &str, fault: Option<Fault>, growing: bool, turns: u64) -> Vec<(u64, usize, usize)> {
    let mut warm = open(arch, "{}", fault);
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
        let r = warm.generate(&req(turn, prompt, 6), &mut NoObserver).expect("turn");
        if growing {
            transcript.push(Message::from_reply(&r.tokens));
        }
        let capacity = warm.dump(0).expect("dump").meta.capacity;
        let expected = open(arch, &format!("{{\"initial_capacity\": {capacity}}}"), None).state_bytes();
        if warm.state_bytes() != expected {
            broken.push((turn, warm.state_bytes(), expected));
        }
    }
    broken
}

/// Run `check` clean (it must pass) and with `fault` (it must be caught).
fn assert_caught(arch: &str, fault: Fault, check: &Check) {
    match check {
        Check::Warm { overrides, turns, expected, then } => {
            let clean = run_warm(arch, overrides, None, turns, *expected);
            assert!(!clean.caught(), "{arch} {fault}: the clean engine must pass the same scenario: {clean:?}");
            let broken = run_warm(arch, overrides, Some(fault), turns, *expected);
            assert!(broken.caught(), "{arch} {fault} survived: {broken:?}");
            then(&broken);
        }
        Check::Memory { growing, turns, min_broken } => {
            assert_eq!(memory_broken(arch, None, *growing, *turns), vec![], "{arch}: clean bytes follow capacity");
            let broken = memory_broken(arch, Some(fault), *growing, *turns);
            assert!(broken.len() >= *min_broken, "{arch} {fault} survived the memory check: {broken:?}");
        }
    }
}

/// A two-turn chat on `arch` (with `overrides`): turn 2 continues turn 1 (prompt + reply + new text).
/// Returns both requests (6 tokens each) and the length turn 1 fed.
fn chat(arch: &str, overrides: &str, first: &str, second: &str) -> (Vec<Request>, usize) {
    let mut warm = open(arch, overrides, None);
    let mut t = vec![Message::new(Role::User, text(first))];
    let p1 = render(&t, true);
    let r1 = warm.generate(&req(1, p1.clone(), 6), &mut NoObserver).expect("turn 1");
    assert!(r1.tokens.len() > 1, "the reply must feed at least one id");
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text(second)));
    let fed = p1.len() + r1.tokens.len() - 1;
    (vec![req(1, p1, 6), req(2, render(&t, true), 6)], fed)
}

/// Turn 2 on `slot` after a fixed turn 1 prompt `first`: `head(first, turn 1's reply)` then `tail`.
fn then(slot: usize, first: Vec<u32>, head: fn(&[u32], &[u32]) -> Vec<u32>, tail: Vec<u32>, max_tokens: usize) -> Turn {
    after(move |replies| {
        let mut p = head(&first, &replies[0]);
        p.extend_from_slice(&tail);
        exact_on(2, slot, p, max_tokens)
    })
}

fn whole(prompt: &[u32], reply: &[u32]) -> Vec<u32> {
    prompt.iter().chain(reply).copied().collect()
}

/// The scenarios that catch `fault` on `arch`; `None` where no scenario is mapped (a fault without a test).
fn catching(arch: &str, fault: Fault) -> Option<Vec<Check>> {
    let two = |(turns, _): (Vec<Request>, usize)| turns.into_iter().map(fixed).collect::<Vec<_>>();
    Some(match (arch, fault) {
        // the shared record faults, on the strict-prefix archs
        ("inkling" | "deepseek" | "llama", Fault::CounterReuse) => {
            let (turns, _) = chat(arch, "{}", "tell me about rings", "more");
            let other = render(&[Message::new(Role::User, text("a different conversation, longer than before"))], true);
            vec![warm("{}", vec![fixed(turns[0].clone()), fixed(req(2, other, 6))], 0)]
        }
        ("inkling" | "deepseek" | "llama", Fault::BulkRecord) => {
            let (turns, fed) = chat(arch, "{}", "hello there", "go on");
            vec![warm("{}", turns.into_iter().map(fixed).collect(), fed)]
        }
        ("inkling" | "llama", Fault::MemcmpShort) => {
            let (turns, fed) = chat(arch, "{}", "hello there", "go on");
            let mut p = turns[1].prompt.clone();
            p[fed - 1] = if p[fed - 1] == 66 { 67 } else { 66 };
            vec![warm("{}", vec![fixed(turns[0].clone()), fixed(req(2, p, 6))], 0)]
        }
        ("inkling" | "llama", Fault::ReuseEqual) => {
            // the first prompt again: shorter than what the state recorded
            let (turns, _) = chat(arch, "{}", "hello there", "go on");
            vec![warm("{}", vec![fixed(turns[0].clone()), fixed(turns[0].clone())], 0)]
        }
        ("inkling", Fault::OverrunTruncate) => {
            // turn 2 continues turn 1 but runs past max_ctx: context exceeded mid-prefill, and the record claims
            // rows that were never written
            let (turns, _) = chat(arch, "{}", "hello there", "go on");
            let mut long = turns[1].prompt.clone();
            long.extend(std::iter::repeat_n(65u32, 1100));
            vec![warm("{}", vec![fixed(turns[0].clone()), fixed(req(2, long, 6))], 0)]
        }
        ("inkling", Fault::NoTaint) => {
            // a different clip with the same ids
            let mut content = text("listen ");
            content.extend([AUDIO, AUDIO]);
            let p1 = render(&[Message::new(Role::User, content)], true);
            let t1 = Request { audio: vec![vec![10; 8], vec![250; 8]], ..req(1, p1.clone(), 6) };
            let reply = open(arch, "{}", None).generate(&t1, &mut NoObserver).expect("turn 1").tokens;
            let mut p2 = p1;
            p2.extend(&reply);
            p2.extend(text("and?"));
            let t2 = Request { audio: vec![vec![99; 8], vec![3; 8]], ..req(2, p2, 6) };
            vec![warm("{}", vec![fixed(t1), fixed(t2)], 0)]
        }
        ("inkling", Fault::RingLinearCopy) => {
            // turn 1 wraps the window of 8 and stays under 32 positions; turn 2 grows the slot past 32
            let o = r#"{"initial_capacity": 32}"#;
            let (turns, fed) =
                chat(arch, o, "wrap the ring", "now grow the state well past its first capacity, please");
            assert!(fed % 8 != 0, "a ring whose length is a multiple of the window shows no rotation");
            vec![warm(o, two((turns, fed)), fed)]
        }
        ("inkling" | "llama", Fault::DropGrowRecord) => {
            let o = r#"{"initial_capacity": 32}"#;
            let (turns, fed) =
                chat(arch, o, "wrap the ring", "now grow the state well past its first capacity, please");
            vec![warm(o, two((turns, fed)), fed)]
        }
        ("inkling", Fault::RingAppendFirst) => {
            let (turns, fed) = chat(arch, "{}", "a first turn", "a second turn whose tail is longer than the window");
            vec![warm("{}", two((turns, fed)), fed)]
        }
        ("deepseek", Fault::RecordOnFailure) => {
            // turn 2 is cancelled between two layers of its second prefill segment; turn 3 retries it with more
            let o = r#"{"prefill_chunk": 8}"#;
            let (turns, _) =
                chat(arch, o, "a first turn of some length", "a second turn, cancelled while it is prefilled");
            let layers = common::config(arch, o).base().layers;
            let mut retry = turns[1].prompt.clone();
            retry.extend(text(" (again)"));
            let cancelled = Turn { cancel_at: Some(layers + 3), ..fixed(turns[1].clone()) };
            vec![warm(o, vec![fixed(turns[0].clone()), cancelled, fixed(req(3, retry, 6))], 0)]
        }
        ("kimi", Fault::TruncateRecurrent) => {
            let (turns, _) = chat(arch, "{}", "tell me about recurrent states", "and more");
            // the same conversation, edited near the end of turn 1's user text (a long shared prefix)
            let mut edited = turns[1].prompt.clone();
            edited[20] = b'#' as u32;
            // and turn 1's prompt cut short: a strict prefix of what the state was built from
            let shorter = turns[0].prompt[..turns[0].prompt.len() - 4].to_vec();
            vec![
                warm("{}", vec![fixed(turns[0].clone()), fixed(req(2, edited, 6))], 0),
                warm("{}", vec![fixed(turns[0].clone()), fixed(req(2, shorter, 6))], 0),
            ]
        }
        ("kimi", Fault::KvLeak) => vec![
            Check::Memory { growing: true, turns: 20, min_broken: 1 },
            // it leaks every turn, whether the conversation grows or not
            Check::Memory { growing: false, turns: 10, min_broken: 9 },
        ],
        ("glm", Fault::CounterReuse) => {
            let mut other = ids(60, 2);
            other[0] = 200;
            let turns = vec![fixed(exact_on(1, 0, ids(30, 1), 5)), fixed(exact_on(2, 0, other, 5))];
            vec![warm_then("{}", turns, 0, |s| assert_eq!(s.reused, 34, "30 + 5 - 1, ids never compared"))]
        }
        ("glm", Fault::BulkRecord) => {
            let turns = vec![fixed(exact_on(1, 0, ids(30, 3), 5)), then(0, ids(30, 3), whole, ids(6, 4), 5)];
            vec![warm_then("{}", turns, 34, |s| assert_eq!(s.reused, 35, "the never-fed last reply id was claimed"))]
        }
        ("glm", Fault::MemcmpShort) => {
            let diverge_last = |p: &[u32], reply: &[u32]| {
                let mut f = fed(p, reply);
                let last = f.len() - 1;
                f[last] = (f[last] + 1) % 256;
                f
            };
            let turns = vec![fixed(exact_on(1, 0, ids(30, 5), 5)), then(0, ids(30, 5), diverge_last, ids(6, 6), 5)];
            vec![warm_then("{}", turns, 33, |s| assert_eq!(s.reused, 34))]
        }
        ("glm", Fault::ReuseEqual) => {
            let turns = vec![fixed(exact_on(1, 0, ids(30, 7), 5)), fixed(exact_on(2, 0, ids(30, 7), 5))];
            vec![warm_then("{}", turns, 29, |s| {
                assert_eq!(s.reused, 30);
                assert!(s.tokens_differ, "sampled from the stale logits after the last reply id");
            })]
        }
        ("glm", Fault::DropGrowRecord) => {
            // turn 2 (55 ids + 5) grows the slot past 32
            let turns = vec![fixed(exact_on(1, 0, ids(20, 8), 5)), then(0, ids(20, 8), whole, ids(30, 9), 5)];
            vec![warm_then(r#"{"initial_capacity": 32}"#, turns, 24, |s| assert_eq!(s.reused, 0))]
        }
        ("glm", Fault::StaleSlot) => {
            // a long conversation on slot 0, then a shorter one on the same slot: its decode must not see the rows
            // of positions past its own
            let mut other = ids(20, 11);
            other[0] = 200;
            let turns = vec![fixed(exact_on(1, 0, ids(60, 10), 8)), fixed(exact_on(2, 0, other, 8))];
            vec![warm_then("{}", turns, 0, |s| assert!(s.tokens_differ || s.state_differs.is_some(), "{s:?}"))]
        }
        ("glm", Fault::ShareOffByOne) => {
            // slot 1 (empty) gets a prompt sharing exactly 25 ids with slot 0's conversation
            let a = ids(40, 12);
            let mut p = a[..25].to_vec();
            p.extend(ids(20, 13));
            if p[25] == a[25] {
                p[25] = (p[25] + 1) % 256;
            }
            let turns = vec![fixed(exact_on(1, 0, a, 5)), fixed(exact_on(2, 1, p, 5))];
            vec![warm_then(r#"{"kv_share": true}"#, turns, 25, |s| assert_eq!(s.reused, 26))]
        }
        // glm53: turn 1 = `first` replying n, turn 2 = `first` + the whole reply + more
        ("glm53", Fault::VariableChunks) => {
            // 40 ids are cut 14/14/12 by the original chunker, 47 ids 16/16/15: the reused rows 0..32 were written
            // by chunks a cold run of the second prompt never uses. (The split follows the row count, and 13 to 15
            // rows happen to tile a 64-wide reduction alike, so lengths cut into those sizes would hide it.)
            let turns = vec![fixed(exact_on(1, 0, ids(40, 1), 4)), then(0, ids(40, 1), whole, ids(3, 2), 5)];
            vec![warm_then("{}", turns, 32, |s| {
                let diff = s.state_differs.as_deref().expect("rows differ");
                let cut = diff.contains("chunk 0 of 14 rows") && diff.contains("chunk 0 of 16 rows");
                assert!(diff.contains("pos 0:") && cut, "{diff}");
                assert!(!s.reuse_wrong, "the reuse count alone does not show this fault");
            })]
        }
        ("glm53", Fault::NoCanonicalBound) => {
            // prompt 32 + 20 replies: decode wrote rows 32..51; the fault reuses 48 where the rule says 32
            let turns = vec![fixed(exact_on(1, 0, ids(32, 3), 20)), then(0, ids(32, 3), whole, ids(5, 4), 5)];
            vec![warm_then("{}", turns, 32, |s| {
                assert_eq!(s.reused, 48);
                assert_eq!(
                    s.state_differs.as_deref(),
                    Some(
                        "layer 0 `k`, pos 32: warm row by decode (req 1, step 0), cold row by prefill (req 2, chunk \
                         2 of 16 rows)"
                    )
                );
            })]
        }
        ("glm53", Fault::NoGridQuantize) => {
            // the previous prompt (40) ends mid-grid: rows 32..40 were written by an 8-row chunk, cold writes 16
            let turns = vec![fixed(exact_on(1, 0, ids(40, 5), 4)), then(0, ids(40, 5), whole, ids(10, 6), 5)];
            vec![warm_then("{}", turns, 32, |s| {
                assert_eq!(s.reused, 40);
                let diff = s.state_differs.as_deref().expect("rows differ");
                assert!(diff.contains("pos 32:") && diff.contains("chunk 2 of 8 rows"), "{diff}");
            })]
        }
        ("glm53", Fault::DrafterNotResumed) => {
            // verification is exact, so the tokens survive it: the drafter's own rows show it
            let turns = vec![fixed(exact_on(1, 0, ids(40, 7), 6)), then(0, ids(40, 7), whole, ids(10, 8), 5)];
            vec![warm_then("{}", turns, 32, |s| {
                let diff = s.state_differs.as_deref().expect("rows differ");
                assert!(diff.contains("`draft_"), "{diff}");
            })]
        }
        _ => return None,
    })
}

#[test]
fn every_fault_of_every_arch_is_caught() {
    let mut missing = Vec::new();
    let mut caught = 0;
    for arch in bundled::arches() {
        for &fault in arch.faults {
            let Some(checks) = catching(arch.name, fault) else {
                missing.push(format!("{} {fault}", arch.name));
                continue;
            };
            assert!(!checks.is_empty(), "{} {fault}: an empty scenario list catches nothing", arch.name);
            for check in &checks {
                assert_caught(arch.name, fault, check);
            }
            caught += 1;
        }
    }
    assert!(missing.is_empty(), "faults with no catching scenario: {}", missing.join(", "));
    assert!(caught >= 25, "every arch lists its faults ({caught} caught)");
}

#[test]
fn a_fault_an_arch_does_not_have_is_refused() {
    for arch in bundled::arches() {
        for fault in Fault::iter().filter(|f| !arch.faults.contains(f)) {
            assert!(bundled::check_fault(arch.name, Some(fault)).is_err(), "{} {fault}", arch.name);
            assert!(catching(arch.name, fault).is_none(), "{} {fault}: a scenario for a fault it lacks", arch.name);
        }
    }
}
