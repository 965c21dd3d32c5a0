//! The short hash that names a model in `EngineInfo` and every dump: equal hashes mean equal config and weights.
//!
//! One definition for every arch, so two archs can never disagree on what "the same model" means, and a
//! pinned fixture hash stays pinned whichever arch computes it.

use sha2::{Digest, Sha256};

use crate::config::{ArchConfig, HashLayout};
use crate::weights::Weights;

/// The first 6 bytes (12 hex digits) of sha256 over the config's hash layout (JSON) and the weight file's bytes.
pub fn model_hash<C: ArchConfig>(config: &C, weights: &Weights) -> String {
    hash_of(config, |hasher| hasher.update(weights.raw()))
}

/// The first 6 bytes (12 hex digits) of sha256 over the config's hash layout (JSON), then whatever `weights` feeds
/// the hasher: a weight file's bytes, or what stands for a file too large to read whole (a GGUF's header and
/// samples of its data).
pub(crate) fn hash_of<C: ArchConfig>(config: &C, weights: impl FnOnce(&mut Sha256)) -> String {
    let mut hasher = Sha256::new();
    hasher.update(HashLayout::of(config).and_then(|layout| serde_json::to_vec(&layout)).unwrap_or_default());
    weights(&mut hasher);
    hasher.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use crate::config::Preset;

    /// Every arch's tiny model (seed 0) keeps its hash: a change to the hash layout, to how a config serialises
    /// or to the fixture's bytes shows here, before a hash pinned in a report stops naming its model.
    #[test]
    fn the_tiny_models_keep_their_hashes() {
        let pinned = [
            ("inkling", "605448de6d74"),
            ("deepseek", "c385154e7ee3"),
            ("kimi", "0a156f95c797"),
            ("glm53", "b01db178ac56"),
            ("glm", "276952c0677f"),
            ("llama", "c171f654f8b8"),
        ];
        assert_eq!(crate::bundled::arches().count(), pinned.len(), "an arch without a pinned hash");
        for (arch, hash) in pinned {
            let e = crate::bundled::open_preset(arch, Preset::Tiny, 0, None).expect(arch);
            assert_eq!(e.info().model_hash, hash, "{arch}");
        }
    }
}
