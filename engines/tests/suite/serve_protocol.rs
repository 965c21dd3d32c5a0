//! The serve protocol, frame by frame, against the real `kvproof-engine` binary (inkling, tiny preset, seed 0).
//!
//! Byte-level checks read the child's stdout with a small reader of their own (not the crate's frame parser);
//! conversation-level checks go through `StdioEngine`, which exercises the client too.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use kvproof_engines::chat::{self, Message, Role};
use kvproof_engines::engine::{Flow, Observer, Request, Sampling, TokenEvent};
use kvproof_engines::serve::{ClientReply, ErrorCode, StdioEngine};
use kvproof_engines::tokenizer::{Tokenizer, AUDIO, EOS, ROLE_ASSISTANT, ROLE_USER};

const BIN: &str = env!("CARGO_BIN_EXE_kvproof-engine");
const TIMEOUT: Duration = Duration::from_secs(60);

fn engine_args() -> Vec<String> {
    [BIN, "--arch", "inkling", "--preset", "tiny", "--seed", "0"].iter().map(|s| s.to_string()).collect()
}

fn spawn() -> StdioEngine {
    StdioEngine::spawn(&engine_args(), &[], TIMEOUT).expect("engine starts")
}

fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Turn 1 of the conversations below.
fn first_prompt() -> Vec<u32> {
    chat::render(&[Message::new(Role::System, text("be brief")), Message::new(Role::User, text("hello there"))], true)
}

/// The next turn after `prompt` + `reply`: the reply closed with eos, a user message, the assistant marker —
/// what the chat template renders for the grown transcript.
fn next_prompt(prompt: &[u32], reply: &[u32], user: &str) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    ids.extend_from_slice(reply);
    if reply.last() != Some(&EOS) {
        ids.push(EOS);
    }
    ids.push(ROLE_USER);
    ids.extend(text(user));
    ids.push(EOS);
    ids.push(ROLE_ASSISTANT);
    ids
}

fn request(id: u64, prompt: &[u32], max_tokens: usize) -> Request {
    Request { id, slot: 0, prompt: prompt.to_vec(), max_tokens, sampling: Sampling::default(), ..Request::default() }
}

/// The reply a freshly started engine gives to `prompt` alone.
fn cold(prompt: &[u32], max_tokens: usize) -> ClientReply {
    let mut e = spawn();
    let reply = e.submit(&request(1, prompt, max_tokens)).expect("cold reply");
    assert_eq!(reply.reused(), Some(0), "a fresh engine has nothing to reuse");
    let status = e.shutdown().expect("exits");
    assert!(status.success());
    reply
}

// -----------------------------------------------------------------------------------------------------------------
// A raw view of the child: bytes exactly as written.

struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Receiver<Vec<u8>>,
    buf: Vec<u8>,
}

impl Raw {
    fn spawn(env: &[(&str, &str)]) -> Raw {
        let mut cmd = Command::new(BIN);
        cmd.args(&engine_args()[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.env_remove("KVPROOF_PREFIX_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn engine");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, out) = mpsc::channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut chunk) {
                if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        Raw { child, stdin, out, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).and_then(|()| stdin.flush()).expect("write to engine");
    }

    fn fill(&mut self, want: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !want(&self.buf) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(chunk) => self.buf.extend(chunk),
                Err(e) => panic!("engine output stopped ({e:?}); have {:?}", String::from_utf8_lossy(&self.buf)),
            }
        }
    }

    /// One line, without its newline.
    fn line(&mut self) -> Vec<u8> {
        self.fill(|b| b.contains(&b'\n'));
        let at = self.buf.iter().position(|&b| b == b'\n').expect("newline");
        let line = self.buf[..at].to_vec();
        self.buf.drain(..=at);
        line
    }

    fn line_str(&mut self) -> String {
        String::from_utf8(self.line()).expect("header lines are UTF-8")
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        self.fill(|b| b.len() >= n);
        self.buf.drain(..n).collect()
    }

    /// READY and CAPS; returns the CAPS line.
    fn start(&mut self) -> String {
        assert_eq!(self.line(), b"\x01\x01READY\x01\x01");
        let caps = self.line_str();
        assert!(caps.starts_with("CAPS "), "{caps}");
        caps
    }

    /// The next frame: its header and, for DATA and PROMPT, its counted body (checked to end in a newline).
    fn frame(&mut self) -> (String, Option<Vec<u8>>) {
        let header = self.line_str();
        if header.starts_with("DATA ") || header.starts_with("PROMPT ") {
            let n: usize = header.split(' ').nth(2).and_then(|n| n.parse().ok()).expect("DATA/PROMPT <n>");
            let text = self.bytes(n);
            assert_eq!(self.bytes(1), b"\n", "a counted body must be followed by a newline");
            return (header, Some(text));
        }
        (header, None)
    }

    /// Frames until the one for which `last` holds (inclusive).
    fn frames_until(&mut self, last: impl Fn(&str) -> bool) -> Vec<(String, Option<Vec<u8>>)> {
        let mut frames = Vec::new();
        loop {
            let f = self.frame();
            let end = last(&f.0);
            frames.push(f);
            if end {
                return frames;
            }
        }
    }

    /// Close stdin and wait for the exit; returns the status and everything written on stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        self.stdin = None;
        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "engine did not exit after EOF");
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut stderr = String::new();
        self.child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
        (status, stderr)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn caps_value<'a>(caps: &'a str, key: &str) -> &'a str {
    caps.split(' ').find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('='))).unwrap_or_else(|| {
        panic!("CAPS has no {key}: {caps}");
    })
}

fn submit_ids(id: u64, ids: &[u32], max_tokens: usize, extra: &str) -> Vec<u8> {
    let payload = ids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
    format!("SUBMIT {id} 0 {} {max_tokens} 0 1 ids=1{extra}\n{payload}\n", payload.len()).into_bytes()
}

// -----------------------------------------------------------------------------------------------------------------

#[test]
fn ready_then_caps() {
    let mut raw = Raw::spawn(&[]);
    let caps = raw.start();
    assert_eq!(caps_value(&caps, "arch"), "inkling");
    assert_eq!(caps_value(&caps, "preset"), "tiny");
    assert_eq!(caps_value(&caps, "proto"), "1");
    for flag in ["ids", "dump", "reuse", "stop", "cancel", "logprobs"] {
        assert_eq!(caps_value(&caps, flag), "1", "{flag}");
    }
    assert_eq!(caps_value(&caps, "vocab"), Tokenizer.vocab().to_string());
    assert_eq!(caps_value(&caps, "fault"), "none");
    for key in ["slots", "max_ctx", "initial_capacity", "audio_frame"] {
        assert!(caps_value(&caps, key).parse::<usize>().is_ok(), "{key} in {caps}");
    }
    assert!(["0", "1"].contains(&caps_value(&caps, "audio")));
    assert!(!caps_value(&caps, "model").is_empty());
    let (status, _) = raw.finish();
    assert!(status.success(), "EOF while idle exits 0: {status}");
}

#[test]
fn text_and_ids_payloads_give_identical_frames() {
    let mut raw = Raw::spawn(&[]);
    raw.start();
    let prompt = "<|bos|><|user|>hello<|eos|><|assistant|>";
    raw.send(format!("SUBMIT 1 0 {} 12 0 1\n{prompt}\n", prompt.len()).as_bytes());
    let by_text = raw.frames_until(|h| h.starts_with("DONE 1 "));
    let ids = Tokenizer.encode(prompt.as_bytes());
    assert_eq!(ids.len(), 9);
    // the same prompt again: shorter than the record, so nothing is reused and the frames must be identical
    raw.send(&submit_ids(1, &ids, 12, ""));
    let by_ids = raw.frames_until(|h| h.starts_with("DONE 1 "));

    for frames in [&by_text, &by_ids] {
        let (data, done) = frames.split_at(frames.len() - 1);
        assert!(!data.is_empty());
        for (header, body) in data {
            // DATA <id> <n> tid=<t> gap=<g>
            let f: Vec<&str> = header.split(' ').collect();
            assert_eq!(f.len(), 5, "{header}");
            assert_eq!(f[0..2], ["DATA", "1"]);
            let tid: u32 = f[3].strip_prefix("tid=").and_then(|t| t.parse().ok()).expect("tid");
            let gap: f32 = f[4].strip_prefix("gap=").and_then(|g| g.parse().ok()).expect("gap");
            assert!(gap >= 0.0, "top-1 minus top-2 is never negative: {header}");
            let body = body.as_ref().expect("DATA text");
            assert_eq!(f[2], body.len().to_string());
            assert_eq!(body, &Tokenizer.token_bytes(tid));
        }
        // DONE <id> STAT <emitted> <tok_s> <hit_pct> <rss_gb> <prompt_tokens> <length_limited> <prefix_reused>
        let f: Vec<&str> = done[0].0.split(' ').collect();
        assert_eq!(f.len(), 10, "{}", done[0].0);
        assert_eq!(f[2], "STAT");
        assert_eq!(f[3], data.len().to_string(), "one DATA per emitted token");
        assert!(f[4].parse::<f64>().is_ok() && f[6].parse::<f64>().is_ok());
        assert_eq!(f[5], "0.0");
        assert_eq!(f[7], "9");
        let last_eos = data.last().is_some_and(|(h, _)| h.contains(&format!("tid={EOS} ")));
        assert_eq!(f[8], if data.len() == 12 && !last_eos { "1" } else { "0" }, "length_limited");
        assert_eq!(f[9], "0");
    }
    let data = |frames: &[(String, Option<Vec<u8>>)]| frames[..frames.len() - 1].to_vec();
    assert_eq!(data(&by_text), data(&by_ids));
    let (status, _) = raw.finish();
    assert!(status.success());
}

#[test]
fn second_turn_reuses_prompt_and_reply_and_matches_a_fresh_engine() {
    let mut e = spawn();
    let p1 = first_prompt();
    let r1 = e.submit(&request(1, &p1, 12)).expect("turn 1");
    assert_eq!(r1.reused(), Some(0));
    assert_eq!(r1.done.prompt_tokens, Some(p1.len()));

    let p2 = next_prompt(&p1, &r1.tokens, "and more");
    let r2 = e.submit(&request(2, &p2, 12)).expect("turn 2");
    // everything fed so far: the prompt and every reply token but the last (emitted, never fed)
    assert_eq!(r2.reused(), Some(p1.len() + r1.tokens.len() - 1));
    let pct = 100.0 * (p1.len() + r1.tokens.len() - 1) as f64 / p2.len() as f64;
    assert!((r2.done.hit_pct - pct).abs() < 0.051, "hit_pct {} vs {pct}", r2.done.hit_pct);
    assert_eq!(r2.tokens, cold(&p2, 12).tokens, "warm turn 2 must equal a fresh engine given turn 2 alone");

    let p3 = next_prompt(&p2, &r2.tokens, "once more");
    let r3 = e.submit(&request(3, &p3, 12)).expect("turn 3");
    assert_eq!(r3.reused(), Some(p2.len() + r2.tokens.len() - 1));
    assert_eq!(r3.tokens, cold(&p3, 12).tokens);
    assert!(e.shutdown().expect("exit").success());
}

#[test]
fn repeated_and_divergent_prompts_reuse_nothing_and_match_a_fresh_engine() {
    let mut e = spawn();
    let p1 = first_prompt();
    let r1 = e.submit(&request(1, &p1, 12)).expect("turn 1");
    let p2 = next_prompt(&p1, &r1.tokens, "next");
    let fed = p1.len() + r1.tokens.len() - 1;

    // the same prompt again: shorter than the record
    let again = e.submit(&request(2, &p1, 12)).expect("repeat");
    assert_eq!(again.reused(), Some(0));
    assert_eq!(again.tokens, r1.tokens);

    // diverging in the middle, and at the last recorded id (the state holds p1 + r1 minus its last token)
    for (n, at) in [(3, p1.len() / 2), (4, fed - 1)] {
        let mut diverged = p2.clone();
        diverged[at] = (diverged[at] + 1) % 256;
        let warm = e.submit(&request(n, &diverged, 12)).expect("diverged");
        assert_eq!(warm.reused(), Some(0), "divergence at {at}");
        assert_eq!(warm.tokens, cold(&diverged, 12).tokens, "divergence at {at}");
        // back to the conversation, so the next case diverges from p1 + r1 again
        let back = e.submit(&request(n + 10, &p1, 12)).expect("back");
        assert_eq!(back.tokens, r1.tokens);
    }
    assert!(e.shutdown().expect("exit").success());
}

/// Stops (or cancels) after `after` tokens.
struct Interrupt {
    after: usize,
    seen: usize,
    flow: Flow,
}

impl Observer for Interrupt {
    fn on_token(&mut self, _event: &TokenEvent) -> Flow {
        self.seen += 1;
        if self.seen >= self.after {
            self.flow
        } else {
            Flow::Continue
        }
    }
}

fn long_request(id: u64, prompt: &[u32], e: &StdioEngine) -> Request {
    let max_ctx = e.caps().max_ctx().expect("max_ctx");
    Request { ignore_eos: true, ..request(id, prompt, max_ctx - prompt.len() - 64) }
}

#[test]
fn stop_ends_generation_and_the_next_turn_still_reuses() {
    let mut e = spawn();
    let p1 = first_prompt();
    let req = long_request(1, &p1, &e);
    let mut stop = Interrupt { after: 3, seen: 0, flow: Flow::Stop };
    let stopped = e.submit_observed(&req, &mut stop).expect("stopped reply");
    assert!(!stopped.late_interrupt);
    assert!(stopped.tokens.len() >= 3 && stopped.tokens.len() < req.max_tokens, "{}", stopped.tokens.len());
    assert_eq!(stopped.done.length_limited, Some(false));
    let full = cold(&p1, req.max_tokens);
    assert_eq!(stopped.tokens[..], full.tokens[..stopped.tokens.len()], "a stopped reply is a prefix of the full one");

    let p2 = next_prompt(&p1, &stopped.tokens, "go on");
    let r2 = e.submit(&request(2, &p2, 8)).expect("turn 2");
    assert_eq!(r2.reused(), Some(p1.len() + stopped.tokens.len() - 1));
    assert_eq!(r2.tokens, cold(&p2, 8).tokens);

    // STOP for an id that finished, and for one never seen
    for id in [2, 77] {
        e.stop(id).expect("send");
        let frame = e.next_frame(TIMEOUT).expect("answer");
        assert_eq!(frame.id(), Some(id));
        assert!(matches!(frame, kvproof_engines::serve::EngineFrame::Error(ref f) if f.code == ErrorCode::NotFound));
    }
    assert!(e.shutdown().expect("exit").success());
}

#[test]
fn stop_in_the_same_write_as_submit() {
    let mut raw = Raw::spawn(&[]);
    raw.start();
    let mut bytes = submit_ids(5, &first_prompt(), 500, " ignore_eos=1");
    bytes.extend_from_slice(b"STOP 5\n");
    raw.send(&bytes);
    let frames = raw.frames_until(|h| h.starts_with("DONE 5 "));
    let emitted = frames.len() - 1;
    assert!((1..500).contains(&emitted), "{emitted}");
    assert!(frames.last().is_some_and(|(h, _)| h.split(' ').nth(8) == Some("0")));
    let (status, _) = raw.finish();
    assert!(status.success());
}

#[test]
fn cancel_answers_cancelled_and_the_slot_is_not_reused() {
    let mut e = spawn();
    let p1 = first_prompt();
    let r1 = e.submit(&request(1, &p1, 12)).expect("turn 1");
    let p2 = next_prompt(&p1, &r1.tokens, "cancel me");
    let mut cancel = Interrupt { after: 2, seen: 0, flow: Flow::Cancel };
    let err = e.submit_observed(&long_request(2, &p2, &e), &mut cancel).expect_err("cancelled");
    assert_eq!(err.code(), Some(&ErrorCode::Cancelled), "{err}");
    // the cancelled turn left a half-updated state: the next turn, which extends it, must not reuse it
    let p3 = next_prompt(&p2, &[], "after the cancel");
    let r3 = e.submit(&request(3, &p3, 12)).expect("turn 3");
    assert_eq!(r3.reused(), Some(0));
    assert_eq!(r3.tokens, cold(&p3, 12).tokens);

    e.cancel(99).expect("send");
    let frame = e.next_frame(TIMEOUT).expect("answer");
    assert!(matches!(frame, kvproof_engines::serve::EngineFrame::Error(ref f)
        if f.code == ErrorCode::NotFound && f.id == Some(99)));
    assert!(e.shutdown().expect("exit").success());
}

#[test]
fn eof_finishes_what_was_read_and_exits_zero() {
    let mut raw = Raw::spawn(&[]);
    raw.start();
    raw.send(&submit_ids(1, &first_prompt(), 16, " ignore_eos=1"));
    raw.stdin = None; // EOF right behind the request
    let frames = raw.frames_until(|h| h.starts_with("DONE 1 "));
    assert_eq!(frames.len(), 17);
    let (status, _) = raw.finish();
    assert!(status.success(), "{status}");
}

/// Send `send`; the next line must be `want` (optionally followed by a detail).
fn expect(raw: &mut Raw, send: &[u8], want: &str) {
    raw.send(send);
    let line = raw.line_str();
    assert!(
        line == want || line.starts_with(&format!("{want} ")),
        "sent {:?}: got {line:?}, want {want:?}",
        String::from_utf8_lossy(send)
    );
}

#[test]
fn every_error_code() {
    let mut raw = Raw::spawn(&[]);
    let caps = raw.start();
    let max_ctx: usize = caps_value(&caps, "max_ctx").parse().expect("max_ctx");
    let slots: usize = caps_value(&caps, "slots").parse().expect("slots");
    expect(&mut raw, b"HELLO\n", "ERROR - BAD_FRAME");
    expect(&mut raw, b"\n", "ERROR - BAD_FRAME");
    expect(&mut raw, b"SUBMIT x 0 2 4 0 1\nhi\n", "ERROR - BAD_FRAME");
    expect(&mut raw, b"SUBMIT 5 0 2 4 0\nhi\n", "ERROR 5 BAD_FRAME");
    expect(&mut raw, b"SUBMIT 5 0 1 4 0 1\nhi\n", "ERROR 5 BAD_FRAME");
    expect(&mut raw, b"STOP\n", "ERROR - BAD_FRAME");
    expect(&mut raw, b"DUMP 5 0\n", "ERROR 5 BAD_FRAME");
    expect(&mut raw, b"SUBMIT 6 0 2 4 -1 1\nhi\n", "ERROR 6 BAD_REQUEST");
    expect(&mut raw, b"SUBMIT 6 0 2 4 0 1 colour=red\nhi\n", "ERROR 6 BAD_REQUEST");
    expect(&mut raw, b"SUBMIT 6 0 5 4 0 1 ids=1\n99999\n", "ERROR 6 BAD_REQUEST");
    expect(&mut raw, format!("SUBMIT 6 {slots} 2 4 0 1\nhi\n").as_bytes(), "ERROR 6 BAD_REQUEST");
    expect(&mut raw, b"SUBMIT 6 0 2 4 0 1 3\nhiabc\n", "ERROR 6 BAD_REQUEST");
    expect(&mut raw, format!("DUMP 6 {slots} /tmp/x.safetensors\n").as_bytes(), "ERROR 6 BAD_REQUEST");
    expect(&mut raw, b"SUBMIT 7 0 0 4 0 1\n\n", "ERROR 7 EMPTY_PROMPT");
    expect(&mut raw, b"STOP 8\n", "ERROR 8 NOT_FOUND");
    expect(&mut raw, b"CANCEL 8\n", "ERROR 8 NOT_FOUND");
    let too_long = vec![65u32; max_ctx + 1];
    expect(&mut raw, &submit_ids(9, &too_long, 4, ""), &format!("ERROR 9 CONTEXT_EXCEEDED {} {max_ctx}", max_ctx + 1));
    expect(&mut raw, b"DUMP 10 0 /nonexistent-dir/state.safetensors\n", "ERROR 10 DUMP_FAILED");

    // SLOT_BUSY, DUPLICATE_ID and CANCELLED need a request generating; the STOP/CANCEL behind them ends it
    let prompt = first_prompt();
    let mut bytes = submit_ids(11, &prompt, 500, " ignore_eos=1");
    bytes.extend(submit_ids(12, &prompt, 4, ""));
    bytes.extend(submit_ids(11, &prompt, 4, ""));
    bytes.extend_from_slice(b"STOP 11\n");
    raw.send(&bytes);
    let frames = raw.frames_until(|h| h.starts_with("DONE 11 "));
    let headers: Vec<&str> = frames.iter().map(|(h, _)| h.as_str()).filter(|h| !h.starts_with("DATA ")).collect();
    assert_eq!(headers.len(), 3, "{headers:?}");
    assert!(headers[0].starts_with("ERROR 12 SLOT_BUSY"), "{headers:?}");
    assert!(headers[1].starts_with("ERROR 11 DUPLICATE_ID"), "{headers:?}");

    let mut bytes = submit_ids(13, &prompt, 500, " ignore_eos=1");
    bytes.extend_from_slice(b"CANCEL 13\n");
    raw.send(&bytes);
    let frames = raw.frames_until(|h| h.starts_with("ERROR 13 "));
    assert_eq!(frames.last().map(|(h, _)| h.as_str()), Some("ERROR 13 CANCELLED"));
    assert!(frames.iter().all(|(h, _)| h.starts_with("DATA 13 ") || h.starts_with("ERROR 13 ")));

    // and the engine still answers
    raw.send(&submit_ids(14, &prompt, 2, ""));
    raw.frames_until(|h| h.starts_with("DONE 14 "));
    let (status, _) = raw.finish();
    assert!(status.success());
}

#[test]
fn prefix_log_lines_on_stderr() {
    let p1 = first_prompt();
    let mut raw = Raw::spawn(&[("KVPROOF_PREFIX_LOG", "1")]);
    raw.start();
    raw.send(&submit_ids(1, &p1, 6, ""));
    let frames = raw.frames_until(|h| h.starts_with("DONE 1 "));
    let reply: Vec<u32> = frames[..frames.len() - 1]
        .iter()
        .map(|(h, _)| {
            h.split(' ').nth(3).and_then(|t| t.strip_prefix("tid=")).and_then(|t| t.parse().ok()).expect("tid")
        })
        .collect();
    let p2 = next_prompt(&p1, &reply, "more");
    raw.send(&submit_ids(2, &p2, 6, ""));
    raw.frames_until(|h| h.starts_with("DONE 2 "));
    let (status, stderr) = raw.finish();
    assert!(status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[PREFIX]")).collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert_eq!(lines[0], format!("[PREFIX] no reuse: held=0 prompt={} (empty)", p1.len()));
    let reused = p1.len() + reply.len() - 1;
    assert!(
        lines[1].starts_with(&format!("[PREFIX] reusing {reused} of {} prompt tokens (", p2.len())),
        "{}",
        lines[1]
    );

    // off unless asked for
    let mut quiet = Raw::spawn(&[]);
    quiet.start();
    quiet.send(&submit_ids(1, &p1, 2, ""));
    quiet.frames_until(|h| h.starts_with("DONE 1 "));
    let (_, stderr) = quiet.finish();
    assert!(!stderr.contains("[PREFIX]"), "{stderr}");
}

#[test]
fn dump_writes_the_state_file() {
    let dir = std::env::temp_dir().join(format!("kvproof-serve-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("slot0.safetensors");
    let path_str = path.to_str().expect("utf-8 temp path");

    let mut raw = Raw::spawn(&[]);
    raw.start();
    let p1 = first_prompt();
    raw.send(&submit_ids(1, &p1, 5, ""));
    let frames = raw.frames_until(|h| h.starts_with("DONE 1 "));
    raw.send(format!("DUMP 2 0 {path_str}\n").as_bytes());
    let line = raw.line_str();
    let bytes: u64 = line
        .strip_prefix(&format!("DUMPED 2 {path_str} "))
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(std::fs::metadata(&path).expect("dump file").len(), bytes);
    let (status, _) = raw.finish();
    assert!(status.success());

    // the record holds what was fed: the prompt and every reply token but the last
    let dump = kvproof_engines::dump::read_file(&path).expect("a state dump");
    let reply: Vec<u32> = frames[..frames.len() - 1]
        .iter()
        .map(|(h, _)| {
            h.split(' ').nth(3).and_then(|t| t.strip_prefix("tid=")).and_then(|t| t.parse().ok()).expect("tid")
        })
        .collect();
    let mut fed = p1.clone();
    fed.extend_from_slice(&reply[..reply.len() - 1]);
    assert_eq!(dump.record.ids, fed);

    // and through the client
    let mut e = spawn();
    e.submit(&request(1, &p1, 5)).expect("turn");
    assert_eq!(e.dump(0, path_str).expect("dumped"), std::fs::metadata(&path).expect("file").len());
    assert!(e.shutdown().expect("exit").success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn logprobs_list_the_top_k() {
    let mut e = spawn();
    let req = Request { logprobs: 3, ..request(1, &first_prompt(), 6) };
    let reply = e.submit(&req).expect("reply");
    for ((tid, gap), top) in reply.tokens.iter().zip(&reply.gaps).zip(&reply.tops) {
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].0, *tid, "greedy picks the top-1");
        assert!(top[0].1 >= top[1].1 && top[1].1 >= top[2].1);
        assert!((top[0].1 - top[1].1 - gap).abs() <= 1e-4 * top[0].1.abs().max(1.0), "gap is top-1 minus top-2");
    }
    assert!(e.shutdown().expect("exit").success());
}

#[test]
fn audio_frames_travel_in_the_ext_block() {
    let mut e = spawn();
    if !e.caps().audio() {
        return;
    }
    let frame = e.caps().number("audio_frame").expect("audio_frame");
    let mut prompt = first_prompt();
    prompt.splice(3..3, [AUDIO, AUDIO]);
    let req = Request { audio: vec![vec![1; frame], vec![2; frame]], ..request(1, &prompt, 6) };
    let r1 = e.submit(&req).expect("audio reply");
    // a request that brings audio is never reused, even when it extends the record
    let p2 = next_prompt(&prompt, &r1.tokens, "again");
    let r2 = e.submit(&Request { id: 2, prompt: p2.clone(), ..req.clone() }).expect("turn 2");
    assert_eq!(r2.reused(), Some(0));
    let mut cold_engine = spawn();
    let cold = cold_engine.submit(&Request { id: 2, prompt: p2, ..req.clone() }).expect("cold");
    assert_eq!(r2.tokens, cold.tokens);

    // frames of the wrong size
    let bad = Request { id: 3, audio: vec![vec![1; frame + 1], vec![2; frame + 1]], ..req };
    assert_eq!(e.submit(&bad).expect_err("wrong size").code(), Some(&ErrorCode::BadRequest));
    assert!(e.shutdown().expect("exit").success());
}

// -----------------------------------------------------------------------------------------------------------------
// Additions to revision 1: declared rules, chat and echo, RESET, cancel_at, config overrides.

fn spawn_with(args: &[&str]) -> StdioEngine {
    let mut cmd = vec![BIN.to_string()];
    cmd.extend(args.iter().map(|s| s.to_string()));
    StdioEngine::spawn(&cmd, &[], TIMEOUT).expect("engine starts")
}

#[test]
fn caps_declare_each_archs_reuse_rule_and_the_extensions() {
    for (arch, rule) in [("inkling", "strict"), ("kimi", "strict"), ("deepseek", "strict"), ("glm", "lcp")] {
        let e = spawn_with(&["--arch", arch, "--preset", "tiny"]);
        assert_eq!(e.caps().reuse_rule(), Some(rule), "{arch}");
        assert_eq!(e.caps().get("kv_share"), None, "{arch}: sharing is off by default");
        for flag in ["chat", "echo", "reset", "cancel_at"] {
            assert!(e.caps().flag(flag), "{arch} {flag}");
        }
        assert!(e.caps().keeps_state_on().is_empty(), "the bundled engines spoil a slot on every failure");
        assert!(e.shutdown().expect("exit").success());
    }
    let e = spawn_with(&["--arch", "glm53", "--preset", "tiny"]);
    let rows = e.caps().number("prompt_rows").expect("glm53 has a grid");
    assert_eq!(e.caps().reuse_rule(), Some(format!("grid:{rows}").as_str()));
    drop(e);
    // a config override reaches the served engine: glm with sharing on says so
    let e = spawn_with(&["--arch", "glm", "--preset", "tiny", "--config", r#"{"kv_share": true}"#]);
    assert_eq!((e.caps().reuse_rule(), e.caps().get("kv_share")), (Some("lcp"), Some("1")));
    drop(e);
    // an override the config does not have is a start-up error naming it
    let out = Command::new(BIN)
        .args(["--arch", "inkling", "--preset", "tiny", "--config", r#"{"kv_shared": true}"#])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kv_shared"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn config_overrides_give_the_weights_an_in_process_engine_gets() {
    use kvproof_engines::bundled::ModelConfig;
    use kvproof_engines::config::Preset;
    // the same arch, preset, seed and overrides: the model hash in CAPS is the in-process engine's
    let overrides = serde_json::json!({"kv_share": true});
    let config =
        ModelConfig::with_overrides("glm", Preset::Tiny, overrides.as_object().expect("an object")).expect("preset");
    let weights = kvproof_engines::fixture::generate_weights(&config, 3).expect("weights");
    let local = kvproof_engines::bundled::open(config, weights, None).expect("open");
    let e = spawn_with(&["--arch", "glm", "--preset", "tiny", "--seed", "3", "--config", r#"{"kv_share":true}"#]);
    assert_eq!(e.caps().model(), Some(local.info().model_hash.as_str()));
}

#[test]
fn chat_payloads_are_rendered_with_the_template_and_echoed() {
    use kvproof_engines::chat::{render_text, TextMessage};
    let msg = |role: &str, content: &str| TextMessage { role: role.into(), content: content.into() };
    let mut messages = vec![msg("system", "be brief"), msg("user", "hello there")];
    let mut e = spawn();
    let r1 = e.submit_chat(1, 0, &messages, 6, false, true).expect("turn 1");
    let p1 = render_text(&messages).expect("render");
    assert_eq!(r1.prompt_ids.as_deref(), Some(&p1[..]), "PROMPT carries the ids the template made");
    assert_eq!(r1.done.prompt_tokens, Some(p1.len()));
    // the same conversation as ids gives the same reply on a fresh engine
    assert_eq!(r1.tokens, cold(&p1, 6).tokens);
    assert_eq!(r1.pieces.concat(), r1.text);

    // turn 2: the reply as the assistant's text, then a user message
    let reply_text: Vec<u8> =
        if r1.tokens.last() == Some(&EOS) { r1.pieces[..r1.pieces.len() - 1].concat() } else { r1.pieces.concat() };
    messages.push(msg("assistant", &String::from_utf8_lossy(&reply_text)));
    messages.push(msg("user", "and more"));
    let r2 = e.submit_chat(2, 0, &messages, 6, false, true).expect("turn 2");
    let p2 = r2.prompt_ids.clone().expect("echoed");
    assert_eq!(p2, render_text(&messages).expect("render"));
    let mut fed = p1.clone();
    fed.extend_from_slice(&r1.tokens[..r1.tokens.len() - 1]);
    // strict prefix: everything turn 1 fed when turn 2's ids extend it (a reply that renders back to its own ids)
    let expected = if p2.len() > fed.len() && p2.starts_with(&fed) { fed.len() } else { 0 };
    assert_eq!(r2.reused(), Some(expected));
    assert_eq!(r2.tokens, cold(&p2, 6).tokens);

    // without echo there is no PROMPT frame
    let r3 = e.submit_chat(3, 0, &messages[..2], 2, false, false).expect("no echo");
    assert_eq!(r3.prompt_ids, None);
    assert!(e.shutdown().expect("exit").success());

    // bad conversations
    let mut raw = Raw::spawn(&[]);
    raw.start();
    expect(&mut raw, b"SUBMIT 1 0 2 4 0 1 chat=1\n[]\n", "ERROR 1 EMPTY_PROMPT");
    expect(&mut raw, b"SUBMIT 2 0 5 4 0 1 chat=1\nhello\n", "ERROR 2 BAD_REQUEST");
    let robot = br#"[{"role":"robot","content":"x"}]"#;
    let mut bytes = format!("SUBMIT 3 0 {} 4 0 1 chat=1\n", robot.len()).into_bytes();
    bytes.extend_from_slice(robot);
    bytes.push(b'\n');
    expect(&mut raw, &bytes, "ERROR 3 BAD_REQUEST");
    expect(&mut raw, b"SUBMIT 4 0 3 4 0 1 chat=1 ids=1\n1 2\n", "ERROR 4 BAD_REQUEST");
    // echo of a text prompt: PROMPT before the first DATA
    raw.send(b"SUBMIT 5 0 2 2 0 1 echo=1\nhi\n");
    let frames = raw.frames_until(|h| h.starts_with("DONE 5 "));
    assert_eq!(frames[0].0, "PROMPT 5 7");
    assert_eq!(raw_body(&frames[0]), b"104 105");
    assert!(frames[1].0.starts_with("DATA 5 "), "{frames:?}");
    let (status, _) = raw.finish();
    assert!(status.success());
}

fn raw_body(frame: &(String, Option<Vec<u8>>)) -> Vec<u8> {
    frame.1.clone().unwrap_or_default()
}

#[test]
fn reset_forgets_every_slot() {
    let mut e = spawn();
    let p1 = first_prompt();
    let r1 = e.submit(&request(1, &p1, 8)).expect("turn 1");
    let p2 = next_prompt(&p1, &r1.tokens, "and more");
    assert!(e.submit(&request(2, &p2, 8)).expect("turn 2").reused() > Some(0));
    e.reset().expect("RESET answered CLEARED");
    // the same turn 1 again: nothing to reuse, the fresh engine's reply
    let again = e.submit(&request(3, &p1, 8)).expect("after reset");
    assert_eq!((again.reused(), &again.tokens), (Some(0), &r1.tokens));
    assert!(e.shutdown().expect("exit").success());

    // RESET behind a generating request is answered after it ends
    let mut raw = Raw::spawn(&[]);
    raw.start();
    let mut bytes = submit_ids(1, &first_prompt(), 40, " ignore_eos=1");
    bytes.extend_from_slice(b"RESET 7\n");
    raw.send(&bytes);
    let frames = raw.frames_until(|h| h.starts_with("CLEARED 7"));
    assert!(frames[frames.len() - 2].0.starts_with("DONE 1 "), "{:?}", &frames[frames.len() - 2..]);
    expect(&mut raw, b"RESET\n", "ERROR - BAD_FRAME");
    expect(&mut raw, b"RESET 8 0\n", "ERROR 8 BAD_FRAME");
    let (status, _) = raw.finish();
    assert!(status.success());
}

#[test]
fn cancel_at_fails_the_request_at_its_prefill_poll_and_spoils_the_slot() {
    use kvproof_engines::serve::SubmitExtras;
    let mut e = spawn();
    let p1 = first_prompt();
    let r1 = e.submit(&request(1, &p1, 8)).expect("turn 1");
    let mut p2 = next_prompt(&p1, &r1.tokens, "a longer question, long enough to take several prefill segments");
    p2.extend(text(" and then some more words to make it longer still"));
    let at = SubmitExtras { echo: true, cancel_at: Some(0) };
    let err = e.submit_with(&request(2, &p2, 8), at, &mut kvproof_engines::engine::NoObserver).expect_err("cancelled");
    assert_eq!(err.code(), Some(&ErrorCode::Cancelled), "{err}");
    // the cancelled prompt extended: the half-written state is not reused
    let p3 = next_prompt(&p2, &[], "after");
    let r3 = e.submit(&request(3, &p3, 8)).expect("turn 3");
    assert_eq!(r3.reused(), Some(0));
    assert_eq!(r3.tokens, cold(&p3, 8).tokens);
    // a poll the request never reaches: it runs to DONE like any other
    let p4 = next_prompt(&p3, &r3.tokens, "go on");
    let late = SubmitExtras { echo: false, cancel_at: Some(1_000_000) };
    let r4 = e.submit_with(&request(4, &p4, 8), late, &mut kvproof_engines::engine::NoObserver).expect("turn 4");
    assert_eq!(r4.reused(), Some(p3.len() + r3.tokens.len() - 1));
    assert_eq!(r4.tokens, cold(&p4, 8).tokens);
    assert!(e.shutdown().expect("exit").success());
}

/// While a request generates, STOP of an unknown id is answered at once, before that request's DONE; once nothing
/// generates, frames are answered in order, so `STOP <fresh id>` is a barrier behind a late STOP.
#[test]
fn not_found_comes_back_at_once_and_is_a_barrier_when_idle() {
    let mut raw = Raw::spawn(&[]);
    raw.start();
    raw.send(&submit_ids(5, &first_prompt(), 500, " ignore_eos=1"));
    let first = raw.frame();
    assert!(first.0.starts_with("DATA 5 "), "{first:?}");
    raw.send(b"STOP 999\n");
    let frames = raw.frames_until(|h| h.starts_with("ERROR 999 "));
    assert!(frames.iter().all(|(h, _)| h.starts_with("DATA 5 ") || h.starts_with("ERROR 999 NOT_FOUND")), "{frames:?}");
    raw.send(b"STOP 5\n");
    let frames = raw.frames_until(|h| h.starts_with("DONE 5 "));
    let done: Vec<&str> = frames.last().map(|(h, _)| h.split(' ').collect()).unwrap_or_default();
    let emitted: usize = done[3].parse().expect("emitted");
    assert!(emitted < 500 && done[8] == "0", "stopped, so NOT_FOUND 999 came before its DONE: {done:?}");
    // idle: a late STOP and a barrier come back in the order they were sent
    raw.send(b"STOP 5\nSTOP 1000\n");
    assert!(raw.line_str().starts_with("ERROR 5 NOT_FOUND"));
    assert!(raw.line_str().starts_with("ERROR 1000 NOT_FOUND"));
    let (status, _) = raw.finish();
    assert!(status.success());
}
