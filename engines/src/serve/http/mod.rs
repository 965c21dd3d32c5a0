//! An OpenAI-compatible HTTP server over one engine (`kvproof-engine --http PORT`; docs/http.md): requests are
//! served one at a time, in the order their connections arrive.
//!
//! - `GET /v1/models`: the one model served, with the engine's description under `kvproof`;
//! - `POST /v1/completions` (`prompt`: text, or an array of token ids) and `POST /v1/chat/completions`
//!   (`messages`, rendered with the engine's own template), streamed as server-sent events when asked;
//! - reuse reported both ways real servers do: `usage.prompt_tokens_details.cached_tokens` (vLLM, SGLang) and
//!   `timings.cache_n` / `timings.prompt_n` (llama.cpp);
//! - llama.cpp's `id_slot`, `cache_prompt: false` (a fresh state: nothing reused, the slot untouched),
//!   `return_tokens` and `POST /slots/{id}?action=erase`; vLLM's `return_token_ids`,
//!   `return_tokens_as_token_ids`, `cache_salt` and `POST /reset_prefix_cache`;
//! - every refusal a JSON error object with its HTTP status; a panicking engine is reset and answers 500.
//!
//! `wire` frames requests and responses, `api` reads request bodies, `reply` writes answers.

pub mod api;
pub mod reply;
pub mod wire;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use serde_json::{json, Value};

use crate::engine::{Engine, EngineInfo, Flow, Observer, Request, Sampling, TokenEvent};
use crate::error::EngineError;
use crate::serve::text::ServeText;
use crate::tokenizer::AUDIO;

use api::{ApiError, Endpoint, Input};
use reply::{Answer, Format};
use wire::{EventStream, HttpRequest, Limits, ReadError};

/// How the server describes and bounds itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpOptions {
    /// The model name served (default `<arch>-<preset>`, or `<arch>` for a model directory).
    pub model: Option<String>,
    /// Print a `[PREFIX]` line per request on stderr.
    pub prefix_log: bool,
    /// The engine copies prefixes across slots (announced under `kvproof` in `/v1/models`).
    pub kv_share: bool,
    /// The engine's reuse rule, in the harness's syntax (`strict`, `lcp`, `grid:R`, ...), when known.
    pub reuse_rule: Option<String>,
    pub limits: Limits,
}

/// The paths the server answers, with the method each takes.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/slots/{id}"),
];

/// Serve `engine` on `listener` until the process ends. Connections are taken one at a time: a request runs to
/// its end before the next connection is read.
pub fn serve_http(engine: &mut dyn Engine, listener: TcpListener, options: HttpOptions) -> io::Result<()> {
    let mut server = Server::new(engine, options);
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => server.connection(stream),
            // a connection that failed before it was accepted concerns nobody else
            Err(e) if is_transient(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    ) || e.raw_os_error() == Some(24) // EMFILE: out of descriptors for now; the next accept may succeed
}

struct Server<'a> {
    engine: &'a mut dyn Engine,
    info: EngineInfo,
    /// The engine's tokenizer and template, taken once at start.
    text: ServeText,
    model: String,
    options: HttpOptions,
    next_id: u64,
    /// Positions each slot holds after its last request, as far as the server knows (`n_erased`).
    held: Vec<usize>,
}

impl<'a> Server<'a> {
    fn new(engine: &'a mut dyn Engine, options: HttpOptions) -> Self {
        let info = engine.info();
        let model = options.model.clone().unwrap_or_else(|| match &info.preset {
            Some(p) => format!("{}-{p}", info.arch),
            None => info.arch.clone(),
        });
        let held = vec![0; info.slots];
        let text = ServeText::of(&*engine);
        Server { engine, info, text, model, options, next_id: 1, held }
    }

    fn connection(&mut self, mut stream: TcpStream) {
        let limits = self.options.limits;
        let _ = stream.set_read_timeout(Some(limits.io_timeout));
        let _ = stream.set_write_timeout(Some(limits.io_timeout));
        let _ = stream.set_nodelay(true);
        match wire::read_request(&mut stream, &limits) {
            Ok(request) => {
                if let Err(e) = self.route(&request, &mut stream) {
                    let _ = respond_error(&mut stream, &e);
                }
                let _ = stream.shutdown(Shutdown::Write);
            }
            Err(ReadError::Refused { status, message }) => {
                let _ = respond_error(&mut stream, &ApiError::status(status, message));
                linger(stream);
            }
            Err(ReadError::Closed | ReadError::Io(_)) => {}
        }
    }

    /// Answer one request; an `Err` is answered as a JSON error by the caller.
    fn route(&mut self, request: &HttpRequest, out: &mut TcpStream) -> Result<(), ApiError> {
        let method = request.method.as_str();
        let path = request.path.as_str();
        match (method, path) {
            ("GET", "/v1/models") => respond_json(out, 200, &self.models()),
            ("GET", "/health") => respond_json(out, 200, &json!({"status": "ok"})),
            ("POST", "/v1/completions") => self.generate(Endpoint::Completions, request, out),
            ("POST", "/v1/chat/completions") => self.generate(Endpoint::Chat, request, out),
            ("POST", "/reset_prefix_cache") => {
                self.reset();
                respond_json(out, 200, &json!({"status": "ok"}))
            }
            ("POST", p) if p.starts_with("/slots/") => self.slot_action(&p["/slots/".len()..], request, out),
            _ => {
                let template = |r: &str| r.strip_suffix("{id}").map_or(r == path, |prefix| path.starts_with(prefix));
                match ROUTES.iter().find(|(_, r)| template(r)) {
                    Some((m, _)) => Err(ApiError::status(405, format!("{path} takes {m}, not {method}"))),
                    None => Err(ApiError::status(404, format!("no route for {method} {path}"))),
                }
            }
        }
    }

    fn models(&self) -> Value {
        json!({
            "object": "list",
            "data": [{
                "id": self.model,
                "object": "model",
                "created": 0,
                "owned_by": "kvproof",
                "max_model_len": self.info.max_ctx,
                "meta": {"n_vocab": self.info.vocab, "n_ctx": self.info.max_ctx, "n_slots": self.info.slots},
                "kvproof": {
                    "engine": self.info,
                    "kv_share": self.options.kv_share,
                    "reuse_rule": self.options.reuse_rule,
                    "version": crate::VERSION,
                },
            }],
        })
    }

    fn reset(&mut self) {
        self.engine.reset();
        self.held.iter_mut().for_each(|h| *h = 0);
    }

    /// `POST /slots/{id}?action=erase`. The engine API forgets every slot at once (`Engine::reset`), so an
    /// engine with several slots forgets them all.
    fn slot_action(&mut self, id: &str, request: &HttpRequest, out: &mut TcpStream) -> Result<(), ApiError> {
        let slot = id.parse::<usize>().ok().filter(|&s| s < self.info.slots).ok_or_else(|| {
            ApiError::bad("id_slot", format!("{id:?} is not a slot of this engine (0..{})", self.info.slots))
        })?;
        match request.query_param("action") {
            Some("erase") => {
                let n_erased = self.held[slot];
                self.reset();
                respond_json(
                    out,
                    200,
                    &json!({"id_slot": slot, "n_erased": n_erased, "n_slots_erased": self.info.slots}),
                )
            }
            Some(other) => Err(ApiError::bad("action", format!("`{other}` is not served (erase)"))),
            None => Err(ApiError::bad("action", "missing (erase)")),
        }
    }

    fn generate(&mut self, endpoint: Endpoint, request: &HttpRequest, out: &mut TcpStream) -> Result<(), ApiError> {
        let g = api::parse(endpoint, &request.body, &self.info)?;
        if let Some(m) = g.model.as_ref().filter(|m| **m != self.model) {
            return Err(ApiError {
                param: Some("model".into()),
                code: Some("model_not_found"),
                ..ApiError::status(404, format!("model `{m}` is not served here (`{}` is)", self.model))
            });
        }
        let (prompt, field) = match &g.input {
            Input::Ids(ids) => (ids.clone(), "prompt"),
            Input::Text(text) => (self.text.encode(text), "prompt"),
            Input::Chat(messages) => {
                (self.text.render_chat(messages).map_err(|e| ApiError::bad("messages", e))?, "messages")
            }
        };
        if prompt.is_empty() {
            return Err(ApiError::bad(field, "the prompt has no tokens").with_code("empty_prompt"));
        }
        if self.info.audio && prompt.contains(&AUDIO) {
            return Err(ApiError::bad(field, "the audio id needs an audio frame, which this API does not carry"));
        }
        let id = self.next_id;
        self.next_id += 1;
        let engine_request = Request {
            id,
            slot: g.slot,
            prompt: prompt.clone(),
            audio: Vec::new(),
            max_tokens: g.max_tokens,
            sampling: Sampling { temperature: g.temperature, top_p: g.top_p, top_k: g.top_k, seed: g.seed },
            // every logit, so log probabilities are normalised over the whole vocabulary
            logprobs: if g.logprobs.is_some() { self.info.vocab } else { 0 },
            ignore_eos: g.ignore_eos,
        };
        let fresh_state = !g.cache_prompt || g.cache_salt.is_some();
        let answer = Answer::new(Format::new(&g, id, &self.model, self.text.clone()), prompt);
        let mut emit = Emit { answer, stream: None, out: Some(out), gone: false, streaming: g.stream };
        let result = {
            let mut fresh;
            let engine: &mut dyn Engine = if fresh_state {
                fresh = self.engine.fresh();
                fresh.as_mut()
            } else {
                &mut *self.engine
            };
            let result = catch_unwind(AssertUnwindSafe(|| engine.generate(&engine_request, &mut emit)));
            if result.is_err() {
                // a half-updated state must never be reused
                engine.reset();
            }
            result
        };
        match result {
            Ok(Ok(reply)) => {
                if !fresh_state {
                    self.held[g.slot] = reply.prompt_tokens + reply.tokens.len().saturating_sub(1);
                }
                if self.options.prefix_log {
                    eprintln!("{}", crate::serve::server::prefix_log_line(&reply));
                }
                emit.finish(&reply, g.include_usage)
            }
            Ok(Err(e)) => {
                if !fresh_state {
                    self.held[g.slot] = 0;
                }
                emit.fail(engine_error(&e, field))
            }
            Err(panic) => {
                if !fresh_state {
                    self.held.iter_mut().for_each(|h| *h = 0);
                }
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let e = ApiError::status(500, format!("engine panicked: {what}; every slot was reset"));
                emit.fail(e.with_code("internal"))
            }
        }
    }
}

/// The API error for an engine's refusal.
fn engine_error(e: &EngineError, field: &str) -> ApiError {
    match e {
        EngineError::ContextExceeded { used, limit } => ApiError {
            code: Some("context_length_exceeded"),
            extra: vec![("n_prompt_tokens", json!(used)), ("n_ctx", json!(limit))],
            ..ApiError::bad(field, format!("{used} tokens exceed the context of {limit}"))
        },
        EngineError::EmptyPrompt => ApiError::bad(field, "the prompt has no tokens").with_code("empty_prompt"),
        EngineError::NoSuchSlot { .. } => ApiError::bad("id_slot", e.to_string()),
        EngineError::BadRequest(m) => ApiError::bad(field, m.clone()),
        EngineError::Cancelled => ApiError::status(499, "cancelled: the client went away").with_code("cancelled"),
        other => ApiError::status(500, other.to_string()).with_code("internal"),
    }
}

/// The observer of one request: collects tokens, or streams them as events from the first one on. A stream
/// begins at the first token, so a request the engine refuses before any (an exceeded context) is answered with
/// its status, streamed or not.
struct Emit<'o> {
    answer: Answer,
    stream: Option<EventStream<&'o mut TcpStream>>,
    out: Option<&'o mut TcpStream>,
    /// The client went away: generation is cancelled.
    gone: bool,
    streaming: bool,
}

impl Emit<'_> {
    fn start(&mut self) -> Result<(), ApiError> {
        if self.stream.is_some() {
            return Ok(());
        }
        let out = self.out.take().ok_or_else(|| ApiError::status(500, "the connection is gone"))?;
        match EventStream::start(out) {
            Ok(s) => {
                self.stream = Some(s);
                if let Some(chunk) = self.answer.opening_chunk() {
                    self.send(&chunk);
                }
                Ok(())
            }
            Err(e) => {
                self.gone = true;
                Err(ApiError::status(499, format!("the client went away: {e}")))
            }
        }
    }

    fn send(&mut self, chunk: &Value) {
        if let Some(s) = self.stream.as_mut() {
            if s.event(&chunk.to_string()).is_err() {
                self.gone = true;
            }
        }
    }

    fn finish(mut self, reply: &crate::engine::Reply, include_usage: bool) -> Result<(), ApiError> {
        if self.streaming {
            if self.stream.is_none() {
                self.start()?;
            }
            for chunk in self.answer.closing_chunks(reply, include_usage) {
                self.send(&chunk);
            }
            if let Some(s) = self.stream.take() {
                let _ = s.finish();
            }
            return Ok(());
        }
        let body = self.answer.whole(reply);
        match self.out.take() {
            Some(out) => respond_json(out, 200, &body),
            None => Ok(()),
        }
    }

    /// A refusal: a JSON error before the stream began, an error event inside it.
    fn fail(mut self, e: ApiError) -> Result<(), ApiError> {
        if self.gone {
            return Ok(());
        }
        match self.stream.take() {
            None => Err(e),
            Some(mut s) => {
                let _ = s.event(&e.body().to_string());
                let _ = s.finish();
                Ok(())
            }
        }
    }
}

impl Observer for Emit<'_> {
    fn on_token(&mut self, event: &TokenEvent) -> Flow {
        let chunk = self.answer.token(event);
        if self.streaming {
            if self.stream.is_none() && self.start().is_err() {
                return Flow::Cancel;
            }
            self.send(&chunk);
        }
        if self.gone {
            Flow::Cancel
        } else {
            Flow::Continue
        }
    }
}

fn respond_json(out: &mut TcpStream, status: u16, body: &Value) -> Result<(), ApiError> {
    // a client that went away cannot be told anything
    let _ = wire::write_response(out, status, "application/json", body.to_string().as_bytes());
    Ok(())
}

fn respond_error(out: &mut TcpStream, e: &ApiError) -> io::Result<()> {
    wire::write_response(out, e.status, "application/json", e.body().to_string().as_bytes())
}

/// Close a connection whose request was refused unread: stop writing, then drain what the client still sends
/// (bounded), so the refusal is read before the connection resets.
fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 8192];
    let mut drained = 0usize;
    while drained < 1 << 20 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    let _ = stream.flush();
}
