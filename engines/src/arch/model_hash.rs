//! The short hash that names a model in `EngineInfo` and every dump: equal hashes mean equal config and weights.
//!
//! One definition for every arch, so two archs can never disagree on what "the same model" means, and a
//! pinned fixture hash stays pinned whichever arch computes it.

use sha2::{Digest, Sha256};

use crate::config::{ArchConfig, HashLayout};
use crate::weights::Weights;

/// The first 6 bytes (12 hex digits) of sha256 over the config's hash layout (JSON) and the weight file's bytes.
pub fn model_hash<C: ArchConfig>(config: &C, weights: &Weights) -> String {
    let mut hasher = Sha256::new();
    hasher.update(HashLayout::of(config).and_then(|layout| serde_json::to_vec(&layout)).unwrap_or_default());
    hasher.update(weights.raw());
    hasher.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect()
}
