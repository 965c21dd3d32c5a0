//! The `EngineInfo` every engine reports, filled in from its config, fault and model hash.
//!
//! Shared so the fields that mean the same for every arch are read the same way. The base says: no audio, no
//! sliding window, no prefill grid; an arch that has one of them sets it on top (`EngineInfo { window: ..,
//! ..engine_info(..) }`), so what is particular to an arch stays visible in the arch.

use crate::config::ModelConfig;
use crate::engine::EngineInfo;
use crate::fault::Fault;

/// The info of an engine without audio, sliding window or prefill grid.
pub fn engine_info(c: &ModelConfig, fault: Option<Fault>, model_hash: &str) -> EngineInfo {
    EngineInfo {
        arch: c.arch.clone(),
        preset: c.preset.clone(),
        slots: c.slots,
        max_ctx: c.max_ctx,
        vocab: c.vocab,
        audio: false,
        audio_frame_bytes: 0,
        window: None,
        prompt_rows: None,
        initial_capacity: c.initial_capacity,
        fault: fault.map(|f| f.name().to_string()),
        model_hash: model_hash.to_string(),
    }
}
