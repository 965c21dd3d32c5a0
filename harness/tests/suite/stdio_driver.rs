//! The stdio driver against a bundled engine served by `kvproof-engine` (built by `cargo test --workspace` next to
//! this test's binary), next to the same engine in-process: what CAPS give the driver, conversations as text
//! (`generate_chat`, with the prompt ids the engine fed), a cancel at a prefill poll, and cold instances that are one
//! process reset before each run.

use kvproof::driver::{launcher_for, ChatRequest, Launcher};
use kvproof::scenario::{Cold, DeclaredRule, EngineSpec, Via};
use kvproof_engines::chat::{render_text, TextMessage};
use kvproof_engines::config::Preset;
use kvproof_engines::engine::Request;
use kvproof_engines::tokenizer::{Tokenizer, EOS};

fn spec(arch: &str, via: Via, cold: Cold) -> EngineSpec {
    EngineSpec::Bundled {
        arch: arch.into(),
        preset: Preset::Tiny,
        seed: 0,
        fault: None,
        config: Default::default(),
        via,
        cold,
        gguf: None,
    }
}

fn launcher(via: Via, cold: Cold) -> Box<dyn Launcher> {
    launcher_for(&spec("inkling", via, cold), None).expect("launch")
}

fn messages() -> Vec<TextMessage> {
    let m = |role: &str, content: &str| TextMessage { role: role.into(), content: content.into() };
    vec![m("system", "be brief"), m("user", "what is a prefix cache?")]
}

#[test]
fn caps_come_from_the_engines_declaration() {
    let stdio = launcher(Via::Stdio, Cold::Process);
    let caps = stdio.caps();
    assert_eq!(caps.reuse_rule, Some(DeclaredRule::Strict));
    assert!(caps.chat && caps.cancel_at_poll && caps.reuse_count && caps.dumps, "{caps:?}");
    assert!(!caps.state_bytes, "state bytes do not travel over stdio");
    assert!(
        stdio.label().starts_with("inkling/tiny/seed 0 via stdio: kvproof-engine --arch inkling"),
        "{}",
        stdio.label()
    );
    let glm = launcher_for(
        &EngineSpec::Bundled {
            arch: "glm".into(),
            preset: Preset::Tiny,
            seed: 0,
            fault: None,
            config: serde_json::from_str(r#"{"kv_share": true}"#).expect("json"),
            via: Via::Stdio,
            cold: Cold::Process,
            gguf: None,
        },
        None,
    )
    .expect("glm");
    assert_eq!((glm.caps().reuse_rule, glm.caps().kv_share), (Some(DeclaredRule::Lcp), true));
}

#[test]
fn a_conversation_as_text_gives_the_same_ids_and_reply_over_stdio_and_in_process() {
    let (stdio, local) = (launcher(Via::Stdio, Cold::Process), launcher(Via::InProcess, Cold::Process));
    let req = ChatRequest { id: 1, slot: 0, messages: messages(), max_tokens: 8, ignore_eos: false };
    let a = stdio.launch().expect("stdio").generate_chat(&req).expect("stdio chat");
    let b = local.launch().expect("local").generate_chat(&req).expect("local chat");
    let ids = render_text(&req.messages).expect("render");
    assert_eq!(a.prompt_ids.as_deref(), Some(&ids[..]));
    assert_eq!(a.prompt_ids, b.prompt_ids);
    assert_eq!((&a.tokens, a.reused, a.prompt_tokens), (&b.tokens, b.reused, b.prompt_tokens));
    // each DATA frame's text is the token's text in the engine's own vocabulary
    let pieces: Vec<Vec<u8>> = a.tokens.iter().map(|&t| Tokenizer.token_bytes(t)).collect();
    assert_eq!(a.pieces.as_ref(), Some(&pieces));
    assert_eq!(a.pieces, b.pieces);
}

#[test]
fn a_cancel_at_a_prefill_poll_fails_alike_over_stdio_and_in_process() {
    let prompt: Vec<u32> = (0..80).map(|i| 97 + i % 26).collect();
    let req = Request { id: 1, prompt, max_tokens: 4, ..Request::default() };
    for via in [Via::Stdio, Via::InProcess] {
        let mut d = launcher(via, Cold::Process).launch().expect("launch");
        let err = d.generate_cancel_at(&req, 0).expect_err("cancelled");
        assert_eq!(err.code(), "CANCELLED", "{via}");
        // a poll the request never reaches: it runs normally
        let ok = d.generate_cancel_at(&Request { id: 2, ..req.clone() }, 10_000).expect("runs");
        assert_eq!(ok.reused, Some(0), "{via}: the cancelled request left nothing to reuse");
    }
}

#[test]
fn cold_instances_by_reset_start_from_a_fresh_state() {
    let l = launcher(Via::Stdio, Cold::Reset);
    assert!(l.label().contains(Cold::RESET_NOTE), "{}", l.label());
    let first = Request { id: 1, prompt: vec![256, 259, 104, 105, 257, 260], max_tokens: 4, ..Request::default() };
    let mut replies = Vec::new();
    for round in 0..3u64 {
        // each cold run gets the one process, reset: turn 1 reuses nothing, turn 2 reuses turn 1
        let mut cold = l.launch_cold().expect("cold");
        let r1 = cold.generate(&Request { id: 10 * round + 1, ..first.clone() }).expect("turn 1");
        assert_eq!(r1.reused, Some(0), "round {round}: the reset process held state");
        let mut p2 = first.prompt.clone();
        p2.extend(&r1.tokens);
        if r1.tokens.last() != Some(&EOS) {
            p2.push(EOS);
        }
        p2.extend([259, 111, 107, 257, 260]);
        let r2 = cold.generate(&Request { id: 10 * round + 2, prompt: p2, ..first.clone() }).expect("turn 2");
        assert_eq!(r2.reused, Some(first.prompt.len() + r1.tokens.len() - 1), "round {round}");
        replies.push((r1.tokens, r2.tokens));
    }
    assert!(replies.windows(2).all(|w| w[0] == w[1]), "a reset process answers as a fresh one every time");
}
