//! kvproof-engines: the engines kvproof bundles, their shared core, and the stdio serve protocol.
//!
//! Layout: the shared core (`config`, `weights`, `tensors`, `gguf`, `fixture`, `tokenizer`, `chat`, `kernels`, `sampler`,
//! `prefix`, `cache`, `moe`, `dump`, `state_diff`, `engine`, `fault`), the one request loop every bundled engine
//! runs (`engine_loop`: `BundledEngine<A: Arch>`), one folder per arch under `arch/` (its config, weights, forward
//! pass, slot state, reuse rule and fault hooks), the serve protocol under `serve/`, and `bundled` to open any of
//! them by name.

pub mod arch;
pub mod bench;
pub mod bpe;
pub mod bundled;
pub mod cache;
pub mod chat;
pub mod chat_template;
pub mod config;
pub mod cpu_steal;
pub mod decode;
pub mod decode_team;
pub mod dump;
pub mod dump_file;
pub mod engine;
pub mod engine_loop;
pub mod error;
pub mod fault;
mod file_bytes;
pub mod fixture;
pub mod gguf;
pub mod huge_pages;
pub mod kernels;
pub mod line_aligned;
pub mod model_cost;
pub mod moe;
pub mod prefix;
pub mod rng;
pub mod safetensors_layout;
pub mod sampler;
pub mod scratch_dir;
pub mod serve;
pub mod state_diff;
pub mod tensors;
pub mod text_tokenizer;
pub mod tokenizer;
pub mod weights;

pub use engine::{Engine, EngineInfo, Flow, NoObserver, Observer, Reply, Request, Sampling, StopReason, TokenEvent};
pub use error::EngineError;
pub use fault::Fault;

/// The library's own tests allocate as the binaries do (`line_aligned`: large blocks line-aligned). A library
/// cannot choose the allocator of the programs that link it; `kvproof-engine` and `kvproof` install it themselves.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: line_aligned::LineAligned = line_aligned::LineAligned;

/// The kvproof version every artifact carries.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
