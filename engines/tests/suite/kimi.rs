//! Kimi end to end: chunking invariance, layer kinds and what they dump, warm vs cold continuation across capacity
//! growth, the strict-prefix rule, failure paths that taint, and state bytes that follow the context length.

use crate::common;

use common::*;

use kvproof_engines::arch::kimi::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::CacheKind;
use kvproof_engines::engine::{Flow, NoObserver, Request, StopReason};
use kvproof_engines::EngineError;

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

#[test]
fn every_preset_has_a_latent_mla_layers_and_no_rope_or_audio() {
    for p in Preset::ALL {
        let c = ModelConfig::preset(p);
        assert!(c.kv_lora > 0 && c.mla_every > 0);
        // MLA layers are NoPE and there is no audio: kimi's config has no such options
        let fields = serde_json::to_value(&c).expect("json");
        assert!(fields.get("qk_rope").is_none() && fields.get("audio_frame_bytes").is_none(), "{fields}");
    }
}

#[test]
fn three_of_four_layers_are_kda_and_the_rest_and_the_last_are_mla() {
    let c = tiny();
    let mut e = open_config(c.clone(), None);
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
fn cancel_mid_prefill_taints_and_the_next_turn_starts_over() {
    let mut c = tiny();
    c.prefill_chunk = 8;
    let mut warm = open_config(c, None);
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
    let mut e = open_config(c, None);
    let p: Vec<u32> = (0..30).map(|i| 60 + i).collect();
    let r = e.generate(&req(1, p.clone(), 3), &mut ProgressAt { at: 1, flow: Flow::Stop, polls: 0 }).expect("stop");
    assert_eq!((r.stop, r.tokens.len()), (StopReason::Stopped, 0));
    assert_eq!(e.dump(0).expect("dump").record.ids, p[..16].to_vec());
    let r2 = e.generate(&req(2, p.clone(), 3), &mut NoObserver).expect("continue");
    assert_eq!(r2.reused, 16);
    assert_eq!(r2.tokens, e.fresh().generate(&req(2, p, 3), &mut NoObserver).expect("cold").tokens);
}

/// Bytes a fresh slot allocated at `capacity` holds: what a state of that capacity must hold, whatever its history.
fn bytes_at(config: &ModelConfig, capacity: usize) -> usize {
    let mut c = config.clone();
    c.initial_capacity = capacity;
    open_config(c, None).state_bytes()
}

#[test]
fn state_bytes_follow_the_context_length_not_the_turn_count() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open_config(c.clone(), None);
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
    let mut e = open_config(tiny(), None);
    let prompts = ["first question?", "second question", "third question!", "first question?"];
    let mut bytes = Vec::new();
    for (i, q) in prompts.iter().cycle().take(12).enumerate() {
        let p = render(&[Message::new(Role::User, text(q))], true);
        e.generate(&req(i as u64, p, 5), &mut NoObserver).expect("turn");
        bytes.push(e.state_bytes());
    }
    assert!(bytes.iter().all(|&b| b == bytes[0]), "{bytes:?}");
}

#[test]
fn kv_leak_is_invisible_to_warm_cold_comparison() {
    // why the memory check (faults.rs) exists: the leak answers right, reuses right and holds the same rows
    let mut warm = open("kimi", "{}", Some(kvproof_engines::fault::Fault::KvLeak));
    let (w, c, fed) = continue_conversation(warm.as_mut(), "hello there", "go on", 6);
    assert_eq!((w.reused, &w.tokens), (fed, &c.tokens));
}
