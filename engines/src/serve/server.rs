//! The serve loop: any `Engine` over a byte stream (stdin/stdout for `kvproof-engine`).
//!
//! A reader thread parses frames into a channel; generation runs on the calling thread. While a request
//! generates, its observer drains the channel on every token and every prefill segment, so STOP/CANCEL act at
//! once and other frames are answered (errors) or queued (SUBMIT for another slot, DUMP, RESET) in arrival order.

use std::collections::VecDeque;
use std::io::{self, BufReader, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, TryRecvError};

use crate::engine::{Engine, EngineInfo, Flow, Observer, Reply, Request, StopReason, TokenEvent};
use crate::error::EngineError;
use crate::serve::frame::{
    self, BadCommand, Caps, Command, DataFrame, DoneFrame, DumpedFrame, EngineFrame, ErrorCode, PromptFrame, Rejection,
    Verb,
};
use crate::serve::request;
use crate::serve::text::ServeText;

/// The environment variable that turns on the `[PREFIX]` lines.
pub const PREFIX_LOG_ENV: &str = "KVPROOF_PREFIX_LOG";

/// Knobs of the serve loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeOptions {
    /// Print a `[PREFIX]` line per request on the log stream.
    pub prefix_log: bool,
    /// CAPS entries the serve loop cannot know from `EngineInfo` (e.g. `reuse_rule`, `kv_share`), appended to
    /// (or replacing) its own.
    pub caps: Vec<(String, String)>,
}

impl ServeOptions {
    /// `KVPROOF_PREFIX_LOG` set to anything but empty or `0` turns the log on.
    pub fn from_env() -> Self {
        let on = std::env::var(PREFIX_LOG_ENV).map(|v| !v.is_empty() && v != "0").unwrap_or(false);
        ServeOptions { prefix_log: on, caps: Vec::new() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The client's end of the output is gone or failing; nothing more can be answered.
    #[error("writing a frame to the client: {0}")]
    Write(#[source] io::Error),
    #[error("starting the frame reader thread: {0}")]
    Spawn(#[source] io::Error),
}

/// The CAPS line for an engine.
pub fn caps(info: &EngineInfo) -> Caps {
    let opt = |v: Option<usize>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let mut caps = Caps::default();
    caps.set("proto", frame::PROTOCOL_VERSION);
    caps.set("arch", &info.arch);
    caps.set("preset", info.preset.as_deref().unwrap_or("-"));
    caps.set("slots", info.slots);
    caps.set("max_ctx", info.max_ctx);
    caps.set("vocab", info.vocab);
    caps.set("ids", 1);
    caps.set("dump", 1);
    caps.set("reuse", 1);
    caps.set("stop", 1);
    caps.set("cancel", 1);
    caps.set("logprobs", 1);
    caps.set("chat", 1);
    caps.set("echo", 1);
    caps.set("reset", 1);
    caps.set("cancel_at", 1);
    caps.set("audio", u8::from(info.audio));
    caps.set("audio_frame", info.audio_frame_bytes);
    caps.set("window", opt(info.window));
    caps.set("prompt_rows", opt(info.prompt_rows));
    caps.set("initial_capacity", info.initial_capacity);
    caps.set("fault", info.fault.as_deref().unwrap_or("none"));
    caps.set("model", &info.model_hash);
    caps.set("version", crate::VERSION);
    caps
}

/// Serve `engine` until `input` ends (then finish every frame already read and return `Ok`).
///
/// `log` receives the `[PREFIX]` lines. Returns `Err` only when `output` fails.
pub fn serve<R, W, L>(
    engine: &mut dyn Engine,
    input: R,
    output: W,
    log: L,
    options: ServeOptions,
) -> Result<(), ServeError>
where
    R: Read + Send + 'static,
    W: Write,
    L: Write,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("serve-reader".into())
        .spawn(move || {
            let mut input = BufReader::new(input);
            loop {
                let incoming = match frame::read_command(&mut input) {
                    Ok(Some(Ok(command))) => Incoming::Command(command),
                    Ok(Some(Err(bad))) => Incoming::Bad(bad),
                    // A read error ends the input like EOF: nothing more can be parsed.
                    Ok(None) | Err(_) => Incoming::Eof,
                };
                let last = matches!(incoming, Incoming::Eof);
                if tx.send(incoming).is_err() || last {
                    return;
                }
            }
        })
        .map_err(ServeError::Spawn)?;

    let info = engine.info();
    let mut session = Session {
        out: output,
        log,
        rx,
        info,
        text: ServeText::of(&*engine),
        options,
        queue: VecDeque::new(),
        current: None,
        eof: false,
        write_error: None,
    };
    session.send(&EngineFrame::Ready);
    let mut announced = caps(&session.info);
    // the id that ends a reply is the engine's tokenizer's, so a client can tell a reply that stopped at eos
    if let Some(eos) = session.text.tokenizer().eos() {
        announced.set("eos", eos);
    }
    for (k, v) in &session.options.caps {
        announced.set(k, v);
    }
    session.send(&EngineFrame::Caps(announced));
    loop {
        if let Some(e) = session.write_error.take() {
            return Err(ServeError::Write(e));
        }
        if let Some(job) = session.queue.pop_front() {
            session.run(engine, job);
            continue;
        }
        if session.eof {
            return Ok(());
        }
        match session.rx.recv() {
            Ok(incoming) => session.handle(incoming),
            Err(_) => session.eof = true,
        }
    }
}

/// What the reader thread hands over.
enum Incoming {
    Command(Command),
    Bad(BadCommand),
    Eof,
}

/// Work accepted and waiting for the engine.
enum Job {
    Submit { req: Request, stop: bool, echo: bool, cancel_at: Option<usize> },
    Dump { id: u64, slot: usize, path: String },
    Reset { id: u64 },
}

/// The request generating right now.
struct Current {
    id: u64,
    slot: usize,
    stop: bool,
    cancel: bool,
}

struct Session<W, L> {
    out: W,
    log: L,
    rx: Receiver<Incoming>,
    info: EngineInfo,
    /// The engine's tokenizer and template, taken once at start.
    text: ServeText,
    options: ServeOptions,
    queue: VecDeque<Job>,
    current: Option<Current>,
    eof: bool,
    /// The first output failure; once set nothing more is written and the loop ends.
    write_error: Option<io::Error>,
}

impl<W: Write, L: Write> Session<W, L> {
    /// Write one frame and flush it: the client sees every frame as soon as it exists.
    fn send(&mut self, frame: &EngineFrame) {
        if self.write_error.is_some() {
            return;
        }
        let result = self.out.write_all(&frame.to_bytes()).and_then(|()| self.out.flush());
        if let Err(e) = result {
            self.write_error = Some(e);
        }
    }

    fn error(&mut self, id: Option<u64>, rejection: Rejection) {
        self.send(&EngineFrame::Error(rejection.answer(id)));
    }

    /// Whether `id` is generating or queued (a second SUBMIT with it is a DUPLICATE_ID).
    fn in_flight(&self, id: u64) -> bool {
        self.current.as_ref().is_some_and(|c| c.id == id)
            || self.queue.iter().any(|j| matches!(j, Job::Submit { req, .. } if req.id == id))
    }

    /// Answer or queue one incoming frame (idle or between tokens).
    fn handle(&mut self, incoming: Incoming) {
        match incoming {
            Incoming::Eof => self.eof = true,
            Incoming::Bad(mut bad) => {
                // An ERROR carrying an in-flight id would read as that request's end: a SUBMIT reusing it is a
                // DUPLICATE_ID, any other bad frame is answered without the id.
                if bad.id.is_some_and(|id| self.in_flight(id)) {
                    if bad.verb == Some(Verb::Submit) {
                        return self.duplicate(bad.id);
                    }
                    bad.id = None;
                }
                self.send(&EngineFrame::Error(bad.answer()));
            }
            Incoming::Command(Command::Submit(submit)) => {
                let id = submit.id;
                if self.in_flight(id) {
                    return self.duplicate(Some(id));
                }
                if self.current.as_ref().is_some_and(|c| c.slot == submit.slot) {
                    let detail = format!("slot {} is generating request {}", submit.slot, self.current_id());
                    return self.error(Some(id), Rejection::new(ErrorCode::SlotBusy, detail));
                }
                let (echo, cancel_at) = (submit.echo, submit.cancel_at);
                match request::build(submit, &self.info, &self.text) {
                    Ok(req) => self.queue.push_back(Job::Submit { req, stop: false, echo, cancel_at }),
                    Err(rejection) => self.error(Some(id), rejection),
                }
            }
            Incoming::Command(Command::Stop { id }) => {
                if let Some(current) = self.current.as_mut().filter(|c| c.id == id) {
                    current.stop = true;
                } else if let Some(stop) = self.queued_submit(id) {
                    *stop = true;
                } else {
                    self.not_found("STOP", id);
                }
            }
            Incoming::Command(Command::Cancel { id }) => {
                if let Some(current) = self.current.as_mut().filter(|c| c.id == id) {
                    current.cancel = true;
                } else if let Some(at) =
                    self.queue.iter().position(|j| matches!(j, Job::Submit { req, .. } if req.id == id))
                {
                    // Never started: nothing ran, so no state to taint.
                    self.queue.remove(at);
                    self.error(Some(id), Rejection::new(ErrorCode::Cancelled, "cancelled before it started"));
                } else {
                    self.not_found("CANCEL", id);
                }
            }
            Incoming::Command(Command::Dump { id, slot, path }) => self.queue.push_back(Job::Dump { id, slot, path }),
            Incoming::Command(Command::Reset { id }) => self.queue.push_back(Job::Reset { id }),
        }
    }

    fn current_id(&self) -> String {
        self.current.as_ref().map_or_else(|| "-".into(), |c| c.id.to_string())
    }

    fn duplicate(&mut self, id: Option<u64>) {
        let detail = "this id is generating or queued; the earlier request goes on";
        self.error(id, Rejection::new(ErrorCode::DuplicateId, detail));
    }

    fn not_found(&mut self, verb: &str, id: u64) {
        self.error(
            Some(id),
            Rejection::new(ErrorCode::NotFound, format!("{verb}: no request {id} is generating or queued")),
        );
    }

    fn queued_submit(&mut self, id: u64) -> Option<&mut bool> {
        self.queue.iter_mut().find_map(|j| match j {
            Job::Submit { req, stop, .. } if req.id == id => Some(stop),
            _ => None,
        })
    }

    /// Take every frame that has arrived, without waiting.
    fn poll(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(incoming) => self.handle(incoming),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.eof = true;
                    return;
                }
            }
        }
    }

    /// What the engine should do next for the current request.
    fn flow(&self, after_token: bool) -> Flow {
        match &self.current {
            // The client is gone: stop spending work on an answer nobody reads.
            _ if self.write_error.is_some() => Flow::Cancel,
            Some(c) if c.cancel => Flow::Cancel,
            // STOP ends generation normally, so it takes effect at a token (a reply is never empty).
            Some(c) if c.stop && after_token => Flow::Stop,
            _ => Flow::Continue,
        }
    }

    fn run(&mut self, engine: &mut dyn Engine, job: Job) {
        match job {
            Job::Submit { req, stop, echo, cancel_at } => self.run_submit(engine, req, stop, echo, cancel_at),
            Job::Dump { id, slot, path } => self.run_dump(engine, id, slot, &path),
            Job::Reset { id } => {
                // Exactly the state a freshly started engine holds: every slot and record forgotten.
                engine.reset();
                self.send(&EngineFrame::Cleared { id });
            }
        }
    }

    fn run_submit(&mut self, engine: &mut dyn Engine, req: Request, stop: bool, echo: bool, cancel_at: Option<usize>) {
        self.current = Some(Current { id: req.id, slot: req.slot, stop, cancel: false });
        if echo {
            self.send(&EngineFrame::Prompt(PromptFrame { id: req.id, ids: req.prompt.clone() }));
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut live = Live { session: self, id: req.id, polls: 0, cancel_at };
            engine.generate(&req, &mut live)
        }));
        self.current = None;
        match result {
            Ok(Ok(reply)) => {
                self.send(&EngineFrame::Done(done_frame(req.id, &reply)));
                if self.options.prefix_log {
                    let line = prefix_log_line(&reply);
                    // The log is for humans; a failing log stream must not stop serving.
                    let _ = writeln!(self.log, "{line}").and_then(|()| self.log.flush());
                }
            }
            Ok(Err(e)) => self.error(Some(req.id), rejection_for(&format!("SUBMIT {}", req.id), &e)),
            Err(panic) => {
                // A half-updated state must never be reused: forget every slot.
                engine.reset();
                let what = panic_message(&*panic);
                self.error(
                    Some(req.id),
                    Rejection::new(ErrorCode::Internal, format!("engine panicked: {what}; all slots reset")),
                );
            }
        }
    }

    fn run_dump(&mut self, engine: &mut dyn Engine, id: u64, slot: usize, path: &str) {
        let answer = engine.dump(slot).map_err(|e| rejection_for(&format!("DUMP {id}"), &e)).and_then(|dump| {
            crate::dump::write_file(&dump, Path::new(path))
                .map_err(|e| Rejection::new(ErrorCode::DumpFailed, format!("DUMP {id}: {e}")))
        });
        match answer {
            Ok(bytes) => self.send(&EngineFrame::Dumped(DumpedFrame { id, path: path.to_string(), bytes })),
            Err(rejection) => self.error(Some(id), rejection),
        }
    }
}

/// The observer of the generating request: streams DATA and takes frames between tokens.
struct Live<'a, W, L> {
    session: &'a mut Session<W, L>,
    id: u64,
    /// Prefill progress polls so far.
    polls: usize,
    /// `cancel_at=N`: cancel at the N-th poll (0-based), as a CANCEL read at that moment would.
    cancel_at: Option<usize>,
}

impl<W: Write, L: Write> Observer for Live<'_, W, L> {
    fn on_token(&mut self, event: &TokenEvent) -> Flow {
        let data = DataFrame {
            id: self.id,
            tid: Some(event.id),
            gap: Some(event.gap),
            top: event.top.clone(),
            text: self.session.text.token_bytes(event.id),
        };
        self.session.send(&EngineFrame::Data(data));
        self.session.poll();
        self.session.flow(true)
    }

    fn on_progress(&mut self) -> Flow {
        let n = self.polls;
        self.polls += 1;
        self.session.poll();
        if self.cancel_at == Some(n) {
            if let Some(current) = self.session.current.as_mut() {
                current.cancel = true;
            }
        }
        self.session.flow(false)
    }
}

/// ERROR code for an engine failure of the frame `what` (e.g. `SUBMIT 7`).
fn rejection_for(what: &str, e: &EngineError) -> Rejection {
    let detail = format!("{what}: {e}");
    match e {
        EngineError::EmptyPrompt => Rejection::new(ErrorCode::EmptyPrompt, detail),
        EngineError::NoSuchSlot { .. } | EngineError::BadRequest(_) => Rejection::bad_request(detail),
        EngineError::ContextExceeded { used, limit } => {
            Rejection::new(ErrorCode::ContextExceeded { used: *used, limit: *limit }, String::new())
        }
        EngineError::Cancelled => Rejection::new(ErrorCode::Cancelled, String::new()),
        _ => Rejection::new(ErrorCode::Internal, detail),
    }
}

fn done_frame(id: u64, reply: &Reply) -> DoneFrame {
    let emitted = reply.tokens.len();
    let decode = reply.timings.decode.as_secs_f64();
    let tok_s = if decode > 0.0 { emitted as f64 / decode } else { 0.0 };
    let hit_pct = if reply.prompt_tokens > 0 { 100.0 * reply.reused as f64 / reply.prompt_tokens as f64 } else { 0.0 };
    DoneFrame {
        id,
        emitted,
        tok_s,
        hit_pct,
        rss_gb: rss_gb(),
        prompt_tokens: Some(reply.prompt_tokens),
        length_limited: Some(reply.stop == StopReason::Length),
        reused: Some(reply.reused),
    }
}

/// The `[PREFIX]` line for a finished request: the engine's own (it knows why it did or did not reuse); for an
/// engine that leaves it empty, the reuse count alone.
pub fn prefix_log_line(reply: &Reply) -> String {
    if !reply.prefix_log.is_empty() {
        return reply.prefix_log.clone();
    }
    let n = reply.prompt_tokens;
    if reply.reused > 0 {
        let pct = if n > 0 { 100.0 * reply.reused as f64 / n as f64 } else { 0.0 };
        format!("[PREFIX] reusing {} of {n} prompt tokens ({pct:.0}%)", reply.reused)
    } else {
        format!("[PREFIX] no reuse: prompt={n} (engine gave no reason)")
    }
}

/// Resident set size of this process in GB (0 where /proc is unavailable).
fn rss_gb() -> f64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0.0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb * 1024.0 / 1e9)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::StateDump;
    use crate::engine::Timings;
    use crate::fault::Fault;
    use std::time::Duration;

    /// How long a test waits for the serve loop before giving up.
    const TEST_WAIT: Duration = Duration::from_secs(10);

    /// An engine stand-in: echoes the prompt's last id `max_tokens` times, slowly; it remembers one prompt.
    struct Echo {
        record: Vec<u32>,
    }

    impl Engine for Echo {
        fn info(&self) -> EngineInfo {
            EngineInfo {
                arch: "echo".into(),
                preset: None,
                slots: 2,
                max_ctx: 32,
                vocab: crate::tokenizer::VOCAB,
                audio: false,
                audio_frame_bytes: 0,
                window: None,
                prompt_rows: None,
                initial_capacity: 8,
                fault: None,
                model_hash: "e".into(),
                cost: None,
            }
        }
        fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply, EngineError> {
            if req.prompt.len() > 32 {
                return Err(EngineError::ContextExceeded { used: req.prompt.len(), limit: 32 });
            }
            if observer.on_progress() == Flow::Cancel {
                return Err(EngineError::Cancelled);
            }
            let reused = if req.prompt.len() > self.record.len() && req.prompt.starts_with(&self.record) {
                self.record.len()
            } else {
                0
            };
            self.record = req.prompt.clone();
            let last = *req.prompt.last().ok_or(EngineError::EmptyPrompt)?;
            let mut tokens = Vec::new();
            let mut stop = StopReason::Length;
            for _ in 0..req.max_tokens {
                // Slow enough that every frame of a test input is read while the first request generates.
                std::thread::sleep(Duration::from_millis(20));
                tokens.push(last);
                match observer.on_token(&TokenEvent { id: last, gap: 0.5, top: vec![] }) {
                    Flow::Continue => {}
                    Flow::Stop => {
                        stop = StopReason::Stopped;
                        break;
                    }
                    Flow::Cancel => return Err(EngineError::Cancelled),
                }
            }
            Ok(Reply {
                gaps: vec![0.5; tokens.len()],
                tokens,
                reused,
                prompt_tokens: req.prompt.len(),
                timings: Timings::default(),
                stop,
                prefix_log: if reused > 0 { format!("[PREFIX] reusing {reused}") } else { String::new() },
            })
        }
        fn dump(&self, slot: usize) -> Result<StateDump, EngineError> {
            Err(EngineError::NoSuchSlot { slot, slots: 0 })
        }
        fn reset(&mut self) {
            self.record.clear();
        }
        fn fresh(&self) -> Box<dyn Engine> {
            Box::new(Echo { record: Vec::new() })
        }
        fn state_bytes(&self) -> usize {
            0
        }
        fn fault(&self) -> Option<Fault> {
            None
        }
    }

    fn run(input: &'static [u8], prefix_log: bool) -> (String, String) {
        let (done_tx, done_rx) = mpsc::channel();
        // A thread of its own, so a hung loop fails the test instead of hanging it.
        std::thread::spawn(move || {
            let mut engine = Echo { record: Vec::new() };
            let (mut out, mut log) = (Vec::new(), Vec::new());
            let options = ServeOptions { prefix_log, caps: vec![("reuse_rule".into(), "strict".into())] };
            let ok = serve(&mut engine, input, &mut out, &mut log, options).is_ok();
            let _ = done_tx.send((ok, out, log));
        });
        let (ok, out, log) = done_rx.recv_timeout(TEST_WAIT).expect("serve did not end");
        assert!(ok, "serve failed");
        (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&log).into_owned())
    }

    fn body(out: &str) -> String {
        // drop READY and CAPS; stats vary, so DONE is cut after the prompt/limited/reuse fields
        out.lines()
            .skip(2)
            .map(|l| match l.strip_prefix("DONE ") {
                Some(rest) => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    format!("DONE {} {} .. {}", f[0], f[2], f[6..].join(" "))
                }
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The body of the reply to `input`, served without a prefix log.
    fn served(input: &'static [u8]) -> String {
        body(&run(input, false).0)
    }

    #[test]
    fn ready_caps_then_answers() {
        let (out, _) = run(b"SUBMIT 1 0 2 2 0 1\nhi\n", false);
        assert!(out.starts_with("\x01\x01READY\x01\x01\nCAPS proto=1 arch=echo "), "{out}");
        assert_eq!(body(&out), "DATA 1 1 tid=105 gap=0.5\ni\nDATA 1 1 tid=105 gap=0.5\ni\nDONE 1 2 .. 2 1 0");
    }

    #[test]
    fn stop_and_cancel_of_queued_and_unknown_ids() {
        // everything below is read before the first request starts, so 2 and 3 are queued behind 1
        let body =
            served(b"SUBMIT 1 0 1 3 0 1\na\nSUBMIT 2 1 1 3 0 1\nb\nSUBMIT 3 1 1 3 0 1\nc\nSTOP 2\nCANCEL 3\nSTOP 9\n");
        assert!(body.contains("ERROR 3 CANCELLED"), "{body}");
        assert!(body.contains("ERROR 9 NOT_FOUND"), "{body}");
        assert!(body.contains("DONE 2 1 .."), "a STOP for a queued request stops at its first token: {body}");
        assert!(!body.contains("DONE 3"), "{body}");
    }

    #[test]
    fn duplicate_and_busy_while_queued() {
        let body = served(b"SUBMIT 1 0 1 2 0 1\na\nSUBMIT 1 1 1 2 0 1\nb\nSUBMIT 1 0 1 2 0 x\nb\n");
        assert_eq!(body.matches("ERROR 1 DUPLICATE_ID").count(), 2, "{body}");
        assert_eq!(body.matches("DONE 1").count(), 1, "{body}");
    }

    #[test]
    fn bad_frames_never_carry_an_in_flight_id() {
        let body = served(b"SUBMIT 1 0 1 3 0 1\na\nSTOP 1 now\nDUMP 1 0\nSUBMIT 1 0 1 2 0 1 x=1\nb\n");
        assert_eq!(body.matches("ERROR - BAD_FRAME").count(), 2, "{body}");
        assert_eq!(body.matches("ERROR 1 DUPLICATE_ID").count(), 1, "{body}");
        assert!(body.ends_with("DONE 1 3 .. 1 1 0"), "{body}");
    }

    #[test]
    fn engine_errors_map_to_codes() {
        let body = served(b"SUBMIT 1 0 33 2 0 1\n012345678901234567890123456789012\nDUMP 2 0 /nonexistent/x\n");
        assert!(body.contains("ERROR 1 CONTEXT_EXCEEDED 33 32"), "{body}");
        assert!(body.contains("ERROR 2 BAD_REQUEST"), "{body}");
    }

    #[test]
    fn echo_reset_and_cancel_at() {
        // slot 1 for the queued ones (a SUBMIT for the generating slot would be SLOT_BUSY)
        let body = served(
            b"SUBMIT 1 0 2 1 0 1\nab\nSUBMIT 2 1 3 1 0 1 echo=1\nabc\nRESET 3\n\
              SUBMIT 4 1 4 1 0 1 cancel_at=0 echo=1\nabcd\nSUBMIT 5 1 4 1 0 1 cancel_at=1\nabcd\n",
        );
        let want = [
            "DATA 1 1 tid=98 gap=0.5\nb\nDONE 1 1 .. 2 1 0",
            "PROMPT 2 8\n97 98 99\nDATA 2 1 tid=99 gap=0.5\nc\nDONE 2 1 .. 3 1 2",
            "CLEARED 3",
            // cancelled at its first poll, before anything was fed; PROMPT still comes first
            "PROMPT 4 12\n97 98 99 100\nERROR 4 CANCELLED",
            // the stand-in polls once: cancel_at=1 is never reached; the reset left nothing to reuse
            "DATA 5 1 tid=100 gap=0.5\nd\nDONE 5 1 .. 4 1 0",
        ];
        assert_eq!(body, want.join("\n"));
    }

    #[test]
    fn extra_caps_are_announced() {
        let (out, _) = run(b"", false);
        let caps = out.lines().nth(1).unwrap_or_default();
        assert!(caps.contains(" chat=1 echo=1 reset=1 cancel_at=1 "), "{caps}");
        assert!(caps.ends_with(" reuse_rule=strict"), "{caps}");
    }

    #[test]
    fn prefix_log_lines() {
        // slot 1 for the second: a SUBMIT for the generating slot would be SLOT_BUSY (the stand-in has one record)
        let (_, log) = run(b"SUBMIT 1 0 2 2 0 1\nab\nSUBMIT 2 1 3 2 0 1\nabc\n", true);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines, ["[PREFIX] no reuse: prompt=2 (engine gave no reason)", "[PREFIX] reusing 2"]);
    }
}
