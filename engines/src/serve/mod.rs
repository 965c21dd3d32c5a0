//! The stdio serve protocol (docs/protocol.md), so the harness drives any engine process the same way:
//! `frame` is the wire syntax, `request` maps SUBMIT to an engine `Request`, `server` serves any `Engine`,
//! `client` drives any process that speaks the protocol (`process_tree` kills it with what it started), `fuzz` feeds arbitrary bytes to both readers, `text` is the engine's tokenizer and template as both
//! servers use it. `http` serves an engine over an OpenAI-compatible HTTP API
//! instead (docs/http.md).

pub mod client;
pub mod frame;
pub mod fuzz;
pub mod http;
pub mod process_tree;
pub mod request;
pub mod server;
pub mod text;

pub use client::{ClientError, ClientReply, StdioEngine, SubmitExtras};
pub use frame::{
    Caps, Command, DataFrame, DoneFrame, DumpedFrame, EngineFrame, ErrorCode, ErrorFrame, PromptFrame, SubmitFrame,
};
pub use http::{serve_http, HttpOptions};
pub use server::{serve, ServeError, ServeOptions, PREFIX_LOG_ENV};
