//! Drivers: one trait over every way of reaching an engine. A driver declares what it can report
//! (`Caps`); a check that needs a missing capability is skipped with the reason, never passed.
//!
//! `inprocess` runs a bundled engine in this process (fastest); `stdio` spawns any command speaking the serve
//! protocol (docs/protocol.md), one process per instance (or one long-lived process reset before each cold run),
//! and serves a bundled engine through a sibling `kvproof-engine` when the scenario asks for `via: stdio`; `http`
//! drives a server with an OpenAI-compatible API (docs/http.md), whose instances share that server.

mod http;
mod inprocess;
mod stdio;

use std::time::Duration;

use kvproof_engines::chat::TextMessage;
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{EngineInfo, Request, StopReason};
use kvproof_engines::fault::Fault;

pub use http::HttpLauncher;
pub use inprocess::InProcessLauncher;
pub use stdio::{bundled_command, from_caps, resolve_program, sibling_binary, StdioLauncher};

use crate::scenario::{DeclaredRule, EngineSpec, Via};

/// What a driver can report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caps {
    /// Replies carry token ids (not only text).
    pub token_ids: bool,
    /// Replies report how many prompt positions were reused.
    pub reuse_count: bool,
    /// Replies report the top-2 logit gap of each token.
    pub gaps: bool,
    /// The slot's state can be dumped row by row.
    pub dumps: bool,
    /// Bytes of one audio frame, when the engine takes audio.
    pub audio_frame_bytes: Option<usize>,
    /// A request can be cancelled at a given prefill poll (`Driver::generate_cancel_at`): a deterministic
    /// mid-prefill failure. Over stdio a CANCEL frame races the engine, so only an engine that declares
    /// `cancel_at=1` (it cancels itself at the poll) can.
    #[serde(default)]
    pub cancel_at_poll: bool,
    /// The engine's state bytes are visible (`Driver::state_bytes`), for the memory check.
    #[serde(default)]
    pub state_bytes: bool,
    /// The engine copies prefixes into empty slots from other slots (glm's `kv_share`); the oracle models it.
    #[serde(default)]
    pub kv_share: bool,
    /// The reuse rule the engine declares (CAPS `reuse_rule=`), or the scenario declares for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_rule: Option<DeclaredRule>,
    /// The engine takes conversations as text and renders them with its own template (`Driver::generate_chat`).
    #[serde(default)]
    pub chat: bool,
    /// Error codes after which the engine declares the slot's state unchanged (CAPS `keeps_state_on=`); the
    /// oracle assumes every other failure mid-way spoils the slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keeps_state_on: Vec<String>,
}

/// A request whose prompt is a conversation in text: the engine applies its own chat template and tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRequest {
    pub id: u64,
    pub slot: usize,
    pub messages: Vec<TextMessage>,
    pub max_tokens: usize,
    /// Generate past eos: a reply of exactly `max_tokens` tokens.
    pub ignore_eos: bool,
}

/// One finished request as the harness sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// Top-2 gap per token, when the driver reports it.
    pub gaps: Option<Vec<f32>>,
    /// Reused positions, when the driver reports it.
    pub reused: Option<usize>,
    pub prompt_tokens: usize,
    pub prefill: Duration,
    pub decode: Duration,
    /// Wall time as the harness measured it (includes transport).
    pub wall: Duration,
    pub stop: StopReason,
    /// The ids the engine fed for the prompt, when it reports them (a chat request: what its template and
    /// tokenizer made of the text).
    pub prompt_ids: Option<Vec<u32>>,
    /// Each emitted token's text, when the driver reports it (failure messages show it in the engine's own
    /// vocabulary).
    pub pieces: Option<Vec<Vec<u8>>>,
}

#[cfg(test)]
impl Generation {
    /// A reply of `tokens` to a `prompt_tokens`-id prompt that stopped at its length, with no timings, gaps, reuse
    /// count, prompt ids or pieces: the checks' tests set only the fields they look at.
    pub(crate) fn for_test(tokens: Vec<u32>, prompt_tokens: usize) -> Self {
        Generation {
            tokens,
            gaps: None,
            reused: None,
            prompt_tokens,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            wall: Duration::ZERO,
            stop: StopReason::Length,
            prompt_ids: None,
            pieces: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DriverError {
    /// The engine answered the request with an error; the instance is still usable.
    #[error("engine refused the request: {code}{}", if .detail.is_empty() { String::new() } else { format!(" ({})", .detail) })]
    Refused { code: String, detail: String },
    /// The instance is gone (process exited, stream broken, or the engine panicked).
    #[error("engine died: {detail}")]
    Died { detail: String, stderr_tail: String },
    /// No answer within the per-request timeout; the instance was killed.
    #[error("engine timed out after {after_ms} ms")]
    Timeout { after_ms: u64, stderr_tail: String },
    /// The driver cannot do this (e.g. the engine has no dump extension).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The instance could not be started.
    #[error("cannot start engine {engine}: {detail}")]
    Start { engine: String, detail: String },
}

/// The code of a DUMP whose file the harness cannot read as a state dump: the trial is an error, not a skipped check.
pub const DUMP_UNREADABLE: &str = "DUMP_UNREADABLE";

impl DriverError {
    /// Whether the instance must be replaced before it is used again.
    pub fn is_fatal(&self) -> bool {
        matches!(self, DriverError::Died { .. } | DriverError::Timeout { .. })
    }

    /// The last lines of the engine's stderr, when the driver captured them.
    pub fn stderr_tail(&self) -> Option<&str> {
        match self {
            DriverError::Died { stderr_tail, .. } | DriverError::Timeout { stderr_tail, .. } => {
                Some(stderr_tail.as_str()).filter(|s| !s.is_empty())
            }
            _ => None,
        }
    }

    /// The error code comparisons use: two instances that fail the same way agree.
    pub fn code(&self) -> String {
        match self {
            DriverError::Refused { code, .. } => code.clone(),
            DriverError::Died { .. } => "DIED".into(),
            DriverError::Timeout { .. } => "TIMEOUT".into(),
            DriverError::Unsupported(_) => "UNSUPPORTED".into(),
            DriverError::Start { .. } => "START".into(),
        }
    }
}

/// The engine as a launcher and its instances describe it. Every launcher and driver holds one, so the traits'
/// `info`, `caps` and `label` read it in one place.
#[derive(Debug, Clone)]
pub struct Profile {
    pub label: String,
    pub info: EngineInfo,
    pub caps: Caps,
}

/// One engine instance: a slot state the harness drives request by request.
pub trait Driver: Send {
    fn profile(&self) -> &Profile;
    fn info(&self) -> &EngineInfo {
        &self.profile().info
    }
    fn caps(&self) -> &Caps {
        &self.profile().caps
    }
    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError>;
    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError>;
    /// Run `req`, cancelling it at the engine's `poll`-th progress poll (0-based; engines poll between prefill
    /// segments, deepseek also between the layers of a segment). Only drivers with `Caps::cancel_at_poll`.
    fn generate_cancel_at(&mut self, req: &Request, poll: usize) -> Result<Generation, DriverError> {
        let _ = (req, poll);
        Err(DriverError::Unsupported("this driver cannot cancel a request at a given prefill poll".into()))
    }
    /// Run a conversation given as text (drivers with `Caps::chat`).
    fn generate_chat(&mut self, req: &ChatRequest) -> Result<Generation, DriverError> {
        let _ = req;
        Err(DriverError::Unsupported("this driver takes no conversations as text".into()))
    }
    /// Bytes the engine's state holds (every slot), when the driver can see them (`Caps::state_bytes`).
    fn state_bytes(&mut self) -> Option<usize> {
        None
    }
}

/// Starts instances of one engine: the warm one, and a fresh one for every cold run.
pub trait Launcher: Send + Sync {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError>;
    /// An instance with a fresh state for a cold run (cold, control, probe): a new instance unless the engine
    /// gets its fresh state another way (a reset process, a second server, a per-request cache bypass).
    fn launch_cold(&self) -> Result<Box<dyn Driver>, DriverError> {
        self.launch()
    }
    /// The engine as the manifest records it.
    fn profile(&self) -> &Profile;
    fn info(&self) -> &EngineInfo {
        &self.profile().info
    }
    fn caps(&self) -> &Caps {
        &self.profile().caps
    }
    fn label(&self) -> String {
        self.profile().label.clone()
    }
    /// Whether plans may run at the same time. Instances that share one server must not: their plans run one at
    /// a time, in order.
    fn parallel_plans(&self) -> bool {
        true
    }
}

/// The launcher for a scenario's engine; `fault` overrides the scenario's for bundled engines.
pub fn launcher_for(spec: &EngineSpec, fault: Option<Option<Fault>>) -> Result<Box<dyn Launcher>, DriverError> {
    match spec {
        EngineSpec::Bundled { arch, preset, seed, fault: own, config, via, cold, gguf } => {
            let fault = fault.unwrap_or(*own);
            let label = EngineSpec::Bundled {
                arch: arch.clone(),
                preset: *preset,
                seed: *seed,
                fault,
                config: config.clone(),
                via: *via,
                cold: *cold,
                gguf: gguf.clone(),
            }
            .label();
            // a model that is not there is an input error that says how to get it
            let model = gguf
                .as_deref()
                .map(|m| {
                    kvproof_engines::gguf::resolve(m)
                        .map_err(|detail| DriverError::Start { engine: label.clone(), detail })
                })
                .transpose()?;
            match (via, model) {
                (Via::InProcess, None) => {
                    Ok(Box::new(InProcessLauncher::open_with(arch, *preset, *seed, fault, config)?))
                }
                (Via::InProcess, Some(path)) => {
                    Ok(Box::new(InProcessLauncher::open_gguf(&path, fault, config, &label)?))
                }
                (Via::Stdio, model) => {
                    let command = match model {
                        Some(path) => stdio::gguf_command(&path, fault, config),
                        None => bundled_command(arch, *preset, *seed, fault, config),
                    };
                    Ok(Box::new(StdioLauncher::start(&command, stdio::BUNDLED_TIMEOUT_MS, *cold)?.with_label(label)))
                }
            }
        }
        EngineSpec::Command { command, timeout_ms, reuse_rule, cold } => {
            Ok(Box::new(StdioLauncher::start(command, *timeout_ms, *cold)?.with_reuse_rule(*reuse_rule)))
        }
        EngineSpec::Http(spec) => Ok(Box::new(HttpLauncher::start(spec)?)),
    }
}
