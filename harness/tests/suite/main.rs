//! kvproof's integration tests, one module per area, in one test binary: the dependency tree is linked once for
//! all of them rather than once per file. `cargo test -p kvproof --test suite shard::` runs one module's tests.
//!
//! Two files stay test binaries of their own, each needing the process to itself:
//! - `tests/diff_memory.rs` measures the process's peak RSS (/proc/self), so no other test may allocate meanwhile;
//! - `tests/fuzz_bounded.rs` installs a counting `#[global_allocator]` (the workspace's only unsafe code), which
//!   would otherwise be the allocator of every test here, its refusal of huge requests included.

mod support;

mod agentic;
mod cli;
mod conformance;
mod failure_rate;
mod fuzz_corpus;
mod growth;
mod http;
mod index_html;
mod investigate;
mod junit;
mod mutants_gate;
mod out_dir;
mod panic_guard;
mod plots;
mod pr_gate;
mod provenance;
mod provenance_glm53;
mod scenario_inputs;
mod schema;
mod shard;
mod staleness;
mod stdio;
mod stdio_boundary;
mod stdio_driver;
mod stdio_misbehaving;
