//! Llama (modelled on llama.cpp serving a GGUF file, e.g. SmolLM2-135M-Instruct in Q4_1): GQA attention with
//! RoPE over a full k/v cache, SwiGLU FFN, weights kept in their GGUF blocks.
//!
//! Reuse is strict-prefix via the record: a prompt that extends every id the state was built from prefills only
//! its tail; anything else starts over. Growing capacity copies every layer linearly and keeps the record. A
//! prompt longer than `max_ctx` is refused up front.

mod forward;
mod model;
mod state;

use std::path::Path;
use std::sync::Arc;

pub use forward::PairRope;
pub use model::{Config, Layer, Model};
pub use state::State;

use crate::decode::Generable;
use crate::engine::Engine;
use crate::engine_loop::{on_worker, Arch, ArchInfo, BundledEngine, DeclaredReuse, Progress, Segment, Slot, Step};
use crate::error::Result;
use crate::fault::Fault;
use crate::gguf::Gguf;

pub const INFO: ArchInfo = ArchInfo {
    name: "llama",
    modelled_on: "llama.cpp serving a GGUF (scenario `\"gguf\": \"smollm2\"`; presets are random-init)",
    state: "full GQA k/v cache per layer (rows carry position and writer)",
    reuse_rule: "strict prefix via the record; capacity growth copies every layer and keeps the record",
    declares: DeclaredReuse::Strict,
    faults: &[Fault::CounterReuse, Fault::BulkRecord, Fault::MemcmpShort, Fault::ReuseEqual, Fault::DropGrowRecord],
};

impl Arch for Model {
    crate::model_parts!(State, (), INFO);

    fn new_layers(&self) -> State {
        State::new(&self.config)
    }

    /// Every id of the model's own vocabulary; its eos ends a reply.
    fn generable(&self) -> Generable {
        Generable { eos: self.eos, bytes_only: false }
    }

    /// The file's BPE tokenizer and chat template; a synthetic model's byte tokenizer.
    fn text(&self) -> Arc<dyn crate::text_tokenizer::TextTokenizer> {
        match &self.text {
            Some(t) => t.clone(),
            None => Arc::new(crate::tokenizer::Tokenizer),
        }
    }

    fn prefill(&self, slot: &mut Slot<State>, seg: &Segment, _: &mut Progress, _: Option<Fault>) -> Option<Vec<f32>> {
        Some(on_worker(|| self.forward(&mut slot.layers, seg)))
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, _: Option<Fault>) -> Vec<f32> {
        self.forward(&mut slot.layers, &s.segment())
    }
}

/// The model a GGUF file holds.
pub fn load(path: &Path) -> Result<Model> {
    Model::from_gguf(Arc::new(Gguf::open(path)?))
}

/// The options of a GGUF model's config an engine may set: how it serves, not what the file holds.
pub const GGUF_OPTIONS: &[&str] = &["slots", "initial_capacity", "prefill_chunk", "max_ctx"];

/// The model a GGUF file holds, served with `overrides` (only [`GGUF_OPTIONS`]; `max_ctx` at most the file's
/// context length). Errors name the key, as for a scenario's `engine.config`.
pub fn load_with(path: &Path, overrides: &serde_json::Map<String, serde_json::Value>) -> Result<Model> {
    let mut model = load(path)?;
    let file_ctx = model.config.max_ctx;
    let bad = |message: String| crate::error::EngineError::Config { path: path.into(), message };
    let config = crate::config::apply_overrides(model.config.clone(), overrides, Some((GGUF_OPTIONS, "the GGUF file")))
        .map_err(bad)?;
    if config.max_ctx > file_ctx {
        return Err(bad(format!(
            "engine.config.max_ctx: {} is past the file's context length {file_ctx}",
            config.max_ctx
        )));
    }
    model.config = config;
    Ok(model)
}

/// An engine serving the GGUF model at `path` with `overrides`, with `fault` on.
pub fn open_gguf(
    path: &Path,
    overrides: &serde_json::Map<String, serde_json::Value>,
    fault: Option<Fault>,
) -> Result<Box<dyn Engine>> {
    crate::bundled::check_fault(INFO.name, fault)?;
    Ok(Box::new(BundledEngine::new(Arc::new(load_with(path, overrides)?), fault)))
}

/// One line of `kvproof-engine --bench --gguf`: a prompt of `prompt` ids prefilled in `prefill_chunk` segments,
/// then `decode` single-id steps.
#[derive(Debug, Clone, Copy)]
pub struct BenchRow {
    pub prompt: usize,
    pub decode: usize,
    /// Prefill's fastest run and slowest of [`crate::bench::MODEL_RUNS`] (its work: the kernels' count).
    pub prefill: crate::bench::Phase,
    /// The decode steps' fastest run and slowest.
    pub decode_phase: crate::bench::Phase,
}

/// Prefill and decode speed of `model` for prompts of each of `lens` ids (deterministic ids spread over the
/// vocabulary), `decode` steps after each; each the fastest of [`crate::bench::MODEL_RUNS`] runs on a fresh state,
/// each phase with its limit measured around it (`gauge`).
pub fn bench(model: &Model, lens: &[usize], decode: usize, gauge: &crate::bench::Gauge) -> Vec<BenchRow> {
    let vocab = model.config.vocab as u64;
    let mut rows = Vec::new();
    for &len in lens {
        let ids: Vec<u32> = (0..len as u64).map(|i| ((i * 7919 + 13) % (vocab - 100) + 100) as u32).collect();
        let Ok((prefill, decode_phase)) = crate::bench::Phase::fastest_of(|_| {
            Ok::<_, std::convert::Infallible>(bench_once(model, &ids, decode, gauge))
        });
        rows.push(BenchRow { prompt: len, decode, prefill, decode_phase });
    }
    rows
}

/// One run of `bench` for one prompt: its prefill phase, then its `decode` steps'.
fn bench_once(
    model: &Model,
    ids: &[u32],
    decode: usize,
    gauge: &crate::bench::Gauge,
) -> (crate::bench::Phase, crate::bench::Phase) {
    use crate::bench::Phase;
    use crate::dump::{Writer, WriterKind};
    let writer = Writer { request: 1, kind: WriterKind::Prefill { chunk: 0, chunk_rows: 0 } };
    let c = &model.config;
    let len = ids.len();
    let mut st = State::new(&Config {
        base: crate::config::BaseConfig { initial_capacity: len + decode, ..c.base.clone() },
        ..c.clone()
    });
    let w0 = crate::kernels::work();
    let mut logits = Vec::new();
    let (prefill, peak) = gauge.peak_around(|| {
        let t0 = std::time::Instant::now();
        for (i, seg) in ids.chunks(c.prefill_chunk.max(1)).enumerate() {
            // as the engine loop runs a segment
            logits = on_worker(|| model.forward(&mut st, &Segment::of_ids(seg, i * c.prefill_chunk, writer)));
        }
        t0.elapsed().as_secs_f64()
    });
    let w1 = crate::kernels::work();
    let (dec, around) = gauge.read_around(|| {
        let t1 = std::time::Instant::now();
        for step in 0..decode {
            let id = crate::sampler::argmax(&logits);
            // as the engine loop runs a decode step
            logits = crate::decode_team::run(|| model.forward(&mut st, &Segment::of_ids(&[id], len + step, writer)));
        }
        t1.elapsed().as_secs_f64()
    });
    let w2 = crate::kernels::work();
    (
        Phase::once(w1.since(w0), prefill, len).with_limit(peak),
        Phase::once(w2.since(w1), dec, decode).with_limit(around),
    )
}
