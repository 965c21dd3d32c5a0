//! The HTTP driver: an engine behind an OpenAI-compatible API (vLLM, SGLang, llama.cpp's `llama-server`,
//! Ollama, `kvproof-engine --http`; docs/http.md).
//!
//! Token-id prompts go to `/v1/completions`, conversations as text to `/v1/chat/completions`, greedy, streamed,
//! each under a timeout; a connection that fails before any answer is tried again, an answer never is. The warm
//! instance is the server itself, reset (`reset`) when a plan starts; a cold instance is a second server, reset
//! before each cold run, or the same server's per-request cache bypass, a weaker cold. Every instance shares a
//! server, so plans run one at a time. The API carries no state dumps, no cancel at a prefill poll and no state
//! bytes: those checks are skipped with the reason.
//!
//! What an answer reports is read the ways real servers write it: token ids from `choices[].token_ids`
//! (vLLM's `return_token_ids`), a top-level `tokens` array (llama.cpp's `return_tokens`) or the ids of the log
//! probabilities (llama.cpp); reuse from `usage.prompt_tokens_details.cached_tokens` (vLLM, SGLang) or
//! `timings.cache_n` (llama.cpp); the top-2 gap from `top_logprobs`, in the chat shape (`content` entries) or
//! the legacy completion shape (`tokens`, `top_logprobs` maps). A server that returns no ids gets stable
//! pseudo-ids from each token's text (`Caps.token_ids` false).

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{EngineInfo, Request, StopReason};
use serde_json::{json, Map, Value};

use super::{Caps, ChatRequest, Driver, DriverError, Generation, Launcher, Profile};
use crate::scenario::{ColdSpec, DeclaredRule, HttpApi, HttpEngine, ResetKind};

/// Bytes of one answer the driver reads at most.
const ANSWER_LIMIT: u64 = 64 << 20;
/// Bytes of one server-sent event (its lines together) the driver holds at most: one chunk of a stream carries a
/// token or a few, so a longer one is a server that never ends its line or event.
const EVENT_LIMIT: usize = 1 << 20;
/// Bytes of a refusal's body an error quotes.
const EXCERPT: usize = 400;
/// The top log probabilities asked for: two give the gap.
const TOP: usize = 2;

/// A blocking HTTP client with the scenario's timeout and retries.
#[derive(Clone)]
struct Client {
    agent: ureq::Agent,
    timeout: Duration,
    retries: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("timeout", &self.timeout).field("retries", &self.retries).finish()
    }
}

type Response = ureq::http::Response<ureq::Body>;

impl Client {
    fn new(timeout: Duration, retries: u32) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .timeout_connect(Some(timeout.min(Duration::from_secs(10))))
            .user_agent(format!("kvproof/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Client { agent, timeout, retries }
    }

    /// Send a request; a connection that fails before any answer is tried again (`retries` times, backing
    /// off), anything else is returned as it is.
    fn send(&self, method: &str, url: &str, body: Option<&Value>) -> Result<Response, DriverError> {
        let mut attempt = 0;
        loop {
            let result = match (method, body) {
                ("GET", _) => self.agent.get(url).call(),
                (_, Some(b)) => self.agent.post(url).header("Content-Type", "application/json").send(b.to_string()),
                (_, None) => self.agent.post(url).send_empty(),
            };
            match result {
                Ok(r) => return Ok(r),
                Err(e) => {
                    let (error, retriable) = transport_error(e, method, url, self.timeout);
                    if !retriable || attempt >= self.retries {
                        return Err(error);
                    }
                    std::thread::sleep(Duration::from_millis(250 << attempt.min(6)));
                    attempt += 1;
                }
            }
        }
    }

    /// A JSON answer to a GET, or the refusal.
    fn get_json(&self, url: &str) -> Result<Value, DriverError> {
        let response = self.send("GET", url, None)?;
        let status = response.status().as_u16();
        let text = read_text(response, url, self.timeout)?;
        if !(200..300).contains(&status) {
            return Err(refusal(status, &text, "GET", url));
        }
        serde_json::from_str(&text).map_err(|e| malformed("GET", url, &format!("not JSON ({e}): {}", excerpt(&text))))
    }

    /// A POST whose answer only has to be a success.
    fn post_ok(&self, url: &str) -> Result<(), DriverError> {
        let response = self.send("POST", url, None)?;
        let status = response.status().as_u16();
        let text = read_text(response, url, self.timeout)?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(refusal(status, &text, "POST", url))
        }
    }
}

/// The error for a request that got no answer, and whether sending it again may help.
fn transport_error(e: ureq::Error, method: &str, url: &str, timeout: Duration) -> (DriverError, bool) {
    use std::io::ErrorKind as K;
    let died = |detail: String| DriverError::Died { detail, stderr_tail: String::new() };
    match e {
        ureq::Error::Timeout(_) => (DriverError::Timeout { after_ms: ms(timeout), stderr_tail: String::new() }, false),
        ureq::Error::Io(io) if io.kind() == K::TimedOut => {
            (DriverError::Timeout { after_ms: ms(timeout), stderr_tail: String::new() }, false)
        }
        ureq::Error::Io(io) => {
            let retriable = matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::UnexpectedEof
            );
            (died(format!("{method} {url}: no answer: {io}")), retriable)
        }
        ureq::Error::ConnectionFailed => (died(format!("{method} {url}: the connection failed")), true),
        other => (died(format!("{method} {url}: {other}")), false),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

fn excerpt(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(EXCERPT) {
        Some((at, _)) => format!("{}...", &t[..at]),
        None => t.to_string(),
    }
}

fn malformed(method: &str, url: &str, what: &str) -> DriverError {
    DriverError::Died { detail: format!("{method} {url}: malformed answer: {what}"), stderr_tail: String::new() }
}

/// Read a (small) answer body as text.
fn read_text(response: Response, url: &str, timeout: Duration) -> Result<String, DriverError> {
    let mut text = String::new();
    let mut reader = response.into_body().into_with_config().limit(ANSWER_LIMIT).reader();
    match reader.read_to_string(&mut text) {
        Ok(_) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            Err(DriverError::Timeout { after_ms: ms(timeout), stderr_tail: String::new() })
        }
        Err(e) => Err(malformed("POST", url, &format!("the body broke off: {e}"))),
    }
}

/// The error for an HTTP error status: the protocol code the checks compare (`CONTEXT_EXCEEDED` for an
/// exceeded context, as every driver reports it), with the status and an excerpt of the body.
fn refusal(status: u16, body: &str, method: &str, url: &str) -> DriverError {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = if v["error"].is_object() { &v["error"] } else { &v };
    let field = |k: &str| error[k].as_str().unwrap_or("").to_ascii_lowercase();
    let (code, kind, message) = (field("code"), field("type"), field("message"));
    let message = if message.is_empty() { v["detail"].as_str().unwrap_or("").to_ascii_lowercase() } else { message };
    let context = code.contains("context_length")
        || kind.contains("exceed_context")
        || message.contains("maximum context length")
        || message.contains("exceed the context")
        || message.contains("exceeds the context")
        || message.contains("context size");
    let code = if context {
        "CONTEXT_EXCEEDED".to_string()
    } else {
        match status {
            400 | 422 => "BAD_REQUEST".into(),
            404 => "NOT_FOUND".into(),
            413 => "TOO_LARGE".into(),
            500 => "INTERNAL".into(),
            s => format!("HTTP_{s}"),
        }
    };
    DriverError::Refused { code, detail: format!("HTTP {status} from {method} {url}: {}", excerpt(body)) }
}

/// One token as the log probabilities describe it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Entry {
    id: Option<u32>,
    piece: Option<Vec<u8>>,
    /// The top alternatives' log probabilities, most likely first.
    top: Vec<f64>,
}

/// `token_id:N` (vLLM's `return_tokens_as_token_ids`).
fn id_of(token: &str) -> Option<u32> {
    token.strip_prefix("token_id:").and_then(|n| n.parse().ok())
}

/// The bytes a token string stands for: `<0xNN>` is one byte, `token_id:N` says nothing of the text.
fn piece_of(token: &str) -> Option<Vec<u8>> {
    if token.starts_with("token_id:") {
        return None;
    }
    if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if hex.len() == 2 {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return Some(vec![b]);
            }
        }
    }
    Some(token.as_bytes().to_vec())
}

fn sorted_desc(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| b.total_cmp(a));
    v
}

/// The entries of a `logprobs` object: chat's `content` list (llama.cpp writes it for completions too) or the
/// legacy completion arrays.
fn logprob_entries(v: &Value) -> Vec<Entry> {
    if let Some(content) = v["content"].as_array() {
        return content
            .iter()
            .map(|e| {
                let token = e["token"].as_str().unwrap_or("");
                let bytes = e["bytes"].as_array().and_then(|b| b.iter().map(|x| x.as_u64().map(|x| x as u8)).collect());
                let top = e["top_logprobs"]
                    .as_array()
                    .map_or_else(Vec::new, |t| sorted_desc(t.iter().filter_map(|x| x["logprob"].as_f64()).collect()));
                Entry {
                    id: e["id"].as_u64().map(|i| i as u32).or_else(|| id_of(token)),
                    piece: bytes.or_else(|| piece_of(token)),
                    top,
                }
            })
            .collect();
    }
    let Some(tokens) = v["tokens"].as_array() else {
        return Vec::new();
    };
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let token = t.as_str().unwrap_or("");
            let top = v["top_logprobs"][i]
                .as_object()
                .map_or_else(Vec::new, |m| sorted_desc(m.values().filter_map(Value::as_f64).collect()));
            Entry { id: id_of(token), piece: piece_of(token), top }
        })
        .collect()
}

/// Everything an answer reported, from its whole object or from its chunks in order.
#[derive(Debug, Default)]
struct Collected {
    texts: Vec<String>,
    choice_ids: Vec<u32>,
    top_ids: Vec<u32>,
    entries: Vec<Entry>,
    prompt_ids: Option<Vec<u32>>,
    finish: Option<String>,
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    cached_tokens: Option<usize>,
    cache_n: Option<usize>,
    prompt_n: Option<usize>,
    prompt_ms: Option<f64>,
    predicted_ms: Option<f64>,
    error: Option<Value>,
    /// When the first token arrived (streaming).
    first_token: Option<Instant>,
}

fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?.iter().map(|x| x.as_u64().map(|x| x as u32)).collect()
}

fn count(v: &Value) -> Option<usize> {
    v.as_u64().map(|x| x as usize)
}

impl Collected {
    fn absorb(&mut self, obj: &Value) {
        if !obj["error"].is_null() {
            self.error = Some(obj["error"].clone());
            return;
        }
        let before = (self.texts.len(), self.choice_ids.len(), self.top_ids.len(), self.entries.len());
        let usage = &obj["usage"];
        if usage.is_object() {
            self.prompt_tokens = count(&usage["prompt_tokens"]).or(self.prompt_tokens);
            self.completion_tokens = count(&usage["completion_tokens"]).or(self.completion_tokens);
            self.cached_tokens = count(&usage["prompt_tokens_details"]["cached_tokens"]).or(self.cached_tokens);
        }
        let timings = &obj["timings"];
        if timings.is_object() {
            self.cache_n = count(&timings["cache_n"]).or(self.cache_n);
            self.prompt_n = count(&timings["prompt_n"]).or(self.prompt_n);
            self.prompt_ms = timings["prompt_ms"].as_f64().or(self.prompt_ms);
            self.predicted_ms = timings["predicted_ms"].as_f64().or(self.predicted_ms);
        }
        if let Some(t) = ids(&obj["tokens"]) {
            self.top_ids.extend(t);
        }
        if let Some(p) = ids(&obj["prompt_token_ids"]) {
            self.prompt_ids = Some(p);
        }
        let choice = obj["choices"].as_array().and_then(|c| c.iter().find(|c| c["index"].as_u64().unwrap_or(0) == 0));
        if let Some(c) = choice {
            let text = c["text"].as_str().or(c["delta"]["content"].as_str()).or(c["message"]["content"].as_str());
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                self.texts.push(t.to_string());
            }
            if let Some(t) = ids(&c["token_ids"]) {
                self.choice_ids.extend(t);
            }
            if let Some(p) = ids(&c["prompt_token_ids"]) {
                self.prompt_ids = Some(p);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                self.finish = Some(f.to_string());
            }
            self.entries.extend(logprob_entries(&c["logprobs"]));
        }
        let after = (self.texts.len(), self.choice_ids.len(), self.top_ids.len(), self.entries.len());
        if self.first_token.is_none() && after != before {
            self.first_token = Some(Instant::now());
        }
    }

    fn reused(&self) -> Option<usize> {
        self.cached_tokens.or(self.cache_n)
    }

    /// An answer that reports its reuse both ways must report one count.
    fn reuse_agrees(&self) -> Result<(), String> {
        match (self.cached_tokens, self.cache_n) {
            (Some(c), Some(n)) if c != n => Err(format!(
                "it reports reuse two ways that disagree: usage.prompt_tokens_details.cached_tokens {c}, \
                 timings.cache_n {n}"
            )),
            _ => Ok(()),
        }
    }

    /// The reply's token ids, when the answer gave them.
    fn token_ids(&self) -> Option<Vec<u32>> {
        if !self.choice_ids.is_empty() {
            return Some(self.choice_ids.clone());
        }
        if !self.top_ids.is_empty() {
            return Some(self.top_ids.clone());
        }
        if !self.entries.is_empty() {
            return self.entries.iter().map(|e| e.id).collect();
        }
        None
    }

    fn generation(self, sent_prompt: usize, max_tokens: usize, started: Instant) -> Generation {
        let wall = started.elapsed();
        let ids = self.token_ids();
        let pieces: Option<Vec<Vec<u8>>> =
            if self.entries.is_empty() { None } else { self.entries.iter().map(|e| e.piece.clone()).collect() };
        let tokens = match ids {
            Some(ids) => ids,
            None => match &pieces {
                Some(p) => p.iter().map(|b| pseudo_id(b)).collect(),
                None => self.texts.iter().map(|t| pseudo_id(t.as_bytes())).collect(),
            },
        };
        let pieces = pieces.filter(|p| p.len() == tokens.len()).or_else(|| {
            (self.entries.is_empty() && self.texts.len() == tokens.len())
                .then(|| self.texts.iter().map(|t| t.as_bytes().to_vec()).collect())
        });
        let gaps = (self.entries.len() == tokens.len() && !tokens.is_empty())
            .then(|| {
                self.entries
                    .iter()
                    .map(|e| if e.top.len() >= 2 { (e.top[0] - e.top[1]) as f32 } else { f32::NAN })
                    .collect::<Vec<f32>>()
            })
            .filter(|g| !g.iter().all(|x| x.is_nan()));
        let stop = match self.finish.as_deref() {
            Some("length") => StopReason::Length,
            Some("stop" | "eos") => StopReason::Eos,
            Some(_) => StopReason::Stopped,
            None if tokens.len() >= max_tokens => StopReason::Length,
            None => StopReason::Eos,
        };
        let prompt_tokens = self.prompt_tokens.or_else(|| Some(self.prompt_n? + self.cache_n?)).unwrap_or(sent_prompt);
        let ttft = self.first_token.map_or(wall, |t| t.duration_since(started));
        let from_ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1000.0);
        Generation {
            reused: self.reused(),
            prefill: self.prompt_ms.map_or(ttft, from_ms),
            decode: self.predicted_ms.map_or(wall.saturating_sub(ttft), from_ms),
            tokens,
            gaps,
            prompt_tokens,
            wall,
            stop,
            prompt_ids: self.prompt_ids,
            pieces,
        }
    }
}

/// A server that answers more tokens than the request allowed breaks its API: the reply is not what was asked.
fn within_max_tokens(g: &Generation, max_tokens: usize) -> Result<(), String> {
    if g.tokens.len() > max_tokens {
        return Err(format!("{} tokens in the reply, more than the request's max_tokens {max_tokens}", g.tokens.len()));
    }
    Ok(())
}

/// A stable id for a token known only by its text: FNV-1a of the bytes, with the top bit set so it lies outside
/// any real vocabulary (a prompt built from it is refused, never silently fed).
pub fn pseudo_id(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h | 0x8000_0000
}

/// Read an answer: a stream of server-sent events, or one JSON object.
fn collect(response: Response, method: &str, url: &str, timeout: Duration) -> Result<Collected, DriverError> {
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !(200..300).contains(&status) {
        let text = read_text(response, url, timeout)?;
        return Err(refusal(status, &text, method, url));
    }
    let mut out = Collected::default();
    if !streamed {
        let text = read_text(response, url, timeout)?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| malformed(method, url, &format!("not JSON ({e}): {}", excerpt(&text))))?;
        out.absorb(&v);
        return Ok(out);
    }
    let reader = response.into_body().into_with_config().limit(ANSWER_LIMIT).reader();
    let mut lines = BufReader::new(reader);
    let mut data = String::new();
    let mut done = false;
    loop {
        let line = read_event_line(&mut lines).map_err(|e| match e {
            EventLine::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                DriverError::Timeout { after_ms: ms(timeout), stderr_tail: String::new() }
            }
            EventLine::Io(e) => malformed(method, url, &format!("the event stream broke off: {e}")),
            EventLine::TooLong => malformed(method, url, &format!("an event line longer than {EVENT_LIMIT} bytes")),
        })?;
        let n = line.as_ref().map_or(0, |l| l.len() + 1);
        let l = line.as_deref().unwrap_or("");
        if data.len() + l.len() > EVENT_LIMIT {
            return Err(malformed(method, url, &format!("an event longer than {EVENT_LIMIT} bytes")));
        }
        if n == 0 || l.is_empty() {
            // the end of an event
            if !data.is_empty() {
                if data.trim() == "[DONE]" {
                    done = true;
                    break;
                }
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| malformed(method, url, &format!("event is not JSON ({e}): {}", excerpt(&data))))?;
                out.absorb(&v);
                data.clear();
            }
            if n == 0 {
                break;
            }
        } else if let Some(d) = l.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
        // `event:`, `id:`, `retry:` and `:` comments carry nothing the driver reads
    }
    if !done && out.error.is_none() && out.finish.is_none() {
        return Err(malformed(method, url, "the event stream ended without a finish reason or [DONE]"));
    }
    Ok(out)
}

/// Why an event line could not be read.
enum EventLine {
    Io(std::io::Error),
    TooLong,
}

/// The next line of an event stream without its line end (`None` at the end of the stream), never holding more
/// than `EVENT_LIMIT` bytes of it. Invalid UTF-8 is replaced: it can only make the event's JSON fail to parse.
fn read_event_line(r: &mut impl BufRead) -> Result<Option<String>, EventLine> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(EVENT_LIMIT as u64 + 1).read_until(b'\n', &mut buf).map_err(EventLine::Io)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > EVENT_LIMIT {
        return Err(EventLine::TooLong);
    }
    let line = String::from_utf8_lossy(&buf);
    Ok(Some(line.trim_end_matches(['\r', '\n']).to_string()))
}

/// Where requests go: a base URL and the model name they carry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    url: String,
    model: String,
}

/// The server's root, where reset endpoints live: the base URL without a trailing `/v1`.
fn root_of(url: &str) -> String {
    url.strip_suffix("/v1").unwrap_or(url).to_string()
}

/// How cold instances are had.
#[derive(Debug, Clone)]
enum Cold {
    /// The warm server with the per-request bypass, on this slot (or the request's own).
    Bypass { slot: Option<usize> },
    /// A second server.
    Server(Target),
}

/// What `GET /models` says of the model served.
#[derive(Debug, Default)]
struct Described {
    info: Option<EngineInfo>,
    kv_share: bool,
    reuse_rule: Option<String>,
    max_ctx: Option<usize>,
    vocab: Option<usize>,
    slots: Option<usize>,
}

fn start_error(url: &str, detail: impl std::fmt::Display) -> DriverError {
    DriverError::Start { engine: url.to_string(), detail: detail.to_string() }
}

/// The model to use at `url`, and what the listing says of it.
fn describe(client: &Client, url: &str, want: Option<&str>) -> Result<(String, Described), DriverError> {
    let models =
        client.get_json(&format!("{url}/models")).map_err(|e| start_error(url, format!("GET /models: {e}")))?;
    let listed: Vec<&Value> = models["data"].as_array().map(|d| d.iter().collect()).unwrap_or_default();
    let names: Vec<&str> = listed.iter().filter_map(|m| m["id"].as_str()).collect();
    let name = match want {
        Some(w) if names.contains(&w) => w.to_string(),
        Some(w) => {
            return Err(start_error(
                url,
                format!("model `{w}` is not among the models it serves ({})", names.join(", ")),
            ))
        }
        None => names.first().map(|n| n.to_string()).ok_or_else(|| start_error(url, "GET /models lists no model"))?,
    };
    let entry = listed.iter().find(|m| m["id"].as_str() == Some(&name)).copied().unwrap_or(&Value::Null);
    let k = &entry["kvproof"];
    let info = match &k["engine"] {
        Value::Null => None,
        v => Some(
            serde_json::from_value::<EngineInfo>(v.clone())
                .map_err(|e| start_error(url, format!("GET /models: kvproof.engine: {e}")))?,
        ),
    };
    let described = Described {
        info,
        kv_share: k["kv_share"].as_bool().unwrap_or(false),
        reuse_rule: k["reuse_rule"].as_str().map(str::to_string),
        max_ctx: count(&entry["max_model_len"]).or(count(&entry["meta"]["n_ctx"])),
        vocab: count(&entry["meta"]["n_vocab"]),
        slots: count(&entry["meta"]["n_slots"]),
    };
    Ok((name, described))
}

/// Starts instances of an engine behind an HTTP API.
#[derive(Debug)]
pub struct HttpLauncher {
    spec: HttpEngine,
    client: Client,
    warm: Target,
    cold: Cold,
    profile: Profile,
}

impl HttpLauncher {
    /// Read what the server says of its model, check the cold server serves the same one, and probe with one tiny
    /// request what its answers report (token ids, reuse counts, top log probabilities).
    pub fn start(spec: &HttpEngine) -> Result<Self, DriverError> {
        let client = Client::new(Duration::from_millis(spec.timeout_ms), spec.retries);
        let url = spec.url.clone();
        let (model, described) = describe(&client, &url, spec.model.as_deref())?;
        let warm = Target { url: url.clone(), model: model.clone() };

        // llama.cpp's /props knows the slots and the context of each
        let props = if described.info.is_none() && spec.reset == ResetKind::LlamaCpp {
            client.get_json(&format!("{}/props", root_of(&url))).ok()
        } else {
            None
        };
        let server_slots = described
            .info
            .as_ref()
            .map(|i| i.slots)
            .or(described.slots)
            .or_else(|| props.as_ref().and_then(|p| count(&p["total_slots"])));
        let bypass_slot = match spec.cold {
            ColdSpec::BypassSlot { bypass_slot } => Some(bypass_slot),
            _ => None,
        };
        let slots = spec.slots.unwrap_or_else(|| {
            let s = server_slots.unwrap_or(1);
            bypass_slot.map_or(s, |b| s.min(b)).max(1)
        });
        if let Some(b) = bypass_slot {
            if b < slots {
                return Err(start_error(
                    &url,
                    format!("engine.cold.bypass_slot {b} is one of the warm slots (0..{slots})"),
                ));
            }
            if server_slots.is_some_and(|s| b >= s) {
                return Err(start_error(
                    &url,
                    format!("engine.cold.bypass_slot {b}: the server has {} slot(s)", server_slots.unwrap_or(0)),
                ));
            }
        }
        let mut info = described.info.clone().unwrap_or_else(|| EngineInfo {
            arch: model.clone(),
            preset: None,
            slots,
            max_ctx: described
                .max_ctx
                .or_else(|| props.as_ref().and_then(|p| count(&p["default_generation_settings"]["n_ctx"])))
                .unwrap_or(usize::MAX),
            vocab: described.vocab.unwrap_or(kvproof_engines::tokenizer::VOCAB),
            audio: false,
            audio_frame_bytes: 0,
            window: None,
            prompt_rows: None,
            initial_capacity: usize::MAX,
            fault: None,
            model_hash: String::new(),
            cost: None,
        });
        info.slots = slots;

        let cold = match &spec.cold {
            ColdSpec::Bypass(_) => Cold::Bypass { slot: None },
            ColdSpec::BypassSlot { bypass_slot } => Cold::Bypass { slot: Some(*bypass_slot) },
            ColdSpec::Server { url: cold_url, model: cold_model } => {
                let want = cold_model.as_deref().unwrap_or(&model);
                let (cold_name, cold_described) = describe(&client, cold_url, Some(want))
                    .map_err(|e| start_error(&url, format!("engine.cold.url: {e}")))?;
                if let (Some(w), Some(c)) = (&described.info, &cold_described.info) {
                    if w.model_hash != c.model_hash || w.fault != c.fault {
                        return Err(start_error(
                            &url,
                            format!(
                                "engine.cold.url: {cold_url} serves model {} (fault {:?}), the warm server {} (fault \
                                 {:?})",
                                c.model_hash, c.fault, w.model_hash, w.fault
                            ),
                        ));
                    }
                }
                Cold::Server(Target { url: cold_url.clone(), model: cold_name })
            }
        };

        let mut launcher = HttpLauncher {
            spec: spec.clone(),
            client,
            warm,
            cold,
            profile: Profile {
                label: String::new(),
                info,
                caps: Caps {
                    token_ids: false,
                    reuse_count: false,
                    gaps: false,
                    dumps: false,
                    audio_frame_bytes: None,
                    cancel_at_poll: false,
                    state_bytes: false,
                    kv_share: described.kv_share,
                    reuse_rule: None,
                    chat: true,
                    keeps_state_on: Vec::new(),
                },
            },
        };
        launcher.profile.caps.reuse_rule = match (spec.reuse_rule, &described.reuse_rule) {
            (Some(r), _) => Some(r),
            (None, Some(r)) => Some(
                r.parse::<DeclaredRule>()
                    .map_err(|e| start_error(&url, format!("GET /models: kvproof.reuse_rule: {e}")))?,
            ),
            (None, None) => None,
        };
        let probe = launcher.probe()?;
        launcher.profile.caps.token_ids = probe.token_ids().is_some();
        launcher.profile.caps.reuse_count = probe.reused().is_some();
        launcher.profile.caps.gaps = probe.entries.iter().any(|e| e.top.len() >= 2);
        launcher.profile.label = format!(
            "{} model {} (HTTP {}; {}; reset {})",
            url,
            model,
            spec.api.name(),
            spec.cold.describe(),
            spec.reset.name()
        );
        Ok(launcher)
    }

    /// One tiny request on the warm server, through the endpoint the scenario drives.
    fn probe(&self) -> Result<Collected, DriverError> {
        let driver = self.driver(self.warm.clone(), None);
        let (endpoint, body) = match self.spec.api {
            HttpApi::Completions => ("completions", driver.completions_body(&json!("Hello"), 0, 2, false)),
            HttpApi::Chat => {
                let messages = json!([{"role": "user", "content": "Hello"}]);
                ("chat/completions", driver.chat_body(&messages, 0, 2, false))
            }
        };
        let url = format!("{}/{endpoint}", self.warm.url);
        let response = self
            .client
            .send("POST", &url, Some(&body))
            .map_err(|e| start_error(&self.warm.url, format!("probe: {e}")))?;
        let collected = collect(response, "POST", &url, self.client.timeout)
            .map_err(|e| start_error(&self.warm.url, format!("probe: {e}")))?;
        if let Some(e) = &collected.error {
            return Err(start_error(&self.warm.url, format!("probe: the answer is an error: {e}")));
        }
        Ok(collected)
    }

    fn driver(&self, target: Target, bypass: Option<Option<usize>>) -> HttpDriver {
        HttpDriver {
            client: self.client.clone(),
            target,
            api: self.spec.api,
            bypass,
            extra_body: self.spec.extra_body.clone().unwrap_or_default(),
            profile: self.profile.clone(),
        }
    }

    /// Make the server at `url` forget what it cached (as `reset` says), for slots `0..slots`.
    fn reset(&self, url: &str, slots: usize) -> Result<(), DriverError> {
        let root = root_of(url);
        let endpoints: Vec<String> = match self.spec.reset {
            ResetKind::LlamaCpp => (0..slots).map(|s| format!("{root}/slots/{s}?action=erase")).collect(),
            ResetKind::Vllm => vec![format!("{root}/reset_prefix_cache")],
            ResetKind::Sglang => vec![format!("{root}/flush_cache")],
            ResetKind::None => Vec::new(),
        };
        for e in endpoints {
            self.client
                .post_ok(&e)
                .map_err(|err| start_error(url, format!("reset ({}): {err}", self.spec.reset.name())))?;
        }
        Ok(())
    }
}

impl Launcher for HttpLauncher {
    /// The warm instance: the server, reset so that the plan starts from a fresh state.
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        self.reset(&self.warm.url, self.profile.info.slots)?;
        Ok(Box::new(self.driver(self.warm.clone(), None)))
    }

    /// A cold instance: the second server, reset; or the warm server with the per-request bypass.
    fn launch_cold(&self) -> Result<Box<dyn Driver>, DriverError> {
        match &self.cold {
            Cold::Bypass { slot } => Ok(Box::new(self.driver(self.warm.clone(), Some(*slot)))),
            Cold::Server(target) => {
                self.reset(&target.url, self.profile.info.slots)?;
                Ok(Box::new(self.driver(target.clone(), None)))
            }
        }
    }

    fn parallel_plans(&self) -> bool {
        false
    }

    fn profile(&self) -> &Profile {
        &self.profile
    }
}

static SALTS: AtomicU64 = AtomicU64::new(0);

/// One instance: requests to one server, with or without the cache bypass.
pub struct HttpDriver {
    client: Client,
    target: Target,
    api: HttpApi,
    /// `Some(slot)`: every request bypasses the cache, on `slot` (or its own slot when `None`).
    bypass: Option<Option<usize>>,
    extra_body: Map<String, Value>,
    profile: Profile,
}

impl HttpDriver {
    /// The fields every generation request carries: greedy, streamed with usage, the top-2 log probabilities,
    /// token ids asked both ways servers take it, the slot; the bypass; then the scenario's `extra_body`.
    fn finish_body(&self, mut body: Map<String, Value>, slot: usize, ignore_eos: bool) -> Value {
        body.insert("model".into(), json!(self.target.model));
        body.insert("temperature".into(), json!(0));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        body.insert("return_tokens".into(), json!(true));
        body.insert("return_token_ids".into(), json!(true));
        body.insert("id_slot".into(), json!(slot));
        if ignore_eos {
            body.insert("ignore_eos".into(), json!(true));
        }
        if let Some(bypass_slot) = self.bypass {
            let salt = SALTS.fetch_add(1, Ordering::Relaxed);
            body.insert("cache_prompt".into(), json!(false));
            body.insert("cache_salt".into(), json!(format!("kvproof-cold-{}-{salt}", std::process::id())));
            body.insert("id_slot".into(), json!(bypass_slot.unwrap_or(slot)));
        }
        for (k, v) in &self.extra_body {
            body.insert(k.clone(), v.clone());
        }
        Value::Object(body)
    }

    fn completions_body(&self, prompt: &Value, slot: usize, max_tokens: usize, ignore_eos: bool) -> Value {
        let mut body = Map::new();
        body.insert("prompt".into(), prompt.clone());
        body.insert("max_tokens".into(), json!(max_tokens));
        body.insert("logprobs".into(), json!(TOP));
        self.finish_body(body, slot, ignore_eos)
    }

    fn chat_body(&self, messages: &Value, slot: usize, max_tokens: usize, ignore_eos: bool) -> Value {
        let mut body = Map::new();
        body.insert("messages".into(), messages.clone());
        body.insert("max_tokens".into(), json!(max_tokens));
        body.insert("logprobs".into(), json!(true));
        body.insert("top_logprobs".into(), json!(TOP));
        self.finish_body(body, slot, ignore_eos)
    }

    fn run(
        &self,
        endpoint: &str,
        body: &Value,
        sent_prompt: usize,
        max_tokens: usize,
    ) -> Result<Generation, DriverError> {
        let url = format!("{}/{endpoint}", self.target.url);
        let started = Instant::now();
        let response = self.client.send("POST", &url, Some(body))?;
        let collected = collect(response, "POST", &url, self.client.timeout)?;
        if let Some(e) = &collected.error {
            let status = e["code"].as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or(500);
            return Err(refusal(status, &json!({ "error": e }).to_string(), "POST", &url));
        }
        collected.reuse_agrees().map_err(|why| malformed("POST", &url, &why))?;
        let generation = collected.generation(sent_prompt, max_tokens, started);
        within_max_tokens(&generation, max_tokens).map_err(|why| malformed("POST", &url, &why))?;
        Ok(generation)
    }
}

impl Driver for HttpDriver {
    fn profile(&self) -> &Profile {
        &self.profile
    }

    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        if self.api == HttpApi::Chat {
            return Err(DriverError::Unsupported(
                "the engine is driven through its chat API (engine.api: chat), which takes no token-id prompts".into(),
            ));
        }
        if !req.audio.is_empty() {
            return Err(DriverError::Unsupported("audio frames cannot travel over the HTTP API".into()));
        }
        let body = self.completions_body(&json!(req.prompt), req.slot, req.max_tokens, req.ignore_eos);
        self.run("completions", &body, req.prompt.len(), req.max_tokens)
    }

    fn generate_chat(&mut self, req: &ChatRequest) -> Result<Generation, DriverError> {
        let messages = serde_json::to_value(&req.messages)
            .map_err(|e| DriverError::Unsupported(format!("messages cannot be written as JSON: {e}")))?;
        let body = self.chat_body(&messages, req.slot, req.max_tokens, req.ignore_eos);
        self.run("chat/completions", &body, 0, req.max_tokens)
    }

    fn dump(&mut self, _slot: usize) -> Result<StateDump, DriverError> {
        Err(DriverError::Unsupported("an HTTP API offers no state dumps".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn absorbed(objects: &[Value]) -> Collected {
        let mut c = Collected::default();
        for o in objects {
            c.absorb(o);
        }
        c
    }

    #[test]
    fn more_tokens_than_max_tokens_is_an_error() {
        let chunk = |id: u32| json!({"choices": [{"text": "a", "index": 0, "token_ids": [id]}]});
        let c = absorbed(&[chunk(5), chunk(6), chunk(7)]);
        let g = c.generation(4, 2, Instant::now());
        let err = within_max_tokens(&g, 2).expect_err("3 tokens for max_tokens 2");
        assert_eq!(err, "3 tokens in the reply, more than the request's max_tokens 2");
        assert!(within_max_tokens(&g, 3).is_ok());
    }

    #[test]
    fn event_lines_are_bounded() {
        let mut ok = std::io::Cursor::new(b"data: {}\r\n\nlast".to_vec());
        assert_eq!(read_event_line(&mut ok).ok().flatten().as_deref(), Some("data: {}"));
        assert_eq!(read_event_line(&mut ok).ok().flatten().as_deref(), Some(""));
        assert_eq!(read_event_line(&mut ok).ok().flatten().as_deref(), Some("last"));
        assert!(matches!(read_event_line(&mut ok), Ok(None)));
        // a line that never ends is cut at the limit, not read to the end of the answer
        let endless = std::io::Read::chain(std::io::Cursor::new(b"data: ".to_vec()), std::io::repeat(b'x'));
        let mut endless = BufReader::new(endless);
        assert!(matches!(read_event_line(&mut endless), Err(EventLine::TooLong)));
    }

    /// A llama.cpp `llama-server` stream (completions): ids and bytes in `content` log probabilities, reuse in
    /// `timings`, no `prompt_tokens_details`.
    #[test]
    fn reads_a_llama_cpp_stream() {
        let chunk = |id: u32, text: &str, top: [(u32, f64); 2]| {
            json!({"choices": [{"text": text, "index": 0, "finish_reason": null, "logprobs": {"content": [
                {"id": id, "token": text, "bytes": text.as_bytes(), "logprob": top[0].1,
                 "top_logprobs": [{"id": top[0].0, "token": "a", "logprob": top[0].1},
                                  {"id": top[1].0, "token": "b", "logprob": top[1].1}]}]}}],
                   "object": "text_completion"})
        };
        let c = absorbed(&[
            chunk(9906, "Hello", [(9906, -0.5), (13, -1.25)]),
            chunk(13, ",", [(13, -0.1), (9906, -3.1)]),
            json!({"choices": [{"text": "", "index": 0, "finish_reason": "length", "logprobs": null}],
                   "usage": {"completion_tokens": 2, "prompt_tokens": 12, "total_tokens": 14},
                   "timings": {"cache_n": 8, "prompt_n": 4, "prompt_ms": 3.5, "predicted_n": 2, "predicted_ms": 7.0}}),
        ]);
        let g = c.generation(12, 2, Instant::now());
        assert_eq!(g.tokens, vec![9906, 13]);
        assert_eq!(g.reused, Some(8));
        assert_eq!(g.prompt_tokens, 12);
        assert_eq!(g.stop, StopReason::Length);
        assert_eq!(g.gaps, Some(vec![0.75, 3.0]));
        assert_eq!(g.pieces, Some(vec![b"Hello".to_vec(), b",".to_vec()]));
        assert_eq!(g.prefill, Duration::from_secs_f64(0.0035));
    }

    /// A vLLM stream (completions, `return_token_ids`): ids in the choice, legacy log probabilities, reuse in
    /// `usage.prompt_tokens_details`, usage in a last chunk with no choices.
    #[test]
    fn reads_a_vllm_stream() {
        let c = absorbed(&[
            json!({"choices": [{"index": 0, "text": " the", "token_ids": [279], "prompt_token_ids": [1, 2, 3],
                   "logprobs": {"tokens": [" the"], "token_logprobs": [-0.2], "top_logprobs": [{" the": -0.2, " a": -2.2}],
                                "text_offset": [0]}, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "text": "", "token_ids": [2], "logprobs": {"tokens": ["</s>"],
                   "token_logprobs": [-0.01], "top_logprobs": [{"</s>": -0.01}], "text_offset": [4]},
                   "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                   "prompt_tokens_details": {"cached_tokens": 2}}}),
        ]);
        let g = c.generation(3, 8, Instant::now());
        assert_eq!(g.tokens, vec![279, 2]);
        assert_eq!(g.reused, Some(2));
        assert_eq!(g.prompt_ids, Some(vec![1, 2, 3]));
        assert_eq!(g.stop, StopReason::Eos);
        let gaps = g.gaps.expect("gaps");
        assert!((gaps[0] - 2.0).abs() < 1e-6 && gaps[1].is_nan(), "{gaps:?}");
    }

    /// A server that gives neither ids nor reuse nor log probabilities (Ollama's OpenAI API): pseudo-ids from
    /// each chunk's text, stable across answers and outside any vocabulary.
    #[test]
    fn pseudo_ids_from_text() {
        let chunk = |t: &str| json!({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]});
        let a = absorbed(&[
            chunk("Hi"),
            chunk(" there"),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ]);
        let b = absorbed(&[chunk("Hi"), chunk(" there")]);
        let (ga, gb) = (a.generation(0, 8, Instant::now()), b.generation(0, 8, Instant::now()));
        assert_eq!(ga.tokens, gb.tokens);
        assert_eq!(ga.tokens.len(), 2);
        assert!(ga.tokens.iter().all(|&t| t >= 0x8000_0000));
        assert_ne!(ga.tokens[0], ga.tokens[1]);
        assert_eq!((ga.reused, ga.gaps.clone()), (None, None));
        assert_eq!(ga.pieces, Some(vec![b"Hi".to_vec(), b" there".to_vec()]));
    }

    #[test]
    fn reuse_reported_two_ways_must_agree() {
        let answer = |cached: usize, cache_n: usize| {
            absorbed(&[json!({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": cached}},
                              "timings": {"cache_n": cache_n, "prompt_n": 9 - cache_n}})])
        };
        assert!(answer(4, 4).reuse_agrees().is_ok());
        let e = answer(5, 4).reuse_agrees().expect_err("disagree");
        assert!(e.contains("cached_tokens 5") && e.contains("cache_n 4"), "{e}");
    }

    #[test]
    fn token_strings() {
        assert_eq!((id_of("token_id:42"), piece_of("token_id:42")), (Some(42), None));
        assert_eq!(piece_of("<0x8D>"), Some(vec![0x8d]));
        assert_eq!(piece_of("<|eos|>"), Some(b"<|eos|>".to_vec()));
    }

    #[test]
    fn refusals_keep_status_and_body() {
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 3000 tokens","type":"BadRequestError","param":null,"code":400}"#;
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":3000,"n_ctx":2048}}"#;
        let ours = r#"{"error":{"code":"context_length_exceeded","message":"prompt: 1025 tokens exceed the context of 1024","param":"prompt","type":"invalid_request_error"}}"#;
        for body in [vllm, llama, ours] {
            let e = refusal(400, body, "POST", "http://x/v1/completions");
            assert_eq!(e.code(), "CONTEXT_EXCEEDED", "{body}");
        }
        let e = refusal(
            400,
            r#"{"error":{"message":"prompt[2]: bad","param":"prompt[2]"}}"#,
            "POST",
            "http://x/v1/completions",
        );
        assert_eq!(e.code(), "BAD_REQUEST");
        assert!(
            e.to_string().contains("HTTP 400 from POST http://x/v1/completions") && e.to_string().contains("prompt[2]"),
            "{e}"
        );
        assert_eq!(refusal(503, "busy", "POST", "u").code(), "HTTP_503");
        let long = "x".repeat(5000);
        assert!(refusal(500, &long, "POST", "u").to_string().len() < 600);
    }

    #[test]
    fn pseudo_ids_are_stable() {
        assert_eq!(pseudo_id(b"abc"), pseudo_id(b"abc"));
        assert_ne!(pseudo_id(b"abc"), pseudo_id(b"abd"));
        assert_eq!(root_of("http://h:1/v1"), "http://h:1");
        assert_eq!(root_of("http://h:1"), "http://h:1");
    }
}
