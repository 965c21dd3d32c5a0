//! A connection to the engine under test that trusts nothing: stdout is cut into frames by their own syntax (a
//! header line, and the counted body of DATA and PROMPT), each kept with its raw text so a violation can show the
//! frame that revealed it, and parsed by the protocol's reference reader. Unlike the harness's client, nothing here
//! kills the engine on a bad frame: the check goes on and reports it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Cursor, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvproof_engines::serve::frame::{EngineFrameReader, MAX_HEADER, MAX_PAYLOAD, READY};
use kvproof_engines::serve::process_tree::kill_tree;
use kvproof_engines::serve::EngineFrame;

/// Lines of stderr kept for messages.
const STDERR_LINES: usize = 20;

/// One frame as the engine wrote it.
#[derive(Debug, Clone)]
pub struct Got {
    /// The header line and, for DATA and PROMPT, the body, escaped for display.
    pub raw: String,
    /// What the reference reader makes of it (`Err`: why it is not a frame).
    pub frame: Result<EngineFrame, String>,
    /// When it arrived.
    pub at: Instant,
}

impl Got {
    /// The request id the frame answers, when it parsed and has one.
    pub fn id(&self) -> Option<u64> {
        self.frame.as_ref().ok().and_then(EngineFrame::id)
    }
}

enum Event {
    Frame(Got),
    Closed,
}

/// The engine process and its frames.
pub struct Conn {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Event>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    closed: bool,
    /// Frames put back by a reader that looked ahead.
    pushed: VecDeque<Got>,
}

/// Bytes shown as text: printable ASCII as is, anything else escaped, cut to a readable length.
pub fn show(bytes: &[u8]) -> String {
    const MAX: usize = 160;
    let mut s = String::new();
    for &b in bytes.iter().take(MAX) {
        match b {
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            b'\n' => s.push_str("\\n"),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if bytes.len() > MAX {
        s.push_str(&format!("...({} bytes)", bytes.len()));
    }
    s
}

impl Conn {
    pub fn spawn(command: &[String]) -> std::io::Result<Conn> {
        let (program, args) = command.split_first().ok_or_else(|| std::io::Error::other("empty command"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_tree(&mut child);
            return Err(std::io::Error::other("child pipes missing"));
        };
        let (tx, events) = mpsc::channel();
        std::thread::Builder::new().name("conformance-stdout".into()).spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut pending: Option<Vec<u8>> = None;
            loop {
                let got = match next_raw(&mut reader, &mut pending) {
                    Some(got) => Event::Frame(got),
                    None => Event::Closed,
                };
                let last = matches!(got, Event::Closed);
                if tx.send(got).is_err() || last {
                    return;
                }
            }
        })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let keep = Arc::clone(&tail);
        std::thread::Builder::new().name("conformance-stderr".into()).spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.by_ref().take(4096).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let mut t = keep.lock().unwrap_or_else(PoisonError::into_inner);
                        if t.len() == STDERR_LINES {
                            t.pop_front();
                        }
                        t.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
                    }
                }
            }
        })?;
        Ok(Conn { child, stdin: Some(stdin), events, stderr: tail, closed: false, pushed: VecDeque::new() })
    }

    /// Write bytes to the engine; `false` when its stdin is closed.
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        match self.stdin.as_mut() {
            Some(s) => s.write_all(bytes).and_then(|()| s.flush()).is_ok(),
            None => false,
        }
    }

    /// The next frame, or `None` when none comes by `deadline` or the engine closed its stdout.
    pub fn next(&mut self, deadline: Instant) -> Option<Got> {
        if let Some(g) = self.pushed.pop_front() {
            return Some(g);
        }
        if self.closed {
            return None;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(Event::Frame(g)) => Some(g),
            Ok(Event::Closed) | Err(RecvTimeoutError::Disconnected) => {
                self.closed = true;
                None
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// Put a frame back: the next `next` returns it.
    pub fn push_back(&mut self, got: Got) {
        self.pushed.push_front(got);
    }

    /// Whether the engine closed its stdout.
    pub fn is_closed(&self) -> bool {
        self.closed && self.pushed.is_empty()
    }

    /// Every frame that arrives within `wait` (stops early when the stream closes).
    pub fn drain(&mut self, wait: Duration) -> Vec<Got> {
        let deadline = Instant::now() + wait;
        std::iter::from_fn(|| self.next(deadline)).collect()
    }

    /// The last lines the engine wrote on stderr.
    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Close stdin (EOF) and wait up to `wait` for the exit status; frames written meanwhile are returned too.
    pub fn close(&mut self, wait: Duration) -> (Option<ExitStatus>, Vec<Got>) {
        self.stdin = None;
        let deadline = Instant::now() + wait;
        let mut frames = Vec::new();
        while let Some(g) = self.next(deadline) {
            frames.push(g);
        }
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return (Some(status), frames),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => return (None, frames),
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stdin = None;
        kill_tree(&mut self.child);
    }
}

/// One line without its newline (and a `\r` before it); `None` at the end of the stream.
fn read_line<R: BufRead>(r: &mut R) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(MAX_HEADER as u64 + 1).read_until(b'\n', &mut buf).ok()?;
    if n == 0 {
        return None;
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Some(buf)
}

/// The next frame's bytes from the engine's stdout, cut by the protocol's own syntax; `None` at the end.
fn next_raw<R: BufRead>(r: &mut R, pending: &mut Option<Vec<u8>>) -> Option<Got> {
    let line = match pending.take() {
        Some(l) => l,
        None => read_line(r)?,
    };
    if let Some(at) = line.windows(READY.len()).position(|w| w == READY) {
        if at > 0 {
            // text before the marker is noise on stdout; the marker is read next
            *pending = Some(line[at..].to_vec());
            let raw = show(&line[..at]);
            return Some(Got { frame: Err("not a frame".into()), raw, at: Instant::now() });
        }
        let rest = &line[READY.len()..];
        if !rest.is_empty() {
            *pending = Some(rest.to_vec());
        }
        return Some(Got { raw: show(READY), frame: Ok(EngineFrame::Ready), at: Instant::now() });
    }
    let mut bytes = line.clone();
    bytes.push(b'\n');
    let fields: Vec<&[u8]> = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).collect();
    let counted = matches!(fields.first(), Some(&b"DATA") | Some(&b"PROMPT"));
    let mut raw = show(&line);
    if counted {
        let n = fields.get(2).and_then(|f| std::str::from_utf8(f).ok()).and_then(|f| f.parse::<usize>().ok());
        if let Some(n) = n.filter(|&n| n <= MAX_PAYLOAD) {
            let mut body = Vec::new();
            let _ = r.by_ref().take(n as u64 + 1).read_to_end(&mut body);
            raw.push_str(&format!(" | {}", show(&body)));
            bytes.extend_from_slice(&body);
        }
    }
    let mut reader = EngineFrameReader::new(Cursor::new(bytes));
    let frame = match reader.next_frame() {
        Ok(Some(Ok(f))) => Ok(f),
        Ok(Some(Err(e))) => Err(e.message),
        Ok(None) | Err(_) => Err("an empty frame".into()),
    };
    Some(Got { raw, frame, at: Instant::now() })
}
