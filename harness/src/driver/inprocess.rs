//! The in-process driver: a bundled engine behind `Box<dyn Engine>`. A cold instance is `engine.fresh()`: a new
//! state over the same `Arc` weights, so starting one costs an allocation, not a model load.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvproof_engines::config::Preset;
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Request};
use kvproof_engines::error::EngineError;
use kvproof_engines::fault::Fault;

use kvproof_engines::text_tokenizer::TextTokenizer;

use super::{Caps, ChatRequest, Driver, DriverError, Generation, Launcher, Profile};
use crate::scenario::engine_config::{self, ConfigOverrides};

/// Opens fresh instances of one bundled engine.
pub struct InProcessLauncher {
    /// `Engine` is `Send` but not `Sync`: cloning a fresh state goes through the lock.
    base: Mutex<Box<dyn Engine>>,
    profile: Profile,
}

impl std::fmt::Debug for InProcessLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessLauncher").field("label", &self.profile.label).finish()
    }
}

impl InProcessLauncher {
    pub fn open(arch: &str, preset: Preset, seed: u64, fault: Option<Fault>) -> Result<Self, DriverError> {
        Self::open_with(arch, preset, seed, fault, &ConfigOverrides::new())
    }

    /// Open `arch` at `preset` with `config` overrides applied to its model config before the fixture weights
    /// are generated (so the weights are the preset's whenever the overrides leave the shapes alone).
    pub fn open_with(
        arch: &str,
        preset: Preset,
        seed: u64,
        fault: Option<Fault>,
        config: &ConfigOverrides,
    ) -> Result<Self, DriverError> {
        let mut label = format!("{arch}/{preset}/seed {seed}");
        if !config.is_empty() {
            label.push_str(&format!("/config {}", engine_config::describe(config)));
        }
        if let Some(f) = fault {
            label.push_str(&format!("/fault {f}"));
        }
        label.push_str(" (in-process)");
        let start = |detail: String| DriverError::Start { engine: label.clone(), detail };
        let model = engine_config::model_config(arch, preset, config).map_err(start)?;
        let kv_share = model.kv_share();
        let weights = kvproof_engines::fixture::generate_weights(&model, seed).map_err(|e| start(e.to_string()))?;
        let engine = kvproof_engines::bundled::open(model, weights, fault).map_err(|e| start(e.to_string()))?;
        Ok(Self::from_engine(engine, label.clone()).sharing(kv_share))
    }

    /// Open the GGUF model at `path` (arch llama) with `config` (how it is served) and `fault`; `label` names it
    /// as the scenario does (`llama/gguf smollm2/...`).
    pub fn open_gguf(
        path: &std::path::Path,
        fault: Option<Fault>,
        config: &ConfigOverrides,
        label: &str,
    ) -> Result<Self, DriverError> {
        let label = format!("{label} (in-process)");
        let engine = kvproof_engines::arch::llama::open_gguf(path, config, fault)
            .map_err(|e| DriverError::Start { engine: label.clone(), detail: e.to_string() })?;
        Ok(Self::from_engine(engine, label))
    }

    /// Declare whether the engine shares prefixes across slots (the oracle cannot read it from `EngineInfo`).
    pub fn sharing(mut self, kv_share: bool) -> Self {
        self.profile.caps.kv_share = kv_share;
        self
    }

    /// Wrap an already opened engine (tests use this to drive hand-built engines).
    pub fn from_engine(engine: Box<dyn Engine>, label: String) -> Self {
        let info = engine.info();
        let caps = Caps::in_process((info.audio && info.audio_frame_bytes > 0).then_some(info.audio_frame_bytes));
        InProcessLauncher { base: Mutex::new(engine), profile: Profile { label, info, caps } }
    }
}

impl Caps {
    /// What an engine run in this process reports: everything but prefix sharing across slots (declared with
    /// `sharing`). Tests use it as the capabilities of a driver that can report all.
    pub(crate) fn in_process(audio_frame_bytes: Option<usize>) -> Caps {
        Caps {
            token_ids: true,
            reuse_count: true,
            gaps: true,
            dumps: true,
            audio_frame_bytes,
            cancel_at_poll: true,
            state_bytes: true,
            kv_share: false,
            reuse_rule: None,
            chat: true,
            keeps_state_on: Vec::new(),
        }
    }
}

impl Launcher for InProcessLauncher {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        let engine = self.base.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).fresh();
        let text = engine.text();
        Ok(Box::new(InProcess { engine, text, profile: self.profile.clone() }))
    }
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

/// One in-process instance.
pub struct InProcess {
    engine: Box<dyn Engine>,
    /// The engine's tokenizer and chat template, for conversations sent as text.
    text: Arc<dyn TextTokenizer>,
    profile: Profile,
}

/// The protocol's error code for an engine error, so in-process and stdio failures compare alike.
pub fn error_code(e: &EngineError) -> &'static str {
    match e {
        EngineError::ContextExceeded { .. } => "CONTEXT_EXCEEDED",
        EngineError::Cancelled => "CANCELLED",
        EngineError::EmptyPrompt => "EMPTY_PROMPT",
        EngineError::BadRequest(_) | EngineError::NoSuchSlot { .. } => "BAD_REQUEST",
        _ => "INTERNAL",
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

impl Driver for InProcess {
    fn profile(&self) -> &Profile {
        &self.profile
    }

    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        self.generate_observed(req, &mut NoObserver)
    }

    fn generate_cancel_at(&mut self, req: &Request, poll: usize) -> Result<Generation, DriverError> {
        self.generate_observed(req, &mut CancelAt { poll, seen: 0 })
    }

    fn generate_chat(&mut self, req: &ChatRequest) -> Result<Generation, DriverError> {
        let bad = |detail: String| DriverError::Refused { code: "BAD_REQUEST".into(), detail };
        let prompt = self.text.render_chat(&req.messages).map_err(bad)?;
        let r = Request {
            id: req.id,
            slot: req.slot,
            prompt: prompt.clone(),
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            ..Request::default()
        };
        let mut g = self.generate(&r)?;
        g.prompt_ids = Some(prompt);
        Ok(g)
    }

    fn state_bytes(&mut self) -> Option<usize> {
        Some(self.engine.state_bytes())
    }

    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError> {
        match catch_unwind(AssertUnwindSafe(|| self.engine.dump(slot))) {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(DriverError::Refused { code: error_code(&e).into(), detail: e.to_string() }),
            Err(p) => Err(DriverError::Died {
                detail: format!("engine panicked in dump: {}", panic_message(p.as_ref())),
                stderr_tail: String::new(),
            }),
        }
    }
}

/// Cancels at the `poll`-th progress poll (0-based): a mid-prefill failure at a fixed point.
struct CancelAt {
    poll: usize,
    seen: usize,
}

impl Observer for CancelAt {
    fn on_progress(&mut self) -> Flow {
        let n = self.seen;
        self.seen += 1;
        if n == self.poll {
            Flow::Cancel
        } else {
            Flow::Continue
        }
    }
}

impl InProcess {
    fn generate_observed(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Generation, DriverError> {
        let t0 = Instant::now();
        // A panicking engine is this driver's "process died": the runner replaces the instance and goes on.
        let result = catch_unwind(AssertUnwindSafe(|| self.engine.generate(req, observer)));
        let wall = t0.elapsed();
        match result {
            Ok(Ok(reply)) => Ok(Generation {
                tokens: reply.tokens.clone(),
                gaps: Some(reply.gaps),
                reused: Some(reply.reused),
                prompt_tokens: reply.prompt_tokens,
                prefill: reply.timings.prefill,
                decode: reply.timings.decode,
                wall,
                stop: reply.stop,
                prompt_ids: None,
                pieces: Some(reply.tokens.iter().map(|&t| self.text.token_bytes(t)).collect()),
            }),
            Ok(Err(e)) => Err(DriverError::Refused { code: error_code(&e).into(), detail: e.to_string() }),
            Err(p) => Err(DriverError::Died {
                detail: format!("engine panicked: {}", panic_message(p.as_ref())),
                stderr_tail: String::new(),
            }),
        }
    }
}
