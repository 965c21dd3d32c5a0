//! DeepSeek end to end: chunking invariance, the compressor's block structure, warm vs cold continuation across the
//! window and capacity growth, the strict-prefix rule, and failure paths that taint.

use kvproof_engines::arch::deepseek::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{CacheKind, StateDump, WriterKind};
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Reply, Request, StopReason, TokenEvent};
use kvproof_engines::{bundled, fixture, EngineError};

const RATIO: usize = 4;

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

/// Rows matched by absolute position: every position both hold must be bitwise equal; returns how many matched.
fn assert_same_rows(a: &StateDump, b: &StateDump) -> usize {
    assert_eq!(a.tensors.len(), b.tensors.len());
    let mut matched = 0;
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
            matched += 1;
        }
    }
    matched
}

#[test]
fn opens_by_name_at_every_preset() {
    for p in Preset::ALL {
        let c = ModelConfig::preset(p);
        assert_eq!(c.compress_ratio, RATIO);
        assert!(serde_json::to_value(&c).expect("json").get("audio_frame_bytes").is_none(), "no audio option");
        assert!(c.window > 0);
    }
    let mut e = bundled::open_preset("deepseek", Preset::Tiny, 0, None).expect("open tiny");
    assert_eq!(e.info().arch, "deepseek");
    assert!(e.fault().is_none(), "faults are off by default");
    let r = e.generate(&req(1, text("hi"), 3), &mut NoObserver).expect("generate");
    assert!(!r.tokens.is_empty());
}

#[test]
fn chunking_changes_no_bit_of_logits_or_state() {
    // 45 ids: the window of 8 wraps several times, ratio-4 and ratio-16 blocks close mid-chunk
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

#[test]
fn compressor_emits_one_row_per_block_at_its_last_position() {
    let mut e = open(tiny());
    // 22 prompt positions, 1 generated token never fed: the state covers 0..22
    e.generate(&req(1, (0..22).map(|i| 40 + i).collect(), 1), &mut NoObserver).expect("generate");
    let d = e.dump(0).expect("dump");
    assert_eq!(d.meta.len, 22);
    for t in d.tensors.iter().filter(|t| t.kind == CacheKind::Compressed) {
        let ratio = if t.layer.is_multiple_of(2) { RATIO } else { 4 * RATIO };
        let held: Vec<i64> = t.positions.iter().copied().filter(|&p| p >= 0).collect();
        let expected: Vec<i64> = (0..22 / ratio).map(|b| ((b + 1) * ratio - 1) as i64).collect();
        assert_eq!(held, expected, "layer {}: one row per completed block, at the block's last position", t.layer);
    }
    for t in d.tensors.iter().filter(|t| t.kind == CacheKind::Recurrent) {
        assert_eq!(t.positions, vec![21], "layer {} {}: the last position folded in", t.layer, t.name);
    }
    // ring layers hold the last `window` positions
    let window = tiny().window as i64;
    for t in d.tensors.iter().filter(|t| t.kind == CacheKind::Ring) {
        let mut held: Vec<i64> = t.positions.clone();
        held.sort_unstable();
        assert_eq!(held, (22 - window..22).collect::<Vec<_>>());
    }
}

#[test]
fn score_state_starts_at_minus_infinity_and_overlap_layers_carry_the_previous_block() {
    let mut e = open(tiny());
    let score = |e: &dyn Engine, layer: usize| -> Vec<f32> {
        let d = e.dump(0).expect("dump");
        d.tensors.iter().find(|t| t.layer == layer && t.name == "score_state").expect("score_state").data.clone()
    };
    let fresh = score(e.as_ref(), 0);
    assert!(fresh.iter().all(|&s| s == f32::NEG_INFINITY), "never fed: every score slot is -inf");
    // layer 0 has ratio 4 with overlap: 2·ratio state rows of 2·width
    let kvd = tiny().kv_heads * tiny().head_dim;
    assert_eq!(fresh.len(), 2 * RATIO * 2 * kvd);
    // 3 positions: the previous-block rows stay empty, the current block has slots 0..3 filled
    e.generate(&req(1, vec![65, 66, 67], 1), &mut NoObserver).expect("3 positions");
    let s = score(e.as_ref(), 0);
    let row = |r: usize| &s[r * 2 * kvd..(r + 1) * 2 * kvd];
    for r in 0..RATIO {
        assert!(row(r).iter().all(|&v| v == f32::NEG_INFINITY), "previous block row {r} is still empty");
    }
    for r in RATIO..RATIO + 3 {
        assert!(row(r).iter().all(|&v| v != f32::NEG_INFINITY), "current block row {r} was filled");
    }
    assert!(row(2 * RATIO - 1).iter().all(|&v| v == f32::NEG_INFINITY));
    // 5 positions: block 0 closed and moved to the previous-block rows
    e.generate(&req(2, vec![65, 66, 67, 68, 69], 1), &mut NoObserver).expect("5 positions");
    let s = score(e.as_ref(), 0);
    let row = |r: usize| &s[r * 2 * kvd..(r + 1) * 2 * kvd];
    for r in 0..RATIO {
        assert!(row(r).iter().all(|&v| v != f32::NEG_INFINITY), "block 0 is now the previous block (row {r})");
    }
}

/// Turn 1 on `warm`, then turn 2 (which continues turn 1) on `warm` and on a fresh engine.
fn continue_conversation(warm: &mut dyn Engine, first: &str, second: &str, max_tokens: usize) -> (Reply, Reply, usize) {
    let mut transcript = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text(first))];
    let p1 = render(&transcript, true);
    let r1 = warm.generate(&req(1, p1.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    let fed = p1.len() + r1.tokens.len() - 1;
    // the record holds exactly what was fed: the prompt and every reply id but the last
    let rec = warm.dump(0).expect("dump").record;
    assert_eq!(rec.ids.len(), fed);
    assert_eq!(&rec.ids[..p1.len()], &p1[..]);
    assert_eq!(&rec.ids[p1.len()..], &r1.tokens[..r1.tokens.len() - 1]);
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
    assert_eq!(w.reused, fed);
    assert_eq!(c.reused, 0);
    assert_eq!(w.tokens, c.tokens);
    assert_eq!(
        w.prefix_log,
        format!("[PREFIX] reusing {fed} of {} prompt tokens ({:.0}%)", w.prompt_tokens, {
            100.0 * fed as f64 / w.prompt_tokens as f64
        })
    );
}

#[test]
fn continuation_past_the_window_and_across_capacity_growth() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open(c);
    let long = "a conversation that runs well past the sliding window";
    let (w, cold, fed) = continue_conversation(warm.as_mut(), long, "and now a second long turn to grow the state", 9);
    assert!(fed > 32, "turn 1 must outgrow the initial capacity");
    assert_eq!(w.reused, fed);
    assert_eq!(w.tokens, cold.tokens);
    let d = warm.dump(0).expect("dump");
    assert!(d.meta.capacity > 64, "turn 2 grew the slot again: {}", d.meta.capacity);
    // the compressed rows written before the growth survived it (they carry turn 1's writer)
    let kept = d
        .tensors
        .iter()
        .filter(|t| t.kind == CacheKind::Compressed)
        .flat_map(|t| t.writers.iter().flatten())
        .filter(|w| w.request == 1)
        .count();
    assert!(kept > 0);
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
    // the next prompt carries the whole reply, last id included; only what was fed is reused
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
fn prefill_rows_carry_their_segment_and_decode_rows_their_step() {
    let mut c = tiny();
    c.prefill_chunk = 5;
    let mut e = open(c);
    e.generate(&Request { ignore_eos: true, ..req(7, (0..12).map(|i| 70 + i).collect(), 4) }, &mut NoObserver)
        .expect("generate");
    let d = e.dump(0).expect("dump");
    let k0 = d.tensors.iter().find(|t| t.layer == 0 && t.name == "k").expect("k");
    for (p, w) in k0.positions.iter().zip(&k0.writers) {
        let w = w.expect("written");
        assert_eq!(w.request, 7);
        let expected = if *p < 12 {
            WriterKind::Prefill { chunk: (*p / 5) as u32, chunk_rows: if *p < 10 { 5 } else { 2 } }
        } else {
            WriterKind::Decode { step: (*p - 12) as u32 }
        };
        assert_eq!(w.kind, expected, "position {p}");
    }
}

#[test]
fn cancel_mid_prefill_taints_and_the_next_turn_starts_over() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let layers = c.layers;
    let mut warm = open(c);
    let p1 = render(&[Message::new(Role::User, text("a first turn of some length"))], true);
    let r1 = warm.generate(&req(1, p1.clone(), 4), &mut NoObserver).expect("turn 1");
    let mut t = vec![Message::new(Role::User, text("a first turn of some length")), Message::from_reply(&r1.tokens)];
    t.push(Message::new(Role::User, text("a second turn, cancelled while it is prefilled")));
    let p2 = render(&t, true);
    // polls per segment: one between each pair of layers, one after it; cancel inside the second segment
    let at = layers + 3;
    let mut cancel = ProgressAt { at, flow: Flow::Cancel, polls: 0 };
    let err = warm.generate(&req(2, p2.clone(), 4), &mut cancel).expect_err("cancelled");
    assert!(matches!(err, EngineError::Cancelled));
    assert!(warm.dump(0).expect("dump").record.tainted);
    let mut p3 = p2.clone();
    p3.extend(text("!"));
    let r3 = warm.generate(&req(3, p3.clone(), 4), &mut NoObserver).expect("retry");
    assert_eq!(r3.reused, 0, "a tainted record never matches");
    let mut cold = warm.fresh();
    assert_eq!(r3.tokens, cold.generate(&req(3, p3, 4), &mut NoObserver).expect("cold").tokens);
    assert_same_rows(&warm.dump(0).expect("dump"), &cold.dump(0).expect("dump"));
}

#[test]
fn cancel_between_segments_and_during_decode_also_taint() {
    let p = render(&[Message::new(Role::User, text("some prompt that takes a few segments"))], true);
    let layers = tiny().layers;
    // the poll after the first segment
    let mut e = open(tiny());
    let mut cancel = ProgressAt { at: layers - 1, flow: Flow::Cancel, polls: 0 };
    assert!(matches!(e.generate(&req(1, p.clone(), 3), &mut cancel), Err(EngineError::Cancelled)));
    assert!(e.dump(0).expect("dump").record.tainted);
    // a cancel while tokens stream
    struct CancelToken;
    impl Observer for CancelToken {
        fn on_token(&mut self, _: &TokenEvent) -> Flow {
            Flow::Cancel
        }
    }
    let mut e = open(tiny());
    assert!(matches!(e.generate(&req(1, p.clone(), 3), &mut CancelToken), Err(EngineError::Cancelled)));
    assert!(e.dump(0).expect("dump").record.tainted);
    let mut p2 = p;
    p2.extend(text("x"));
    assert_eq!(e.generate(&req(2, p2, 3), &mut NoObserver).expect("next").reused, 0);
}

#[test]
fn stop_mid_prefill_finishes_the_segment_and_keeps_it_recorded() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let mut e = open(c);
    let p: Vec<u32> = (0..30).map(|i| 60 + i).collect();
    // a stop asked between two layers of the second segment: that segment still completes
    let mut stop = ProgressAt { at: tiny().layers + 2, flow: Flow::Stop, polls: 0 };
    let r = e.generate(&req(1, p.clone(), 3), &mut stop).expect("stopped");
    assert_eq!(r.stop, StopReason::Stopped);
    assert!(r.tokens.is_empty());
    let d = e.dump(0).expect("dump");
    assert_eq!(d.record.ids, p[..16].to_vec());
    assert!(!d.record.tainted);
    let r2 = e.generate(&req(2, p.clone(), 3), &mut NoObserver).expect("continue");
    assert_eq!(r2.reused, 16);
    assert_eq!(r2.tokens, e.fresh().generate(&req(2, p, 3), &mut NoObserver).expect("cold").tokens);
}

#[test]
fn context_exceeded_is_an_error_that_taints() {
    let mut e = open(tiny());
    let p1 = text("short");
    e.generate(&req(1, p1.clone(), 3), &mut NoObserver).expect("turn 1");
    let limit = tiny().max_ctx;
    let too_long = vec![65u32; limit + 1];
    match e.generate(&req(2, too_long, 3), &mut NoObserver) {
        Err(EngineError::ContextExceeded { used, limit: l }) => assert_eq!((used, l), (limit + 1, limit)),
        other => panic!("expected ContextExceeded, got {other:?}"),
    }
    assert!(e.dump(0).expect("dump").record.tainted);
    // a prompt of exactly max_ctx fits: one token is sampled, none fed
    let full = vec![66u32; limit];
    let r = e.generate(&req(3, full, 5), &mut NoObserver).expect("max_ctx prompt");
    assert_eq!(r.tokens.len(), 1);
    assert_eq!(e.dump(0).expect("dump").meta.len, limit);
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
    // validation errors do not touch the state: a real turn afterwards is normal
    let r = e.generate(&req(2, vec![1, 2, 3], 0), &mut NoObserver).expect("max_tokens 0");
    assert!(r.tokens.is_empty());
    assert_eq!(e.dump(0).expect("dump").record.ids, vec![1, 2, 3]);
}

#[test]
fn same_request_same_tokens_on_a_fresh_instance() {
    let a = open(tiny());
    let r = Request {
        sampling: kvproof_engines::Sampling { temperature: 0.8, top_p: 0.9, top_k: 20, seed: 5 },
        ..req(1, text("sample me"), 12)
    };
    let x = a.fresh().generate(&r, &mut NoObserver).expect("x");
    let y = a.fresh().generate(&r, &mut NoObserver).expect("y");
    assert_eq!(x.tokens, y.tokens);
    assert!(x.tokens.iter().all(|&t| t < 256 || t == kvproof_engines::tokenizer::EOS));
}

#[test]
fn state_bytes_follow_capacity() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut e = open(c);
    let before = e.state_bytes();
    e.generate(&req(1, vec![65; 100], 2), &mut NoObserver).expect("grow");
    assert!(e.state_bytes() > before);
}

#[test]
fn dump_file_round_trips_every_row_writer_and_the_minus_infinity_scores() {
    let mut e = open(tiny());
    e.generate(&req(1, text("short dump"), 3), &mut NoObserver).expect("generate");
    let d = e.dump(0).expect("dump");
    let path = std::env::temp_dir().join(format!("kvproof-deepseek-dump-{}.safetensors", std::process::id()));
    kvproof_engines::dump::write_file(&d, &path).expect("write");
    let back = kvproof_engines::dump::read_file(&path).expect("read");
    let _ = std::fs::remove_file(&path);
    assert_eq!(rows_of(&back), rows_of(&d));
    assert_eq!(back.tensors.iter().map(|t| t.writers.clone()).collect::<Vec<_>>(), {
        d.tensors.iter().map(|t| t.writers.clone()).collect::<Vec<_>>()
    });
    assert_eq!(back.record, d.record);
    // under 16 positions the ratio-16 layers have not filled a block: unfilled slots are still -inf
    let s = back.tensors.iter().find(|t| t.layer == 1 && t.name == "score_state").expect("score_state");
    assert!(s.data.contains(&f32::NEG_INFINITY));
}
