//! Inkling end to end: ring vs full cache, warm vs cold continuation, capacity growth, and every fault caught.

use kvproof_engines::arch::inkling::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Reply, Request, TokenEvent};
use kvproof_engines::fault::Fault;
use kvproof_engines::tokenizer::AUDIO;
use kvproof_engines::{bundled, fixture};

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

fn open(config: ModelConfig, fault: Option<Fault>) -> Box<dyn Engine> {
    let weights = fixture::generate_weights(&config.clone().into(), 0).expect("fixture");
    bundled::open(config.into(), weights, fault).expect("open")
}

fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, prompt, max_tokens, ..Default::default() }
}

/// Every emitted token's full logit list (ids and bits).
#[derive(Default)]
struct Logits(Vec<Vec<(u32, u32)>>);
impl Observer for Logits {
    fn on_token(&mut self, e: &TokenEvent) -> Flow {
        self.0.push(e.top.iter().map(|&(i, l)| (i, l.to_bits())).collect());
        Flow::Continue
    }
}

fn logits_of(engine: &mut dyn Engine, prompt: &[u32], max_tokens: usize) -> Vec<Vec<(u32, u32)>> {
    let mut obs = Logits::default();
    let r = Request { logprobs: 300, ..req(1, prompt.to_vec(), max_tokens) };
    engine.generate(&r, &mut obs).expect("generate");
    obs.0
}

#[test]
fn ring_and_full_cache_give_bit_identical_logits_batch_and_token_by_token() {
    // 44 prompt ids + 8 generated with window 8: the ring wraps more than 4 times
    let prompt: Vec<u32> = (0..44).map(|i| (i * 7 + 3) % 250).collect();
    let mut variants = Vec::new();
    for (ring_kv, chunk) in [(true, 64), (true, 1), (false, 64), (false, 1), (true, 5)] {
        let mut c = tiny();
        c.ring_kv = ring_kv;
        c.prefill_chunk = chunk;
        let mut e = open(c, None);
        variants.push(((ring_kv, chunk), logits_of(e.as_mut(), &prompt, 8)));
    }
    let (_, reference) = &variants[0];
    assert_eq!(reference.len(), 8);
    for (label, l) in &variants[1..] {
        assert_eq!(l, reference, "variant {label:?} differs from ring prefilled in one batch");
    }
}

/// Turn 1 on `warm`, then turn 2 (which continues turn 1) on `warm` and on a fresh engine.
fn continue_conversation(warm: &mut dyn Engine, first: &str, second: &str, max_tokens: usize) -> (Reply, Reply, usize) {
    let mut transcript = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text(first))];
    let p1 = render(&transcript, true);
    let r1 = warm.generate(&req(1, p1.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    let fed = p1.len() + r1.tokens.len() - 1;
    transcript.push(Message::from_reply(&r1.tokens));
    transcript.push(Message::new(Role::User, text(second)));
    let p2 = render(&transcript, true);
    let r2 = warm.generate(&req(2, p2.clone(), max_tokens), &mut NoObserver).expect("turn 2 warm");
    let mut cold = warm.fresh();
    let c2 = cold.generate(&req(2, p2, max_tokens), &mut NoObserver).expect("turn 2 cold");
    (r2, c2, fed)
}

#[test]
fn turn_two_reuses_the_recorded_length_and_matches_a_fresh_engine() {
    let mut warm = open(tiny(), None);
    let (w, c, fed) = continue_conversation(warm.as_mut(), "hello", "and then?", 6);
    assert_eq!(w.reused, fed);
    assert_eq!(c.reused, 0);
    assert_eq!(w.tokens, c.tokens);
}

#[test]
fn continuation_past_the_window_and_across_capacity_growth() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open(c, None);
    // turn 1 (~50 ids) grows past 32 and wraps the window of 8; turn 2 grows again past 64
    let long = "a conversation that runs well past the sliding window";
    let (w, cold, fed) = continue_conversation(warm.as_mut(), long, "and now a second long turn to grow the state", 9);
    assert!(fed > 32, "turn 1 must outgrow the initial capacity");
    assert_eq!(w.reused, fed);
    assert_eq!(w.tokens, cold.tokens);
    let d = warm.dump(0).expect("dump");
    assert!(d.meta.capacity > 64, "turn 2 grew the slot again: {}", d.meta.capacity);
}

#[test]
fn divergent_and_repeated_prompts_reuse_nothing_and_still_match() {
    let mut warm = open(tiny(), None);
    let p1 = render(&[Message::new(Role::User, text("first question"))], true);
    warm.generate(&req(1, p1.clone(), 5), &mut NoObserver).expect("turn 1");
    let repeat = warm.generate(&req(2, p1.clone(), 5), &mut NoObserver).expect("repeat");
    assert_eq!(repeat.reused, 0);
    let other = render(&[Message::new(Role::User, text("Another question entirely"))], true);
    let div = warm.generate(&req(3, other.clone(), 5), &mut NoObserver).expect("divergent");
    assert_eq!(div.reused, 0);
    let mut cold = warm.fresh();
    assert_eq!(repeat.tokens, cold.generate(&req(2, p1, 5), &mut NoObserver).expect("cold").tokens);
    let mut cold = warm.fresh();
    assert_eq!(div.tokens, cold.generate(&req(3, other, 5), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn audio_taints_the_record() {
    let mut warm = open(tiny(), None);
    let mut content = text("listen: ");
    content.push(AUDIO);
    content.push(AUDIO);
    let p1 = render(&[Message::new(Role::User, content)], true);
    let frames = vec![vec![7u8; 8], vec![200u8; 8]];
    let r1 = Request { audio: frames, ..req(1, p1.clone(), 4) };
    let out = warm.generate(&r1, &mut NoObserver).expect("audio turn");
    assert!(warm.dump(0).expect("dump").record.tainted);
    let mut p2 = p1;
    p2.extend_from_slice(&out.tokens);
    p2.extend(text(" more"));
    // the same ids with different audio payloads must not be reused
    let r2 = Request { audio: vec![vec![9u8; 8], vec![1u8; 8]], ..req(2, p2, 4) };
    assert_eq!(warm.generate(&r2, &mut NoObserver).expect("turn 2").reused, 0);
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let mut e = open(tiny(), None);
    assert!(e.generate(&req(1, vec![], 3), &mut NoObserver).is_err());
    assert!(e.generate(&req(1, vec![9999], 3), &mut NoObserver).is_err());
    assert!(e.generate(&req(1, vec![AUDIO], 3), &mut NoObserver).is_err(), "audio id without a frame");
    assert!(e.generate(&Request { slot: 3, ..req(1, vec![1, 2], 3) }, &mut NoObserver).is_err());
    let too_long = vec![65u32; 2000];
    assert!(matches!(
        e.generate(&req(1, too_long, 3), &mut NoObserver),
        Err(kvproof_engines::EngineError::ContextExceeded { .. })
    ));
}

#[test]
fn state_bytes_follow_capacity() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut e = open(c, None);
    let before = e.state_bytes();
    e.generate(&req(1, vec![65; 100], 2), &mut NoObserver).expect("grow");
    assert!(e.state_bytes() > before);
}
