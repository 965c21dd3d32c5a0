//! The stdio serve protocol (docs/protocol.md), so the harness drives any engine process the same way:
//! `frame` is the wire syntax, `request` maps SUBMIT to an engine `Request`, `server` serves any `Engine`,
//! `client` drives any process that speaks the protocol.

pub mod client;
pub mod frame;
pub mod request;
pub mod server;

pub use client::{ClientError, ClientReply, StdioEngine, SubmitExtras};
pub use frame::{
    Caps, Command, DataFrame, DoneFrame, DumpedFrame, EngineFrame, ErrorCode, ErrorFrame, PromptFrame, SubmitFrame,
};
pub use server::{serve, ServeError, ServeOptions, PREFIX_LOG_ENV};
