//! Seeded fuzzing of the serve protocol: 1200 malformed frames (deterministic), each answered by exactly one ERROR
//! with the expected code, each followed by a valid SUBMIT that must still get the correct reply — so a bad frame
//! neither kills the engine nor desynchronises the stream.

use std::time::Duration;

use kvproof_engines::engine::Request;
use kvproof_engines::rng::SplitMix64;
use kvproof_engines::serve::{EngineFrame, ErrorCode, StdioEngine};
use kvproof_engines::tokenizer::Tokenizer;

const BIN: &str = env!("CARGO_BIN_EXE_kvproof-engine");
const FRAMES: usize = 1200;
const SEED: u64 = 0x006b_7670_726f_6f66;

/// One malformed frame and the answer it must get.
struct Case {
    bytes: Vec<u8>,
    code: ErrorCode,
    /// `None`: answered with `-`.
    id: Option<u64>,
    what: &'static str,
}

struct Gen {
    rng: SplitMix64,
    max_ctx: usize,
    slots: usize,
}

impl Gen {
    fn pick<'a, T: ?Sized>(&mut self, items: &'a [&'a T]) -> &'a T {
        items[self.rng.below(items.len() as u64) as usize]
    }

    fn id(&mut self) -> u64 {
        // never 1: that is the valid request's id
        2 + self.rng.below(1 << 40)
    }

    /// Random bytes without a newline; `printable` keeps them to visible ASCII.
    fn junk(&mut self, len: usize, printable: bool) -> Vec<u8> {
        (0..len)
            .map(|_| {
                let b = if printable { 0x20 + self.rng.below(0x5f) as u8 } else { self.rng.below(256) as u8 };
                if b == b'\n' {
                    b'?'
                } else {
                    b
                }
            })
            .collect()
    }

    fn text_payload(&mut self) -> Vec<u8> {
        let len = 1 + self.rng.below(24) as usize;
        // any bytes but the newline would be fine inside a counted payload; keep some newlines too
        let mut p = {
            let printable = self.rng.below(2) == 0;
            self.junk(len, printable)
        };
        if self.rng.below(3) == 0 {
            p.push(b'\n');
            p.push(b'x');
        }
        p
    }

    fn submit(id: &str, slot: &str, bytes: usize, rest: &str, payload: &[u8]) -> Vec<u8> {
        let mut out = format!("SUBMIT {id} {slot} {bytes} {rest}\n").into_bytes();
        out.extend_from_slice(payload);
        out.push(b'\n');
        out
    }

    fn case(&mut self) -> Case {
        let id = self.id();
        let ids = id.to_string();
        let bad = |bytes: Vec<u8>, code: ErrorCode, id: Option<u64>, what| Case { bytes, code, id, what };
        // Kinds 0..=16 equally often; an over-long prompt (17) rarely: the engine prefills before it can tell.
        let kind = self.rng.below(171) / 10;
        match kind {
            0 => {
                // a line of junk whose first word is no verb
                let len = 1 + self.rng.below(80) as usize;
                let mut line = b"#".to_vec();
                line.extend({
                    let printable = self.rng.below(2) == 0;
                    self.junk(len, printable)
                });
                line.push(b'\n');
                bad(line, ErrorCode::BadFrame, None, "junk line")
            }
            1 => bad(b"\n".to_vec(), ErrorCode::BadFrame, None, "empty line"),
            2 => {
                let verb = self.pick(&["HELLO", "submit", "Stop", "SUBMITS", "DATA", "DONE", "PING", "\x01\x01READY"]);
                bad(format!("{verb} {ids} 0 1\n").into_bytes(), ErrorCode::BadFrame, None, "unknown verb")
            }
            3 => {
                let p = self.text_payload();
                bad(Self::submit(&ids, "0", p.len(), "4 0", &p), ErrorCode::BadFrame, Some(id), "too few fields")
            }
            4 => {
                let count = self.pick(&["abc", "-1", "+3", "1.5", "0x10", ""]);
                let line = format!("SUBMIT {ids} 0 {count} 4 0 1\n").into_bytes();
                // an empty count shifts the fields: `4` becomes the count, so send 4 bytes and the newline
                if count.is_empty() {
                    let mut line = line;
                    line.extend_from_slice(b"abcd\n");
                    return bad(line, ErrorCode::BadFrame, Some(id), "shifted fields");
                }
                bad(line, ErrorCode::BadFrame, Some(id), "count not a number")
            }
            5 => {
                let p = self.text_payload();
                let wrong = self.pick(&["x1", "-", "1e3", "18446744073709551616"]);
                bad(Self::submit(wrong, "0", p.len(), "4 0 1", &p), ErrorCode::BadFrame, None, "id not a number")
            }
            6 => {
                // declared shorter than what follows (no newline inside): the rest of the line is skipped
                let len = 2 + self.rng.below(20) as usize;
                let p = self.junk(len, true);
                let declared = self.rng.below(len as u64 - 1) as usize;
                bad(Self::submit(&ids, "0", declared, "4 0 1", &p), ErrorCode::BadFrame, Some(id), "count too short")
            }
            7 => {
                let p = self.text_payload();
                let rest = self.pick(&[
                    "4 -1 1",
                    "4 nan 1",
                    "4 inf 1",
                    "4 0 0",
                    "4 0 1.01",
                    "4 0 -0.5",
                    "0 0 1",
                    "x 0 1",
                    "4 0 1 colour=red",
                    "4 0 1 seed=1 seed=2",
                    "4 0 1 ids=2",
                    "4 0 1 ignore_eos=yes",
                    "4 0 1 logprobs=999999",
                    "4 0 1 top_k=-3",
                    "4 0 1 0 stray",
                    "4 0 1 chat=2",
                    "4 0 1 echo=yes",
                    "4 0 1 cancel_at=x",
                    "4 0 1 ids=1 chat=1",
                    "4 0 1 chat=1",
                ]);
                bad(Self::submit(&ids, "0", p.len(), rest, &p), ErrorCode::BadRequest, Some(id), "bad value")
            }
            8 => {
                let p = self.text_payload();
                let slot = (self.slots + self.rng.below(1000) as usize).to_string();
                bad(
                    Self::submit(&ids, &slot, p.len(), "4 0 1", &p),
                    ErrorCode::BadRequest,
                    Some(id),
                    "slot out of range",
                )
            }
            9 => {
                let p = self.pick(&["99999", "1 2 x", "264", "-5", "1,2", "4294967296"]).as_bytes().to_vec();
                bad(Self::submit(&ids, "0", p.len(), "4 0 1 ids=1", &p), ErrorCode::BadRequest, Some(id), "bad ids")
            }
            10 => {
                const EMPTY: [&[u8]; 3] = [b"", b" ", b"\t \n"];
                let p: &[u8] = self.pick(&EMPTY);
                let mode = if p.is_empty() { "4 0 1" } else { "4 0 1 ids=1" };
                bad(Self::submit(&ids, "0", p.len(), mode, p), ErrorCode::EmptyPrompt, Some(id), "empty prompt")
            }
            11 => {
                // ext bytes with no audio id in the prompt
                let ext = 1 + self.rng.below(20) as usize;
                let mut p = b"hello".to_vec();
                p.extend(self.junk(ext, false));
                let header = format!("SUBMIT {ids} 0 5 4 0 1 {ext}\n");
                let mut bytes = header.into_bytes();
                bytes.extend(p);
                bytes.push(b'\n');
                bad(bytes, ErrorCode::BadRequest, Some(id), "ext without audio")
            }
            12 => {
                let verb = self.pick(&["STOP", "CANCEL"]);
                let eol = self.pick(&["\n", "\r\n"]);
                bad(format!("{verb} {ids}{eol}").into_bytes(), ErrorCode::NotFound, Some(id), "unknown id")
            }
            13 => {
                let (line, id) = match self.rng.below(5) {
                    0 => ("STOP\n".to_string(), None),
                    1 => (format!("CANCEL {ids} now\n"), Some(id)),
                    2 => ("RESET\n".to_string(), None),
                    3 => (format!("RESET {ids} 0\n"), Some(id)),
                    _ => (format!("DUMP {ids} 0\n"), Some(id)),
                };
                bad(line.into_bytes(), ErrorCode::BadFrame, id, "wrong field count")
            }
            14 => {
                let slot = self.slots + self.rng.below(100) as usize;
                bad(
                    format!("DUMP {ids} {slot} /tmp/x.safetensors\n").into_bytes(),
                    ErrorCode::BadRequest,
                    Some(id),
                    "dump slot",
                )
            }
            15 => {
                let huge = self.pick(&["99999999999", "67108865", "18446744073709551615"]);
                bad(
                    format!("SUBMIT {ids} 0 {huge} 4 0 1\n").into_bytes(),
                    ErrorCode::BadFrame,
                    Some(id),
                    "oversize count",
                )
            }
            16 => {
                let mut line = vec![b'A'; 64 * 1024 + 1 + self.rng.below(1000) as usize];
                line.push(b'\n');
                bad(line, ErrorCode::BadFrame, None, "header too long")
            }
            _ => {
                let n = self.max_ctx + 1 + self.rng.below(8) as usize;
                let payload = vec!["65"; n].join(" ").into_bytes();
                let code = ErrorCode::ContextExceeded { used: n, limit: self.max_ctx };
                bad(Self::submit(&ids, "0", payload.len(), "4 0 1 ids=1", &payload), code, Some(id), "too long")
            }
        }
    }
}

#[test]
fn malformed_frames_are_answered_and_never_desynchronise() {
    let cmd: Vec<String> =
        [BIN, "--arch", "inkling", "--preset", "tiny", "--seed", "0"].iter().map(|s| s.to_string()).collect();
    let mut e = StdioEngine::spawn(&cmd, &[], Duration::from_secs(60)).expect("engine starts");
    let mut gen = Gen {
        rng: SplitMix64::new(SEED),
        max_ctx: e.caps().max_ctx().expect("max_ctx"),
        slots: e.caps().slots().expect("slots"),
    };
    let valid = Request {
        id: 1,
        prompt: Tokenizer.encode(b"<|bos|><|user|>sync?<|assistant|>"),
        max_tokens: 4,
        ..Request::default()
    };
    let expected = e.submit(&valid).expect("baseline").tokens;
    assert!(!expected.is_empty());
    let mut seen = std::collections::BTreeMap::new();
    for n in 0..FRAMES {
        let case = gen.case();
        *seen.entry(case.what).or_insert(0) += 1;
        let shown = String::from_utf8_lossy(&case.bytes[..case.bytes.len().min(120)]).into_owned();
        e.send_raw(&case.bytes).expect("send");
        match e.next_frame(Duration::from_secs(60)) {
            Ok(EngineFrame::Error(err)) => {
                assert_eq!(err.code, case.code, "frame {n} ({}): {shown:?} -> {err:?}", case.what);
                assert_eq!(err.id, case.id, "frame {n} ({}): {shown:?} -> {err:?}", case.what);
            }
            other => panic!("frame {n} ({}): {shown:?} answered {other:?}", case.what),
        }
        // exactly one answer, and the stream is still in step: a valid request gets the right reply
        let reply = e.submit(&valid).unwrap_or_else(|err| panic!("after frame {n} ({}) {shown:?}: {err}", case.what));
        assert_eq!(reply.tokens, expected, "after frame {n} ({})", case.what);
    }
    assert!(seen.len() >= 18, "every kind of malformed frame was sent: {seen:?}");
    assert!(e.shutdown().expect("exit").success());
}
