//! DeepSeek end to end: chunking invariance, the compressor's block structure, warm vs cold continuation across the
//! window and capacity growth, the strict-prefix rule, and failure paths that taint.

use crate::common;

use common::*;

use kvproof_engines::arch::deepseek::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::CacheKind;
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, StopReason, TokenEvent};
use kvproof_engines::EngineError;

const RATIO: usize = 4;

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

#[test]
fn every_preset_has_a_window_a_compressor_and_no_audio() {
    for p in Preset::ALL {
        let c = ModelConfig::preset(p);
        assert_eq!(c.compress_ratio, RATIO);
        assert!(serde_json::to_value(&c).expect("json").get("audio_frame_bytes").is_none(), "no audio option");
        assert!(c.window > 0);
    }
}

#[test]
fn compressor_emits_one_row_per_block_at_its_last_position() {
    let mut e = open_config(tiny(), None);
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
    let mut e = open_config(tiny(), None);
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

#[test]
fn continuation_past_the_window_and_across_capacity_growth() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open_config(c, None);
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
fn cancel_mid_prefill_taints_and_the_next_turn_starts_over() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let layers = c.layers;
    let mut warm = open_config(c, None);
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
    let mut e = open_config(tiny(), None);
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
    let mut e = open_config(tiny(), None);
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
    let mut e = open_config(c, None);
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
fn dump_file_round_trips_every_row_writer_and_the_minus_infinity_scores() {
    let mut e = open_config(tiny(), None);
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
