//! A client for any process that speaks the serve protocol: spawn it, read READY + CAPS, submit requests and
//! collect their frames, with a per-request timeout that kills a hung engine and errors that carry the tail of
//! its stderr.
//!
//! Three threads per engine keep every call bounded by the timeout: one writes stdin (a full pipe never blocks
//! the caller), one parses stdout into frames, one keeps the last lines of stderr.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdout, Command as Process, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::chat::TextMessage;
use crate::engine::Flow;
use crate::engine::{NoObserver, Observer, Reply, Request, StopReason, Timings, TokenEvent};
use crate::serve::frame::{
    Caps, Command, DoneFrame, EngineFrame, EngineFrameReader, ErrorCode, ErrorFrame, SubmitFrame,
};
use crate::serve::request;
use crate::tokenizer::EOS;

/// How many stderr lines error reports carry.
pub const STDERR_TAIL_LINES: usize = 40;
/// Ids from here up are the client's own (DUMP tags, barriers); requests must use ids below it.
pub const CLIENT_IDS: u64 = 1 << 63;
/// How long to wait for CAPS after READY (engines that predate CAPS send none).
const CAPS_GRACE: Duration = Duration::from_secs(1);
/// Longest stderr line kept (longer lines are split).
const MAX_STDERR_LINE: u64 = 4096;
/// Frames parsed ahead of the caller. The stdout thread waits when the queue is full, so an engine that writes
/// faster than the harness reads fills its own pipe, not the harness's memory.
const FRAME_QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("empty engine command")]
    EmptyCommand,
    #[error("starting `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}`: no {waiting_for} within {after:?}; engine killed{}", tail(.stderr))]
    Timeout { command: String, waiting_for: String, after: Duration, stderr: String },
    #[error("`{command}` exited ({status}) while waiting for {waiting_for}{}", tail(.stderr))]
    Exited { command: String, status: String, waiting_for: String, stderr: String },
    #[error("`{command}`: protocol error while waiting for {waiting_for}: {message}; engine killed{}", tail(.stderr))]
    Protocol { command: String, waiting_for: String, message: String, stderr: String },
    /// The engine answered with an ERROR frame.
    #[error("engine answered {}", error_line(.frame))]
    Engine { frame: ErrorFrame },
    #[error("cannot send: {0}")]
    Request(String),
    #[error("`{command}` is no longer usable: {reason}")]
    Dead { command: String, reason: String },
}

impl ClientError {
    /// The ERROR code, when the engine answered with one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            ClientError::Engine { frame } => Some(&frame.code),
            _ => None,
        }
    }
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("\n--- engine stderr (last lines) ---\n{stderr}")
    }
}

fn error_line(frame: &ErrorFrame) -> String {
    String::from_utf8_lossy(&EngineFrame::Error(frame.clone()).to_bytes()).trim_end().to_string()
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientReply {
    pub id: u64,
    /// Token ids of the DATA frames that carried `tid=`.
    pub tokens: Vec<u32>,
    /// `gap=` of each DATA frame (NaN where absent).
    pub gaps: Vec<f32>,
    /// `top=` of each DATA frame.
    pub tops: Vec<Vec<(u32, f32)>>,
    /// The DATA texts, concatenated.
    pub text: Vec<u8>,
    /// Each DATA frame's text.
    pub pieces: Vec<Vec<u8>>,
    /// The prompt ids the engine fed, when it echoed them (`echo=1`: a PROMPT frame).
    pub prompt_ids: Option<Vec<u32>>,
    /// Every DATA frame carried `tid=` (else `tokens` is incomplete).
    pub ids_complete: bool,
    pub done: DoneFrame,
    /// A STOP/CANCEL this client sent arrived after the engine had finished (answered NOT_FOUND).
    pub late_interrupt: bool,
    /// Prompt length as sent (used when DONE omits it).
    pub prompt_len: usize,
    /// From sending SUBMIT to reading DONE.
    pub wall: Duration,
    /// The id that ends a reply: CAPS `eos=`, else the bundled byte tokenizer's.
    pub eos: u32,
}

impl ClientReply {
    /// The engine's reuse count, if its DONE carries one.
    pub fn reused(&self) -> Option<usize> {
        self.done.reused
    }

    /// As an engine `Reply`. `reused` is 0 when the engine does not report it: check [`ClientReply::reused`] (or
    /// CAPS `reuse=1`) before asserting on it.
    pub fn to_reply(&self) -> Result<Reply, ClientError> {
        if !self.ids_complete {
            return Err(ClientError::Request(format!(
                "request {}: the engine sent DATA without tid=, so the reply's token ids are unknown",
                self.id
            )));
        }
        let emitted = self.tokens.len() as f64;
        let decode = if self.done.tok_s > 0.0 {
            Duration::try_from_secs_f64(emitted / self.done.tok_s).unwrap_or(self.wall).min(self.wall)
        } else {
            Duration::ZERO
        };
        let stop = if self.done.length_limited == Some(true) {
            StopReason::Length
        } else if self.tokens.last() == Some(&self.eos) {
            StopReason::Eos
        } else {
            StopReason::Stopped
        };
        Ok(Reply {
            tokens: self.tokens.clone(),
            gaps: self.gaps.clone(),
            reused: self.done.reused.unwrap_or(0),
            prompt_tokens: self.done.prompt_tokens.unwrap_or(self.prompt_len),
            timings: Timings { prefill: self.wall.saturating_sub(decode), decode },
            stop,
            // The engine's line goes to its stderr (KVPROOF_PREFIX_LOG=1); it is not on the wire.
            prefix_log: String::new(),
        })
    }
}

/// Options of a SUBMIT beyond the request itself (each needs the engine to declare it in CAPS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitExtras {
    /// `echo=1`: the engine reports the prompt ids it fed (`ClientReply::prompt_ids`).
    pub echo: bool,
    /// `cancel_at=N`: the engine cancels the request at its N-th prefill poll.
    pub cancel_at: Option<usize>,
}

/// What the reader threads report.
enum Event {
    Frame(EngineFrame),
    Bad(String),
    Closed(Option<String>),
}

/// The last lines of the child's stderr.
#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
    /// The stderr thread has read to the end (every process holding the pipe has exited).
    closed: bool,
}

impl Tail {
    fn push(&mut self, line: String) {
        if self.lines.len() == STDERR_TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// The tail, shared with the thread that reads stderr; the condition variable signals its end.
#[derive(Debug, Default)]
struct SharedTail {
    tail: Mutex<Tail>,
    ended: Condvar,
}

impl SharedTail {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tail once stderr has ended, or as it stands after `grace`: an engine's last words (a panic message,
    /// a wrapper's note) are often written just before it dies, and the reader thread may not have them yet.
    fn settled(&self, grace: Duration) -> String {
        let guard = self.lock();
        let (tail, _) =
            self.ended.wait_timeout_while(guard, grace, |t| !t.closed).unwrap_or_else(PoisonError::into_inner);
        tail.lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

/// How long a dead engine's stderr may take to reach its end before the tail is taken as it is (a grandchild
/// that keeps the pipe open must not hold up the report).
const STDERR_SETTLE: Duration = Duration::from_secs(2);

/// An engine process driven over its stdin/stdout.
#[derive(Debug)]
pub struct StdioEngine {
    command: String,
    child: Child,
    /// Dropping it closes the child's stdin (EOF: graceful shutdown).
    writer: Option<Sender<Vec<u8>>>,
    events: Receiver<Event>,
    stderr: Arc<SharedTail>,
    caps: Caps,
    timeout: Duration,
    next_client_id: u64,
    /// Why the engine can no longer be used (killed after a timeout or protocol error, or exited).
    dead: Option<String>,
}

impl StdioEngine {
    /// Start `cmd` with extra `env`, wait for READY (and CAPS). `timeout` bounds start-up and each request.
    pub fn spawn(cmd: &[String], env: &[(String, String)], timeout: Duration) -> Result<Self, ClientError> {
        let (program, args) = cmd.split_first().ok_or(ClientError::EmptyCommand)?;
        let command = cmd.join(" ");
        let spawn_error = |source: io::Error| ClientError::Spawn { command: command.clone(), source };
        let mut child = Process::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            super::process_tree::kill_tree(&mut child);
            return Err(spawn_error(io::Error::other("child pipes missing")));
        };
        let tail = Arc::new(SharedTail::default());
        let (event_tx, events) = mpsc::sync_channel(FRAME_QUEUE);
        let (writer, write_rx) = mpsc::channel::<Vec<u8>>();
        let threads = start_threads(stdin, write_rx, stdout, event_tx, stderr, Arc::clone(&tail));
        let mut engine = StdioEngine {
            command,
            child,
            writer: Some(writer),
            events,
            stderr: tail,
            caps: Caps::default(),
            timeout,
            next_client_id: CLIENT_IDS,
            dead: None,
        };
        // From here on, Drop kills the child on any early return.
        threads.map_err(|e| ClientError::Spawn { command: engine.command.clone(), source: e })?;
        let deadline = Instant::now() + timeout;
        match engine.recv(deadline, "READY")? {
            EngineFrame::Ready => {}
            other => return Err(engine.protocol("READY", format!("first frame is {other:?}"))),
        }
        match engine.recv_until(Instant::now() + CAPS_GRACE.min(timeout), "CAPS")? {
            Some(EngineFrame::Caps(caps)) => engine.caps = caps,
            Some(other) => return Err(engine.protocol("CAPS", format!("unsolicited frame after READY: {other:?}"))),
            None => {}
        }
        Ok(engine)
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// The command line, for messages.
    pub fn command(&self) -> &str {
        &self.command
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether the engine can still be used.
    pub fn is_alive(&self) -> bool {
        self.dead.is_none()
    }

    /// The last lines the engine wrote on stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr.settled(Duration::ZERO)
    }

    /// Run one request to its end.
    pub fn submit(&mut self, req: &Request) -> Result<ClientReply, ClientError> {
        self.submit_observed(req, &mut NoObserver)
    }

    /// Run one request, showing each token to `observer`: `Flow::Stop` sends STOP, `Flow::Cancel` sends CANCEL
    /// (then the result is `Err` with code CANCELLED, unless the engine had already finished).
    pub fn submit_observed(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<ClientReply, ClientError> {
        self.submit_with(req, SubmitExtras::default(), observer)
    }

    /// Run one request with `extras` (`echo=1`, `cancel_at=N`), showing each token to `observer`.
    pub fn submit_with(
        &mut self,
        req: &Request,
        extras: SubmitExtras,
        observer: &mut dyn Observer,
    ) -> Result<ClientReply, ClientError> {
        let mut frame = request::to_frame(req).map_err(ClientError::Request)?;
        frame.echo = extras.echo;
        frame.cancel_at = extras.cancel_at;
        self.run_frame(frame, req.prompt.len(), observer)
    }

    /// Run a conversation given as text (`chat=1`): the engine renders it with its own template and tokenizer.
    /// With `echo`, the reply carries the prompt ids it fed.
    pub fn submit_chat(
        &mut self,
        id: u64,
        slot: usize,
        messages: &[TextMessage],
        max_tokens: usize,
        ignore_eos: bool,
        echo: bool,
    ) -> Result<ClientReply, ClientError> {
        let mut frame = request::chat_frame(id, slot, messages, max_tokens, ignore_eos);
        frame.echo = echo;
        self.run_frame(frame, 0, &mut NoObserver)
    }

    /// Forget every slot's state (RESET); returns once the engine answered CLEARED.
    pub fn reset(&mut self) -> Result<(), ClientError> {
        let id = self.client_id();
        let deadline = Instant::now() + self.timeout;
        self.send(&Command::Reset { id }.to_bytes())?;
        let waiting = format!("the answer to RESET {id}");
        match self.recv(deadline, &waiting)? {
            EngineFrame::Cleared { id: got } if got == id => Ok(()),
            EngineFrame::Error(e) if e.id == Some(id) => Err(ClientError::Engine { frame: e }),
            other => Err(self.protocol(&waiting, format!("unexpected frame {other:?}"))),
        }
    }

    /// Send one SUBMIT and collect its frames to DONE or ERROR (`prompt_len`: the prompt's length as sent, for
    /// a DONE that omits it).
    fn run_frame(
        &mut self,
        frame: SubmitFrame,
        prompt_len: usize,
        observer: &mut dyn Observer,
    ) -> Result<ClientReply, ClientError> {
        let (id, max_tokens) = (frame.id, frame.max_tokens);
        if id >= CLIENT_IDS {
            return Err(ClientError::Request(format!("request id {id} is in the client's reserved range")));
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        self.send(&Command::Submit(frame).to_bytes())?;
        let waiting = format!("the answer to SUBMIT {id}");
        let mut reply = ClientReply {
            id,
            tokens: Vec::new(),
            gaps: Vec::new(),
            tops: Vec::new(),
            text: Vec::new(),
            pieces: Vec::new(),
            prompt_ids: None,
            ids_complete: true,
            done: DoneFrame {
                id,
                emitted: 0,
                tok_s: 0.0,
                hit_pct: 0.0,
                rss_gb: 0.0,
                prompt_tokens: None,
                length_limited: None,
                reused: None,
            },
            late_interrupt: false,
            eos: self.caps.eos().unwrap_or(EOS),
            prompt_len,
            wall: Duration::ZERO,
        };
        let mut interrupted = false;
        let end = loop {
            match self.recv(deadline, &waiting)? {
                EngineFrame::Prompt(p) if p.id == id && reply.prompt_ids.is_none() && reply.pieces.is_empty() => {
                    reply.prompt_len = p.ids.len();
                    reply.prompt_ids = Some(p.ids);
                }
                EngineFrame::Data(d) if d.id == id => {
                    // Past max_tokens the engine breaks the protocol; stopping here also bounds what one reply
                    // holds, whatever the engine goes on sending.
                    if reply.pieces.len() >= max_tokens {
                        let message = format!(
                            "DATA frame {} for request {id} exceeds the request's max_tokens {max_tokens}",
                            reply.pieces.len() + 1
                        );
                        return Err(self.protocol(&waiting, message));
                    }
                    match d.tid {
                        Some(tid) => reply.tokens.push(tid),
                        None => reply.ids_complete = false,
                    }
                    reply.gaps.push(d.gap.unwrap_or(f32::NAN));
                    reply.tops.push(d.top.clone());
                    reply.text.extend_from_slice(&d.text);
                    reply.pieces.push(d.text.clone());
                    if !interrupted {
                        let event =
                            TokenEvent { id: d.tid.unwrap_or(u32::MAX), gap: d.gap.unwrap_or(f32::NAN), top: d.top };
                        let command = match observer.on_token(&event) {
                            Flow::Continue => None,
                            Flow::Stop => Some(Command::Stop { id }),
                            Flow::Cancel => Some(Command::Cancel { id }),
                        };
                        if let Some(command) = command {
                            self.send(&command.to_bytes())?;
                            interrupted = true;
                        }
                    }
                }
                EngineFrame::Done(d) if d.id == id => break Ok(d),
                EngineFrame::Error(e) if e.id == Some(id) => break Err(e),
                other => return Err(self.protocol(&waiting, format!("unexpected frame {other:?}"))),
            }
        };
        reply.wall = start.elapsed();
        if interrupted {
            reply.late_interrupt = self.barrier(id, deadline)?;
        }
        match end {
            Ok(done) => {
                reply.done = done;
                Ok(reply)
            }
            Err(frame) => Err(ClientError::Engine { frame }),
        }
    }

    /// Write the slot's state dump to `path` (as the engine sees it); returns the file's size.
    pub fn dump(&mut self, slot: usize, path: &str) -> Result<u64, ClientError> {
        if path.is_empty() || path.trim() != path || path.contains(['\n', '\r']) {
            return Err(ClientError::Request(format!("DUMP path {path:?} must be one line without outer spaces")));
        }
        let id = self.client_id();
        let deadline = Instant::now() + self.timeout;
        self.send(&Command::Dump { id, slot, path: path.to_string() }.to_bytes())?;
        let waiting = format!("the answer to DUMP {id}");
        match self.recv(deadline, &waiting)? {
            EngineFrame::Dumped(d) if d.id == id => Ok(d.bytes),
            EngineFrame::Error(e) if e.id == Some(id) => Err(ClientError::Engine { frame: e }),
            other => Err(self.protocol(&waiting, format!("unexpected frame {other:?}"))),
        }
    }

    /// Send `STOP <id>` (for use with [`StdioEngine::send_raw`] / [`StdioEngine::next_frame`]).
    pub fn stop(&mut self, id: u64) -> Result<(), ClientError> {
        self.send(&Command::Stop { id }.to_bytes())
    }

    /// Send `CANCEL <id>` (for use with [`StdioEngine::send_raw`] / [`StdioEngine::next_frame`]).
    pub fn cancel(&mut self, id: u64) -> Result<(), ClientError> {
        self.send(&Command::Cancel { id }.to_bytes())
    }

    /// Send bytes as they are (tests, fuzzing, hand-made frames).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.send(bytes)
    }

    /// The next frame; kills the engine if none comes within `timeout`.
    pub fn next_frame(&mut self, timeout: Duration) -> Result<EngineFrame, ClientError> {
        self.recv(Instant::now() + timeout, "the next frame")
    }

    /// The next frame, or `None` if none comes within `timeout` (the engine is left running).
    pub fn poll_frame(&mut self, timeout: Duration) -> Result<Option<EngineFrame>, ClientError> {
        loop {
            match self.recv_until(Instant::now() + timeout, "the next frame")? {
                Some(EngineFrame::Caps(caps)) => self.caps = caps,
                other => return Ok(other),
            }
        }
    }

    /// Close stdin (EOF: the engine finishes what it has read and exits) and wait for the exit status;
    /// kills the engine if it does not exit within the timeout.
    pub fn shutdown(mut self) -> Result<ExitStatus, ClientError> {
        self.writer = None;
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() >= deadline => return Err(self.timed_out("exit after EOF")),
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    return Err(ClientError::Exited {
                        command: self.command.clone(),
                        status: format!("unknown: {e}"),
                        waiting_for: "exit after EOF".into(),
                        stderr: self.stderr_tail(),
                    })
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------------------------

    fn client_id(&mut self) -> u64 {
        self.next_client_id = self.next_client_id.wrapping_add(1).max(CLIENT_IDS);
        self.next_client_id
    }

    fn alive(&self) -> Result<(), ClientError> {
        match &self.dead {
            Some(reason) => Err(ClientError::Dead { command: self.command.clone(), reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.alive()?;
        let sent = self.writer.as_ref().is_some_and(|w| w.send(bytes.to_vec()).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.exited("stdin to accept a frame", None))
        }
    }

    /// Everything the engine says after a STOP/CANCEL we sent has been read once our barrier (a STOP for a fresh
    /// client id, always answered NOT_FOUND, in order) comes back. Returns whether our interrupt came too late.
    fn barrier(&mut self, id: u64, deadline: Instant) -> Result<bool, ClientError> {
        let barrier = self.client_id();
        self.send(&Command::Stop { id: barrier }.to_bytes())?;
        let waiting = format!("the barrier after interrupting {id}");
        let mut late = false;
        loop {
            match self.recv(deadline, &waiting)? {
                EngineFrame::Error(e) if e.code == ErrorCode::NotFound && e.id == Some(barrier) => return Ok(late),
                EngineFrame::Error(e) if e.code == ErrorCode::NotFound && e.id == Some(id) => late = true,
                other => return Err(self.protocol(&waiting, format!("unexpected frame {other:?}"))),
            }
        }
    }

    /// The next frame (CAPS is absorbed); a timeout kills the engine.
    fn recv(&mut self, deadline: Instant, waiting_for: &str) -> Result<EngineFrame, ClientError> {
        loop {
            match self.recv_until(deadline, waiting_for)? {
                Some(EngineFrame::Caps(caps)) => self.caps = caps,
                Some(frame) => return Ok(frame),
                None => return Err(self.timed_out(waiting_for)),
            }
        }
    }

    /// The next frame, or `None` at the deadline.
    fn recv_until(&mut self, deadline: Instant, waiting_for: &str) -> Result<Option<EngineFrame>, ClientError> {
        self.alive()?;
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(Event::Frame(frame)) => Ok(Some(frame)),
            Ok(Event::Bad(message)) => Err(self.protocol(waiting_for, message)),
            Ok(Event::Closed(error)) => Err(self.exited(waiting_for, error)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(self.exited(waiting_for, None)),
        }
    }

    /// Kills the engine and every process it started (a wrapper's child too), then it is dead.
    fn kill(&mut self, reason: String) {
        super::process_tree::kill_tree(&mut self.child);
        self.writer = None;
        self.dead = Some(reason);
    }

    fn timed_out(&mut self, waiting_for: &str) -> ClientError {
        self.kill(format!("killed after no {waiting_for} within {:?}", self.timeout));
        ClientError::Timeout {
            command: self.command.clone(),
            waiting_for: waiting_for.to_string(),
            after: self.timeout,
            stderr: self.stderr.settled(STDERR_SETTLE),
        }
    }

    fn protocol(&mut self, waiting_for: &str, message: String) -> ClientError {
        self.kill(format!("killed after a protocol error: {message}"));
        ClientError::Protocol {
            command: self.command.clone(),
            waiting_for: waiting_for.to_string(),
            message,
            stderr: self.stderr.settled(STDERR_SETTLE),
        }
    }

    /// The engine closed its stdout: collect its exit status (briefly), then it is dead.
    fn exited(&mut self, waiting_for: &str, error: Option<String>) -> ClientError {
        let deadline = Instant::now() + Duration::from_secs(2);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => break "closed stdout, still running: killed".to_string(),
                Err(e) => break format!("status unknown: {e}"),
            }
        };
        let status = match error {
            Some(e) => format!("{status}; reading stdout: {e}"),
            None => status,
        };
        self.kill(format!("exited ({status})"));
        ClientError::Exited {
            command: self.command.clone(),
            status,
            waiting_for: waiting_for.to_string(),
            stderr: self.stderr.settled(STDERR_SETTLE),
        }
    }
}

impl Drop for StdioEngine {
    fn drop(&mut self) {
        self.writer = None;
        super::process_tree::kill_tree(&mut self.child);
    }
}

fn start_threads(
    mut stdin: std::process::ChildStdin,
    write_rx: Receiver<Vec<u8>>,
    stdout: ChildStdout,
    event_tx: SyncSender<Event>,
    stderr: ChildStderr,
    tail: Arc<SharedTail>,
) -> io::Result<()> {
    let noise_tail = Arc::clone(&tail);
    std::thread::Builder::new().name("engine-stdin".into()).spawn(move || {
        // Ends when the client drops its sender (EOF for the engine) or the pipe breaks.
        for bytes in write_rx {
            if stdin.write_all(&bytes).and_then(|()| stdin.flush()).is_err() {
                return;
            }
        }
    })?;
    std::thread::Builder::new()
        .name("engine-stdout".into())
        .spawn(move || read_stdout(stdout, event_tx, noise_tail))?;
    std::thread::Builder::new().name("engine-stderr".into()).spawn(move || read_stderr(stderr, tail))?;
    Ok(())
}

/// Parse stdout into events. Anything before READY is noise (banners): kept in the stderr tail, not reported.
fn read_stdout(stdout: ChildStdout, tx: SyncSender<Event>, tail: Arc<SharedTail>) {
    let mut reader = EngineFrameReader::new(BufReader::new(stdout));
    let mut ready = false;
    loop {
        let event = match reader.next_frame() {
            Ok(Some(Ok(frame))) => {
                if frame == EngineFrame::Ready {
                    ready = true;
                } else if !ready {
                    continue;
                }
                Event::Frame(frame)
            }
            Ok(Some(Err(e))) if !ready => {
                tail.lock().push(format!("[stdout before READY] {}", e.line));
                continue;
            }
            Ok(Some(Err(e))) => Event::Bad(e.to_string()),
            Ok(None) => Event::Closed(None),
            Err(e) => Event::Closed(Some(e.to_string())),
        };
        // After a frame that does not parse the stream is out of step: nothing more of it is read.
        let last = matches!(event, Event::Closed(_) | Event::Bad(_));
        if tx.send(event).is_err() || last {
            return;
        }
    }
}

fn read_stderr(stderr: ChildStderr, tail: Arc<SharedTail>) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.by_ref().take(MAX_STDERR_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => {
                tail.lock().closed = true;
                tail.ended.notify_all();
                return;
            }
            Ok(_) => {
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                tail.lock().push(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn empty_command_is_an_error() {
        assert!(matches!(StdioEngine::spawn(&[], &[], Duration::from_secs(1)), Err(ClientError::EmptyCommand)));
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let cmd = vec!["/nonexistent/kvproof-engine".to_string()];
        assert!(matches!(StdioEngine::spawn(&cmd, &[], Duration::from_secs(1)), Err(ClientError::Spawn { .. })));
    }

    #[test]
    fn banner_then_ready_without_caps() {
        // an older engine: a banner, the marker, no CAPS; it answers one request with the 7-field DONE
        let script = r#"echo banner; printf '\001\001READY\001\001\n'; echo oops >&2; read -r h; read -r p;
            printf 'DATA 1 1 tid=104\nh\nDONE 1 STAT 1 5.0 0.0 0.01\n'; read -r x"#;
        let mut e = StdioEngine::spawn(&sh(script), &[], Duration::from_secs(5)).expect("spawn");
        assert!(e.caps().entries.is_empty());
        let req = Request { id: 1, prompt: vec![104], max_tokens: 1, ..Request::default() };
        let reply = e.submit(&req).expect("reply");
        assert_eq!(reply.tokens, vec![104]);
        assert_eq!(reply.reused(), None);
        assert!(reply.gaps[0].is_nan());
        let as_reply = reply.to_reply().expect("ids complete");
        assert_eq!(as_reply.prompt_tokens, 1);
        assert!(e.stderr_tail().contains("banner"), "{}", e.stderr_tail());
    }

    #[test]
    fn timeout_kills_and_reports_stderr() {
        let script = r#"printf '\001\001READY\001\001\nCAPS ids=1\n'; echo 'stuck here' >&2; sleep 30"#;
        let mut e = StdioEngine::spawn(&sh(script), &[], Duration::from_millis(300)).expect("spawn");
        assert!(e.caps().ids());
        let req = Request { id: 1, prompt: vec![1], max_tokens: 1, ..Request::default() };
        let err = e.submit(&req).expect_err("must time out");
        assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("stuck here"), "{err}");
        assert!(!e.is_alive());
        assert!(matches!(e.submit(&req), Err(ClientError::Dead { .. })));
    }

    /// A wrapper (a shell that starts the engine as its child) that hangs: the timeout kills the process the
    /// wrapper started too, so it does not run on after the harness gave up on it.
    #[cfg(target_os = "linux")]
    #[test]
    fn timeout_kills_what_the_engine_started() {
        let pidfile = std::env::temp_dir().join(format!("kvproof-client-grandchild-{}", std::process::id()));
        let script = format!(
            r#"sleep 300 & echo $! > {}; printf '\001\001READY\001\001\nCAPS ids=1\n'; wait"#,
            pidfile.display()
        );
        let mut e = StdioEngine::spawn(&sh(&script), &[], Duration::from_millis(300)).expect("spawn");
        let req = Request { id: 1, prompt: vec![1], max_tokens: 1, ..Request::default() };
        let err = e.submit(&req).expect_err("must time out");
        assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
        let pid = std::fs::read_to_string(&pidfile).expect("the wrapper wrote its child's pid");
        let _ = std::fs::remove_file(&pidfile);
        let pid: u32 = pid.trim().parse().expect("a pid");
        assert!(crate::serve::process_tree::ends(pid), "the engine's child {pid} outlived the timeout");
    }

    #[test]
    fn exit_is_reported_with_status() {
        let script = r#"printf '\001\001READY\001\001\nCAPS\n'; echo 'bye' >&2; exit 3"#;
        let mut e = StdioEngine::spawn(&sh(script), &[], Duration::from_secs(5)).expect("spawn");
        let req = Request { id: 1, prompt: vec![1], max_tokens: 1, ..Request::default() };
        let err = e.submit(&req).expect_err("exited");
        assert!(matches!(err, ClientError::Exited { .. }), "{err}");
        assert!(err.to_string().contains('3'), "{err}");
    }

    #[test]
    fn last_words_written_after_stdout_closed_reach_the_error() {
        // the engine's process leaves at once; a process it leaves behind writes the reason a moment later and
        // then closes stderr (a wrapper's note, a panic hook flushing late): the tail waits for stderr's end
        let script = r#"printf '\001\001READY\001\001\nCAPS\n'; read -r h; exec 1>&-;
            (sleep 0.3; echo 'out of memory in layer 7' >&2) & exit 1"#;
        let mut e = StdioEngine::spawn(&sh(script), &[], Duration::from_secs(5)).expect("spawn");
        let req = Request { id: 1, prompt: vec![1], max_tokens: 1, ..Request::default() };
        let err = e.submit(&req).expect_err("exited");
        let ClientError::Exited { stderr, .. } = &err else { panic!("not an exit: {err}") };
        assert_eq!(stderr, "out of memory in layer 7", "{err}");
    }

    #[test]
    fn garbage_after_ready_is_a_protocol_error() {
        let script = r#"printf '\001\001READY\001\001\nCAPS\nhello\n'; sleep 5"#;
        let mut e = StdioEngine::spawn(&sh(script), &[], Duration::from_secs(5)).expect("spawn");
        let err = e.next_frame(Duration::from_secs(5)).expect_err("garbage");
        assert!(matches!(err, ClientError::Protocol { .. }), "{err}");
    }
}
