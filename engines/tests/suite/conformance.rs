//! What every bundled engine does, checked on every arch `bundled::arches()` lists: it opens at every preset,
//! answers the same request the same way on a fresh instance, reuses exactly what its rule allows and then matches
//! a fresh engine bit for bit, refuses bad requests with errors (never panics), grows its state with the context,
//! taints on a cancel, follows the one STOP policy during prefill, and dumps states that round-trip through the
//! dump file.
//!
//! Where archs differ (how much of an edited prompt they reuse), `expected_reuse` states each arch's rule.

use crate::common;

use common::{
    assert_same_rows, config, fed, lcp, logits_of, open, req, rows_of, text, warm_equals_cold, ProgressAt, TokenAt,
};
use kvproof_engines::bundled;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::Preset;
use kvproof_engines::dump::{CacheKind, WriterKind};
use kvproof_engines::engine::{Engine, Flow, NoObserver, Reply, Request, Sampling, StopReason};
use kvproof_engines::tokenizer::{AUDIO, EOS};
use kvproof_engines::EngineError;

fn archs() -> impl Iterator<Item = &'static str> {
    bundled::arches().map(|a| a.name)
}

/// The reuse `arch`'s rule gives `prompt` on a slot that fed `fed`, the last request's prompt being `prev` long.
fn expected_reuse(e: &dyn Engine, fed: &[u32], prev: usize, prompt: &[u32]) -> usize {
    let common = lcp(fed, prompt);
    match e.info().arch.as_str() {
        // position-addressed latent rows: truncate to the common prefix, keep one id to prefill
        "glm" => common.min(prompt.len() - 1),
        // also bounded by the rows prefill wrote, and rounded down to the chunk grid
        "glm53" => {
            let grid = e.info().prompt_rows.expect("glm53 has a grid");
            common.min(prev).min(prompt.len() - 1) / grid * grid
        }
        // rings, compressors and recurrent states cannot be rewound: all of what was fed, or nothing
        _ if common == fed.len() && prompt.len() > fed.len() => fed.len(),
        _ => 0,
    }
}

fn first_turn() -> Vec<u32> {
    turn_one("hello there")
}

fn turn_one(user: &str) -> Vec<u32> {
    render(&[Message::new(Role::System, text("be brief")), Message::new(Role::User, text(user))], true)
}

#[test]
fn opens_at_every_preset_and_answers() {
    for arch in archs() {
        for p in Preset::ALL {
            let c = bundled::ModelConfig::preset(arch, p).expect("preset");
            let mut e = bundled::open_preset(arch, p, 0, None).expect("open");
            let info = e.info();
            assert_eq!((info.arch.as_str(), info.preset.as_deref()), (arch, Some(p.name())));
            let b = c.base();
            assert_eq!(
                (info.slots, info.max_ctx, info.vocab, info.initial_capacity),
                (b.slots, b.max_ctx, b.vocab, b.initial_capacity)
            );
            assert!(e.fault().is_none() && info.fault.is_none(), "{arch}: faults are off by default");
            if p == Preset::Tiny {
                let r = e.generate(&req(1, text("hi"), 3), &mut NoObserver).expect("generate");
                assert!(!r.tokens.is_empty(), "{arch}");
            }
        }
    }
}

#[test]
fn same_request_same_tokens_on_a_fresh_instance() {
    for arch in archs() {
        let a = open(arch, "{}", None);
        let sampling = Sampling { temperature: 0.8, top_p: 0.9, top_k: 20, seed: 5 };
        let r = Request { sampling, ..req(1, text("sample me"), 12) };
        let x = a.fresh().generate(&r, &mut NoObserver).expect("x");
        let y = a.fresh().generate(&r, &mut NoObserver).expect("y");
        assert_eq!(x, Reply { timings: x.timings, ..y }, "{arch}: the whole reply but its timings");
        assert!(x.tokens.iter().all(|&t| t < 256 || t == EOS), "{arch}: only bytes and eos are generated");
        let greedy = req(2, first_turn(), 8);
        let (g1, g2) = (a.fresh().generate(&greedy, &mut NoObserver), a.fresh().generate(&greedy, &mut NoObserver));
        let (g1, g2) = (g1.expect("g1"), g2.expect("g2"));
        assert_eq!(g1, Reply { timings: g1.timings, ..g2 }, "{arch}");
    }
}

/// Turn 1, then turn 2 continuing it (prompt + reply + a question) on the warm engine, compared with a cold one.
fn continuation(arch: &str, overrides: &str, first: &str, second: &str, max_tokens: usize) -> (Box<dyn Engine>, usize) {
    let mut warm = open(arch, overrides, None);
    let p1 = turn_one(first);
    let r1 = warm.generate(&req(1, p1.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    assert!(r1.tokens.len() > 1, "{arch}: the reply must feed an id");
    // the record holds exactly what was fed: the prompt and every reply id but the last
    let fed1 = fed(&p1, &r1.tokens);
    assert_eq!(warm.dump(0).expect("dump").record.ids, fed1, "{arch}");
    let mut t = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text(first))];
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text(second)));
    let p2 = render(&t, true);
    let want = expected_reuse(warm.as_ref(), &fed1, p1.len(), &p2);
    assert!(want > 0, "{arch}: a continuation reuses");
    let w = warm_equals_cold(warm.as_mut(), &req(2, p2.clone(), max_tokens));
    assert_eq!(w.reused, want, "{arch}");
    let pct = 100.0 * want as f64 / p2.len() as f64;
    assert_eq!(w.prefix_log, format!("[PREFIX] reusing {want} of {} prompt tokens ({pct:.0}%)", p2.len()), "{arch}");
    (warm, fed1.len())
}

#[test]
fn a_continuation_reuses_what_was_fed_and_matches_a_fresh_engine() {
    for arch in archs() {
        continuation(arch, "{}", "hello there", "and then?", 6);
    }
}

#[test]
fn a_continuation_across_capacity_growth_matches_a_fresh_engine() {
    for arch in archs() {
        // turn 1 (~50 ids) grows past 32 (and wraps a window of 8); turn 2 grows again past 64
        let first = "a conversation that runs well past the sliding window";
        let o = r#"{"initial_capacity": 32}"#;
        let (warm, fed) = continuation(arch, o, first, "and now a second long turn to grow the state", 9);
        assert!(fed > 32, "{arch}: turn 1 must outgrow the initial capacity");
        assert!(warm.dump(0).expect("dump").meta.capacity > 64, "{arch}: turn 2 grew the slot again");
    }
}

#[test]
fn chunking_changes_no_bit_of_logits_or_state() {
    // 45 ids: a window of 8 wraps several times, compressor blocks close mid-chunk. glm53's kernels follow the
    // chunk's row count on purpose (glm53.rs shows it): every other arch is batch-invariant.
    let prompt: Vec<u32> = (0..45).map(|i| (i * 7 + 3) % 250).collect();
    for arch in archs().filter(|&a| a != "glm53") {
        let run = |chunk: usize| {
            let mut e = open(arch, &format!("{{\"prefill_chunk\": {chunk}}}"), None);
            let (_, logits) = logits_of(e.as_mut(), &req(1, prompt.clone(), 6));
            (logits, rows_of(&e.dump(0).expect("dump")))
        };
        let (logits, state) = run(64);
        assert_eq!(logits.len(), 6, "{arch}");
        for chunk in [1, 5, 16, 3] {
            let (l, s) = run(chunk);
            assert_eq!(l, logits, "{arch} chunk {chunk}: logits differ from one-batch prefill");
            assert!(s == state, "{arch} chunk {chunk}: state differs from one-batch prefill");
        }
    }
}

#[test]
fn divergent_repeated_and_shorter_prompts_reuse_what_the_rule_allows_and_still_match() {
    let p1 = first_turn();
    let mut middle = p1.clone();
    middle[5] = b'X' as u32;
    middle.extend(text("tail"));
    let other = render(&[Message::new(Role::User, text("Another question entirely"))], true);
    for arch in archs() {
        let probe = open(arch, "{}", None);
        let mut one = probe.fresh();
        let r1 = one.generate(&req(1, p1.clone(), 5), &mut NoObserver).expect("turn 1");
        let mut last = fed(&p1, &r1.tokens);
        let l = last.len() - 1;
        last[l] = if last[l] == 66 { 67 } else { 66 };
        last.extend(text("more"));
        let cases: Vec<(&str, Vec<u32>)> = vec![
            ("repeat", p1.clone()),
            ("shorter", p1[..p1.len() - 3].to_vec()),
            ("diverged in the middle", middle.clone()),
            ("diverged at the first id", other.clone()),
            ("diverged at the last fed id", last),
            ("the prompt plus the whole reply", p1.iter().chain(&r1.tokens).copied().collect()),
        ];
        for (label, prompt) in cases {
            let mut warm = probe.fresh();
            let r1 = warm.generate(&req(1, p1.clone(), 5), &mut NoObserver).expect("turn 1");
            let want = expected_reuse(warm.as_ref(), &fed(&p1, &r1.tokens), p1.len(), &prompt);
            let w = warm_equals_cold(warm.as_mut(), &req(2, prompt, 5));
            assert_eq!(w.reused, want, "{arch} {label}");
        }
    }
}

#[test]
fn bad_requests_are_errors_not_panics() {
    for arch in archs() {
        let mut e = open(arch, "{}", None);
        let slots = e.info().slots;
        let max_ctx = e.info().max_ctx;
        assert!(matches!(e.generate(&req(1, vec![], 3), &mut NoObserver), Err(EngineError::EmptyPrompt)), "{arch}");
        assert!(matches!(e.generate(&req(1, vec![9999], 3), &mut NoObserver), Err(EngineError::BadRequest(_))));
        // a frame with no audio id (inkling), or any frame at all (the rest)
        let audio = Request { audio: vec![vec![0; 8]], ..req(1, vec![1, 2], 3) };
        assert!(matches!(e.generate(&audio, &mut NoObserver), Err(EngineError::BadRequest(_))), "{arch}");
        let short_frame = Request { audio: vec![vec![0; 3]], ..req(1, vec![1, AUDIO, 2], 3) };
        assert!(matches!(e.generate(&short_frame, &mut NoObserver), Err(EngineError::BadRequest(_))), "{arch}");
        let bad_slot = Request { slot: slots, ..req(1, vec![1, 2], 3) };
        match e.generate(&bad_slot, &mut NoObserver) {
            Err(EngineError::NoSuchSlot { slot, slots: n }) => assert_eq!((slot, n), (slots, slots), "{arch}"),
            other => panic!("{arch}: expected NoSuchSlot, got {other:?}"),
        }
        assert!(e.dump(slots).is_err(), "{arch}");
        // validation errors do not touch the state: a real turn afterwards is normal
        let r = e.generate(&req(2, vec![1, 2, 3], 0), &mut NoObserver).expect("max_tokens 0");
        assert!(r.tokens.is_empty(), "{arch}");
        assert_eq!(e.dump(0).expect("dump").record.ids, vec![1, 2, 3], "{arch}");
        // a huge max_tokens is bounded by the context, not an overflow
        let r = e.generate(&Request { ignore_eos: true, ..req(9, vec![1, 2, 3], usize::MAX) }, &mut NoObserver);
        assert_eq!(r.expect("bounded").tokens.len(), max_ctx - 3 + 1, "{arch}");
        // a prompt past the context is an error, and nothing of the slot is reused after it
        let p1 = text("short");
        e.generate(&req(3, p1.clone(), 3), &mut NoObserver).expect("turn");
        let mut too_long = p1.clone();
        too_long.resize(max_ctx + 1, 65);
        match e.generate(&req(4, too_long, 3), &mut NoObserver) {
            Err(EngineError::ContextExceeded { used, limit }) => assert_eq!((used, limit), (max_ctx + 1, max_ctx)),
            other => panic!("{arch}: expected ContextExceeded, got {other:?}"),
        }
        // refused up front, the record is tainted; inkling prefills until a segment no longer fits, and there the
        // record refuses the write and drops itself
        let d = e.dump(0).expect("dump");
        assert!(d.record.tainted || (arch == "inkling" && d.record.ids.is_empty()), "{arch}: {:?}", d.record);
        let mut next = p1.clone();
        next.extend(text(" and more"));
        assert_eq!(e.generate(&req(5, next, 3), &mut NoObserver).expect("after").reused, 0, "{arch}");
        // a prompt of exactly max_ctx fits, on the first slot and on the last: one token is sampled, none fed
        for slot in [0, slots - 1] {
            let full = Request { slot, ..req(6, vec![66u32; max_ctx], 5) };
            let r = e.generate(&full, &mut NoObserver).expect("max_ctx prompt");
            assert_eq!(r.tokens.len(), 1, "{arch} slot {slot}");
            assert_eq!(e.dump(slot).expect("dump").meta.len, max_ctx, "{arch} slot {slot}");
        }
    }
}

#[test]
fn state_bytes_follow_capacity() {
    for arch in archs() {
        let mut e = open(arch, r#"{"initial_capacity": 32}"#, None);
        let before = e.state_bytes();
        e.generate(&req(1, vec![65; 100], 2), &mut NoObserver).expect("grow");
        assert!(e.state_bytes() > before, "{arch}");
        let capacity = e.dump(0).expect("dump").meta.capacity;
        if e.info().slots == 1 {
            let fresh = open(arch, &format!("{{\"initial_capacity\": {capacity}}}"), None);
            assert_eq!(e.state_bytes(), fresh.state_bytes(), "{arch}: the bytes of a fresh slot of that capacity");
        }
        // the bytes follow the context, not the turn count
        let held = e.state_bytes();
        for turn in 0..4 {
            e.generate(&req(2 + turn, text("short"), 2), &mut NoObserver).expect("turn");
        }
        assert_eq!(e.state_bytes(), held, "{arch}");
    }
}

/// A prompt several prefill segments long.
fn long_prompt() -> Vec<u32> {
    render(&[Message::new(Role::User, text("a prompt long enough to take several prefill segments, for sure"))], true)
}

#[test]
fn a_cancel_mid_prefill_or_while_tokens_stream_taints_and_the_next_turn_starts_over() {
    let p = long_prompt();
    for arch in archs() {
        for at in [0, 1] {
            let mut warm = open(arch, "{}", None);
            let out = warm.generate(&req(1, p.clone(), 4), &mut ProgressAt { at, flow: Flow::Cancel, polls: 0 });
            assert!(matches!(out, Err(EngineError::Cancelled)), "{arch} poll {at}: {out:?}");
            assert!(warm.dump(0).expect("dump").record.tainted, "{arch} poll {at}");
            let mut retry = p.clone();
            retry.extend(text("!"));
            let r = warm_equals_cold(warm.as_mut(), &req(2, retry, 4));
            assert_eq!(r.reused, 0, "{arch}: a tainted record never matches");
        }
        let mut warm = open(arch, "{}", None);
        let out = warm.generate(&req(1, p.clone(), 4), &mut TokenAt { at: 1, flow: Flow::Cancel, seen: 0 });
        assert!(matches!(out, Err(EngineError::Cancelled)), "{arch}: {out:?}");
        assert!(warm.dump(0).expect("dump").record.tainted, "{arch}");
        let mut next = p.clone();
        next.extend(text("x"));
        assert_eq!(warm.generate(&req(2, next, 3), &mut NoObserver).expect("next").reused, 0, "{arch}");
    }
}

#[test]
fn a_stop_mid_prefill_ends_the_request_after_its_segment_and_keeps_what_was_fed() {
    let p = long_prompt();
    for arch in archs() {
        let mut e = open(arch, "{}", None);
        let segment = e.info().prompt_rows.unwrap_or(config(arch, "{}").base().prefill_chunk);
        assert!(p.len() > 2 * segment, "{arch}: the prompt takes more than two segments");
        // the first poll: after the first segment, or (deepseek) between two of its layers, which lets it finish
        let r = e.generate(&req(1, p.clone(), 3), &mut ProgressAt { at: 0, flow: Flow::Stop, polls: 0 }).expect("stop");
        assert_eq!((r.stop, r.tokens.len(), r.reused, r.prompt_tokens), (StopReason::Stopped, 0, 0, p.len()), "{arch}");
        let d = e.dump(0).expect("dump");
        assert_eq!((d.record.ids.as_slice(), d.record.tainted, d.meta.len), (&p[..segment], false, segment), "{arch}");
        // the fed segment is reused by the next request, which then matches a fresh engine
        let w = warm_equals_cold(e.as_mut(), &req(2, p.clone(), 3));
        assert_eq!(w.reused, segment, "{arch}");
        // a stop seen once the whole prompt is fed lets decode run
        let mut e = open(arch, "{}", None);
        let short = text("hi");
        let r = e
            .generate(
                &Request { ignore_eos: true, ..req(3, short, 3) },
                &mut ProgressAt { at: 0, flow: Flow::Stop, polls: 0 },
            )
            .expect("stop after the prompt");
        assert_eq!((r.stop, r.tokens.len()), (StopReason::Length, 3), "{arch}");
        // a stop at a token ends generation there, the state valid
        let mut e = open(arch, "{}", None);
        let r = e.generate(&req(4, p.clone(), 8), &mut TokenAt { at: 1, flow: Flow::Stop, seen: 0 }).expect("stop");
        assert_eq!((r.stop, r.tokens.len()), (StopReason::Stopped, 2), "{arch}");
        assert!(!e.dump(0).expect("dump").record.tainted, "{arch}");
    }
}

#[test]
fn prefill_rows_carry_their_segment_and_decode_rows_their_step() {
    let p: Vec<u32> = (0..40).map(|i| 70 + i).collect();
    for arch in archs() {
        let mut e = open(arch, r#"{"prefill_chunk": 5}"#, None);
        let segment = e.info().prompt_rows.unwrap_or(5);
        e.generate(&Request { ignore_eos: true, ..req(7, p.clone(), 4) }, &mut NoObserver).expect("generate");
        let d = e.dump(0).expect("dump");
        let by_position = |k: CacheKind| !matches!(k, CacheKind::Recurrent | CacheKind::Conv | CacheKind::Compressed);
        let t = d.tensors.iter().find(|t| by_position(t.kind)).expect("a position-addressed tensor");
        let mut checked = 0;
        for (&pos, w) in t.positions.iter().zip(&t.writers).filter(|(&pos, _)| pos >= 0) {
            let w = w.expect("written");
            assert_eq!(w.request, 7, "{arch}");
            let pos = pos as usize;
            let expected = if pos < p.len() {
                let rows = segment.min(p.len() - pos / segment * segment);
                WriterKind::Prefill { chunk: (pos / segment) as u32, chunk_rows: rows as u32 }
            } else {
                WriterKind::Decode { step: (pos - p.len()) as u32 }
            };
            assert_eq!(w.kind, expected, "{arch} {} position {pos}", t.name);
            checked += 1;
        }
        assert!(checked >= t.positions.len().min(p.len() + 3), "{arch}: {checked} rows");
    }
}

#[test]
fn dumps_round_trip_through_the_dump_file() {
    for arch in archs() {
        let mut e = open(arch, "{}", None);
        e.generate(&req(1, long_prompt(), 5), &mut NoObserver).expect("generate");
        let d = e.dump(0).expect("dump");
        let path = std::env::temp_dir().join(format!("kvproof-conformance-{arch}-{}.safetensors", std::process::id()));
        kvproof_engines::dump::write_file(&d, &path).expect("write");
        let back = kvproof_engines::dump::read_file(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(back, d, "{arch}: meta, record and every tensor's rows, positions and writers");
        assert!(assert_same_rows(&back, &d) > 0, "{arch}");
        assert_eq!(back.meta.model_hash, e.info().model_hash);
    }
}

#[test]
fn reset_and_fresh_start_from_nothing() {
    for arch in archs() {
        let mut e = open(arch, "{}", None);
        let empty = e.dump(0).expect("dump");
        let bytes = e.state_bytes();
        e.generate(&req(1, long_prompt(), 5), &mut NoObserver).expect("generate");
        assert_eq!(e.fresh().dump(0).expect("dump"), empty, "{arch}");
        e.reset();
        assert_eq!((e.dump(0).expect("dump"), e.state_bytes()), (empty, bytes), "{arch}");
    }
}
