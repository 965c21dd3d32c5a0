//! The registry of bundled engines: which arches exist, their presets and faults, and how to open one.

use std::path::Path;
use std::sync::Arc;

use crate::config::{ModelConfig, Preset};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::weights::Weights;

/// One bundled engine family.
#[derive(Debug, Clone, Copy)]
pub struct ArchInfo {
    pub name: &'static str,
    pub modelled_on: &'static str,
    pub state: &'static str,
    pub reuse_rule: &'static str,
    pub faults: &'static [Fault],
}

pub const ARCHES: &[ArchInfo] = &[crate::arch::inkling::INFO];

pub fn arch(name: &str) -> Result<&'static ArchInfo> {
    ARCHES.iter().find(|a| a.name == name).ok_or_else(|| {
        EngineError::UnknownArch(name.to_string(), ARCHES.iter().map(|a| a.name).collect::<Vec<_>>().join(", "))
    })
}

/// Check that `fault` applies to `arch`.
pub fn check_fault(arch_name: &str, fault: Option<Fault>) -> Result<()> {
    let info = arch(arch_name)?;
    match fault {
        Some(f) if !info.faults.contains(&f) => Err(EngineError::UnknownFault {
            name: f.name().to_string(),
            arch: arch_name.to_string(),
            known: info.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        }),
        _ => Ok(()),
    }
}

/// Open an engine over a model directory (config.json + model.safetensors).
pub fn open_dir(dir: &Path, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    let config = ModelConfig::load(&dir.join("config.json"))?;
    let weights = Weights::open(&dir.join("model.safetensors"))?;
    open(config, weights, fault)
}

/// Open an engine over a generated fixture held in memory (no files).
pub fn open_preset(arch_name: &str, preset: Preset, seed: u64, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    let config = ModelConfig::preset(arch_name, preset)?;
    let weights = crate::fixture::generate_weights(&config, seed)?;
    open(config, weights, fault)
}

/// Open an engine of `config.arch`.
pub fn open(config: ModelConfig, weights: Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    check_fault(&config.arch, fault)?;
    match config.arch.as_str() {
        "inkling" => Ok(Box::new(crate::arch::inkling::Inkling::new(
            Arc::new(crate::arch::inkling::Model::load(config, &weights)?),
            fault,
        ))),
        other => Err(EngineError::UnknownArch(other.to_string(), "inkling".into())),
    }
}
