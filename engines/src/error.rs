//! Errors of the engine library: every variant names what was at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid config: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: tensor `{tensor}`: {message}")]
    Tensor { path: PathBuf, tensor: String, message: String },
    #[error("{path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("unknown arch `{0}` (known: {1})")]
    UnknownArch(String, String),
    #[error("unknown preset `{0}` (known: tiny, small, bench)")]
    UnknownPreset(String),
    #[error("unknown fault `{name}` for arch {arch} (known: {known})")]
    UnknownFault { name: String, arch: String, known: String },
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("slot {slot} out of range (engine has {slots})")]
    NoSuchSlot { slot: usize, slots: usize },
    #[error("context exceeded: {used} > {limit}")]
    ContextExceeded { used: usize, limit: usize },
    #[error("cancelled")]
    Cancelled,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
