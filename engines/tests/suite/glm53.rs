//! glm53 end to end: the grid reuse rule (extend, repeat, shorter, divergent, LCP at a grid boundary ±0/1/2, a
//! reply crossing a grid boundary, capacity growth), warm equal to cold bit for bit, the kernels NOT being
//! batch-invariant, the drafter's exactness, and the cache-off switch reproducing the cold path.

use crate::common;

use common::*;

use kvproof_engines::arch::glm53::Config as ModelConfig;
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::WriterKind;
use kvproof_engines::engine::{Flow, NoObserver, Observer, Request};
use kvproof_engines::{bundled, EngineError};

const GRID: usize = 16;

fn tiny() -> ModelConfig {
    ModelConfig::preset(Preset::Tiny)
}

/// The expected reuse: min(LCP, previous prompt length, prompt length - 1), rounded down to the grid.
fn expected(fed: &[u32], prev_prompt: usize, prompt: &[u32]) -> usize {
    let lcp = fed.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    lcp.min(prev_prompt).min(prompt.len() - 1) / GRID * GRID
}

#[test]
fn two_turn_conversation_reuses_the_grid_rounded_prompt_and_matches_cold() {
    let mut warm = open_config(tiny(), None);
    let mut transcript = vec![
        Message::new(Role::System, text("you are a terse assistant")),
        Message::new(Role::User, text("tell me about position-fixed chunk grids")),
    ];
    let p1 = render(&transcript, true);
    let r1 = warm.generate(&exact(1, p1.clone(), 7), &mut NoObserver).expect("turn 1");
    assert_eq!(r1.tokens.len(), 7);
    let mut fed = p1.clone();
    fed.extend_from_slice(&r1.tokens[..r1.tokens.len() - 1]);
    assert_eq!(warm.dump(0).expect("dump").record.ids, fed, "the record holds what was fed, not the last token");
    transcript.push(Message::from_reply(&r1.tokens));
    transcript.push(Message::new(Role::User, text("and why round down?")));
    let p2 = render(&transcript, true);
    let want = expected(&fed, p1.len(), &p2);
    assert_eq!(want, p1.len() / GRID * GRID, "turn 2 extends turn 1: the previous prompt bounds reuse");
    assert!(want > 0);
    let w = warm_equals_cold(warm.as_mut(), &exact(2, p2, 7));
    assert_eq!(w.reused, want);
    assert_eq!(
        w.prefix_log,
        format!(
            "[PREFIX] reusing {want} of {} prompt tokens ({:.0}%)",
            w.prompt_tokens,
            100.0 * want as f64 / w.prompt_tokens as f64
        )
    );
}

/// Turn 1 = `first`; then each of `seconds` on a warm engine right after turn 1, checked against cold.
fn boundary_case(first: &[u32], max_tokens: usize, second: Vec<u32>) -> usize {
    let mut warm = open_config(tiny(), None);
    let r1 = warm.generate(&exact(1, first.to_vec(), max_tokens), &mut NoObserver).expect("turn 1");
    let mut fed = first.to_vec();
    fed.extend_from_slice(&r1.tokens[..r1.tokens.len().saturating_sub(1)]);
    let want = expected(&fed, first.len(), &second);
    let w = warm_equals_cold(warm.as_mut(), &exact(2, second, 5));
    assert_eq!(w.reused, want);
    want
}

#[test]
fn lcp_at_a_grid_boundary_plus_minus_zero_one_two() {
    let first = ids(64, 1);
    for (d, want) in [(30, 16), (31, 16), (32, 32), (33, 32), (34, 32), (48, 48), (47, 32), (1, 0), (0, 0)] {
        let mut second = first[..d].to_vec();
        second.extend(ids(20, 2));
        if second[d] == first[d] {
            second[d] = (first[d] + 1) % 256;
        }
        assert_eq!(boundary_case(&first, 4, second), want, "LCP {d}");
    }
}

#[test]
fn exact_repeat_and_shorter_prompts_reuse_the_grid_below_len_minus_one() {
    let first = ids(50, 3);
    // exact repeat: min(50, 50, 49) = 49 -> 48
    assert_eq!(boundary_case(&first, 4, first.clone()), 48);
    // a repeat of exactly a grid multiple: min(48, 48, 47) -> 32 (one id must be prefilled)
    assert_eq!(boundary_case(&first[..48], 4, first[..48].to_vec()), 32);
    // shorter prompts: min(L, 50, L - 1) rounded down
    assert_eq!(boundary_case(&first, 4, first[..40].to_vec()), 32);
    assert_eq!(boundary_case(&first, 4, first[..33].to_vec()), 32);
    assert_eq!(boundary_case(&first, 4, first[..32].to_vec()), 16);
    assert_eq!(boundary_case(&first, 4, first[..16].to_vec()), 0);
}

#[test]
fn a_reply_crossing_a_grid_boundary_is_never_reused() {
    // prompt 30 + 6 replies (5 fed) crosses 32: decode wrote rows 30..35, so reuse stops at the previous prompt
    let first = ids(30, 4);
    let mut warm = open_config(tiny(), None);
    let r1 = warm.generate(&exact(1, first.clone(), 6), &mut NoObserver).expect("turn 1");
    let d = warm.dump(0).expect("dump");
    let k0 = &d.tensors[0];
    let writer_at = |p: i64| k0.row_of_position(p).and_then(|i| k0.writers[i]).map(|w| w.kind);
    assert_eq!(writer_at(29), Some(WriterKind::Prefill { chunk: 1, chunk_rows: 14 }));
    assert_eq!(writer_at(32), Some(WriterKind::Decode { step: 2 }));
    let mut second = first.clone();
    second.extend_from_slice(&r1.tokens);
    second.extend(ids(10, 5));
    let w = warm_equals_cold(warm.as_mut(), &exact(2, second, 5));
    assert_eq!(w.reused, 16, "min(LCP 35, canonical 30, ...) = 30, rounded down to 16");
}

#[test]
fn a_longer_conversation_grows_capacity_and_stays_equal_to_cold() {
    let mut c = tiny();
    c.initial_capacity = 32;
    let mut warm = open_config(c, None);
    let mut transcript = vec![Message::new(Role::User, ids(40, 6))];
    let mut prev: Option<(Vec<u32>, usize)> = None;
    for turn in 0..4u64 {
        let p = render(&transcript, true);
        let r = exact(turn + 1, p.clone(), 6);
        let reply = match &prev {
            None => warm.generate(&r, &mut NoObserver).expect("turn 1"),
            Some((fed, prev_len)) => {
                let w = warm_equals_cold(warm.as_mut(), &r);
                assert_eq!(w.reused, expected(fed, *prev_len, &p), "turn {turn}");
                assert!(w.reused > 0);
                w
            }
        };
        let mut fed = p.clone();
        fed.extend_from_slice(&reply.tokens[..reply.tokens.len() - 1]);
        prev = Some((fed, p.len()));
        transcript.push(Message::from_reply(&reply.tokens));
        transcript.push(Message::new(Role::User, ids(13 + turn as usize * 7, 7 + turn as u32)));
    }
    assert!(warm.dump(0).expect("dump").meta.capacity >= 128, "the slot grew twice");
}

#[test]
fn the_kernels_are_not_batch_invariant() {
    let prompt = ids(40, 8);
    let dump_with = |c: ModelConfig, prompt: &[u32], max_tokens: usize| {
        let mut e = open_config(c, None);
        let r = e.generate(&exact(1, prompt.to_vec(), max_tokens), &mut NoObserver).expect("generate");
        (e.dump(0).expect("dump"), r)
    };
    // the same prefix cut into chunks of 16 and of 8 rows: different bits from the first row on
    let (a, _) = dump_with(tiny(), &prompt, 1);
    let mut c8 = tiny();
    c8.prompt_rows = 8;
    let (b, _) = dump_with(c8, &prompt, 1);
    assert!(first_difference_across_configs(&a, &b).is_some(), "chunking changes the bits");
    // prefill vs decode: the same ids at the same positions, written by decode in one run and prefill in another
    let (dec, r) = dump_with(tiny(), &prompt[..32], 5);
    let mut longer = prompt[..32].to_vec();
    longer.extend_from_slice(&r.tokens[..4]);
    let (pre, _) = dump_with(tiny(), &longer, 1);
    let diff = first_difference(&dec, &pre).expect("decode and prefill bits differ");
    assert_eq!(
        diff,
        "layer 0 `k`, pos 32: warm row by decode (req 1, step 0), cold row by prefill (req 1, chunk 2 of 4 rows)"
    );
}

#[test]
fn speculative_decoding_gives_the_plain_greedy_output_bit_for_bit() {
    let prompt = render(&[Message::new(Role::User, text("count: a a a a a a a a a a a a"))], true);
    let r = exact(1, prompt, 48);
    let mut plain = tiny();
    plain.draft_layers = 0;
    let (p, pl) = logits_of(open_config(plain, None).as_mut(), &r);
    let mut spec_engine = open_config(tiny(), None);
    let (s, sl) = logits_of(spec_engine.as_mut(), &r);
    assert_eq!(s.tokens, p.tokens);
    assert_eq!(sl, pl, "verification batches give the one-token decode logits, bit for bit");
    let d = spec_engine.dump(0).expect("dump");
    let draft = d.tensors.iter().find(|t| t.name == "draft_k").expect("the drafter's rows are dumped");
    assert_eq!(held(&d).len(), d.meta.len);
    assert_eq!(draft.positions.iter().filter(|&&p| p >= 0).count(), d.meta.len, "the drafter covers every fed id");
    // sampled decoding too: the drafter never changes what is sampled
    let sampled =
        Request { sampling: kvproof_engines::Sampling { temperature: 0.9, top_p: 0.95, top_k: 40, seed: 5 }, ..r };
    let mut plain = tiny();
    plain.draft_layers = 0;
    assert_eq!(
        open_config(plain, None).generate(&sampled, &mut NoObserver).expect("plain").tokens,
        open_config(tiny(), None).generate(&sampled, &mut NoObserver).expect("spec").tokens
    );
}

#[test]
fn with_the_cache_off_every_turn_is_the_cold_path_bit_for_bit() {
    let mut off = tiny();
    off.prefix_cache = false;
    let mut warm = open_config(off, None);
    let mut transcript = vec![Message::new(Role::User, ids(37, 9))];
    for turn in 0..3u64 {
        let p = render(&transcript, true);
        let r = exact(turn + 1, p, 6);
        let (w, wl) = logits_of(warm.as_mut(), &r);
        assert_eq!(w.reused, 0, "the cache is off");
        // a fresh engine with the cache ON, given this turn alone
        let mut cold = open_config(tiny(), None);
        let (c, cl) = logits_of(cold.as_mut(), &r);
        assert_eq!(w.tokens, c.tokens);
        assert_eq!(wl, cl, "turn {turn}: logits differ");
        let (wd, cd) = (warm.dump(0).expect("dump"), cold.dump(0).expect("dump"));
        assert_eq!(first_difference_across_configs(&wd, &cd), None);
        assert_eq!(held(&wd), held(&cd));
        transcript.push(Message::from_reply(&w.tokens));
        transcript.push(Message::new(Role::User, ids(9, 10 + turn as u32)));
    }
}

#[test]
fn a_cancel_mid_prefill_taints_and_the_next_turn_starts_over() {
    struct CancelAfter(usize);
    impl Observer for CancelAfter {
        fn on_progress(&mut self) -> Flow {
            if self.0 == 0 {
                return Flow::Cancel;
            }
            self.0 -= 1;
            Flow::Continue
        }
    }
    let mut e = open_config(tiny(), None);
    // turn 2 reuses 2 grid chunks and prefills 3 whole ones: the cancel comes after the first of them
    let p = ids(5 * GRID, 11);
    e.generate(&exact(1, p[..2 * GRID + 8].to_vec(), 3), &mut NoObserver).expect("turn 1");
    assert!(matches!(e.generate(&exact(2, p.clone(), 3), &mut CancelAfter(1)), Err(EngineError::Cancelled)));
    assert!(e.dump(0).expect("dump").record.tainted);
    let w = warm_equals_cold(e.as_mut(), &exact(3, p, 3));
    assert_eq!(w.reused, 0);
}

#[test]
fn every_preset_opens_and_answers() {
    for p in Preset::ALL {
        let mut e = bundled::open_preset("glm53", p, 0, None).expect("open");
        let info = e.info();
        assert_eq!(info.arch, "glm53");
        assert_eq!(info.prompt_rows, Some(ModelConfig::preset(p).prompt_rows));
        if p == Preset::Tiny {
            let r = e.generate(&exact(1, ids(20, 13), 3), &mut NoObserver).expect("generate");
            assert_eq!(r.tokens.len(), 3);
        }
    }
}
