//! Deterministic random-init models: the same arch, preset and seed give the same bytes on every machine.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::bundled::ModelConfig;
use crate::config::Preset;
use crate::error::{EngineError, Result};
use crate::rng::SplitMix64;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// How a tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Norm gains.
    Ones,
    /// Uniform in [-scale, scale).
    Uniform(f32),
}

/// One tensor an arch expects in its checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, shape: &[usize], init: Init) -> Self {
        TensorSpec { name: name.into(), shape: shape.to_vec(), init }
    }

    /// A weight matrix `[out, in]` scaled for unit-variance activations.
    pub fn linear(name: impl Into<String>, out: usize, input: usize) -> Self {
        Self::new(name, &[out, input], Init::Uniform((3.0 / input as f32).sqrt()))
    }
}

/// The tensors `config`'s arch expects.
pub fn specs(config: &ModelConfig) -> Result<Vec<TensorSpec>> {
    config.tensors()
}

fn fill(spec: &TensorSpec, seed: u64) -> Vec<u8> {
    let n: usize = spec.shape.iter().product();
    let mut rng = SplitMix64::for_name(seed, &spec.name);
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        let v = match spec.init {
            Init::Ones => 1.0,
            Init::Uniform(a) => rng.uniform(a),
        };
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The safetensors bytes of a random-init model.
pub fn generate_bytes(config: &ModelConfig, seed: u64) -> Result<Vec<u8>> {
    let specs = specs(config)?;
    let data: Vec<(String, Vec<u8>)> = specs.iter().map(|s| (s.name.clone(), fill(s, seed))).collect();
    let views = specs
        .iter()
        .zip(&data)
        .map(|(s, (name, bytes))| {
            TensorView::new(Dtype::F32, s.shape.clone(), bytes).map(|v| (name.clone(), v)).map_err(|e| {
                EngineError::Tensor { path: "<fixture>".into(), tensor: name.clone(), message: e.to_string() }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // A single metadata key keeps the header byte-stable (a map of several would serialise in hash order).
    let info = format!(
        "{{\"arch\":\"{}\",\"preset\":\"{}\",\"seed\":{seed},\"kvproof\":\"{}\"}}",
        config.arch(),
        config.base().preset.as_deref().unwrap_or("custom"),
        crate::VERSION
    );
    let meta = Some(HashMap::from([("kvproof".to_string(), info)]));
    safetensors::tensor::serialize(views, &meta)
        .map_err(|e| EngineError::Weights { path: "<fixture>".into(), message: e.to_string() })
}

/// A random-init model held in memory.
pub fn generate_weights(config: &ModelConfig, seed: u64) -> Result<Weights> {
    Weights::from_bytes(&format!("<fixture {} seed {seed}>", config.arch()), generate_bytes(config, seed)?)
}

/// Write config.json, model.safetensors and tokenizer.json for `arch` at `preset` into `dir`.
pub fn write_dir(arch: &str, preset: Preset, seed: u64, dir: &Path) -> Result<()> {
    let config = ModelConfig::preset(arch, preset)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EngineError::Io { path: path.clone(), source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, pretty(&config)).map_err(io(&cfg_path))?;
    let tok_path = dir.join("tokenizer.json");
    std::fs::write(&tok_path, pretty(&Tokenizer.file())).map_err(io(&tok_path))?;
    let model_path = dir.join("model.safetensors");
    std::fs::write(&model_path, generate_bytes(&config, seed)?).map_err(io(&model_path))?;
    Ok(())
}

/// Pretty JSON with a trailing newline (serialising these plain structs cannot fail).
fn pretty<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let c = ModelConfig::preset("inkling", Preset::Tiny).expect("tiny");
        let a = Sha256::digest(generate_bytes(&c, 0).expect("gen"));
        let b = Sha256::digest(generate_bytes(&c, 0).expect("gen"));
        let other = Sha256::digest(generate_bytes(&c, 1).expect("gen"));
        assert_eq!(a, b);
        assert_ne!(a, other);
    }

    #[test]
    fn written_fixture_loads_and_hashes_stably() {
        let base = std::env::temp_dir().join(format!("kvproof-fixture-{}", std::process::id()));
        let (d1, d2) = (base.join("a"), base.join("b"));
        write_dir("inkling", Preset::Tiny, 7, &d1).expect("write a");
        write_dir("inkling", Preset::Tiny, 7, &d2).expect("write b");
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            let x = std::fs::read(d1.join(f)).expect("read");
            let y = std::fs::read(d2.join(f)).expect("read");
            assert_eq!(Sha256::digest(&x), Sha256::digest(&y), "{f}");
        }
        let engine = crate::bundled::open_dir(&d1, None).expect("open");
        assert_eq!(engine.info().arch, "inkling");
        let _ = std::fs::remove_dir_all(&base);
    }
}
