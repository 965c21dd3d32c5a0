//! The reuse count a served engine writes in DONE is the engine's own: for every bundled arch, a few hundred seeded
//! requests (continuations, repeats, shorter and diverging prompts, fresh conversations, slot changes, audio) go to an
//! in-process engine and to `kvproof-engine` serving the same model, and each DONE's `prefix_reused` (and reply)
//! must equal the in-process `Reply` — over many distinct values, so an off-by-one or a constant in how the serve
//! layer writes the count cannot pass.

use std::collections::BTreeSet;
use std::time::Duration;

use kvproof_engines::bundled::ModelConfig;
use kvproof_engines::config::Preset;
use kvproof_engines::engine::{Engine, NoObserver, Request, Sampling};
use kvproof_engines::rng::SplitMix64;
use kvproof_engines::serve::StdioEngine;
use kvproof_engines::tokenizer::AUDIO;

const BIN: &str = env!("CARGO_BIN_EXE_kvproof-engine");
const REQUESTS_PER_ARCH: usize = 64;

/// The engine in this process and the same model served over stdio.
fn pair(arch: &str, kv_share: bool) -> (Box<dyn Engine>, StdioEngine) {
    let overrides = if kv_share { serde_json::json!({"kv_share": true}) } else { serde_json::json!({}) };
    let config =
        ModelConfig::with_overrides(arch, Preset::Tiny, overrides.as_object().expect("an object")).expect("preset");
    let weights = kvproof_engines::fixture::generate_weights(&config, 0).expect("weights");
    let local = kvproof_engines::bundled::open(config, weights, None).expect("open");
    let mut cmd: Vec<String> = [BIN, "--arch", arch, "--preset", "tiny", "--seed", "0"].map(String::from).to_vec();
    if kv_share {
        cmd.extend(["--config".to_string(), r#"{"kv_share":true}"#.to_string()]);
    }
    let served = StdioEngine::spawn(&cmd, &[], Duration::from_secs(60)).expect("engine starts");
    assert_eq!(served.caps().model(), Some(local.info().model_hash.as_str()), "{arch}: the same model");
    (local, served)
}

fn random_ids(rng: &mut SplitMix64, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(256) as u32).collect()
}

/// Compare `REQUESTS_PER_ARCH` seeded requests; returns the distinct reuse counts seen.
fn compare(arch: &str, kv_share: bool, seed: u64) -> BTreeSet<usize> {
    let (mut local, mut served) = pair(arch, kv_share);
    let info = local.info();
    let mut rng = SplitMix64::new(seed);
    // per slot: the last prompt and the last prompt followed by its whole reply
    let mut last: Vec<(Vec<u32>, Vec<u32>)> = vec![(Vec::new(), Vec::new()); info.slots];
    let mut counts = BTreeSet::new();
    for n in 0..REQUESTS_PER_ARCH {
        let slot = if info.slots > 1 && rng.below(4) == 0 { rng.below(info.slots as u64) as usize } else { 0 };
        let (prompt_before, full_before) = last[slot].clone();
        let tail = 1 + rng.below(12) as usize;
        let (fresh_len, long_tail) = (4 + rng.below(36) as usize, 30 + rng.below(60) as usize);
        let mut audio: Vec<Vec<u8>> = Vec::new();
        let mut prompt = match rng.below(8) {
            _ if full_before.is_empty() => random_ids(&mut rng, fresh_len),
            0..=2 => [full_before.clone(), random_ids(&mut rng, tail)].concat(),
            3 => prompt_before.clone(),
            4 => prompt_before[..prompt_before.len().saturating_sub(1 + rng.below(4) as usize).max(1)].to_vec(),
            5 => {
                let mut p = full_before.clone();
                let at = rng.below(p.len() as u64) as usize;
                p[at] = (p[at] + 1) % 256;
                p.extend(random_ids(&mut rng, tail));
                p
            }
            6 => [full_before.clone(), random_ids(&mut rng, long_tail)].concat(),
            _ => random_ids(&mut rng, fresh_len),
        };
        if info.audio && rng.below(10) == 0 {
            let at = prompt.len() - 1;
            prompt.insert(at, AUDIO);
        }
        let max_tokens = 1 + rng.below(8) as usize;
        if prompt.len() + max_tokens + 8 > info.max_ctx {
            prompt = random_ids(&mut rng, 8);
        }
        // one frame per audio id (earlier turns and replies may hold some too)
        if info.audio {
            for _ in prompt.iter().filter(|&&t| t == AUDIO) {
                audio.push((0..info.audio_frame_bytes).map(|_| rng.below(256) as u8).collect());
            }
        }
        let req = Request {
            id: n as u64 + 1,
            slot,
            prompt: prompt.clone(),
            audio,
            max_tokens,
            sampling: Sampling::default(),
            logprobs: 0,
            ignore_eos: rng.below(2) == 0,
        };
        let want = local.generate(&req, &mut NoObserver).unwrap_or_else(|e| panic!("{arch} request {n}: {e}"));
        let got = served.submit(&req).unwrap_or_else(|e| panic!("{arch} request {n}: {e}"));
        assert_eq!(got.reused(), Some(want.reused), "{arch} request {n}: DONE's reuse count is not the engine's");
        assert_eq!(got.done.prompt_tokens, Some(want.prompt_tokens), "{arch} request {n}");
        assert_eq!(got.tokens, want.tokens, "{arch} request {n}: replies");
        counts.insert(want.reused);
        last[slot] = (prompt.clone(), [prompt, want.tokens].concat());
    }
    assert!(served.shutdown().expect("exit").success());
    counts
}

#[test]
fn done_reports_the_engines_own_reuse_count() {
    let mut all = BTreeSet::new();
    for (i, (arch, share)) in
        [("inkling", false), ("deepseek", false), ("kimi", false), ("glm", true), ("glm53", false)].iter().enumerate()
    {
        let counts = compare(arch, *share, 0x5e_12e0 + i as u64);
        assert!(counts.len() >= 8, "{arch}: only {} distinct reuse counts: {counts:?}", counts.len());
        all.extend(counts);
    }
    assert!(all.len() >= 40, "{} distinct reuse counts over every arch: {all:?}", all.len());
}
