//! Wire syntax of the serve protocol (docs/protocol.md): reading and writing every frame, in both directions.
//!
//! Client -> engine: `SUBMIT`, `STOP`, `CANCEL`, `DUMP`, `RESET` ([`Command`]). Engine -> client: the READY marker,
//! `CAPS`, `PROMPT`, `DATA`, `DONE`, `ERROR`, `DUMPED`, `CLEARED` ([`EngineFrame`]). Readers never trust a byte count they cannot honour and
//! always consume a declared payload before answering, so one bad frame never desynchronises the stream.

use std::fmt;
use std::io::{self, BufRead, Read, Write};

/// The start-up marker an engine writes before anything else (followed by `\n`).
pub const READY: &[u8] = b"\x01\x01READY\x01\x01";
/// Protocol revision announced in CAPS as `proto=`.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest header line accepted (bytes, without the newline); longer lines are skipped and answered BAD_FRAME.
pub const MAX_HEADER: usize = 64 * 1024;
/// Largest declared payload or ext block; a larger count is not trusted (nothing past the header is consumed).
pub const MAX_PAYLOAD: usize = 64 << 20;
/// Largest DATA text a client reader accepts.
pub const MAX_TOKEN_BYTES: usize = 1 << 20;
/// Longest free-text detail written after an ERROR code.
const MAX_DETAIL: usize = 240;

// ---------------------------------------------------------------------------------------------------------------
// Error codes

/// The code of an `ERROR` frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorCode {
    /// The frame's shape is wrong: unknown verb, missing field, id or byte count not a number, oversize or
    /// truncated frame, payload not followed by a newline.
    BadFrame,
    /// The frame is well delimited but a value is invalid.
    BadRequest,
    /// A SUBMIT for the slot that is generating right now.
    SlotBusy,
    /// A SUBMIT reusing an id that is generating or queued.
    DuplicateId,
    EmptyPrompt,
    /// STOP / CANCEL of an id that is not generating or queued.
    NotFound,
    Cancelled,
    ContextExceeded {
        used: usize,
        limit: usize,
    },
    /// Extension: DUMP could not write its file.
    DumpFailed,
    /// Extension: the engine failed for a reason that is not the request's fault.
    Internal,
    /// A code this reader does not know (a newer engine).
    Other(String),
}

impl ErrorCode {
    pub fn name(&self) -> &str {
        match self {
            ErrorCode::BadFrame => "BAD_FRAME",
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::SlotBusy => "SLOT_BUSY",
            ErrorCode::DuplicateId => "DUPLICATE_ID",
            ErrorCode::EmptyPrompt => "EMPTY_PROMPT",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::ContextExceeded { .. } => "CONTEXT_EXCEEDED",
            ErrorCode::DumpFailed => "DUMP_FAILED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Other(name) => name,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::ContextExceeded { used, limit } => write!(f, "CONTEXT_EXCEEDED {used} {limit}"),
            other => f.write_str(other.name()),
        }
    }
}

/// Why a frame is refused, before it is known which id to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: ErrorCode,
    /// For humans only; readers never parse it.
    pub detail: String,
}

impl Rejection {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Rejection { code, detail: detail.into() }
    }

    pub fn bad_frame(detail: impl Into<String>) -> Self {
        Rejection::new(ErrorCode::BadFrame, detail)
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Rejection::new(ErrorCode::BadRequest, detail)
    }

    pub fn answer(self, id: Option<u64>) -> ErrorFrame {
        ErrorFrame { id, code: self.code, detail: self.detail }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Client -> engine

/// A parsed `SUBMIT` frame (values checked for syntax and range; engine limits are checked by `request::build`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubmitFrame {
    pub id: u64,
    pub slot: usize,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// `ids=1`: the payload is space-separated token ids, else text for the tokenizer.
    pub ids: bool,
    pub logprobs: usize,
    pub top_k: usize,
    pub seed: u64,
    /// `ignore_eos=1`: generate `max_tokens` tokens even past eos.
    pub ignore_eos: bool,
    /// `chat=1`: the payload is a JSON array of `{"role", "content"}` messages the engine renders itself.
    pub chat: bool,
    /// `echo=1`: the engine writes the prompt ids it fed (a `PROMPT` frame) before the first DATA.
    pub echo: bool,
    /// `cancel_at=N`: the engine cancels the request itself at its N-th (0-based) prefill progress poll.
    pub cancel_at: Option<usize>,
    pub payload: Vec<u8>,
    pub ext: Vec<u8>,
}

/// A frame a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Submit(SubmitFrame),
    Stop {
        id: u64,
    },
    Cancel {
        id: u64,
    },
    Dump {
        id: u64,
        slot: usize,
        path: String,
    },
    /// Forget every slot's state and record (extension).
    Reset {
        id: u64,
    },
}

/// The verb of a client frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Submit,
    Stop,
    Cancel,
    Dump,
    Reset,
}

impl Verb {
    fn parse(s: &str) -> Option<Verb> {
        match s {
            "SUBMIT" => Some(Verb::Submit),
            "STOP" => Some(Verb::Stop),
            "CANCEL" => Some(Verb::Cancel),
            "DUMP" => Some(Verb::Dump),
            "RESET" => Some(Verb::Reset),
            _ => None,
        }
    }
}

/// A client frame that was read (and fully consumed) but cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCommand {
    pub verb: Option<Verb>,
    /// The id to answer (`-` on the wire when it could not be read).
    pub id: Option<u64>,
    pub rejection: Rejection,
}

impl BadCommand {
    pub fn answer(self) -> ErrorFrame {
        self.rejection.answer(self.id)
    }
}

impl Command {
    pub fn id(&self) -> u64 {
        match self {
            Command::Submit(s) => s.id,
            Command::Stop { id } | Command::Cancel { id } | Command::Dump { id, .. } | Command::Reset { id } => *id,
        }
    }

    /// The exact bytes of this frame.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Command::Submit(s) => {
                out.extend_from_slice(
                    format!(
                        "SUBMIT {} {} {} {} {} {}",
                        s.id,
                        s.slot,
                        s.payload.len(),
                        s.max_tokens,
                        s.temperature,
                        s.top_p
                    )
                    .as_bytes(),
                );
                if !s.ext.is_empty() {
                    out.extend_from_slice(format!(" {}", s.ext.len()).as_bytes());
                }
                if s.ids {
                    out.extend_from_slice(b" ids=1");
                }
                if s.logprobs > 0 {
                    out.extend_from_slice(format!(" logprobs={}", s.logprobs).as_bytes());
                }
                if s.top_k > 0 {
                    out.extend_from_slice(format!(" top_k={}", s.top_k).as_bytes());
                }
                if s.seed != 0 {
                    out.extend_from_slice(format!(" seed={}", s.seed).as_bytes());
                }
                if s.ignore_eos {
                    out.extend_from_slice(b" ignore_eos=1");
                }
                if s.chat {
                    out.extend_from_slice(b" chat=1");
                }
                if s.echo {
                    out.extend_from_slice(b" echo=1");
                }
                if let Some(n) = s.cancel_at {
                    out.extend_from_slice(format!(" cancel_at={n}").as_bytes());
                }
                out.push(b'\n');
                out.extend_from_slice(&s.payload);
                out.extend_from_slice(&s.ext);
                out.push(b'\n');
            }
            Command::Stop { id } => out.extend_from_slice(format!("STOP {id}\n").as_bytes()),
            Command::Cancel { id } => out.extend_from_slice(format!("CANCEL {id}\n").as_bytes()),
            Command::Dump { id, slot, path } => out.extend_from_slice(format!("DUMP {id} {slot} {path}\n").as_bytes()),
            Command::Reset { id } => out.extend_from_slice(format!("RESET {id}\n").as_bytes()),
        }
        out
    }

    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

/// Read the next client frame. `Ok(None)` at a clean end of input; a frame cut short by the end of input is
/// returned as a BAD_FRAME (and the next call returns `Ok(None)`). Only I/O errors of the reader are `Err`.
pub fn read_command<R: BufRead>(r: &mut R) -> io::Result<Option<Result<Command, BadCommand>>> {
    let line = match read_line_bounded(r, MAX_HEADER, AfterTooLong::Skip)? {
        Line::Eof => return Ok(None),
        Line::TooLong => {
            return Ok(Some(Err(BadCommand {
                verb: None,
                id: None,
                rejection: Rejection::bad_frame(format!("header line longer than {MAX_HEADER} bytes")),
            })))
        }
        Line::Unterminated(bytes) => {
            return Ok(Some(Err(BadCommand {
                verb: None,
                id: None,
                rejection: Rejection::bad_frame(format!("input ended inside the header {}", quote(&bytes))),
            })))
        }
        Line::Complete(bytes) => bytes,
    };
    // Lossy: an invalid byte can only make a field fail to parse, which is reported for that field.
    let text = String::from_utf8_lossy(&line);
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    let Some(&verb_text) = fields.first() else {
        return Ok(Some(Err(BadCommand { verb: None, id: None, rejection: Rejection::bad_frame("empty line") })));
    };
    let Some(verb) = Verb::parse(verb_text) else {
        return Ok(Some(Err(BadCommand {
            verb: None,
            id: None,
            rejection: Rejection::bad_frame(format!(
                "unknown verb {} in {}",
                quote(verb_text.as_bytes()),
                quote(&line)
            )),
        })));
    };
    let id = fields.get(1).and_then(|s| parse_count::<u64>(s));
    let bad = |rejection: Rejection| Ok(Some(Err(BadCommand { verb: Some(verb), id, rejection })));
    match verb {
        Verb::Submit => read_submit(r, &fields, &line, id),
        Verb::Stop | Verb::Cancel | Verb::Reset => {
            if fields.len() != 2 {
                return bad(Rejection::bad_frame(format!(
                    "{verb_text} takes exactly one field <id>, got {}",
                    quote(&line)
                )));
            }
            match id {
                None => bad(Rejection::bad_frame(format!(
                    "{verb_text}: id {} is not a number",
                    quote(fields[1].as_bytes())
                ))),
                Some(id) if verb == Verb::Stop => Ok(Some(Ok(Command::Stop { id }))),
                Some(id) if verb == Verb::Reset => Ok(Some(Ok(Command::Reset { id }))),
                Some(id) => Ok(Some(Ok(Command::Cancel { id }))),
            }
        }
        Verb::Dump => {
            let (head, rest) = fields_and_rest(&line, 3);
            if head.len() < 3 || rest.is_empty() {
                return bad(Rejection::bad_frame(format!("DUMP needs <id> <slot> <path>, got {}", quote(&line))));
            }
            let Some(id) = id else {
                return bad(Rejection::bad_frame(format!("DUMP: id {} is not a number", quote(head[1]))));
            };
            let Some(slot) = std::str::from_utf8(head[2]).ok().and_then(parse_count::<usize>) else {
                return bad(Rejection::bad_request(format!("DUMP {id}: slot {} is not a number", quote(head[2]))));
            };
            let Ok(path) = std::str::from_utf8(rest) else {
                return bad(Rejection::bad_request(format!("DUMP {id}: path {} is not UTF-8", quote(rest))));
            };
            Ok(Some(Ok(Command::Dump { id, slot, path: path.to_string() })))
        }
    }
}

/// SUBMIT: find the byte counts, consume payload + ext + newline, then check every other field.
fn read_submit<R: BufRead>(
    r: &mut R,
    fields: &[&str],
    line: &[u8],
    id: Option<u64>,
) -> io::Result<Option<Result<Command, BadCommand>>> {
    let bad = |rejection: Rejection| Ok(Some(Err(BadCommand { verb: Some(Verb::Submit), id, rejection })));
    let Some(bytes) = fields.get(3).and_then(|s| parse_count::<usize>(s)) else {
        // No count to honour: only the header line is consumed.
        return bad(Rejection::bad_frame(format!("SUBMIT without a <bytes> count: {}", quote(line))));
    };
    // Field 8 is the ext count when it is not a k=v option.
    let ext_field = fields.get(7).filter(|s| !s.contains('='));
    let ext_count = ext_field.map(|s| parse_count::<usize>(s));
    let ext = ext_count.flatten().unwrap_or(0);
    if bytes > MAX_PAYLOAD || ext > MAX_PAYLOAD {
        return bad(Rejection::bad_frame(format!(
            "declared payload {bytes} + ext {ext} bytes exceeds the {MAX_PAYLOAD}-byte limit (not consumed)"
        )));
    }
    let Some(payload) = read_exact_or_eof(r, bytes)? else {
        return bad(Rejection::bad_frame(format!("input ended inside the {bytes}-byte payload")));
    };
    let Some(ext_bytes) = read_exact_or_eof(r, ext)? else {
        return bad(Rejection::bad_frame(format!("input ended inside the {ext}-byte ext block")));
    };
    match read_byte(r)? {
        None => return bad(Rejection::bad_frame("input ended before the newline after the payload")),
        Some(b'\n') => {}
        Some(other) => {
            // The declared count was wrong: the rest of this line belongs to the broken frame.
            skip_line(r)?;
            return bad(Rejection::bad_frame(format!(
                "payload of {bytes}+{ext} bytes not followed by a newline (found {}): byte count wrong?",
                quote(&[other])
            )));
        }
    }
    if let (Some(field), None) = (ext_field, ext_count.flatten()) {
        return bad(Rejection::bad_frame(format!("SUBMIT: <ext_bytes> {} is not a count", quote(field.as_bytes()))));
    }
    if fields.len() < 7 {
        return bad(Rejection::bad_frame(format!(
            "SUBMIT needs <id> <slot> <bytes> <max_tokens> <temp> <top_p>, got {}",
            quote(line)
        )));
    }
    let Some(id) = id else {
        return bad(Rejection::bad_frame(format!("SUBMIT: id {} is not a number", quote(fields[1].as_bytes()))));
    };
    match submit_values(id, fields, ext_field.is_some()) {
        Ok(mut frame) => {
            frame.payload = payload;
            frame.ext = ext_bytes;
            Ok(Some(Ok(Command::Submit(frame))))
        }
        Err(rejection) => bad(rejection),
    }
}

/// The typed values of a SUBMIT header whose framing is sound.
fn submit_values(id: u64, fields: &[&str], has_ext: bool) -> Result<SubmitFrame, Rejection> {
    let invalid = |name: &str, s: &str, want: &str| {
        Rejection::bad_request(format!("SUBMIT {id}: {name} {}: {want}", quote(s.as_bytes())))
    };
    let slot = parse_count::<usize>(fields[2]).ok_or_else(|| invalid("slot", fields[2], "not a count"))?;
    let max_tokens = parse_count::<usize>(fields[4]).filter(|&n| n > 0);
    let max_tokens = max_tokens.ok_or_else(|| invalid("max_tokens", fields[4], "must be a count >= 1"))?;
    let temperature = fields[5].parse::<f32>().ok().filter(|t| t.is_finite() && *t >= 0.0);
    let temperature = temperature.ok_or_else(|| invalid("temp", fields[5], "must be a finite number >= 0"))?;
    let top_p = fields[6].parse::<f32>().ok().filter(|p| p.is_finite() && *p > 0.0 && *p <= 1.0);
    let top_p = top_p.ok_or_else(|| invalid("top_p", fields[6], "must be in (0, 1]"))?;
    let mut frame = SubmitFrame { id, slot, max_tokens, temperature, top_p, ..SubmitFrame::default() };
    let mut seen: Vec<&str> = Vec::new();
    for option in &fields[if has_ext { 8 } else { 7 }..] {
        let Some((key, value)) = option.split_once('=') else {
            return Err(invalid("field", option, "unexpected (options are k=v)"));
        };
        if seen.contains(&key) {
            return Err(invalid("option", option, "given twice"));
        }
        seen.push(key);
        let bad = || invalid("option", option, "bad value");
        let flag = || match value {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad()),
        };
        match key {
            "ids" => frame.ids = flag()?,
            "ignore_eos" => frame.ignore_eos = flag()?,
            "logprobs" => frame.logprobs = parse_count(value).ok_or_else(bad)?,
            "top_k" => frame.top_k = parse_count(value).ok_or_else(bad)?,
            "seed" => frame.seed = parse_count(value).ok_or_else(bad)?,
            "chat" => frame.chat = flag()?,
            "echo" => frame.echo = flag()?,
            "cancel_at" => frame.cancel_at = Some(parse_count(value).ok_or_else(bad)?),
            _ => {
                return Err(invalid(
                    "option",
                    option,
                    "unknown (known: ids, logprobs, top_k, seed, ignore_eos, chat, echo, cancel_at)",
                ))
            }
        }
    }
    if frame.ids && frame.chat {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: ids=1 and chat=1 both name the payload's form; give one"
        )));
    }
    Ok(frame)
}

// ---------------------------------------------------------------------------------------------------------------
// Engine -> client

/// The `CAPS` line: ordered `k=v` pairs describing the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    pub entries: Vec<(String, String)>,
}

impl Caps {
    /// Add (or replace) one entry; whitespace in the value is replaced so the line stays one field per pair.
    pub fn set(&mut self, key: &str, value: impl fmt::Display) {
        let value: String =
            value.to_string().chars().map(|c| if c.is_whitespace() || c.is_control() { '_' } else { c }).collect();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_string(), value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A numeric entry; `-` (absent) and unparseable values are `None`.
    pub fn number(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(parse_count::<usize>)
    }

    /// A `0|1` flag; absent is `false`.
    pub fn flag(&self, key: &str) -> bool {
        self.get(key) == Some("1")
    }

    pub fn arch(&self) -> Option<&str> {
        self.get("arch")
    }
    pub fn slots(&self) -> Option<usize> {
        self.number("slots")
    }
    pub fn max_ctx(&self) -> Option<usize> {
        self.number("max_ctx")
    }
    pub fn vocab(&self) -> Option<usize> {
        self.number("vocab")
    }
    /// The id that ends a reply (`eos=`), when the engine declares it.
    pub fn eos(&self) -> Option<u32> {
        self.get("eos").and_then(parse_count::<u32>)
    }
    pub fn window(&self) -> Option<usize> {
        self.number("window")
    }
    /// Whether SUBMIT accepts `ids=1`.
    pub fn ids(&self) -> bool {
        self.flag("ids")
    }
    /// Whether DUMP is supported.
    pub fn dump(&self) -> bool {
        self.flag("dump")
    }
    pub fn audio(&self) -> bool {
        self.flag("audio")
    }
    /// Whether DONE carries the trailing reuse count.
    pub fn reuse(&self) -> bool {
        self.flag("reuse")
    }
    pub fn fault(&self) -> Option<&str> {
        self.get("fault").filter(|f| *f != "-" && *f != "none")
    }
    pub fn model(&self) -> Option<&str> {
        self.get("model").filter(|m| *m != "-")
    }
    /// The reuse rule the engine declares (`strict`, `lcp`, `grid:R`, `block:B`, `none`), unparsed.
    pub fn reuse_rule(&self) -> Option<&str> {
        self.get("reuse_rule").filter(|r| *r != "-")
    }
    /// Whether SUBMIT accepts `chat=1`.
    pub fn chat(&self) -> bool {
        self.flag("chat")
    }
    /// Whether SUBMIT accepts `echo=1` (a PROMPT frame with the ids fed).
    pub fn echo(&self) -> bool {
        self.flag("echo")
    }
    /// Whether the RESET verb is supported.
    pub fn reset(&self) -> bool {
        self.flag("reset")
    }
    /// Whether SUBMIT accepts `cancel_at=N`.
    pub fn cancel_at(&self) -> bool {
        self.flag("cancel_at")
    }
    /// Error codes after which the engine declares the slot's state unchanged (`keeps_state_on=`, comma-separated).
    pub fn keeps_state_on(&self) -> Vec<String> {
        self.get("keeps_state_on")
            .filter(|v| *v != "-")
            .map(|v| v.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// The prompt ids a request fed (`echo=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptFrame {
    pub id: u64,
    pub ids: Vec<u32>,
}

/// One emitted token.
#[derive(Debug, Clone, PartialEq)]
pub struct DataFrame {
    pub id: u64,
    /// Token id (`tid=`); older engines omit it.
    pub tid: Option<u32>,
    /// Top-1 minus top-2 logit (`gap=`).
    pub gap: Option<f32>,
    /// Top-K `(id, logit)` when `logprobs=K` was asked (`top=`).
    pub top: Vec<(u32, f32)>,
    /// The token's bytes.
    pub text: Vec<u8>,
}

/// The end of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct DoneFrame {
    pub id: u64,
    pub emitted: usize,
    /// Decode tokens per second.
    pub tok_s: f64,
    /// 100 * reused / prompt_tokens.
    pub hit_pct: f64,
    pub rss_gb: f64,
    pub prompt_tokens: Option<usize>,
    pub length_limited: Option<bool>,
    /// The trailing reuse count (older engines omit it).
    pub reused: Option<usize>,
}

/// An `ERROR` frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// `None` is `-` on the wire: the frame at fault had no readable id.
    pub id: Option<u64>,
    pub code: ErrorCode,
    /// Free text after the code (for humans; never parsed for meaning).
    pub detail: String,
}

/// The answer to `DUMP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedFrame {
    pub id: u64,
    pub path: String,
    pub bytes: u64,
}

/// A frame an engine sends.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineFrame {
    Ready,
    Caps(Caps),
    Data(DataFrame),
    Done(DoneFrame),
    Error(ErrorFrame),
    Dumped(DumpedFrame),
    /// The prompt ids a request fed, before its first DATA (`echo=1`).
    Prompt(PromptFrame),
    /// The answer to RESET.
    Cleared {
        id: u64,
    },
}

impl EngineFrame {
    /// The request id a frame answers, if it has one.
    pub fn id(&self) -> Option<u64> {
        match self {
            EngineFrame::Ready | EngineFrame::Caps(_) => None,
            EngineFrame::Data(d) => Some(d.id),
            EngineFrame::Done(d) => Some(d.id),
            EngineFrame::Error(e) => e.id,
            EngineFrame::Dumped(d) => Some(d.id),
            EngineFrame::Prompt(p) => Some(p.id),
            EngineFrame::Cleared { id } => Some(*id),
        }
    }

    /// The exact bytes of this frame.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            EngineFrame::Ready => {
                out.extend_from_slice(READY);
                out.push(b'\n');
            }
            EngineFrame::Caps(caps) => {
                out.extend_from_slice(b"CAPS");
                for (k, v) in &caps.entries {
                    out.extend_from_slice(format!(" {k}={v}").as_bytes());
                }
                out.push(b'\n');
            }
            EngineFrame::Data(d) => {
                out.extend_from_slice(format!("DATA {} {}", d.id, d.text.len()).as_bytes());
                if let Some(tid) = d.tid {
                    out.extend_from_slice(format!(" tid={tid}").as_bytes());
                }
                if let Some(gap) = d.gap {
                    out.extend_from_slice(format!(" gap={gap}").as_bytes());
                }
                if !d.top.is_empty() {
                    let top: Vec<String> = d.top.iter().map(|(id, logit)| format!("{id}:{logit}")).collect();
                    out.extend_from_slice(format!(" top={}", top.join(",")).as_bytes());
                }
                out.push(b'\n');
                out.extend_from_slice(&d.text);
                out.push(b'\n');
            }
            EngineFrame::Done(d) => {
                out.extend_from_slice(
                    format!("DONE {} STAT {} {:.1} {:.1} {:.3}", d.id, d.emitted, d.tok_s, d.hit_pct, d.rss_gb)
                        .as_bytes(),
                );
                // Trailing fields are positional: stop at the first absent one.
                if let Some(prompt) = d.prompt_tokens {
                    out.extend_from_slice(format!(" {prompt}").as_bytes());
                    if let Some(limited) = d.length_limited {
                        out.extend_from_slice(format!(" {}", u8::from(limited)).as_bytes());
                        if let Some(reused) = d.reused {
                            out.extend_from_slice(format!(" {reused}").as_bytes());
                        }
                    }
                }
                out.push(b'\n');
            }
            EngineFrame::Error(e) => {
                let id = e.id.map_or_else(|| "-".to_string(), |id| id.to_string());
                out.extend_from_slice(format!("ERROR {id} {}", e.code).as_bytes());
                let detail = printable_line(&e.detail, MAX_DETAIL);
                let detail = detail.trim();
                if !detail.is_empty() {
                    out.extend_from_slice(format!(" {detail}").as_bytes());
                }
                out.push(b'\n');
            }
            EngineFrame::Dumped(d) => {
                out.extend_from_slice(format!("DUMPED {} {} {}\n", d.id, d.path, d.bytes).as_bytes())
            }
            EngineFrame::Prompt(p) => {
                let body = p.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
                out.extend_from_slice(format!("PROMPT {} {}\n", p.id, body.len()).as_bytes());
                out.extend_from_slice(body.as_bytes());
                out.push(b'\n');
            }
            EngineFrame::Cleared { id } => out.extend_from_slice(format!("CLEARED {id}\n").as_bytes()),
        }
        out
    }

    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

/// A frame from an engine that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad engine frame {line}: {message}")]
pub struct FrameError {
    /// The header line, quoted.
    pub line: String,
    pub message: String,
}

/// Reads engine frames; tolerates text on the READY line after the marker (it is read as the next line).
#[derive(Debug)]
pub struct EngineFrameReader<R> {
    inner: R,
    pushed_back: Option<Vec<u8>>,
}

impl<R: BufRead> EngineFrameReader<R> {
    pub fn new(inner: R) -> Self {
        EngineFrameReader { inner, pushed_back: None }
    }

    /// The next frame; `Ok(None)` at the end of the stream.
    pub fn next_frame(&mut self) -> io::Result<Option<Result<EngineFrame, FrameError>>> {
        let line = match self.pushed_back.take() {
            Some(line) => line,
            // An engine's over-long line ends its stream (the client kills it): skipping to a newline that may
            // never come would only wait for the timeout.
            None => match read_line_bounded(&mut self.inner, MAX_HEADER, AfterTooLong::Stop)? {
                Line::Eof => return Ok(None),
                Line::TooLong => {
                    return Ok(Some(Err(FrameError {
                        line: "<too long>".into(),
                        message: format!("header line longer than {MAX_HEADER} bytes"),
                    })))
                }
                Line::Unterminated(bytes) | Line::Complete(bytes) => bytes,
            },
        };
        if let Some(at) = find(&line, READY) {
            let rest = &line[at + READY.len()..];
            if !rest.is_empty() {
                self.pushed_back = Some(rest.to_vec());
            }
            return Ok(Some(Ok(EngineFrame::Ready)));
        }
        let err = |message: String| Ok(Some(Err(FrameError { line: quote(&line), message })));
        let text = String::from_utf8_lossy(&line);
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        match fields.first().copied() {
            Some("CAPS") => Ok(Some(Ok(EngineFrame::Caps(parse_caps(&fields[1..]))))),
            Some("DATA") => {
                let header = match parse_data_header(&fields) {
                    Ok(h) => h,
                    Err(message) => return err(message),
                };
                let Some(text) = read_exact_or_eof(&mut self.inner, header.1)? else {
                    return err("stream ended inside the DATA text".into());
                };
                match read_byte(&mut self.inner)? {
                    Some(b'\n') => {}
                    _ => return err(format!("DATA text of {} bytes not followed by a newline", header.1)),
                }
                let mut data = header.0;
                data.text = text;
                Ok(Some(Ok(EngineFrame::Data(data))))
            }
            Some("DONE") => match parse_done(&fields) {
                Ok(done) => Ok(Some(Ok(EngineFrame::Done(done)))),
                Err(message) => err(message),
            },
            Some("ERROR") => match parse_error(&line) {
                Ok(e) => Ok(Some(Ok(EngineFrame::Error(e)))),
                Err(message) => err(message),
            },
            Some("DUMPED") => match parse_dumped(&line) {
                Ok(d) => Ok(Some(Ok(EngineFrame::Dumped(d)))),
                Err(message) => err(message),
            },
            Some("PROMPT") => {
                let id = fields.get(1).and_then(|s| parse_count::<u64>(s));
                let n = fields.get(2).and_then(|s| parse_count::<usize>(s));
                let (Some(id), Some(n), 3) = (id, n, fields.len()) else {
                    return err("PROMPT needs <id> <bytes>".into());
                };
                if n > MAX_PAYLOAD {
                    return err(format!("PROMPT: {n} bytes exceeds {MAX_PAYLOAD}"));
                }
                let Some(body) = read_exact_or_eof(&mut self.inner, n)? else {
                    return err("stream ended inside the PROMPT ids".into());
                };
                match read_byte(&mut self.inner)? {
                    Some(b'\n') => {}
                    _ => return err(format!("PROMPT ids of {n} bytes not followed by a newline")),
                }
                let ids: Option<Vec<u32>> = std::str::from_utf8(&body)
                    .ok()
                    .and_then(|t| t.split_ascii_whitespace().map(parse_count::<u32>).collect());
                match ids {
                    Some(ids) => Ok(Some(Ok(EngineFrame::Prompt(PromptFrame { id, ids })))),
                    None => err(format!("PROMPT: {} is not a list of token ids", quote(&body))),
                }
            }
            Some("CLEARED") => match (fields.get(1).and_then(|s| parse_count::<u64>(s)), fields.len()) {
                (Some(id), 2) => Ok(Some(Ok(EngineFrame::Cleared { id }))),
                _ => err("CLEARED needs exactly <id>".into()),
            },
            _ => err("not a frame (expected CAPS, PROMPT, DATA, DONE, ERROR, DUMPED or CLEARED)".into()),
        }
    }
}

fn parse_caps(fields: &[&str]) -> Caps {
    let mut caps = Caps::default();
    for f in fields {
        let (k, v) = f.split_once('=').unwrap_or((f, ""));
        caps.entries.push((k.to_string(), v.to_string()));
    }
    caps
}

/// `DATA <id> <n> [k=v ...]`: the frame (without text) and the text length. Unknown k=v are ignored.
fn parse_data_header(fields: &[&str]) -> Result<(DataFrame, usize), String> {
    let id = fields.get(1).and_then(|s| parse_count::<u64>(s)).ok_or("DATA: <id> is not a number")?;
    let n = fields.get(2).and_then(|s| parse_count::<usize>(s)).ok_or("DATA: <n> is not a count")?;
    if n > MAX_TOKEN_BYTES {
        return Err(format!("DATA: {n} bytes for one token exceeds {MAX_TOKEN_BYTES}"));
    }
    let mut data = DataFrame { id, tid: None, gap: None, top: Vec::new(), text: Vec::new() };
    for f in &fields[3..] {
        match f.split_once('=') {
            Some(("tid", v)) => data.tid = Some(parse_count(v).ok_or_else(|| format!("DATA: bad {f}"))?),
            Some(("gap", v)) => data.gap = Some(v.parse().map_err(|_| format!("DATA: bad {f}"))?),
            Some(("top", v)) => {
                for pair in v.split(',').filter(|p| !p.is_empty()) {
                    let (tid, logit) = pair.split_once(':').ok_or_else(|| format!("DATA: bad top entry {pair}"))?;
                    let tid = parse_count(tid).ok_or_else(|| format!("DATA: bad top id in {pair}"))?;
                    let logit = logit.parse().map_err(|_| format!("DATA: bad top logit in {pair}"))?;
                    data.top.push((tid, logit));
                }
            }
            _ => {}
        }
    }
    Ok((data, n))
}

/// `DONE <id> STAT <emitted> <tok_s> <hit_pct> <rss_gb> [<prompt_tokens> [<length_limited> [<prefix_reused>]]]`.
fn parse_done(fields: &[&str]) -> Result<DoneFrame, String> {
    let id = fields.get(1).and_then(|s| parse_count::<u64>(s)).ok_or("DONE: <id> is not a number")?;
    if fields.get(2) != Some(&"STAT") {
        return Err("DONE: expected STAT after the id".into());
    }
    let number = |i: usize, name: &str| -> Result<f64, String> {
        let s = fields.get(i).ok_or_else(|| format!("DONE: missing <{name}>"))?;
        s.parse::<f64>().map_err(|_| format!("DONE: <{name}> {s} is not a number"))
    };
    let optional_count = |i: usize, name: &str| -> Result<Option<usize>, String> {
        fields
            .get(i)
            .map(|s| parse_count::<usize>(s).ok_or_else(|| format!("DONE: <{name}> {s} is not a count")))
            .transpose()
    };
    let emitted = optional_count(3, "emitted")?.ok_or("DONE: missing <emitted>")?;
    let length_limited = match fields.get(8) {
        None => None,
        Some(&"0") => Some(false),
        Some(&"1") => Some(true),
        Some(s) => return Err(format!("DONE: <length_limited> {s} is not 0 or 1")),
    };
    Ok(DoneFrame {
        id,
        emitted,
        tok_s: number(4, "tok_s")?,
        hit_pct: number(5, "hit_pct")?,
        rss_gb: number(6, "rss_gb")?,
        prompt_tokens: optional_count(7, "prompt_tokens")?,
        length_limited,
        reused: optional_count(9, "prefix_reused")?,
    })
}

/// `ERROR <id|-> <CODE> [args] [detail]`.
fn parse_error(line: &[u8]) -> Result<ErrorFrame, String> {
    let (head, rest) = fields_and_rest(line, 3);
    if head.len() < 3 {
        return Err("ERROR needs <id> <CODE>".into());
    }
    let id_text = String::from_utf8_lossy(head[1]);
    let id = match &*id_text {
        "-" => None,
        s => Some(parse_count::<u64>(s).ok_or("ERROR: <id> is neither a number nor -")?),
    };
    let name = String::from_utf8_lossy(head[2]).into_owned();
    let rest = String::from_utf8_lossy(rest).into_owned();
    let (code, detail) = match name.as_str() {
        "BAD_FRAME" => (ErrorCode::BadFrame, rest),
        "BAD_REQUEST" => (ErrorCode::BadRequest, rest),
        "SLOT_BUSY" => (ErrorCode::SlotBusy, rest),
        "DUPLICATE_ID" => (ErrorCode::DuplicateId, rest),
        "EMPTY_PROMPT" => (ErrorCode::EmptyPrompt, rest),
        "NOT_FOUND" => (ErrorCode::NotFound, rest),
        "CANCELLED" => (ErrorCode::Cancelled, rest),
        "DUMP_FAILED" => (ErrorCode::DumpFailed, rest),
        "INTERNAL" => (ErrorCode::Internal, rest),
        "CONTEXT_EXCEEDED" => {
            let mut parts = rest.splitn(3, |c: char| c.is_ascii_whitespace());
            let used = parts.next().and_then(parse_count::<usize>).ok_or("CONTEXT_EXCEEDED: <used> missing")?;
            let limit = parts.next().and_then(parse_count::<usize>).ok_or("CONTEXT_EXCEEDED: <limit> missing")?;
            (ErrorCode::ContextExceeded { used, limit }, parts.next().unwrap_or("").trim().to_string())
        }
        _ => (ErrorCode::Other(name), rest),
    };
    Ok(ErrorFrame { id, code, detail })
}

/// `DUMPED <id> <path> <bytes>`; the path may contain spaces (it is everything between id and the last field).
fn parse_dumped(line: &[u8]) -> Result<DumpedFrame, String> {
    let (head, rest) = fields_and_rest(line, 2);
    let id = head.get(1).and_then(|s| std::str::from_utf8(s).ok()).and_then(parse_count::<u64>);
    let id = id.ok_or("DUMPED: <id> is not a number")?;
    let rest = std::str::from_utf8(rest).map_err(|_| "DUMPED: path is not UTF-8")?;
    let (path, bytes) = rest.rsplit_once(|c: char| c.is_ascii_whitespace()).ok_or("DUMPED needs <path> <bytes>")?;
    let bytes = parse_count::<u64>(bytes).ok_or("DUMPED: <bytes> is not a count")?;
    Ok(DumpedFrame { id, path: path.trim().to_string(), bytes })
}

// ---------------------------------------------------------------------------------------------------------------
// Byte-level helpers

enum Line {
    Eof,
    Complete(Vec<u8>),
    /// The input ended without a newline.
    Unterminated(Vec<u8>),
    /// Longer than the limit (skipped through its newline with `AfterTooLong::Skip`).
    TooLong,
}

/// What a reader does after a line longer than its limit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterTooLong {
    /// Discard through its newline, to read the next frame in step (the engine reading a client).
    Skip,
    /// Leave the rest unread (the client reading an engine: the stream is no longer trusted).
    Stop,
}

/// One line without its `\n` (and without a `\r` before it), never buffering more than `max` + 1 bytes.
fn read_line_bounded<R: BufRead>(r: &mut R, max: usize, after: AfterTooLong) -> io::Result<Line> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(max as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(Line::Eof);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        return Ok(Line::Complete(buf));
    }
    if buf.len() > max {
        if after == AfterTooLong::Skip {
            skip_line(r)?;
        }
        return Ok(Line::TooLong);
    }
    Ok(Line::Unterminated(buf))
}

/// Discard through the next newline (or the end of input).
fn skip_line<R: BufRead>(r: &mut R) -> io::Result<()> {
    loop {
        let (done, used) = {
            let buf = r.fill_buf()?;
            if buf.is_empty() {
                return Ok(());
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (true, i + 1),
                None => (false, buf.len()),
            }
        };
        r.consume(used);
        if done {
            return Ok(());
        }
    }
}

/// Exactly `n` bytes, or `None` if the input ends first.
fn read_exact_or_eof<R: Read>(r: &mut R, n: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    r.take(n as u64).read_to_end(&mut buf)?;
    Ok((buf.len() == n).then_some(buf))
}

fn read_byte<R: Read>(r: &mut R) -> io::Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The first `n` whitespace-separated fields and the rest of the line (trimmed).
fn fields_and_rest(line: &[u8], n: usize) -> (Vec<&[u8]>, &[u8]) {
    let mut fields = Vec::new();
    let mut i = 0;
    while fields.len() < n {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let start = i;
        while i < line.len() && !line[i].is_ascii_whitespace() {
            i += 1;
        }
        fields.push(&line[start..i]);
    }
    (fields, line[i..].trim_ascii())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A decimal count: ASCII digits only (no sign, no spaces), within the type's range.
pub fn parse_count<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Bytes quoted for an error message: escaped, cut to a readable length.
pub fn quote(bytes: &[u8]) -> String {
    const MAX: usize = 60;
    let shown = &bytes[..bytes.len().min(MAX)];
    let mut s = format!("{:?}", String::from_utf8_lossy(shown));
    if bytes.len() > MAX {
        s.push_str(&format!("...({} bytes)", bytes.len()));
    }
    s
}

/// `text` as one line of printable text: every control character (newlines too) a space, and past `max` bytes cut
/// at a character boundary with `...` after it. For free text quoted inside a one-line record, such as an ERROR
/// frame's detail.
pub fn printable_line(text: &str, max: usize) -> String {
    let mut s: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(input: &[u8]) -> Vec<Result<Command, BadCommand>> {
        let mut r = io::BufReader::new(input);
        let mut out = Vec::new();
        while let Some(c) = read_command(&mut r).expect("reading from a slice") {
            out.push(c);
        }
        out
    }

    fn one(input: &[u8]) -> Result<Command, BadCommand> {
        let mut all = commands(input);
        assert_eq!(all.len(), 1, "expected one frame from {:?}, got {all:?}", String::from_utf8_lossy(input));
        all.remove(0)
    }

    fn code(input: &[u8]) -> (Option<u64>, ErrorCode) {
        match one(input) {
            Err(bad) => (bad.id, bad.rejection.code),
            Ok(c) => panic!("accepted {c:?}"),
        }
    }

    fn submit(input: &[u8]) -> SubmitFrame {
        match one(input) {
            Ok(Command::Submit(s)) => s,
            other => panic!("not a submit: {other:?}"),
        }
    }

    #[test]
    fn submit_text_and_options() {
        let s = submit(b"SUBMIT 7 1 5 16 0.5 0.9 logprobs=3 top_k=40 seed=9 ignore_eos=1\nhello\n");
        assert_eq!((s.id, s.slot, s.max_tokens, s.temperature, s.top_p), (7, 1, 16, 0.5, 0.9));
        assert_eq!((s.ids, s.logprobs, s.top_k, s.seed, s.ignore_eos), (false, 3, 40, 9, true));
        assert_eq!(s.payload, b"hello");
        assert!(s.ext.is_empty());
    }

    #[test]
    fn submit_with_ext_and_ids() {
        let s = submit(b"SUBMIT 1 0 7 4 0 1 3 ids=1\n256 262abc\n");
        assert!(s.ids);
        assert_eq!(s.payload, b"256 262");
        assert_eq!(s.ext, b"abc");
    }

    #[test]
    fn payload_may_contain_newlines_and_binary() {
        let s = submit(b"SUBMIT 2 0 4 1 0 1\na\n\x00\xff\n");
        assert_eq!(s.payload, b"a\n\x00\xff");
    }

    #[test]
    fn crlf_header_is_accepted() {
        assert_eq!(one(b"STOP 3\r\n"), Ok(Command::Stop { id: 3 }));
    }

    #[test]
    fn round_trips() {
        let frames = vec![
            Command::Submit(SubmitFrame {
                id: 4,
                slot: 2,
                max_tokens: 9,
                temperature: 0.7,
                top_p: 0.95,
                ids: true,
                logprobs: 2,
                top_k: 5,
                seed: 11,
                ignore_eos: true,
                payload: b"1 2 3".to_vec(),
                ext: vec![0, 1, 2, b'\n'],
                ..SubmitFrame::default()
            }),
            Command::Stop { id: 5 },
            Command::Cancel { id: 6 },
            Command::Dump { id: 7, slot: 0, path: "/tmp/a b.json".into() },
            Command::Reset { id: 8 },
            Command::Submit(SubmitFrame {
                id: 9,
                max_tokens: 3,
                top_p: 1.0,
                chat: true,
                echo: true,
                cancel_at: Some(0),
                payload: br#"[{"role":"user","content":"hi"}]"#.to_vec(),
                ..SubmitFrame::default()
            }),
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            bytes.extend(f.to_bytes());
        }
        let back: Vec<Command> = commands(&bytes).into_iter().map(|c| c.expect("valid")).collect();
        assert_eq!(back, frames);
    }

    #[test]
    fn framing_errors_are_bad_frame() {
        assert_eq!(code(b"\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"HELLO 1\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"submit 1 0 0 1 0 1\n"), (None, ErrorCode::BadFrame), "verbs are case-sensitive");
        assert_eq!(code(b"STOP\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"STOP x\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"STOP 1 2\n"), (Some(1), ErrorCode::BadFrame));
        assert_eq!(code(b"CANCEL -1\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"DUMP 1 0\n"), (Some(1), ErrorCode::BadFrame));
        assert_eq!(code(b"SUBMIT 1 0 x 4 0 1\n"), (Some(1), ErrorCode::BadFrame));
        assert_eq!(code(b"SUBMIT 1 0\n"), (Some(1), ErrorCode::BadFrame));
        assert_eq!(code(b"SUBMIT x 0 2 4 0 1\nhi\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"SUBMIT 1 0 2 4 0\nhi\n"), (Some(1), ErrorCode::BadFrame), "too few fields, payload consumed");
        assert_eq!(code(b"SUBMIT 1 0 2 4 0 1 x\nhi\n"), (Some(1), ErrorCode::BadFrame), "ext not a count");
        assert_eq!(code(b"SUBMIT 9 0 99999999999 4 0 1\n"), (Some(9), ErrorCode::BadFrame));
        assert_eq!(code(b"SUBMIT 1 0 5 4 0 1\nhi"), (Some(1), ErrorCode::BadFrame), "truncated payload");
        assert_eq!(code(b"SUBMIT 1 0 2 4 0 1\nhi"), (Some(1), ErrorCode::BadFrame), "missing final newline");
        assert_eq!(code(b"STOP 1"), (None, ErrorCode::BadFrame), "unterminated header at end of input");
        assert_eq!(code(b"RESET\n"), (None, ErrorCode::BadFrame));
        assert_eq!(code(b"RESET 1 0\n"), (Some(1), ErrorCode::BadFrame));
        assert_eq!(code(b"RESET x\n"), (None, ErrorCode::BadFrame));
    }

    #[test]
    fn value_errors_are_bad_request() {
        for header in [
            "SUBMIT 1 x 2 4 0 1",
            "SUBMIT 1 0 2 0 0 1",
            "SUBMIT 1 0 2 4 -1 1",
            "SUBMIT 1 0 2 4 nan 1",
            "SUBMIT 1 0 2 4 inf 1",
            "SUBMIT 1 0 2 4 0 0",
            "SUBMIT 1 0 2 4 0 1.5",
            "SUBMIT 1 0 2 4 0 1 ids=2",
            "SUBMIT 1 0 2 4 0 1 ignore_eos=yes",
            "SUBMIT 1 0 2 4 0 1 foo=1",
            "SUBMIT 1 0 2 4 0 1 seed=1 seed=2",
            "SUBMIT 1 0 2 4 0 1 0 stray",
            "SUBMIT 1 0 2 4 0 1 logprobs=-1",
            "SUBMIT 1 0 2 4 0 1 chat=2",
            "SUBMIT 1 0 2 4 0 1 echo=yes",
            "SUBMIT 1 0 2 4 0 1 cancel_at=-1",
            "SUBMIT 1 0 2 4 0 1 cancel_at=",
            "SUBMIT 1 0 2 4 0 1 ids=1 chat=1",
        ] {
            let input = format!("{header}\nhi\n");
            assert_eq!(code(input.as_bytes()), (Some(1), ErrorCode::BadRequest), "{header}");
        }
        assert_eq!(code(b"DUMP 1 x /tmp/p\n"), (Some(1), ErrorCode::BadRequest));
    }

    #[test]
    fn a_bad_frame_never_desynchronises() {
        // wrong count (too short): the rest of the line is skipped, the next frame is read intact
        let all = commands(b"SUBMIT 1 0 1 4 0 1\nhello\nSTOP 2\nGARBAGE\x00\xff\nSUBMIT 3 0 2 4 x 1\nhi\nCANCEL 4\n");
        assert_eq!(all.len(), 5);
        assert!(matches!(&all[0], Err(b) if b.rejection.code == ErrorCode::BadFrame && b.id == Some(1)));
        assert_eq!(all[1], Ok(Command::Stop { id: 2 }));
        assert!(matches!(&all[2], Err(b) if b.rejection.code == ErrorCode::BadFrame && b.id.is_none()));
        assert!(matches!(&all[3], Err(b) if b.rejection.code == ErrorCode::BadRequest && b.id == Some(3)));
        assert_eq!(all[4], Ok(Command::Cancel { id: 4 }));
    }

    #[test]
    fn oversize_header_is_skipped() {
        let mut input = vec![b'A'; MAX_HEADER + 10];
        input.extend_from_slice(b"\nSTOP 1\n");
        let all = commands(&input);
        assert_eq!(all.len(), 2);
        assert!(matches!(&all[0], Err(b) if b.rejection.code == ErrorCode::BadFrame));
        assert_eq!(all[1], Ok(Command::Stop { id: 1 }));
    }

    fn engine_frames(input: &[u8]) -> Vec<EngineFrame> {
        let mut r = EngineFrameReader::new(io::BufReader::new(input));
        let mut out = Vec::new();
        while let Some(f) = r.next_frame().expect("reading from a slice") {
            out.push(f.expect("valid frame"));
        }
        out
    }

    #[test]
    fn engine_frames_round_trip() {
        let mut caps = Caps::default();
        caps.set("arch", "inkling");
        caps.set("slots", 4);
        caps.set("model", "a b");
        let frames = vec![
            EngineFrame::Ready,
            EngineFrame::Caps(caps),
            EngineFrame::Data(DataFrame {
                id: 3,
                tid: Some(10),
                gap: Some(0.125),
                top: vec![(10, 1.5), (257, -0.25)],
                text: b"\n".to_vec(),
            }),
            EngineFrame::Data(DataFrame { id: 3, tid: None, gap: None, top: vec![], text: b"<|eos|>".to_vec() }),
            EngineFrame::Done(DoneFrame {
                id: 3,
                emitted: 2,
                tok_s: 10.5,
                hit_pct: 50.0,
                rss_gb: 0.125,
                prompt_tokens: Some(8),
                length_limited: Some(false),
                reused: Some(4),
            }),
            EngineFrame::Error(ErrorFrame { id: None, code: ErrorCode::BadFrame, detail: "empty line".into() }),
            EngineFrame::Error(ErrorFrame {
                id: Some(5),
                code: ErrorCode::ContextExceeded { used: 300, limit: 256 },
                detail: String::new(),
            }),
            EngineFrame::Error(ErrorFrame {
                id: Some(6),
                code: ErrorCode::Other("NEW_CODE".into()),
                detail: "x".into(),
            }),
            EngineFrame::Dumped(DumpedFrame { id: 8, path: "/tmp/my dump.json".into(), bytes: 1234 }),
            EngineFrame::Prompt(PromptFrame { id: 9, ids: vec![256, 259, 104, 105] }),
            EngineFrame::Prompt(PromptFrame { id: 10, ids: vec![] }),
            EngineFrame::Cleared { id: 11 },
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            bytes.extend(f.to_bytes());
        }
        let mut expected = frames.clone();
        if let EngineFrame::Caps(c) = &mut expected[1] {
            c.entries[2].1 = "a_b".into();
        }
        assert_eq!(engine_frames(&bytes), expected);
    }

    #[test]
    fn exact_engine_bytes() {
        let data =
            EngineFrame::Data(DataFrame { id: 1, tid: Some(104), gap: Some(0.5), top: vec![], text: b"h".to_vec() });
        assert_eq!(data.to_bytes(), b"DATA 1 1 tid=104 gap=0.5\nh\n");
        let err = EngineFrame::Error(ErrorFrame {
            id: Some(2),
            code: ErrorCode::ContextExceeded { used: 9, limit: 8 },
            detail: String::new(),
        });
        assert_eq!(err.to_bytes(), b"ERROR 2 CONTEXT_EXCEEDED 9 8\n");
        let err = EngineFrame::Error(ErrorFrame { id: None, code: ErrorCode::BadFrame, detail: "a\nb".into() });
        assert_eq!(err.to_bytes(), b"ERROR - BAD_FRAME a b\n");
        assert_eq!(EngineFrame::Ready.to_bytes(), b"\x01\x01READY\x01\x01\n");
    }

    #[test]
    fn done_without_reuse_count_is_accepted() {
        let frames = engine_frames(b"DONE 4 STAT 3 12.0 0.0 0.1 10 1\nDONE 5 STAT 3 12.0 0.0 0.1\n");
        match &frames[..] {
            [EngineFrame::Done(a), EngineFrame::Done(b)] => {
                assert_eq!((a.prompt_tokens, a.length_limited, a.reused), (Some(10), Some(true), None));
                assert_eq!((b.prompt_tokens, b.length_limited, b.reused), (None, None, None));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ready_marker_with_trailing_text() {
        // some C engines print the marker without a newline before CAPS
        let frames = engine_frames(b"\x01\x01READY\x01\x01CAPS ids=1\n");
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], EngineFrame::Ready);
        assert!(matches!(&frames[1], EngineFrame::Caps(c) if c.ids()));
    }

    #[test]
    fn noise_is_reported_not_swallowed() {
        let mut r = EngineFrameReader::new(io::BufReader::new(&b"loading weights...\nDONE 1\n"[..]));
        assert!(matches!(r.next_frame(), Ok(Some(Err(_)))));
        assert!(matches!(r.next_frame(), Ok(Some(Err(_)))));
        assert!(matches!(r.next_frame(), Ok(None)));
    }
}
