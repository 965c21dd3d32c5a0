//! kvproof-engines' integration tests, one module per area, in one test binary: the dependency tree is linked once
//! for all of them rather than once per file. `cargo test -p kvproof-engines --test suite llama::` runs one
//! module's tests.
//!
//! `tests/work_count.rs` stays a test binary of its own: it asserts exact values of the kernels' work counter
//! (`kernels::work`), which is global to the process, so no other engine may run beside it.

mod common;

mod bpe_goldens;
mod chat_template_goldens;
mod conformance;
mod deepseek;
mod dump_python;
mod faults;
mod gguf;
mod glm;
mod glm53;
mod inkling;
mod kimi;
mod llama;
mod serve_fuzz;
mod serve_gguf;
mod serve_http;
mod serve_protocol;
mod serve_reuse;
