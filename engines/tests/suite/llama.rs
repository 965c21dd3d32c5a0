//! The llama arch on SmolLM2-135M-Instruct (Q4_1 GGUF) against llama.cpp: `tests/data/smollm2-goldens.json`
//! (written by `ci/goldens/logits.py` from llama-server: 24 prompts, the greedy continuation of 16 tokens and the
//! top-5 log-probabilities at each step).
//!
//! The tests need the model (`bash ci/fetch-smollm2.sh`, then `KVPROOF_CACHE=<cache> cargo test -- --ignored`);
//! without it they fail naming that command. `.ci/run` fetches it and runs them.

use std::sync::Arc;

use kvproof_engines::arch::llama::{self, Model, State};
use kvproof_engines::dump::{Writer, WriterKind};
use kvproof_engines::engine::{NoObserver, Request};
use kvproof_engines::engine_loop::{Arch, Segment};
use kvproof_engines::gguf::smollm2_path;
use kvproof_engines::sampler::argmax;
use serde_json::Value;

fn model() -> Model {
    let path = smollm2_path().unwrap_or_else(|e| panic!("{e}"));
    llama::load(&path).expect("the model loads")
}

struct Case {
    prompt: Vec<u32>,
    /// Per step: llama.cpp's greedy id and its top-5 (id, log-probability).
    steps: Vec<(u32, Vec<(u32, f32)>)>,
}

fn goldens() -> Vec<Case> {
    let text = include_str!("../data/smollm2-goldens.json");
    let v: Value = serde_json::from_str(text).expect("golden JSON");
    let ids = |v: &Value| v.as_array().expect("array").iter().map(|i| i.as_u64().expect("id") as u32).collect();
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt"]),
            steps: c["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|s| {
                    let top = s["top"]
                        .as_array()
                        .expect("top")
                        .iter()
                        .map(|p| (p[0].as_u64().expect("id") as u32, p[1].as_f64().expect("logprob") as f32))
                        .collect();
                    (s["id"].as_u64().expect("id") as u32, top)
                })
                .collect(),
        })
        .collect()
}

fn writer() -> Writer {
    Writer { kind: WriterKind::Prefill { chunk: 0, chunk_rows: 0 }, request: 1 }
}

/// Top-1 agreement and logit differences, teacher-forced on llama.cpp's continuation (so every step sees the
/// same context in both engines).
///
/// Log-probabilities are logits minus one constant per step, so the comparison is of differences: for each of
/// llama.cpp's top-5 ids k, `(logit[top1] - logit[k])` here against `(logprob[top1] - logprob[k])` there.
///
/// Measured on this machine (24 prompts, 363 positions: llama.cpp stopped some replies at eos): top-1 agreed at
/// 350 (96.4%); at every one of the 13 others llama.cpp's own top-1 led its top-2 by at most 0.19 (near ties);
/// the largest difference of logit differences over the top-5 was 0.65. They come from arithmetic, not the
/// model: both engines quantize activations to 8-bit blocks for the Q4_1/Q8_0 dot products, but llama.cpp stores
/// k/v in f16 and sums in other orders. (With f32 activations against dequantized weights they were 346, 0.36
/// and 0.87.) The bounds sit with a margin above the measurement — top-1 share at least 0.94, a top-1
/// disagreement only where llama.cpp's lead is under 0.3, a largest difference of 1.0 — while a wrong rope, norm,
/// GQA grouping or block layout moves all three far past them.
#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn agrees_with_llama_cpp() {
    let m = model();
    let cases = goldens();
    assert!(cases.len() >= 20);
    let (mut agree, mut total, mut max_diff, mut max_miss_gap) = (0usize, 0usize, 0.0f32, 0.0f32);
    let mut worst = String::new();
    for (ci, case) in cases.iter().enumerate() {
        let mut st: State = m.new_layers();
        let mut logits = m.forward(&mut st, &Segment::of_ids(&case.prompt, 0, writer()));
        for (pos, (si, (id, top))) in (case.prompt.len()..).zip(case.steps.iter().enumerate()) {
            total += 1;
            if argmax(&logits) == top[0].0 {
                agree += 1;
            } else {
                let gap = top[0].1 - top[1].1;
                max_miss_gap = max_miss_gap.max(gap);
                eprintln!(
                    "case {ci} step {si}: llama.cpp's top-1 {} leads by {gap:.3}; here {}",
                    top[0].0,
                    argmax(&logits)
                );
            }
            let (t1, lp1) = top[0];
            for &(k, lpk) in &top[1..] {
                let d = ((logits[t1 as usize] - logits[k as usize]) - (lp1 - lpk)).abs();
                if d > max_diff {
                    max_diff = d;
                    worst = format!("case {ci} step {si}: ids {t1} vs {k}");
                }
            }
            logits = m.forward(&mut st, &Segment::of_ids(&[*id], pos, writer()));
        }
    }
    let share = agree as f64 / total as f64;
    eprintln!(
        "top-1 agreement {agree}/{total} = {share:.4}; largest logit difference {max_diff:.4} ({worst}); \
         largest llama.cpp top-1 lead where top-1 differs {max_miss_gap:.4}"
    );
    assert!(share >= 0.94, "top-1 agreement {share:.4} below 0.94");
    assert!(max_miss_gap < 0.3, "top-1 differs where llama.cpp's top-1 leads by {max_miss_gap:.4}");
    assert!(max_diff <= 1.0, "largest logit difference {max_diff:.4} above 1.0 at {worst}");
}

/// Served through the engine loop (prefill segments, decode, greedy sampling over the model's own vocabulary),
/// each prompt continues exactly as llama.cpp's does up to llama.cpp's first near tie (a step where
/// its top-1 leads its top-2 by under 0.5, where arithmetic differences may pick the other; see above).
#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn the_engine_continues_as_llama_cpp_does() {
    let path = smollm2_path().unwrap_or_else(|e| panic!("{e}"));
    let mut engine = llama::open_gguf(&path, &Default::default(), None).expect("opens");
    let info = engine.info();
    assert_eq!((info.arch.as_str(), info.vocab, info.max_ctx), ("llama", 49152, 8192));
    let mut compared = 0;
    for (i, case) in goldens().iter().enumerate() {
        let req = Request { id: i as u64 + 1, prompt: case.prompt.clone(), max_tokens: 16, ..Default::default() };
        let reply = engine.generate(&req, &mut NoObserver).expect("generates");
        let want: Vec<u32> = case.steps.iter().map(|s| s.0).collect();
        let sure = case.steps.iter().take_while(|s| s.1[0].1 - s.1[1].1 >= 0.5).count();
        assert_eq!(reply.tokens[..sure], want[..sure], "prompt {i}: the first {sure} tokens");
        compared += sure;
    }
    eprintln!("{compared} tokens compared before near ties");
    assert!(compared >= 60, "only {compared} tokens before near ties");
}

/// A row's values do not depend on how the prompt was split: one prefill, many segments and decode steps give
/// bitwise the same logits (the batch-invariance contract, on the real model).
#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn logits_are_the_same_however_the_prompt_is_fed() {
    let m = Arc::new(model());
    let prompt = &goldens()[1].prompt;
    let mut a: State = m.new_layers();
    let whole = m.forward(&mut a, &Segment::of_ids(prompt, 0, writer()));
    let mut b: State = m.new_layers();
    let mut last = Vec::new();
    for (i, id) in prompt.iter().enumerate() {
        last = m.forward(&mut b, &Segment::of_ids(std::slice::from_ref(id), i, writer()));
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&whole), bits(&last));
}
