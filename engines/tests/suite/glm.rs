//! glm end to end: longest-common-prefix truncation (extend, repeat, shorter, divergent at first/middle/last),
//! pinned slots with interleaved conversations, cross-slot sharing by copied rows, batch invariance (decode rows
//! equal prefill rows), capacity growth — each warm turn equal to a cold engine's, bit for bit.

use crate::common;

use common::*;

use kvproof_engines::arch::glm::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{CacheKind, WriterKind};
use kvproof_engines::engine::{Flow, NoObserver, Observer, Reply, Request};
use kvproof_engines::{bundled, EngineError};

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

fn sharing() -> ModelConfig {
    ModelConfig { kv_share: true, ..tiny() }
}

#[test]
fn two_turn_conversation_reuses_everything_fed_and_matches_cold() {
    let mut warm = open_config(tiny(), None);
    let mut t = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text("what is MLA?"))];
    let p1 = render(&t, true);
    let r1 = warm.generate(&exact_on(1, 0, p1.clone(), 6), &mut NoObserver).expect("turn 1");
    assert_eq!(warm.dump(0).expect("dump").record.ids, fed(&p1, &r1.tokens));
    t.push(Message::from_reply(&r1.tokens));
    t.push(Message::new(Role::User, text("and the latent?")));
    let p2 = render(&t, true);
    let w = warm_equals_cold(warm.as_mut(), &exact_on(2, 0, p2.clone(), 6));
    assert_eq!(w.reused, p1.len() + 5);
    assert!(w.prefix_log.starts_with(&format!("[PREFIX] reusing {} of {}", w.reused, p2.len())), "{}", w.prefix_log);
}

/// Turn 1 = `first` on slot 0, then `second`; returns the reuse, checked against LCP bounded by len - 1.
fn after(first: &[u32], second: Vec<u32>) -> usize {
    let mut warm = open_config(tiny(), None);
    let r1 = warm.generate(&exact_on(1, 0, first.to_vec(), 5), &mut NoObserver).expect("turn 1");
    let want = lcp(&fed(first, &r1.tokens), &second).min(second.len() - 1);
    let w = warm_equals_cold(warm.as_mut(), &exact_on(2, 0, second, 5));
    assert_eq!(w.reused, want);
    w.reused
}

#[test]
fn the_boundary_cases_of_lcp_truncation() {
    let first = ids(40, 1);
    let diverge = |at: usize| {
        let mut p = first.clone();
        p.extend(ids(10, 2));
        p[at] = (p[at] + 1) % 256;
        p
    };
    assert_eq!(after(&first, first.clone()), 39, "exact repeat: all but the last id");
    assert_eq!(after(&first, first[..25].to_vec()), 24, "shorter: all but the last id");
    assert_eq!(after(&first, first[..1].to_vec()), 0, "a one-id prompt always prefills its id");
    assert_eq!(after(&first, diverge(0)), 0, "divergence at the first id");
    assert_eq!(after(&first, diverge(17)), 17, "divergence in the middle");
    assert_eq!(after(&first, diverge(39)), 39, "divergence at the last prompt id");
    // divergence at the last fed id (the 4th reply id of 5): everything before it
    let mut warm = open_config(tiny(), None);
    let r1 = warm.generate(&exact_on(1, 0, first.clone(), 5), &mut NoObserver).expect("turn 1");
    let f = fed(&first, &r1.tokens);
    let mut p = f.clone();
    p.extend(ids(6, 3));
    p[f.len() - 1] = (p[f.len() - 1] + 1) % 256;
    assert_eq!(warm_equals_cold(warm.as_mut(), &exact_on(2, 0, p, 5)).reused, f.len() - 1);
}

#[test]
fn prompt_plus_the_whole_reply_reuses_what_was_fed() {
    let first = ids(30, 4);
    let mut warm = open_config(tiny(), None);
    let r1 = warm.generate(&exact_on(1, 0, first.clone(), 6), &mut NoObserver).expect("turn 1");
    let mut p = first.clone();
    p.extend_from_slice(&r1.tokens);
    // exactly prompt + reply: the last reply id was never fed, so it is the one prefilled
    let w = warm_equals_cold(warm.as_mut(), &exact_on(2, 0, p.clone(), 4));
    assert_eq!(w.reused, 35);
    // and again on top of turn 2: its prompt, then 3 of its 4 replies were fed
    p.extend_from_slice(&w.tokens);
    p.push(65);
    assert_eq!(warm_equals_cold(warm.as_mut(), &exact_on(3, 0, p, 4)).reused, 36 + 3);
}

#[test]
fn interleaved_conversations_stay_pinned_to_their_slots() {
    let mut warm = open_config(tiny(), None);
    let mut convs = [
        vec![Message::new(Role::User, text("slot zero talks about latents"))],
        vec![Message::new(Role::User, text("slot one talks about experts"))],
    ];
    let mut fed_by: [Vec<u32>; 2] = [vec![], vec![]];
    for turn in 0..3u64 {
        for (slot, conv) in convs.iter_mut().enumerate() {
            let p = render(conv, true);
            let r = exact_on(turn * 2 + slot as u64 + 1, slot, p.clone(), 5);
            let w = warm_equals_cold(warm.as_mut(), &r);
            assert_eq!(w.reused, if turn == 0 { 0 } else { fed_by[slot].len() }, "slot {slot} turn {turn}");
            fed_by[slot] = fed(&p, &w.tokens);
            conv.push(Message::from_reply(&w.tokens));
            conv.push(Message::new(Role::User, ids(5 + turn as usize, slot as u32)));
        }
    }
    // a slot switch: slot 1's conversation lands on slot 0, which truncates to their common prefix
    let p = render(&convs[1], true);
    let w = warm_equals_cold(warm.as_mut(), &exact_on(99, 0, p.clone(), 5));
    assert_eq!(w.reused, lcp(&fed_by[0], &p).min(p.len() - 1));
    assert_eq!(w.reused, 2 + "slot ".len(), "bos, the user marker and `slot ` are common");
}

#[test]
fn cross_slot_sharing_copies_the_longest_matching_prefix_into_an_empty_slot() {
    let base = render(&[Message::new(Role::System, text("shared system prompt, long enough to matter"))], false);
    let conv = |tail: &str| {
        let mut p = base.clone();
        p.extend(render(&[Message::new(Role::User, text(tail))], true).into_iter().skip(1));
        p
    };
    for share in [false, true] {
        let mut warm = open_config(if share { sharing() } else { tiny() }, None);
        let a = conv("first question");
        let ra = warm.generate(&exact_on(1, 0, a.clone(), 5), &mut NoObserver).expect("slot 0");
        let b = conv("first quest and more");
        let rb = warm.generate(&exact_on(2, 2, b.clone(), 5), &mut NoObserver).expect("slot 2");
        // a request on empty slot 1 that shares most with slot 0
        let mut c = fed(&a, &ra.tokens);
        c.extend(text(" then"));
        let w = warm_equals_cold(warm.as_mut(), &exact_on(3, 1, c.clone(), 5));
        let want = if share { lcp(&fed(&a, &ra.tokens), &c).min(c.len() - 1) } else { 0 };
        assert_eq!(w.reused, want, "share {share}");
        let d = warm.dump(1).expect("dump");
        let kinds: Vec<Option<WriterKind>> = (0..want as i64 + 1)
            .map(|p| d.tensors[0].row_of_position(p).and_then(|i| d.tensors[0].writers[i]).map(|w| w.kind))
            .collect();
        if share {
            assert!(want > 20, "the share must copy something: {want}");
            assert!(kinds[..want].iter().all(|k| *k == Some(WriterKind::Copied { from_slot: 0 })), "{kinds:?}");
            assert_eq!(kinds[want], Some(WriterKind::Prefill { chunk: 0, chunk_rows: 5 }));
            assert_eq!(d.record.ids, fed(&c, &w.tokens), "the record holds the copied ids, then what was fed");
        }
        // a non-empty slot never shares: slot 2 truncates to its own common prefix with the prompt
        let w = warm_equals_cold(warm.as_mut(), &exact_on(4, 2, c.clone(), 5));
        assert_eq!(w.reused, lcp(&fed(&b, &rb.tokens), &c).min(c.len() - 1));
    }
}

#[test]
fn decode_rows_equal_prefill_rows_and_chunking_never_matters() {
    let prompt = ids(37, 5);
    let mut a = open_config(tiny(), None);
    let r = a.generate(&exact_on(1, 0, prompt.clone(), 9), &mut NoObserver).expect("decode");
    let mut longer = prompt.clone();
    longer.extend_from_slice(&r.tokens[..8]);
    let mut b = open_config(tiny(), None);
    b.generate(&exact_on(1, 0, longer.clone(), 1), &mut NoObserver).expect("prefill");
    let (da, db) = (a.dump(0).expect("dump"), b.dump(0).expect("dump"));
    assert_eq!(first_difference(&da, &db), None, "decode-written rows are bit-equal to prefill-written ones");
    assert_eq!(held(&da), held(&db));
    let mut logits = Vec::new();
    for chunk in [1, 5, 16, 64] {
        let mut e = open_config(
            {
                let mut c = tiny();
                c.prefill_chunk = chunk;
                c
            },
            None,
        );
        let mut obs = Logits::default();
        e.generate(&Request { logprobs: 300, ..exact_on(1, 0, longer.clone(), 4) }, &mut obs).expect("generate");
        logits.push(obs.0);
    }
    assert!(logits.windows(2).all(|w| w[0] == w[1]), "logits do not depend on the prefill segment size");
}

#[test]
fn the_cache_is_latent_rows() {
    let mut e = open_config(tiny(), None);
    e.generate(&exact_on(1, 0, ids(10, 6), 3), &mut NoObserver).expect("generate");
    let d = e.dump(0).expect("dump");
    let c = tiny();
    assert_eq!(d.tensors.len(), 2 * c.layers);
    for t in &d.tensors {
        assert_eq!(t.kind, CacheKind::Latent);
        assert_eq!(t.width, if t.name == "latent" { c.kv_lora } else { c.qk_rope });
        assert_eq!(t.positions.iter().filter(|&&p| p >= 0).count(), 12);
    }
}

#[test]
fn a_long_conversation_grows_capacity_and_stays_equal_to_cold() {
    let mut warm = open_config(
        {
            let mut c = tiny();
            c.initial_capacity = 16;
            c
        },
        None,
    );
    let mut t = vec![Message::new(Role::User, ids(20, 7))];
    let mut prev: Option<Vec<u32>> = None;
    for turn in 0..4u64 {
        let p = render(&t, true);
        let w = warm_equals_cold(warm.as_mut(), &exact_on(turn + 1, 0, p.clone(), 6));
        assert_eq!(w.reused, prev.as_ref().map_or(0, |f| f.len()), "turn {turn}");
        prev = Some(fed(&p, &w.tokens));
        t.push(Message::from_reply(&w.tokens));
        t.push(Message::new(Role::User, ids(11 * (turn as usize + 1), 8 + turn as u32)));
    }
    assert!(warm.dump(0).expect("dump").meta.capacity >= 128);
}

#[test]
fn failures_leave_nothing_reusable() {
    struct CancelFirst;
    impl Observer for CancelFirst {
        fn on_progress(&mut self) -> Flow {
            Flow::Cancel
        }
    }
    let mut e = open_config(tiny(), None);
    let p = ids(50, 9);
    e.generate(&exact_on(1, 0, p[..30].to_vec(), 3), &mut NoObserver).expect("turn 1");
    assert!(matches!(e.generate(&exact_on(2, 0, p.clone(), 3), &mut CancelFirst), Err(EngineError::Cancelled)));
    assert_eq!(warm_equals_cold(e.as_mut(), &exact_on(3, 0, p.clone(), 3)).reused, 0);
    assert!(matches!(
        e.generate(&exact_on(4, 0, vec![65; 5000], 3), &mut NoObserver),
        Err(EngineError::ContextExceeded { .. })
    ));
    assert_eq!(warm_equals_cold(e.as_mut(), &exact_on(5, 0, p, 3)).reused, 0);
}

#[test]
fn every_preset_opens_and_answers_deterministically() {
    for p in Preset::ALL {
        let e = bundled::open_preset("glm", p, 0, None).expect("open");
        assert_eq!(e.info().slots, 4);
        if p == Preset::Tiny {
            let r = exact_on(1, 0, ids(20, 11), 4);
            let a = e.fresh().generate(&r, &mut NoObserver).expect("a");
            let b = e.fresh().generate(&r, &mut NoObserver).expect("b");
            assert_eq!(a, Reply { timings: a.timings, ..b });
        }
    }
}
