//! The engine API every bundled engine implements and every driver speaks to.
//!
//! The model is shared (`Arc`), the state is explicit: a cold instance is a fresh state over the same weights.

use std::time::Duration;

use crate::dump::StateDump;
use crate::error::EngineError;
use crate::fault::Fault;

/// Sampling parameters. `temperature == 0` is greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 means no top-k limit.
    pub top_k: usize,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 }
    }
}

/// One generation request on one slot.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Request id; becomes the writer of every row this request writes.
    pub id: u64,
    pub slot: usize,
    /// Prompt token ids (already rendered through the chat template).
    pub prompt: Vec<u32>,
    /// Extension payloads: one per audio-frame id in the prompt, in order.
    pub audio: Vec<Vec<u8>>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// How many top logits to report per token (0 = none).
    pub logprobs: usize,
    /// Never stop at eos (benchmarks and growth curves want replies of a fixed length).
    pub ignore_eos: bool,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    Length,
    Stopped,
}

/// One emitted token as it is produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: u32,
    /// Top-1 minus top-2 logit at the step that produced this token.
    pub gap: f32,
    /// The top-K (id, logit) pairs when `logprobs > 0` was asked.
    pub top: Vec<(u32, f32)>,
}

/// What a streaming consumer tells the engine after each token or prefill segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// End generation normally (the reply so far is returned, stop reason `Stopped`).
    Stop,
    /// Abort: the request fails with `EngineError::Cancelled` and the slot's record is tainted.
    Cancel,
}

/// Receives tokens as they are emitted and is polled between prefill segments.
pub trait Observer {
    fn on_token(&mut self, _event: &TokenEvent) -> Flow {
        Flow::Continue
    }
    /// Polled after each prefill segment (and, on an arch whose segments can be abandoned part way, between the
    /// layers of a segment). One policy for every bundled engine:
    /// - `Cancel` aborts: the request fails with `EngineError::Cancelled` and the slot's record is tainted;
    /// - `Stop` lets the segment under way finish, then ends prefill. If prompt positions are left unfed the reply
    ///   is empty (stop reason `Stopped`: there are no prompt logits to sample from) and the segments fed stay
    ///   in the state and the record, so a later prompt extending them reuses them; if the whole prompt was fed,
    ///   decode runs as usual.
    ///
    /// The serve protocol never stops here (a STOP frame takes effect at the next token, so a stopped reply over
    /// stdio is never empty); in-process drivers may.
    fn on_progress(&mut self) -> Flow {
        Flow::Continue
    }
}

/// An observer that never interrupts.
pub struct NoObserver;
impl Observer for NoObserver {}

/// Wall time of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    pub prefill: Duration,
    pub decode: Duration,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub tokens: Vec<u32>,
    /// Top-2 logit gap of each emitted token.
    pub gaps: Vec<f32>,
    /// Positions taken from the slot's existing state instead of being prefilled.
    pub reused: usize,
    pub prompt_tokens: usize,
    pub timings: Timings,
    pub stop: StopReason,
    /// The `[PREFIX]` line describing this request's reuse decision (printed with `KVPROOF_PREFIX_LOG=1`).
    pub prefix_log: String,
}

impl Reply {
    /// Tokens this request actually prefilled.
    pub fn prefilled(&self) -> usize {
        self.prompt_tokens - self.reused
    }
}

/// Static description of an engine instance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineInfo {
    pub arch: String,
    pub preset: Option<String>,
    pub slots: usize,
    pub max_ctx: usize,
    pub vocab: usize,
    /// Whether the engine accepts audio frames (extension payloads).
    pub audio: bool,
    /// Bytes of one audio frame's payload (0 when `audio` is false).
    pub audio_frame_bytes: usize,
    /// Sliding window, if the engine has ring layers.
    pub window: Option<usize>,
    /// Fixed prefill chunk grid, if the engine quantizes reuse to it.
    pub prompt_rows: Option<usize>,
    /// Capacity allocated for a fresh slot; growing past it exercises `grow`.
    pub initial_capacity: usize,
    pub fault: Option<String>,
    /// Short hash of config + weights; equal hashes mean equal models.
    pub model_hash: String,
    /// What feeding one position costs the model, when the engine knows (every bundled engine does): growth
    /// curves show the time a turn is expected to take beside the measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::model_cost::ModelCost>,
}

impl EngineInfo {
    /// What a bundled tiny inkling reports (one slot, audio, an 8-row window), less its model hash and cost: the
    /// engine the serve fuzz entries build requests for and the harness's case tests plan against, without
    /// building one.
    #[doc(hidden)]
    pub fn tiny_inkling() -> Self {
        EngineInfo {
            arch: "inkling".into(),
            preset: Some("tiny".into()),
            slots: 1,
            max_ctx: 1024,
            vocab: crate::tokenizer::VOCAB,
            audio: true,
            audio_frame_bytes: 8,
            window: Some(8),
            prompt_rows: None,
            initial_capacity: 64,
            fault: None,
            model_hash: String::new(),
            cost: None,
        }
    }
}

#[cfg(test)]
impl EngineInfo {
    /// A small two-slot engine of the full vocabulary, for the serve layer's parsing tests (one home, so the API and
    /// frame tests check requests against the same limits).
    pub(crate) fn test_fixture(audio: bool) -> Self {
        EngineInfo {
            arch: "test".into(),
            preset: None,
            slots: 2,
            max_ctx: 64,
            vocab: crate::tokenizer::VOCAB,
            audio,
            audio_frame_bytes: 0,
            window: None,
            prompt_rows: None,
            initial_capacity: 16,
            fault: None,
            model_hash: "0".into(),
            cost: None,
        }
    }
}

/// An engine: shared weights plus the mutable state of its slots.
pub trait Engine: Send {
    fn info(&self) -> EngineInfo;

    /// Run one request, streaming tokens to `observer`.
    fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply, EngineError>;

    /// The slot's current state, row by row with writers.
    fn dump(&self, slot: usize) -> Result<StateDump, EngineError>;

    /// Forget every slot's state and record.
    fn reset(&mut self);

    /// A cold instance: fresh state over the same weights and fault.
    fn fresh(&self) -> Box<dyn Engine>;

    /// Bytes the engine's state currently holds (all slots).
    fn state_bytes(&self) -> usize;

    fn fault(&self) -> Option<Fault>;

    /// The engine's text side: how text and chat messages become ids and ids become text (the bundled byte
    /// tokenizer and its template unless the model brings its own).
    fn text(&self) -> std::sync::Arc<dyn crate::text_tokenizer::TextTokenizer> {
        std::sync::Arc::new(crate::tokenizer::Tokenizer)
    }
}
