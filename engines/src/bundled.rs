//! The registry of bundled engines: which arches exist, their presets and faults, and how to open one.

use std::path::Path;

use crate::config::{ModelConfig, Preset};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::fixture::TensorSpec;
use crate::weights::Weights;

pub use crate::engine_loop::ArchInfo;

/// Opens an engine of one arch over loaded weights.
pub type OpenFn = fn(ModelConfig, &Weights, Option<Fault>) -> Result<Box<dyn Engine>>;

/// What every arch module provides (`arch/<name>/mod.rs`): its description, the tensors its checkpoint holds,
/// how its presets differ from the shared base, and how to open it.
pub struct Entry {
    pub info: ArchInfo,
    pub tensor_specs: fn(&ModelConfig) -> Vec<TensorSpec>,
    /// Adjust the shared base preset for this arch (window, latent widths, ...).
    pub preset: fn(&mut ModelConfig, Preset),
    pub open: OpenFn,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("info", &self.info).finish()
    }
}

/// Every bundled engine, in the order `kvproof list` shows them.
pub const ENTRIES: &[Entry] = &[
    crate::arch::inkling::ENTRY,
    crate::arch::deepseek::ENTRY,
    crate::arch::kimi::ENTRY,
    crate::arch::glm53::ENTRY,
    crate::arch::glm::ENTRY,
];

/// The descriptions of every bundled engine.
pub fn arches() -> impl Iterator<Item = &'static ArchInfo> {
    ENTRIES.iter().map(|e| &e.info)
}

fn known() -> String {
    arches().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

pub fn entry(name: &str) -> Result<&'static Entry> {
    ENTRIES.iter().find(|e| e.info.name == name).ok_or_else(|| EngineError::UnknownArch(name.to_string(), known()))
}

pub fn arch(name: &str) -> Result<&'static ArchInfo> {
    entry(name).map(|e| &e.info)
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
    (entry(&config.arch)?.open)(config, &weights, fault)
}
