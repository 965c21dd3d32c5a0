//! Kimi end to end: chunking invariance, layer kinds and what they dump, warm vs cold continuation across capacity
//! growth, the strict-prefix rule, failure paths that taint, and state bytes that follow the context length.

use kvproof_engines::arch::kimi::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{CacheKind, StateDump};
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Reply, Request, StopReason, TokenEvent};
use kvproof_engines::{bundled, fixture, EngineError};

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

fn open(config: ModelConfig) -> Box<dyn Engine> {
    let weights = fixture::generate_weights(&config.clone().into(), 0).expect("fixture");
    bundled::open(config.into(), weights, None).expect("open")
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

/// Answers `flow` at the `at`-th progress poll (0-based), `Continue` before.
struct ProgressAt {
    at: usize,
    flow: Flow,
    polls: usize,
}
impl Observer for ProgressAt {
    fn on_progress(&mut self) -> Flow {
        self.polls += 1;
        if self.polls - 1 == self.at {
            self.flow
        } else {
            Flow::Continue
        }
    }
}

/// Every tensor's rows, bit for bit, with positions (writers excluded: they name requests and chunks).
fn rows_of(d: &StateDump) -> Vec<(usize, String, Vec<i64>, Vec<u32>)> {
    d.tensors
        .iter()
        .map(|t| (t.layer, t.name.clone(), t.positions.clone(), t.data.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

/// Rows matched by absolute position: every position both hold must be bitwise equal.
fn assert_same_rows(a: &StateDump, b: &StateDump) {
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        for i in 0..x.rows() {
            let p = x.positions[i];
            if p < 0 {
                continue;
            }
            let j =
                y.row_of_position(p).unwrap_or_else(|| panic!("layer {} {}: position {p} missing", x.layer, x.name));
            let same = x.row(i).iter().zip(y.row(j)).all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(same, "layer {} {}: position {p} differs", x.layer, x.name);
        }
    }
}

#[test]
fn opens_by_name_at_every_preset() {
    for p in Preset::ALL {
        let c = ModelConfig::preset(p);
        assert!(c.kv_lora > 0 && c.mla_every > 0);
        // MLA layers are NoPE and there is no audio: kimi's config has no such options
        let fields = serde_json::to_value(&c).expect("json");
        assert!(fields.get("qk_rope").is_none() && fields.get("audio_frame_bytes").is_none(), "{fields}");
    }
    let mut e = bundled::open_preset("kimi", Preset::Tiny, 0, None).expect("open tiny");
    assert_eq!(e.info().arch, "kimi");
    assert!(e.fault().is_none(), "faults are off by default");
    assert!(!e.generate(&req(1, text("hi"), 3), &mut NoObserver).expect("generate").tokens.is_empty());
}

#[test]
fn three_of_four_layers_are_kda_and_the_rest_and_the_last_are_mla() {
    let c = tiny();
    let mut e = open(c.clone());
    e.generate(&req(1, (0..10).map(|i| 50 + i).collect(), 1), &mut NoObserver).expect("generate");
    let d = e.dump(0).expect("dump");
    let hd = c.head_dim;
    for l in 0..c.layers {
        let of = |kind| d.tensors.iter().filter(|t| t.layer == l && t.kind == kind).count();
        let mla = (l + 1).is_multiple_of(c.mla_every) || l + 1 == c.layers;
        if mla {
            assert_eq!((of(CacheKind::Latent), of(CacheKind::Recurrent)), (1, 0), "layer {l} is MLA");
            let t = d.tensors.iter().find(|t| t.layer == l).expect("latent");
            assert_eq!(t.width, c.kv_lora, "one kv_lora row per position, no rope row");
            let held: Vec<i64> = t.positions.iter().copied().filter(|&p| p >= 0).collect();
            assert_eq!(held, (0..10).collect::<Vec<_>>());
        } else {
            assert_eq!((of(CacheKind::Recurrent), of(CacheKind::Conv), of(CacheKind::Latent)), (1, 3, 0), "KDA {l}");
            let s = d.tensors.iter().find(|t| t.layer == l && t.kind == CacheKind::Recurrent).expect("state");
            assert_eq!(s.width, c.heads * hd * hd, "heads x hd x hd");
            assert_eq!(s.positions, vec![9], "the last position folded in");
            for conv in d.tensors.iter().filter(|t| t.layer == l && t.kind == CacheKind::Conv) {
                let mut held = conv.positions.clone();
                held.sort_unstable();
                assert_eq!(held, (10 - (c.conv_kernel as i64 - 1)..10).collect::<Vec<_>>());
            }
        }
    }
    let kda = (0..c.layers).filter(|&l| !(l + 1).is_multiple_of(c.mla_every) && l + 1 != c.layers).count();
    assert!(kda * 4 >= c.layers * 2 && kda < c.layers, "about 3 of 4 are KDA: {kda} of {}", c.layers);
}

#[test]
fn chunking_changes_no_bit_of_logits_or_state() {
    let prompt: Vec<u32> = (0..45).map(|i| (i * 7 + 3) % 250).collect();
    let mut runs = Vec::new();
    for chunk in [64, 1, 5, 16, 3] {
        let mut c = tiny();
        c.prefill_chunk = chunk;
        let mut e = open(c);
        let mut obs = Logits::default();
        let r = Request { logprobs: 300, ..req(1, prompt.clone(), 6) };
        e.generate(&r, &mut obs).expect("generate");
        runs.push((chunk, obs.0, rows_of(&e.dump(0).expect("dump"))));
    }
    let (_, logits, state) = &runs[0];
    assert_eq!(logits.len(), 6);
    for (chunk, l, s) in &runs[1..] {
        assert_eq!(l, logits, "chunk {chunk}: logits differ from one-batch prefill");
        assert!(s == state, "chunk {chunk}: state differs from one-batch prefill");
    }
}

/// Turn 1 on `warm`, then turn 2 (which continues turn 1) on `warm` and on a fresh engine.
fn continue_conversation(warm: &mut dyn Engine, first: &str, second: &str, max_tokens: usize) -> (Reply, Reply, usize) {
    let mut transcript = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text(first))];
    let p1 = render(&transcript, true);
    let r1 = warm.generate(&req(1, p1.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    let fed = p1.len() + r1.tokens.len() - 1;
    let rec = warm.dump(0).expect("dump").record;
    assert_eq!(rec.ids.len(), fed, "the record holds the prompt and every reply id but the last");
    transcript.push(Message::from_reply(&r1.tokens));
    transcript.push(Message::new(Role::User, text(second)));
    let p2 = render(&transcript, true);
    let r2 = warm.generate(&req(2, p2.clone(), max_tokens), &mut NoObserver).expect("turn 2 warm");
    let mut cold = warm.fresh();
    let c2 = cold.generate(&req(2, p2, max_tokens), &mut NoObserver).expect("turn 2 cold");
    assert_same_rows(&warm.dump(0).expect("dump"), &cold.dump(0).expect("dump"));
    (r2, c2, fed)
}

#[test]
fn turn_two_reuses_the_recorded_length_and_matches_a_fresh_engine() {
    let mut warm = open(tiny());
    let (w, c, fed) = continue_conversation(warm.as_mut(), "hello", "and then?", 6);
    assert!(fed > 0);
    assert_eq!(w.reused, fed);
    assert_eq!(c.reused, 0);
    assert_eq!(w.tokens, c.tokens);
}

#[test]
fn continuation_across_capacity_growth() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open(c);
    let long = "a conversation that runs well past the first capacity";
    let (w, cold, fed) = continue_conversation(warm.as_mut(), long, "and now a second long turn to grow the state", 9);
    assert!(fed > 32, "turn 1 must outgrow the initial capacity");
    assert_eq!(w.reused, fed);
    assert_eq!(w.tokens, cold.tokens);
    assert!(warm.dump(0).expect("dump").meta.capacity > 64);
}

#[test]
fn divergent_repeated_and_shorter_prompts_reuse_nothing_and_still_match() {
    let p1 = render(&[Message::new(Role::User, text("first question"))], true);
    let mut middle = p1.clone();
    middle[5] = b'X' as u32;
    middle.extend(text("tail"));
    let other = render(&[Message::new(Role::User, text("Another question entirely"))], true);
    let cases: Vec<(&str, Vec<u32>)> = vec![
        ("repeat", p1.clone()),
        ("shorter", p1[..p1.len() - 3].to_vec()),
        ("diverged in the middle", middle),
        ("diverged at the first id", other),
    ];
    for (label, prompt) in cases {
        let mut warm = open(tiny());
        warm.generate(&req(1, p1.clone(), 5), &mut NoObserver).expect("turn 1");
        let r = warm.generate(&req(2, prompt.clone(), 5), &mut NoObserver).expect("turn 2");
        assert_eq!(r.reused, 0, "{label}");
        let mut cold = warm.fresh();
        assert_eq!(r.tokens, cold.generate(&req(2, prompt, 5), &mut NoObserver).expect("cold").tokens, "{label}");
        assert_same_rows(&warm.dump(0).expect("dump"), &cold.dump(0).expect("dump"));
    }
}

#[test]
fn divergence_at_the_last_recorded_id_reuses_nothing() {
    let mut warm = open(tiny());
    let p1 = render(&[Message::new(Role::User, text("hello there"))], true);
    let r1 = warm.generate(&req(1, p1.clone(), 5), &mut NoObserver).expect("turn 1");
    let fed = p1.len() + r1.tokens.len() - 1;
    let mut p2 = p1.clone();
    p2.extend_from_slice(&r1.tokens);
    p2.extend(text("more"));
    p2[fed - 1] = if p2[fed - 1] == 66 { 67 } else { 66 };
    let r2 = warm.generate(&req(2, p2.clone(), 5), &mut NoObserver).expect("turn 2");
    assert_eq!(r2.reused, 0);
    assert_eq!(r2.tokens, warm.fresh().generate(&req(2, p2, 5), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn prompt_plus_whole_reply_reuses_all_but_the_last_generated_id() {
    let mut warm = open(tiny());
    let p1 = render(&[Message::new(Role::User, text("count"))], true);
    let r1 = warm.generate(&Request { ignore_eos: true, ..req(1, p1.clone(), 7) }, &mut NoObserver).expect("turn 1");
    assert_eq!(r1.tokens.len(), 7);
    let mut p2 = p1.clone();
    p2.extend_from_slice(&r1.tokens);
    let r2 = warm.generate(&req(2, p2.clone(), 4), &mut NoObserver).expect("turn 2");
    assert_eq!(r2.reused, p1.len() + 6);
    assert_eq!(r2.tokens, warm.fresh().generate(&req(2, p2, 4), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn cancel_mid_prefill_taints_and_the_next_turn_starts_over() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let mut warm = open(c);
    let p: Vec<u32> = text("a prompt long enough for several prefill segments");
    let mut cancel = ProgressAt { at: 1, flow: Flow::Cancel, polls: 0 };
    assert!(matches!(warm.generate(&req(1, p.clone(), 4), &mut cancel), Err(EngineError::Cancelled)));
    assert!(warm.dump(0).expect("dump").record.tainted);
    let r = warm.generate(&req(2, p.clone(), 4), &mut NoObserver).expect("retry");
    assert_eq!(r.reused, 0, "a tainted record never matches");
    assert_eq!(r.tokens, warm.fresh().generate(&req(2, p, 4), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn stop_mid_prefill_keeps_the_completed_segments() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let mut e = open(c);
    let p: Vec<u32> = (0..30).map(|i| 60 + i).collect();
    let r = e.generate(&req(1, p.clone(), 3), &mut ProgressAt { at: 1, flow: Flow::Stop, polls: 0 }).expect("stop");
    assert_eq!((r.stop, r.tokens.len()), (StopReason::Stopped, 0));
    assert_eq!(e.dump(0).expect("dump").record.ids, p[..16].to_vec());
    let r2 = e.generate(&req(2, p.clone(), 3), &mut NoObserver).expect("continue");
    assert_eq!(r2.reused, 16);
    assert_eq!(r2.tokens, e.fresh().generate(&req(2, p, 3), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn context_exceeded_is_an_error_that_taints() {
    let mut e = open(tiny());
    e.generate(&req(1, text("short"), 3), &mut NoObserver).expect("turn 1");
    let limit = tiny().max_ctx;
    match e.generate(&req(2, vec![65u32; limit + 1], 3), &mut NoObserver) {
        Err(EngineError::ContextExceeded { used, limit: l }) => assert_eq!((used, l), (limit + 1, limit)),
        other => panic!("expected ContextExceeded, got {other:?}"),
    }
    assert!(e.dump(0).expect("dump").record.tainted);
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let mut e = open(tiny());
    assert!(matches!(e.generate(&req(1, vec![], 3), &mut NoObserver), Err(EngineError::EmptyPrompt)));
    assert!(matches!(e.generate(&req(1, vec![9999], 3), &mut NoObserver), Err(EngineError::BadRequest(_))));
    let audio = Request { audio: vec![vec![0; 8]], ..req(1, vec![1, 2], 3) };
    assert!(matches!(e.generate(&audio, &mut NoObserver), Err(EngineError::BadRequest(_))));
    assert!(matches!(
        e.generate(&Request { slot: 3, ..req(1, vec![1, 2], 3) }, &mut NoObserver),
        Err(EngineError::NoSuchSlot { .. })
    ));
    assert!(e.dump(5).is_err());
    // a huge max_tokens is bounded by the context, not an overflow
    let r = e.generate(&Request { ignore_eos: true, ..req(9, vec![1, 2, 3], usize::MAX) }, &mut NoObserver);
    assert_eq!(r.expect("bounded").tokens.len(), tiny().max_ctx - 3 + 1);
}

#[test]
fn same_request_same_tokens_on_a_fresh_instance() {
    let a = open(tiny());
    let sampling = kvproof_engines::Sampling { temperature: 0.8, top_p: 0.9, top_k: 20, seed: 5 };
    let r = Request { sampling, ..req(1, text("sample me"), 12) };
    let x = a.fresh().generate(&r, &mut NoObserver).expect("x");
    let y = a.fresh().generate(&r, &mut NoObserver).expect("y");
    assert_eq!(x.tokens, y.tokens);
}

/// Bytes a fresh slot allocated at `capacity` holds: what a state of that capacity must hold, whatever its history.
fn bytes_at(config: &ModelConfig, capacity: usize) -> usize {
    let mut c = config.clone();
    c.initial_capacity = capacity;
    open(c).state_bytes()
}

#[test]
fn state_bytes_follow_the_context_length_not_the_turn_count() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open(c.clone());
    let mut transcript = vec![Message::new(Role::System, text("be brief"))];
    let mut fed = 0;
    let mut seen = Vec::new();
    for turn in 0..20u64 {
        transcript.push(Message::new(Role::User, text(&format!("turn {turn}: go on"))));
        let p = render(&transcript, true);
        let r = warm.generate(&Request { ignore_eos: true, ..req(turn, p.clone(), 6) }, &mut NoObserver).expect("turn");
        assert_eq!(r.reused, fed, "turn {turn} reuses what turn {} fed", turn.saturating_sub(1));
        fed = p.len() + r.tokens.len() - 1;
        transcript.push(Message::from_reply(&r.tokens));
        let capacity = warm.dump(0).expect("dump").meta.capacity;
        let needed = p.len() + 6;
        assert!(capacity >= needed && capacity <= (2 * needed).max(c.initial_capacity), "turn {turn}: {capacity}");
        let bytes = warm.state_bytes();
        assert_eq!(bytes, bytes_at(&c, capacity), "turn {turn}: bytes are those of a slot of capacity {capacity}");
        seen.push((needed, capacity, bytes));
    }
    let mut capacities: Vec<usize> = seen.iter().map(|s| s.1).collect();
    capacities.dedup();
    let mut sizes: Vec<usize> = seen.iter().map(|s| s.2).collect();
    sizes.dedup();
    assert_eq!(sizes.len(), capacities.len(), "bytes change only when capacity does: {seen:?}");
    assert!(capacities.len() <= 6, "doubling growth: a handful of sizes over 20 turns: {seen:?}");
    assert!(seen.last().expect("turns").0 > 4 * 32, "the conversation really grew");
}

#[test]
fn a_conversation_that_does_not_grow_keeps_state_bytes_constant() {
    let mut e = open(tiny());
    let prompts = ["first question?", "second question", "third question!", "first question?"];
    let mut bytes = Vec::new();
    for (i, q) in prompts.iter().cycle().take(12).enumerate() {
        let p = render(&[Message::new(Role::User, text(q))], true);
        e.generate(&req(i as u64, p, 5), &mut NoObserver).expect("turn");
        bytes.push(e.state_bytes());
    }
    assert!(bytes.iter().all(|&b| b == bytes[0]), "{bytes:?}");
}
