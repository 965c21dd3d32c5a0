//! Inkling's own behaviour: ring vs full cache, continuation past the window and across growth, audio taint.
//! What every engine does is in conformance.rs, its faults in faults.rs.

use crate::common;

use common::*;

use kvproof_engines::arch::inkling::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::engine::{NoObserver, Request};
use kvproof_engines::tokenizer::AUDIO;

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
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
        let mut e = open_config(c, None);
        variants.push(((ring_kv, chunk), logits_of(e.as_mut(), &req(1, prompt.clone(), 8)).1));
    }
    let (_, reference) = &variants[0];
    assert_eq!(reference.len(), 8);
    for (label, l) in &variants[1..] {
        assert_eq!(l, reference, "variant {label:?} differs from ring prefilled in one batch");
    }
}

#[test]
fn audio_taints_the_record() {
    let mut warm = open_config(tiny(), None);
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
fn an_audio_id_needs_its_frame() {
    let mut e = open_config(tiny(), None);
    assert!(e.generate(&req(1, vec![AUDIO], 3), &mut NoObserver).is_err(), "audio id without a frame");
    let two = Request { audio: vec![vec![1; 8]], ..req(1, vec![AUDIO, AUDIO], 3) };
    assert!(e.generate(&two, &mut NoObserver).is_err(), "two audio ids, one frame");
}
