//! `turns.csv`: one row per request any instance ran (setup turns included), with its timings: the raw material
//! of "what reuse buys" (prefilled positions and wall time, warm vs cold, as a conversation grows).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRow {
    pub scenario: String,
    pub plan: String,
    pub step: String,
    /// warm, cold or control.
    pub instance: String,
    pub prompt_tokens: usize,
    pub reused: Option<usize>,
    pub prefilled: Option<usize>,
    pub emitted: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub wall_ms: f64,
    /// "ok", or the error code the request ended with.
    pub outcome: String,
}
