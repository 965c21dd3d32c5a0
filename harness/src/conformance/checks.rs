//! The checks of `kvproof conformance`, in the order they run: start-up and CAPS; a conversation on slot 0 whose
//! every reuse count is compared with the harness's oracle under the engine's declared rule; STOP, CANCEL,
//! `cancel_at`, an over-long prompt, and what each leaves in the slot; DUMP; RESET; concurrent frames; text, chat
//! and echo; every error code, each followed by a valid request that must be answered in step; and EOF.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kvproof_engines::chat::TextMessage;
use kvproof_engines::engine::Request;
use kvproof_engines::rng::SplitMix64;
use kvproof_engines::serve::{self, DoneFrame, EngineFrame, ErrorCode, ErrorFrame};

use super::conn::{show, Conn, Got};
use super::{Finding, Options, Report, StartError, Status};
use crate::oracle::{self, Outcome, Rule, SlotBook};

/// How long CAPS may follow READY.
const CAPS_WAIT: Duration = Duration::from_secs(2);
/// How long the engine is watched for frames nobody asked for.
const QUIET_WAIT: Duration = Duration::from_millis(200);
/// The longest reply the STOP and CANCEL checks ask for (as long as the context allows: a fast engine must still
/// be generating when the interrupt arrives).
const LONG_REPLY: usize = 4096;
/// Longest context an over-long prompt is sent for.
const MAX_OVERFLOW_CTX: usize = 1 << 16;
/// Replies tried to get one that ends at eos.
const EOS_TRIES: usize = 10;

/// How a request ended.
enum End {
    Done(Got, DoneFrame),
    Error(Got, ErrorFrame),
    /// No DONE or ERROR within the timeout.
    Timeout,
    /// The engine closed its stdout.
    Gone,
}

/// Everything the engine wrote about one request.
struct Answer {
    id: u64,
    sent: Vec<u8>,
    sent_at: Instant,
    prompt: Option<(Got, Vec<u32>)>,
    data: Vec<Got>,
    tokens: Vec<u32>,
    pieces: Vec<Vec<u8>>,
    end: Option<End>,
    /// Frames about other ids that arrived meanwhile.
    others: Vec<Got>,
}

impl Answer {
    fn done(&self) -> Option<&DoneFrame> {
        match &self.end {
            Some(End::Done(_, d)) => Some(d),
            _ => None,
        }
    }

    fn error(&self) -> Option<&ErrorFrame> {
        match &self.end {
            Some(End::Error(_, e)) => Some(e),
            _ => None,
        }
    }

    fn end_frame(&self) -> Option<&Got> {
        match &self.end {
            Some(End::Done(g, _) | End::Error(g, _)) => Some(g),
            _ => None,
        }
    }

    /// The reply ended at eos: not length-limited, shorter than asked, not stopped.
    fn ended_at_eos(&self, max_tokens: usize) -> bool {
        self.done().is_some_and(|d| d.length_limited == Some(false) && d.emitted < max_tokens)
    }
}

/// What a DONE must agree with.
struct Expect {
    prompt_len: Option<usize>,
    max_tokens: usize,
    ignore_eos: bool,
    stopped: bool,
}

impl Expect {
    /// A reply of a `prompt_len`-id prompt (None: a text prompt, its length unknown) that may end at eos.
    fn reply(prompt_len: Option<usize>, max_tokens: usize) -> Self {
        Expect { prompt_len, max_tokens, ignore_eos: false, stopped: false }
    }

    /// A long `ignore_eos` reply of a `prompt_len`-id prompt, ended by a STOP or CANCEL.
    fn interrupted(prompt_len: usize, max_tokens: usize) -> Self {
        Expect { prompt_len: Some(prompt_len), max_tokens, ignore_eos: true, stopped: true }
    }
}

struct Probe {
    conn: Conn,
    caps: serve::Caps,
    timeout: Duration,
    findings: Vec<Finding>,
    next_id: u64,
    vocab: usize,
    max_ctx: usize,
    slots: usize,
    rule: Option<Rule>,
    rule_name: String,
    keeps_state_on: Vec<String>,
    /// What the oracle knows of slot 0.
    book: SlotBook,
    /// Whether the book knows slot 0's state (false after a request whose fed ids are unknown).
    book_known: bool,
    /// The last completed request on slot 0: its prompt and its whole reply.
    last_full: Vec<u32>,
    /// The first prompt and its reply on the fresh process.
    first: Option<(Vec<u32>, Vec<u32>)>,
    finished: BTreeSet<u64>,
    rng: SplitMix64,
    /// The reuse counts that matched the rule.
    reuse_matched: Vec<String>,
    reuse_values: Vec<usize>,
    /// Bad frames answered with the right code, per code.
    error_codes: std::collections::BTreeMap<String, usize>,
    /// Where each repeated violation was first noted.
    kinds: std::collections::HashMap<(String, &'static str), usize>,
    reuse_flag_checked: bool,
    data_frames: usize,
    done_frames: usize,
    gone: bool,
}

pub fn run(command: &[String], options: Options) -> Result<Report, StartError> {
    let cmd = command.join(" ");
    let conn = Conn::spawn(command).map_err(|source| StartError::Spawn { command: cmd.clone(), source })?;
    let mut p = Probe {
        conn,
        caps: serve::Caps::default(),
        timeout: options.timeout,
        findings: Vec::new(),
        next_id: 0,
        vocab: 0,
        max_ctx: 0,
        slots: 0,
        rule: None,
        rule_name: String::new(),
        keeps_state_on: Vec::new(),
        book: SlotBook::new(None),
        book_known: true,
        last_full: Vec::new(),
        first: None,
        finished: BTreeSet::new(),
        rng: SplitMix64::new(0x6b76_7072_6f6f_6621),
        reuse_matched: Vec::new(),
        reuse_values: Vec::new(),
        error_codes: std::collections::BTreeMap::new(),
        kinds: std::collections::HashMap::new(),
        reuse_flag_checked: false,
        data_frames: 0,
        done_frames: 0,
        gone: false,
    };
    let caps_line = p.startup(&cmd)?;
    p.check_caps();
    if p.ready_for_requests() {
        p.reuse_sequence();
        p.stop_checks();
        p.cancel_checks();
        p.cancel_at_checks();
        p.context_checks();
        p.dump_checks();
        p.reset_checks();
        p.concurrency_checks();
        p.text_checks();
        p.chat_checks();
        p.error_checks();
        p.summaries();
    }
    p.eof_check();
    if p.gone {
        for check in super::CHECKS {
            if !p.findings.iter().any(|f| f.check == check) {
                p.skip(check, "the engine exited before this was checked");
            }
        }
    }
    let stderr_tail = p.conn.stderr_tail();
    Ok(Report { command: command.to_vec(), caps: caps_line, findings: p.findings, stderr_tail })
}

fn submit_bytes(id: u64, slot: usize, ids: &[u32], max_tokens: usize, options: &str) -> Vec<u8> {
    let payload = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    format!("SUBMIT {id} {slot} {} {max_tokens} 0 1 ids=1{options}\n{payload}\n", payload.len()).into_bytes()
}

/// `ERROR - ...`: an answer to a frame whose id could not be read (or was refused as a whole).
fn is_anonymous_error(g: &Got) -> bool {
    matches!(&g.frame, Ok(EngineFrame::Error(e)) if e.id.is_none())
}

fn frame_error(g: &Got, code: &ErrorCode) -> bool {
    matches!(&g.frame, Ok(EngineFrame::Error(e)) if e.code == *code)
}

impl Probe {
    // -------------------------------------------------------------------------------------------------------------
    // findings

    fn note(&mut self, check: &str, status: Status, detail: String, frame: Option<&Got>, sent: Option<&[u8]>) {
        let frame = frame.map(|g| g.raw.clone());
        let sent = sent.map(show);
        if status != Status::Pass {
            if let Some(f) = self.findings.iter_mut().find(|f| f.check == check && f.detail == detail) {
                f.times += 1;
                return;
            }
        } else if self.findings.iter().any(|f| f.check == check && f.detail == detail) {
            return;
        }
        self.findings.push(Finding { check: check.to_string(), status, detail, frame, sent, times: 1 });
    }

    fn pass(&mut self, check: &str, detail: impl Into<String>) {
        self.note(check, Status::Pass, detail.into(), None, None);
    }

    fn skip(&mut self, check: &str, why: impl Into<String>) {
        self.note(check, Status::Skipped, why.into(), None, None);
    }

    fn violation(&mut self, check: &str, detail: impl Into<String>, frame: Option<&Got>, sent: Option<&[u8]>) {
        self.note(check, Status::Violation, detail.into(), frame, sent);
    }

    /// A violation that repeats on request after request with other numbers: kept once (the first), counted.
    fn repeated(&mut self, check: &str, kind: &'static str, detail: String, frame: Option<&Got>) {
        if let Some(&i) = self.kinds.get(&(check.to_string(), kind)) {
            self.findings[i].times += 1;
            return;
        }
        self.kinds.insert((check.to_string(), kind), self.findings.len());
        self.note(check, Status::Violation, detail, frame, None);
    }

    /// echo=1, yet no PROMPT frame came before the request's first DATA (`frame`: what came instead).
    fn no_prompt_frame(&mut self, frame: Option<&Got>, sent: &[u8]) {
        let rule = "echo=1: a PROMPT frame comes before the request's first DATA";
        self.violation("echo", rule, frame, Some(sent));
    }

    fn violated(&self, check: &str) -> bool {
        self.findings.iter().any(|f| f.check == check && f.status == Status::Violation)
    }

    // -------------------------------------------------------------------------------------------------------------
    // talking to the engine

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// `n` ids every vocabulary has: letters when the vocabulary reaches them.
    fn ids(&mut self, n: usize) -> Vec<u32> {
        let (base, span) = if self.vocab > 123 { (97, 26) } else { (0, self.vocab.max(1) as u64) };
        (0..n).map(|_| base + self.rng.below(span) as u32).collect()
    }

    /// The longest reply that fits after a prompt of `len` ids.
    fn long_reply(&self, len: usize) -> usize {
        LONG_REPLY.min(self.max_ctx.saturating_sub(len + 8)).max(1)
    }

    fn send(&mut self, bytes: &[u8]) {
        if !self.conn.send(bytes) {
            self.lost("writing to its stdin");
        }
    }

    fn lost(&mut self, when: &str) {
        if !self.gone {
            self.gone = true;
            self.violation("alive", format!("the engine closed its stdout or stdin while {when}"), None, None);
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn start(&mut self, id: u64, bytes: Vec<u8>) -> Answer {
        let ans = Answer {
            id,
            sent_at: Instant::now(),
            sent: bytes.clone(),
            prompt: None,
            data: Vec::new(),
            tokens: Vec::new(),
            pieces: Vec::new(),
            end: None,
            others: Vec::new(),
        };
        self.send(&bytes);
        ans
    }

    /// Read the answer's frames until it ends, or (`first_data`) until its first DATA; frames about other ids
    /// go to `ans.others`.
    fn read(&mut self, ans: &mut Answer, first_data: bool) {
        let deadline = self.deadline();
        while ans.end.is_none() && (!first_data || ans.data.is_empty()) {
            match self.next_other(ans, deadline, first_data) {
                Some(g) => ans.others.push(g),
                None => return,
            }
        }
    }

    /// The next frame that is not about `ans` (frames about `ans` are taken into it on the way); `None` when
    /// `ans` ended (or timed out, or the engine is gone) first, or (`at_data`) when it has its first DATA.
    fn next_other(&mut self, ans: &mut Answer, deadline: Instant, at_data: bool) -> Option<Got> {
        loop {
            if self.gone {
                ans.end.get_or_insert(End::Gone);
            }
            let g = match self.conn.next(deadline) {
                Some(g) => g,
                None if self.conn.is_closed() => {
                    ans.end.get_or_insert(End::Gone);
                    self.lost(&format!("answering SUBMIT {}", ans.id));
                    return None;
                }
                None => {
                    if ans.end.is_none() {
                        ans.end = Some(End::Timeout);
                        let what = format!("no DONE or ERROR for SUBMIT {} within {:?}", ans.id, self.timeout);
                        let sent = ans.sent.clone();
                        self.violation("answer", what, None, Some(&sent));
                    }
                    return None;
                }
            };
            if !self.absorb(ans, &g) {
                return Some(g);
            }
            if ans.end.is_some() || (at_data && !ans.data.is_empty()) {
                // the answer ended (or has begun): what follows is not waited for here
                return None;
            }
        }
    }

    /// Take `g` into `ans` when it is about it.
    fn absorb(&mut self, ans: &mut Answer, g: &Got) -> bool {
        let id = ans.id;
        match g.frame.clone() {
            Ok(EngineFrame::Prompt(p)) if p.id == id && ans.end.is_none() => {
                if !ans.data.is_empty() || ans.prompt.is_some() {
                    self.violation("echo", "PROMPT after the request's first DATA (or twice)", Some(g), None);
                }
                ans.prompt = Some((g.clone(), p.ids));
            }
            Ok(EngineFrame::Data(d)) if d.id == id && ans.end.is_none() => {
                self.check_data(g, &d);
                if let Some(t) = d.tid {
                    ans.tokens.push(t);
                }
                ans.pieces.push(d.text);
                ans.data.push(g.clone());
            }
            Ok(EngineFrame::Done(d)) if d.id == id && ans.end.is_none() => {
                self.finished.insert(id);
                ans.end = Some(End::Done(g.clone(), d));
            }
            Ok(EngineFrame::Error(e)) if e.id == Some(id) && ans.end.is_none() && e.code != ErrorCode::DuplicateId => {
                ans.end = Some(End::Error(g.clone(), e));
            }
            _ => return false,
        }
        true
    }

    /// Frames about other ids that a check did not expect.
    fn flag_others(&mut self, ans: &Answer) {
        for g in &ans.others {
            self.stray(g);
        }
    }

    fn stray(&mut self, g: &Got) {
        match &g.frame {
            Ok(EngineFrame::Data(d)) if self.finished.contains(&d.id) => self.repeated(
                "done",
                "data after done",
                format!("DATA for request {} after its DONE: DONE must follow the request's last DATA", d.id),
                Some(g),
            ),
            Ok(_) => self.violation("frames", "a frame that answers nothing that was sent", Some(g), None),
            Err(e) => self.violation("frames", format!("not a frame: {e}"), Some(g), None),
        }
    }

    /// Flag whatever arrives unasked within a moment (a DATA written after its DONE, a second answer): each check
    /// section starts from a quiet stream, so one broken request does not spill into the next check.
    fn settle(&mut self) {
        if self.gone {
            return;
        }
        for g in self.conn.drain(Duration::from_millis(50)) {
            self.stray(&g);
        }
    }

    /// The prologue every check section shares: start from a quiet stream, and do nothing once the engine is gone.
    fn section(&mut self) -> bool {
        self.settle();
        !self.gone
    }

    /// `section` for checks that need a CAPS flag: when the engine does not declare it (`declared` is false), each of
    /// `checks` is skipped, naming `flag`.
    fn section_needing(&mut self, declared: bool, flag: &str, checks: &[&str]) -> bool {
        if !self.section() {
            return false;
        }
        if !declared {
            for check in checks {
                self.skip(check, format!("CAPS does not declare {flag}=1"));
            }
        }
        declared
    }

    /// A STOP or CANCEL that crossed its request's last DATA on the wire may find the request already retired;
    /// then the engine answers it NOT_FOUND after the DONE (docs/protocol.md), which is that frame's answer, not a
    /// stray one. Wait a moment for it; anything else that arrives is flagged as usual.
    fn late_interrupt_answer(&mut self, id: u64) {
        let wait = Instant::now() + self.timeout.min(Duration::from_secs(2));
        if let Some(g) = self.conn.next(wait) {
            if !(g.id() == Some(id) && frame_error(&g, &ErrorCode::NotFound)) {
                self.stray(&g);
            }
        }
    }

    /// Start a reply long enough to be interrupted, from a short fresh prompt (which leaves the whole context for
    /// the reply), and read it up to its first DATA: the prompt, max_tokens, the id and the answer so far.
    fn long_request(&mut self) -> (Vec<u32>, usize, u64, Answer) {
        let prompt = self.ids(8);
        let max = self.long_reply(prompt.len());
        let id = self.id();
        let mut ans = self.start(id, submit_bytes(id, 0, &prompt, max, " ignore_eos=1"));
        self.read(&mut ans, true);
        (prompt, max, id, ans)
    }

    /// Send `bytes` (a STOP or CANCEL of request `id`) unless its answer has already ended, read the rest of the
    /// answer and flag anything else that arrived. A request that ran to its limit first gets the late NOT_FOUND.
    fn interrupt(&mut self, ans: &mut Answer, id: u64, bytes: &[u8]) {
        if ans.end.is_none() {
            self.send(bytes);
            self.read(ans, false);
            if matches!(&ans.end, Some(End::Done(_, d)) if d.length_limited == Some(true)) {
                self.late_interrupt_answer(id);
            }
        }
        self.flag_others(ans);
    }

    /// Send a request and read its whole answer, flagging anything else that arrives.
    fn request(&mut self, id: u64, bytes: Vec<u8>) -> Answer {
        let mut ans = self.start(id, bytes);
        self.read(&mut ans, false);
        self.flag_others(&ans);
        ans
    }

    // -------------------------------------------------------------------------------------------------------------
    // frame checks

    fn check_data(&mut self, g: &Got, d: &serve::DataFrame) {
        self.data_frames += 1;
        match d.tid {
            None => self.violation("data", "DATA without tid=: kvproof compares token ids", Some(g), None),
            Some(t) if self.vocab > 0 && t as usize >= self.vocab => {
                self.violation("data", format!("tid={t} is not below vocab={}", self.vocab), Some(g), None)
            }
            Some(_) => {}
        }
        match d.gap {
            None => {
                self.violation("data", "DATA without gap=: near-ties cannot be told from divergences", Some(g), None)
            }
            Some(gap) if gap < 0.0 => {
                self.violation("data", "gap= is negative: it is top-1 minus top-2 logit", Some(g), None)
            }
            Some(_) => {}
        }
    }

    /// DONE's fields against the DATA frames before it, the request sent, and the clock.
    fn check_done(&mut self, ans: &Answer, expect: &Expect) {
        let Some(End::Done(g, d)) = &ans.end else { return };
        let (g, d) = (g.clone(), d.clone());
        self.done_frames += 1;
        if d.emitted != ans.data.len() {
            let what = format!("DONE says emitted {}, but {} DATA frames came before it", d.emitted, ans.data.len());
            self.repeated("done", "emitted", what, Some(&g));
        }
        if ans.data.len() > expect.max_tokens {
            let what = format!("{} DATA frames for max_tokens {}", ans.data.len(), expect.max_tokens);
            self.violation("data", what, Some(&g), None);
        }
        if let (Some(want), Some(got)) = (expect.prompt_len, d.prompt_tokens) {
            if want != got {
                let what = format!("prompt_tokens {got}, but the SUBMIT carried {want} ids");
                self.repeated("done", "prompt_tokens", what, Some(&g));
            }
        }
        if let (Some(p), Some(r)) = (d.prompt_tokens, d.reused) {
            if r >= p {
                let what =
                    format!("prefix_reused {r} of {p} prompt tokens: at least one prompt id is always prefilled");
                self.violation("done", what, Some(&g), None);
            } else {
                let pct = 100.0 * r as f64 / p as f64;
                if (d.hit_pct - pct).abs() > 0.051 {
                    let what = format!("hit_pct {}, but 100 * {r} / {p} = {pct:.1}", d.hit_pct);
                    self.violation("done", what, Some(&g), None);
                }
            }
        }
        if !(d.rss_gb.is_finite() && d.rss_gb >= 0.0) {
            self.violation("done", format!("rss_gb {} is not a size", d.rss_gb), Some(&g), None);
        }
        match d.length_limited {
            Some(true) if ans.data.len() != expect.max_tokens => {
                let what =
                    format!("length_limited 1 with {} of max_tokens {} emitted", ans.data.len(), expect.max_tokens);
                self.repeated("done", "length_limited 1", what, Some(&g));
            }
            Some(false) if expect.ignore_eos && !expect.stopped && ans.data.len() == expect.max_tokens => {
                let what = "length_limited 0, but an ignore_eos=1 request that was not stopped ended at max_tokens";
                self.violation("done", what, Some(&g), None);
            }
            None => {
                self.violation("done", "DONE without prompt_tokens / length_limited / prefix_reused", Some(&g), None)
            }
            _ => {}
        }
        if !self.reuse_flag_checked {
            self.reuse_flag_checked = true;
            match (self.caps.reuse(), d.reused) {
                (true, None) => {
                    self.violation("caps", "CAPS declares reuse=1, but DONE has no prefix_reused", Some(&g), None)
                }
                (false, Some(r)) => self.violation(
                    "caps",
                    format!(
                        "DONE carries prefix_reused ({r}), but CAPS lacks reuse=1: kvproof skips every reuse check \
                         of this engine"
                    ),
                    Some(&g),
                    None,
                ),
                _ => {}
            }
        }
        self.check_tok_s(ans, &g, &d);
    }

    /// `tok_s` against the clock: decoding `emitted` tokens cannot take longer than the whole request, nor much
    /// less than the time the DATA frames took to arrive.
    fn check_tok_s(&mut self, ans: &Answer, g: &Got, d: &DoneFrame) {
        if !(d.tok_s.is_finite() && d.tok_s >= 0.0) {
            self.violation("tok-s", format!("tok_s {} is not a rate", d.tok_s), Some(g), None);
            return;
        }
        if d.emitted < 2 || d.tok_s == 0.0 {
            return;
        }
        let claimed = d.emitted as f64 / d.tok_s;
        let wall = g.at.duration_since(ans.sent_at).as_secs_f64();
        if claimed > wall * 1.2 + 0.05 {
            let what = format!(
                "tok_s {} means {claimed:.3} s of decoding for {} tokens, but the whole request took {wall:.3} s",
                d.tok_s, d.emitted
            );
            self.repeated("tok-s", "too low", what, Some(g));
            return;
        }
        if let Some(first) = ans.data.first() {
            let span = g.at.duration_since(first.at).as_secs_f64();
            if span >= 0.05 && d.emitted >= 3 && claimed * 4.0 < span {
                let what = format!(
                    "tok_s {} means {claimed:.3} s of decoding, but the DATA frames took {span:.3} s to arrive",
                    d.tok_s
                );
                self.repeated("tok-s", "too high", what, Some(g));
            }
        }
    }

    // -------------------------------------------------------------------------------------------------------------
    // the oracle

    /// The slot is empty and its state known from here on (after RESET): the book starts over.
    fn restart_book(&mut self) {
        self.book = SlotBook::new(self.rule).keeping_state_on(&self.keeps_state_on);
        self.book_known = true;
        self.last_full.clear();
    }

    /// The slot holds request `id`'s prompt `ids` (as PROMPT echoed them) and its `reply` but its last token: the
    /// book starts over from that known state.
    fn restart_book_after(&mut self, id: u64, ids: &[u32], max_tokens: usize, reply: &[u32]) {
        self.restart_book();
        self.book.after(&Self::request_of(id, ids, max_tokens), Outcome::Completed { reply });
        self.last_full = [ids, reply].concat();
    }

    fn request_of(id: u64, prompt: &[u32], max_tokens: usize) -> Request {
        Request { id, slot: 0, prompt: prompt.to_vec(), max_tokens, ..Request::default() }
    }

    /// The reuse count of a finished request on slot 0 against the declared rule; then the book moves on.
    fn check_reuse(&mut self, what: &str, req: &Request, ans: &Answer) {
        match &ans.end {
            Some(End::Done(_, d)) if ans.tokens.len() != ans.data.len() || d.emitted != ans.data.len() => {
                // DATA without tid=, or DONE before the last DATA: the reply's ids, so what the slot fed, are unknown
                self.book_known = false;
                self.last_full.clear();
            }
            Some(End::Done(g, d)) => {
                let (g, reported) = (g.clone(), d.reused);
                if let (Some(reported), true, true) = (reported, self.book_known, self.caps.reuse()) {
                    self.judge_reuse(what, req, reported, &g);
                }
                self.book.after(req, Outcome::Completed { reply: &ans.tokens });
                self.book_known = !matches!(self.rule, Some(Rule::Blocks { .. })) || self.book_known;
                let mut full = req.prompt.clone();
                full.extend_from_slice(&ans.tokens);
                self.last_full = full;
            }
            Some(End::Error(_, e)) => {
                let code = e.code.name().to_string();
                self.book.after(req, Outcome::Failed { code: &code });
            }
            _ => self.book_known = false,
        }
    }

    fn judge_reuse(&mut self, what: &str, req: &Request, reported: usize, g: &Got) {
        let before = self.book.slot(0);
        let fed_back = !self.last_full.is_empty()
            && before.reusable
            && reported == self.last_full.len()
            && req.prompt.len() > self.last_full.len()
            && req.prompt.starts_with(&self.last_full);
        let detail = |s: &str| format!("{what}: {s}");
        match self.book.expected(req) {
            Some(want) if want == reported => {
                self.reuse_matched.push(format!("{what} {reported}"));
                self.reuse_values.push(reported);
            }
            _ if fed_back => {
                let last = self.last_full.last().copied().unwrap_or_default();
                let s = format!(
                    "reused {reported} = the previous prompt and its whole reply: the count (or the state) takes in \
                     the last generated token ({last}), which is emitted, never fed (docs/protocol.md, DONE)"
                );
                self.note("last-token", Status::Violation, detail(&s), Some(g), None);
            }
            Some(want) => {
                let s = format!(
                    "reused {reported}, the declared rule `{}` expects {want} (the slot fed {} ids, {})",
                    self.rule_name,
                    before.fed.len(),
                    if before.reusable { "reusable" } else { "spoiled or fresh" }
                );
                self.note("reuse", Status::Violation, detail(&s), Some(g), None);
            }
            None if self.book.must_reuse(req) && reported == 0 => {
                let s = format!(
                    "the prompt strictly extends all {} ids slot 0 fed, but DONE reports 0 reused: reuse never \
                     fired",
                    before.fed.len()
                );
                self.note("reuse", Status::Violation, detail(&s), Some(g), None);
            }
            None => self.reuse_matched.push(format!("{what} {reported} (no rule: not compared)")),
        }
    }

    /// Run `prompt` on slot 0 with ids and check everything about the answer.
    fn run_ids(&mut self, what: &str, prompt: &[u32], max_tokens: usize, ignore_eos: bool) -> Answer {
        let id = self.id();
        let options = if ignore_eos { " ignore_eos=1" } else { "" };
        let ans = self.request(id, submit_bytes(id, 0, prompt, max_tokens, options));
        self.check_done(&ans, &Expect { ignore_eos, ..Expect::reply(Some(prompt.len()), max_tokens) });
        if let Some(e) = ans.error() {
            let s = format!("{what}: a valid SUBMIT was refused ({})", e.code);
            let (g, sent) = (ans.end_frame().cloned(), ans.sent.clone());
            self.violation("submit-ids", s, g.as_ref(), Some(&sent));
        }
        self.check_reuse(what, &Self::request_of(id, prompt, max_tokens), &ans);
        ans
    }

    /// A prompt that extends what slot 0 holds (the last prompt and its whole reply) by `n` ids; a new
    /// conversation of `n + 8` ids once that one has used half the context.
    fn extension(&mut self, n: usize) -> Vec<u32> {
        if self.last_full.len() + n > self.max_ctx / 2 {
            return self.ids(n + 8);
        }
        let mut p = self.last_full.clone();
        p.extend(self.ids(n));
        p
    }

    // -------------------------------------------------------------------------------------------------------------
    // the checks

    fn startup(&mut self, cmd: &str) -> Result<Option<String>, StartError> {
        let deadline = self.deadline();
        loop {
            match self.conn.next(deadline) {
                Some(g) if matches!(g.frame, Ok(EngineFrame::Ready)) => break,
                Some(g) => self.violation(
                    "ready",
                    "stdout carries frames only: this came before the READY marker",
                    Some(&g),
                    None,
                ),
                None => {
                    return Err(StartError::NoReady {
                        command: cmd.to_string(),
                        after: self.timeout,
                        stderr: self.conn.stderr_tail(),
                    })
                }
            }
        }
        self.pass("ready", "the READY marker came first");
        let caps_line = match self.conn.next(Instant::now() + CAPS_WAIT) {
            Some(g) => match &g.frame {
                Ok(EngineFrame::Caps(c)) => {
                    self.caps = c.clone();
                    let entries: Vec<String> = c.entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    Some(format!("CAPS {}", entries.join(" ")))
                }
                _ => {
                    self.violation("caps", "the frame after READY is not CAPS", Some(&g), None);
                    None
                }
            },
            None => {
                self.violation("caps", format!("no CAPS line within {CAPS_WAIT:?} of READY"), None, None);
                None
            }
        };
        let noise = self.conn.drain(QUIET_WAIT);
        for g in &noise {
            self.violation("quiet", "nothing is written until the client sends something", Some(g), None);
        }
        if noise.is_empty() {
            self.pass("quiet", "nothing unasked after CAPS");
        }
        Ok(caps_line)
    }

    fn check_caps(&mut self) {
        let caps = self.caps.clone();
        let bad = |p: &mut Probe, s: String| p.violation("caps", s, None, None);
        let mut seen: Vec<&str> = Vec::new();
        for (k, v) in &caps.entries {
            if seen.contains(&k.as_str()) {
                bad(self, format!("`{k}` appears twice"));
            }
            seen.push(k);
            if v.is_empty() {
                bad(self, format!("`{k}` is not key=value"));
            }
        }
        for key in ["proto", "arch", "slots", "max_ctx", "vocab", "ids"] {
            if caps.get(key).is_none() {
                bad(self, format!("required key `{key}` is missing"));
            }
        }
        if caps.get("proto").is_some_and(|v| v != "1") {
            bad(self, format!("proto={}: this is revision 1 of the protocol", caps.get("proto").unwrap_or("")));
        }
        for key in ["slots", "max_ctx", "vocab"] {
            if let Some(v) = caps.get(key) {
                if caps.number(key).is_none_or(|n| n == 0) {
                    bad(self, format!("{key}={v} is not a positive count"));
                }
            }
        }
        for key in ["audio_frame", "initial_capacity"] {
            if let Some(v) = caps.get(key) {
                if v != "-" && caps.number(key).is_none() {
                    bad(self, format!("{key}={v} is not a count"));
                }
            }
        }
        for key in ["window", "prompt_rows"] {
            if let Some(v) = caps.get(key) {
                if v != "-" && caps.number(key).is_none() {
                    bad(self, format!("{key}={v} is neither a count nor -"));
                }
            }
        }
        let flags = [
            "ids",
            "dump",
            "reuse",
            "stop",
            "cancel",
            "logprobs",
            "audio",
            "kv_share",
            "chat",
            "echo",
            "reset",
            "cancel_at",
        ];
        for key in flags {
            if let Some(v) = caps.get(key) {
                if v != "0" && v != "1" {
                    bad(self, format!("{key}={v}: flags are 0 or 1"));
                }
            }
        }
        if caps.get("ids") != Some("1") {
            bad(self, "ids=1 is required: kvproof sends token ids".into());
        }
        if caps.audio() && caps.number("audio_frame").unwrap_or(0) == 0 {
            bad(self, "audio=1 without a positive audio_frame".into());
        }
        let known = ["CONTEXT_EXCEEDED", "CANCELLED", "INTERNAL", "BAD_REQUEST", "EMPTY_PROMPT"];
        for code in caps.keeps_state_on() {
            if !known.contains(&code.as_str()) {
                bad(self, format!("keeps_state_on names `{code}`, which is not a failure code of a request"));
            }
        }
        self.vocab = caps.vocab().unwrap_or(0);
        self.max_ctx = caps.max_ctx().unwrap_or(4096);
        self.slots = caps.slots().unwrap_or(1);
        self.keeps_state_on = caps.keeps_state_on();
        match crate::driver::from_caps(&caps) {
            Ok((info, driver_caps)) => {
                self.rule = oracle::rule_for(&info, &driver_caps);
                self.rule_name = match (driver_caps.reuse_rule, self.rule) {
                    (Some(d), _) => d.to_string(),
                    (None, Some(_)) => format!("{} (the bundled arch's)", info.arch),
                    (None, None) => String::new(),
                };
                if let (Some(serve_rows), Some(crate::scenario::DeclaredRule::Grid(r))) =
                    (info.prompt_rows, driver_caps.reuse_rule)
                {
                    if serve_rows != r {
                        bad(self, format!("reuse_rule=grid:{r} but prompt_rows={serve_rows}"));
                    }
                }
            }
            Err(e) => bad(self, e),
        }
        self.book = SlotBook::new(self.rule).keeping_state_on(&self.keeps_state_on);
        if !self.violated("caps") {
            let declared: Vec<&str> = ["reuse", "stop", "cancel", "dump", "reset", "chat", "echo", "cancel_at"]
                .into_iter()
                .filter(|k| caps.flag(k))
                .collect();
            self.pass("caps", format!("required keys and value syntax; declares {}", declared.join(" ")));
        }
        if self.rule.is_none() {
            self.skip(
                "reuse",
                "no reuse rule: CAPS declares no reuse_rule= (and the arch is not bundled); only reuse-fired is checked",
            );
        }
        if !caps.reuse() {
            self.skip("reuse", "CAPS lacks reuse=1: reuse counts are not compared");
        }
    }

    fn ready_for_requests(&mut self) -> bool {
        if self.caps.get("ids") == Some("1") && self.vocab > 0 {
            return true;
        }
        self.skip("submit-ids", "CAPS lacks ids=1 or vocab: no request can be built");
        false
    }

    /// A conversation on slot 0: every reuse count against the rule, the last token never fed back.
    fn reuse_sequence(&mut self) {
        let p1 = self.ids(24);
        let a1 = self.run_ids("turn 1 on a fresh slot", &p1, 8, false);
        if a1.done().is_none() || self.gone {
            return;
        }
        self.pass("submit-ids", "SUBMIT with ids=1 answered by DATA frames and one DONE");
        self.first = Some((p1.clone(), a1.tokens.clone()));
        let p2 = self.extension(6);
        self.run_ids("prompt + whole reply + more", &p2, 6, true);
        if !self.violated("last-token") && self.caps.reuse() {
            self.pass("last-token", "a continuation of prompt + a length-limited reply");
        }
        self.run_ids("the same prompt again", &p2, 6, true);
        let shorter = p2[..p2.len() - 3].to_vec();
        self.run_ids("a shorter prompt", &shorter, 6, true);
        for (name, at) in [("diverging in the middle", 0.5), ("diverging at the last fed id", 1.0)] {
            let fed = self.book.slot(0).fed;
            if fed.is_empty() {
                break;
            }
            let i = ((fed.len() - 1) as f64 * at) as usize;
            let mut d = fed;
            d[i] = if d[i] == 97 { 98 } else { 97 };
            d.extend(self.ids(5));
            self.run_ids(name, &d, 6, true);
        }
        let next = self.extension(5);
        self.run_ids("the next turn", &next, 6, true);

        // A reply that ends at eos, then its continuation: eos is not fed back either.
        let mut eos = false;
        for i in 0..EOS_TRIES {
            let q = self.extension(4 + i);
            let max = 64.min(self.max_ctx.saturating_sub(q.len() + 16)).max(1);
            let a = self.run_ids("a turn that may end at eos", &q, max, false);
            if a.ended_at_eos(max) {
                eos = true;
                break;
            }
            if self.gone || a.done().is_none() {
                break;
            }
        }
        if eos {
            let c = self.extension(5);
            self.run_ids("prompt + a reply ending at eos + more", &c, 4, true);
            if !self.violated("last-token") {
                self.pass("last-token", "a continuation of prompt + a reply that ended at eos");
            }
        } else {
            self.skip("last-token", format!("eos path: none of {EOS_TRIES} replies ended at eos"));
        }
    }

    fn stop_checks(&mut self) {
        if !self.section_needing(self.caps.flag("stop"), "stop", &["stop", "barrier"]) {
            return;
        }
        let (prompt, max, id, mut ans) = self.long_request();
        let fresh = 1_000_000 + id;
        let stop_fresh = format!("STOP {fresh}\n").into_bytes();
        self.send(&stop_fresh);
        // the fresh id's answer, and whether the request had ended before it came
        let mut fresh_answer: Option<(Got, bool)> = None;
        let deadline = self.deadline();
        while !self.gone {
            if ans.end.is_none() {
                match self.next_other(&mut ans, deadline, false) {
                    Some(g) if g.id() == Some(fresh) || is_anonymous_error(&g) => {
                        fresh_answer = Some((g, false));
                        break;
                    }
                    Some(g) => ans.others.push(g),
                    None if matches!(ans.end, Some(End::Done(..) | End::Error(..))) => {}
                    None => break,
                }
            } else {
                match self.conn.next(deadline) {
                    Some(g) if g.id() == Some(fresh) || is_anonymous_error(&g) => {
                        fresh_answer = Some((g, true));
                        break;
                    }
                    Some(g) => ans.others.push(g),
                    None => break,
                }
            }
        }
        match &fresh_answer {
            Some((g, _)) if !frame_error(g, &ErrorCode::NotFound) => {
                let g = g.clone();
                self.violation("stop", "STOP for an id nobody sent is answered NOT_FOUND", Some(&g), Some(&stop_fresh));
            }
            Some((_, false)) => self.pass("not-found", "STOP of an unknown id answered NOT_FOUND at once, mid-request"),
            Some((g, true)) => {
                let limited = ans.done().is_some_and(|d| d.length_limited == Some(true));
                if limited {
                    self.skip("not-found", "the request ended before the STOP of an unknown id was read");
                } else {
                    let g = g.clone();
                    self.violation(
                        "not-found",
                        "STOP of an unknown id was answered after the DONE of the request in flight: it is answered \
                         at once (docs/protocol.md, STOP and CANCEL)",
                        Some(&g),
                        Some(&stop_fresh),
                    );
                }
            }
            None => {
                self.violation("stop", "no answer to STOP of an unknown id", None, Some(&stop_fresh));
            }
        }
        let stop = format!("STOP {id}\n").into_bytes();
        self.interrupt(&mut ans, id, &stop);
        self.check_done(&ans, &Expect::interrupted(prompt.len(), max));
        let req = Self::request_of(id, &prompt, max);
        match &ans.end {
            Some(End::Done(_, d)) if d.length_limited == Some(true) => {
                self.skip("stop", format!("the request ran all {max} tokens before STOP was read"));
            }
            Some(End::Done(g, d)) => {
                if d.emitted == 0 {
                    let g = g.clone();
                    self.violation("stop", "a stopped reply is never empty", Some(&g), Some(&stop));
                } else {
                    self.pass("stop", format!("STOP mid-reply ended it after {} of {max} tokens with DONE", d.emitted));
                }
            }
            Some(End::Error(g, _)) => {
                let g = g.clone();
                self.violation("stop", "STOP ends a request normally: with DONE, not ERROR", Some(&g), Some(&stop));
            }
            _ => {}
        }
        self.check_reuse("a stopped turn", &req, &ans);
        let next = self.extension(5);
        self.run_ids("the turn after a stopped one", &next, 4, true);

        // the barrier: a late STOP, then a STOP for a fresh id, answered in this order
        self.settle();
        let fresh = 2_000_000 + id;
        let bytes = format!("STOP {id}\nSTOP {fresh}\n").into_bytes();
        self.send(&bytes);
        let deadline = self.deadline();
        let got: Vec<Got> = (0..2).filter_map(|_| self.conn.next(deadline)).collect();
        let ok = got.len() == 2
            && got[0].id() == Some(id)
            && frame_error(&got[0], &ErrorCode::NotFound)
            && got[1].id() == Some(fresh)
            && frame_error(&got[1], &ErrorCode::NotFound);
        if ok {
            self.pass("barrier", "a late STOP and a fresh STOP answered NOT_FOUND, in order");
        } else {
            let what = "when idle, STOP <finished id> then STOP <fresh id> are answered NOT_FOUND in that order";
            self.violation("barrier", what, got.first(), Some(&bytes));
            for g in got.iter().skip(1) {
                self.stray(g);
            }
        }

        // a STOP read during prefill stops at the first token
        let prompt = self.extension(4);
        let max = self.long_reply(prompt.len());
        let id = self.id();
        let mut bytes = submit_bytes(id, 0, &prompt, max, " ignore_eos=1");
        bytes.extend_from_slice(format!("STOP {id}\n").as_bytes());
        let ans = self.request(id, bytes.clone());
        self.check_done(&ans, &Expect::interrupted(prompt.len(), max));
        match ans.done() {
            Some(d) if d.emitted == 0 => {
                let g = ans.end_frame().cloned();
                self.violation(
                    "stop",
                    "a STOP read during prefill must stop at the first token",
                    g.as_ref(),
                    Some(&bytes),
                );
            }
            Some(d) if d.length_limited == Some(false) => self.pass("stop", "STOP in the same write as SUBMIT"),
            _ => {}
        }
        self.check_reuse("a turn stopped during prefill", &Self::request_of(id, &prompt, max), &ans);
    }

    fn cancel_checks(&mut self) {
        if !self.section_needing(self.caps.flag("cancel"), "cancel", &["cancel"]) {
            return;
        }
        // CANCEL after the first DATA; an engine that outruns the probe (a reply of thousands of tokens can end
        // before the CANCEL is read) gets a second request with the CANCEL in the same write as its SUBMIT
        let (mut prompt, mut max, mut id, mut ans) = self.long_request();
        let mut cancel = format!("CANCEL {id}\n").into_bytes();
        self.interrupt(&mut ans, id, &cancel);
        let mut how = "CANCEL mid-reply";
        if matches!(&ans.end, Some(End::Done(_, d)) if d.length_limited == Some(true)) {
            self.check_done(&ans, &Expect::interrupted(prompt.len(), max));
            self.check_reuse("a turn that ended before its CANCEL was read", &Self::request_of(id, &prompt, max), &ans);
            prompt = self.ids(8);
            max = self.long_reply(prompt.len());
            id = self.id();
            cancel = format!("CANCEL {id}\n").into_bytes();
            let mut bytes = submit_bytes(id, 0, &prompt, max, " ignore_eos=1");
            bytes.extend_from_slice(&cancel);
            ans = self.start(id, bytes);
            self.read(&mut ans, false);
            if matches!(&ans.end, Some(End::Done(_, d)) if d.length_limited == Some(true)) {
                self.late_interrupt_answer(id);
            }
            self.flag_others(&ans);
            how = "CANCEL in the same write as SUBMIT";
        }
        match &ans.end {
            Some(End::Error(_, e)) if e.code == ErrorCode::Cancelled => {
                self.pass("cancel", format!("{how} answered ERROR CANCELLED"));
            }
            Some(End::Done(_, d)) if d.length_limited == Some(true) => {
                self.skip("cancel", format!("twice the request ran all {max} tokens before CANCEL was read"));
            }
            Some(End::Done(g, _) | End::Error(g, _)) => {
                let g = g.clone();
                self.violation(
                    "cancel",
                    "CANCEL is answered ERROR <id> CANCELLED, instead of DONE",
                    Some(&g),
                    Some(&cancel),
                );
            }
            _ => {}
        }
        self.check_done(&ans, &Expect::interrupted(prompt.len(), max));
        self.check_reuse("a cancelled turn", &Self::request_of(id, &prompt, max), &ans);
        if ans.error().is_some() && ans.data.is_empty() {
            // cancelled before its first token, perhaps before it began: whether the slot was spoiled is unknown
            self.book_known = false;
        }
        // the cancelled prompt, extended: a spoiled slot reuses nothing (unless the engine keeps its state)
        let mut after = prompt.clone();
        after.extend(self.ids(5));
        self.run_ids("the cancelled prompt extended", &after, 4, true);

        self.settle();
        let id = self.id();
        let bytes = format!("CANCEL {}\n", 3_000_000 + id).into_bytes();
        self.send(&bytes);
        match self.conn.next(self.deadline()) {
            Some(g) if frame_error(&g, &ErrorCode::NotFound) && g.id() == Some(3_000_000 + id) => {
                self.pass("not-found", "CANCEL of an unknown id answered NOT_FOUND")
            }
            other => {
                self.violation("cancel", "CANCEL of an unknown id is answered NOT_FOUND", other.as_ref(), Some(&bytes))
            }
        }
    }

    fn cancel_at_checks(&mut self) {
        if !self.section_needing(self.caps.flag("cancel_at"), "cancel_at", &["cancel-at"]) {
            return;
        }
        let tail = 64.min(self.max_ctx.saturating_sub(self.last_full.len() + 16));
        let prompt = self.extension(tail);
        let id = self.id();
        let bytes = submit_bytes(id, 0, &prompt, 4, " cancel_at=0");
        let ans = self.request(id, bytes.clone());
        self.check_done(&ans, &Expect::reply(Some(prompt.len()), 4));
        match ans.error() {
            Some(e) if e.code == ErrorCode::Cancelled => self.pass("cancel-at", "cancel_at=0 answered ERROR CANCELLED"),
            _ => {
                let g = ans.end_frame().cloned();
                self.violation(
                    "cancel-at",
                    format!(
                        "cancel_at=0 on a {}-id prompt must fail CANCELLED at the first prefill poll",
                        prompt.len()
                    ),
                    g.as_ref(),
                    Some(&bytes),
                );
            }
        }
        self.check_reuse("a turn cancelled at a prefill poll", &Self::request_of(id, &prompt, 4), &ans);
        let mut after = prompt.clone();
        after.extend(self.ids(5));
        self.run_ids("the prompt cancelled at a poll, extended", &after, 4, true);
        let next = self.extension(3);
        let id = self.id();
        let bytes = submit_bytes(id, 0, &next, 4, " cancel_at=1000000");
        let ans = self.request(id, bytes.clone());
        self.check_done(&ans, &Expect::reply(Some(next.len()), 4));
        if ans.done().is_some() {
            self.pass("cancel-at", "a cancel_at past the last poll runs to DONE");
        } else {
            let g = ans.end_frame().cloned();
            self.violation("cancel-at", "a cancel_at past the last poll runs normally", g.as_ref(), Some(&bytes));
        }
        self.check_reuse("a turn with an unreached cancel_at", &Self::request_of(id, &next, 4), &ans);
    }

    fn context_checks(&mut self) {
        if !self.section() {
            return;
        }
        if self.max_ctx > MAX_OVERFLOW_CTX {
            self.skip("context-exceeded", format!("max_ctx {} is too long a prompt to send", self.max_ctx));
            return;
        }
        let mut prompt = self.last_full.clone();
        prompt.truncate(self.max_ctx);
        let more = self.max_ctx + 1 - prompt.len();
        prompt.extend(self.ids(more));
        let id = self.id();
        let bytes = submit_bytes(id, 0, &prompt, 4, "");
        let ans = self.request(id, bytes.clone());
        let want = ErrorCode::ContextExceeded { used: self.max_ctx + 1, limit: self.max_ctx };
        match ans.error() {
            Some(e) if e.code == want => {
                self.pass("context-exceeded", format!("{} ids answered {want}", self.max_ctx + 1))
            }
            _ => {
                let g = ans.end_frame().cloned();
                let shown = format!("SUBMIT {id} with {} ids (max_ctx {})", prompt.len(), self.max_ctx);
                self.violation(
                    "context-exceeded",
                    format!("an over-long prompt is answered ERROR <id> {want}"),
                    g.as_ref(),
                    Some(shown.as_bytes()),
                );
            }
        }
        self.check_reuse("an over-long prompt", &Self::request_of(id, &prompt, 4), &ans);
        let next = self.extension(4);
        self.run_ids("the turn after an over-long prompt", &next, 4, true);
    }

    fn dump_checks(&mut self) {
        if !self.section_needing(self.caps.dump(), "dump", &["dump"]) {
            return;
        }
        let next = self.extension(3);
        let a = self.run_ids("a turn before DUMP", &next, 4, true);
        let dir = std::env::temp_dir();
        let path = dir.join(format!("kvproof-conformance-{}-{}.safetensors", std::process::id(), a.id));
        let path_str = path.to_string_lossy().into_owned();
        let id = self.id();
        let bytes = format!("DUMP {id} 0 {path_str}\n").into_bytes();
        self.send(&bytes);
        match self.conn.next(self.deadline()) {
            Some(g) => match &g.frame {
                Ok(EngineFrame::Dumped(d)) if d.id == id => {
                    let size = std::fs::metadata(&path).map(|m| m.len());
                    if size.as_ref().ok() != Some(&d.bytes) {
                        self.violation(
                            "dump",
                            format!("DUMPED says {} bytes; the file has {size:?}", d.bytes),
                            Some(&g),
                            Some(&bytes),
                        );
                    }
                    match kvproof_engines::dump::read_file(&path) {
                        Ok(dump) => {
                            let fed = self.book.slot(0).fed;
                            if a.done().is_some() && dump.record.ids == self.last_full {
                                self.violation(
                                    "last-token",
                                    "the dumped record holds the last generated token: it is emitted, never fed",
                                    Some(&g),
                                    Some(&bytes),
                                );
                            } else if a.done().is_some()
                                && matches!(self.rule, Some(Rule::StrictPrefix { .. } | Rule::CommonPrefix { .. }))
                                && dump.record.ids != fed
                            {
                                self.violation(
                                    "dump",
                                    format!(
                                        "the dumped record holds {} ids; slot 0 fed {}",
                                        dump.record.ids.len(),
                                        fed.len()
                                    ),
                                    Some(&g),
                                    Some(&bytes),
                                );
                            } else {
                                self.pass("dump", "DUMP wrote a state dump whose record holds what was fed");
                            }
                        }
                        Err(e) => self.violation(
                            "dump",
                            format!("the dump is not a kvproof state dump (docs/dump-format.md): {e}"),
                            Some(&g),
                            Some(&bytes),
                        ),
                    }
                }
                _ => self.violation(
                    "dump",
                    "DUMP <id> <slot> <path> is answered DUMPED <id> <path> <bytes>",
                    Some(&g),
                    Some(&bytes),
                ),
            },
            None => self.violation("dump", "no answer to DUMP", None, Some(&bytes)),
        }
        let _ = std::fs::remove_file(&path);
        let slots = self.slots;
        let cases = [
            (
                format!("DUMP {} {slots} {path_str}\n", 4_000_000 + id),
                ErrorCode::BadRequest,
                "DUMP of a slot that does not exist",
            ),
            (
                format!("DUMP {} 0 /nonexistent-kvproof-dir/x.safetensors\n", 4_000_001 + id),
                ErrorCode::DumpFailed,
                "DUMP to a path that cannot be written",
            ),
        ];
        for (bytes, code, what) in cases {
            let bytes = bytes.into_bytes();
            self.send(&bytes);
            match self.conn.next(self.deadline()) {
                Some(g) if frame_error(&g, &code) => self.pass("dump", format!("{what}: {code}")),
                other => self.violation("dump", format!("{what} is answered {code}"), other.as_ref(), Some(&bytes)),
            }
        }
    }

    fn reset_checks(&mut self) {
        if !self.section_needing(self.caps.reset(), "reset", &["reset"]) {
            return;
        }
        let id = self.id();
        let bytes = format!("RESET {id}\n").into_bytes();
        self.send(&bytes);
        match self.conn.next(self.deadline()) {
            Some(g) if matches!(g.frame, Ok(EngineFrame::Cleared { id: got }) if got == id) => {}
            other => {
                self.violation("reset", "RESET <id> is answered CLEARED <id>", other.as_ref(), Some(&bytes));
                return;
            }
        }
        self.restart_book();
        let Some((p1, r1)) = self.first.clone() else { return };
        let a = self.run_ids("turn 1 again after RESET", &p1, 8, false);
        if a.done().is_some_and(|d| d.reused == Some(0) || d.reused.is_none()) && a.tokens == r1 {
            self.pass("reset", "after RESET the first prompt reuses 0 and gets the fresh process's reply");
        } else if a.done().is_some() {
            let g = a.end_frame().cloned();
            self.violation(
                "reset",
                format!("after RESET the first prompt must reuse 0 and give the reply it got on the fresh process ({:?}), got {:?}", r1, a.tokens),
                g.as_ref(),
                Some(&bytes),
            );
        }
    }

    /// Frames that arrive while a request generates: SLOT_BUSY and DUPLICATE_ID (or, for an engine that reads its
    /// input between requests only, the second requests run after the first).
    fn concurrency_checks(&mut self) {
        if !self.section() {
            return;
        }
        let prompt = self.extension(4);
        let stop = self.caps.flag("stop");
        let max = if stop { self.long_reply(prompt.len()) } else { 16 };
        let (a, b) = (self.id(), self.id());
        let mut bytes = submit_bytes(a, 0, &prompt, max, " ignore_eos=1");
        let short = self.ids(6);
        bytes.extend(submit_bytes(b, 0, &short, 2, ""));
        bytes.extend(submit_bytes(a, 0, &short, 2, ""));
        if stop {
            bytes.extend_from_slice(format!("STOP {a}\n").as_bytes());
        }
        self.send(&bytes);
        // read until a ended and b and the duplicate each got an answer, then whatever trails
        let deadline = self.deadline();
        let mut frames: Vec<Got> = Vec::new();
        let mut ends = 0usize;
        let mut busy_answered = false;
        let mut dup_answered = false;
        while !(ends >= 1 && busy_answered && dup_answered) {
            let Some(g) = self.conn.next(deadline) else { break };
            match &g.frame {
                Ok(EngineFrame::Done(d)) if d.id == a => {
                    if ends >= 1 {
                        dup_answered = true;
                    }
                    ends += 1;
                }
                Ok(EngineFrame::Error(e)) if e.id == Some(a) && e.code == ErrorCode::DuplicateId => dup_answered = true,
                Ok(EngineFrame::Error(e)) if e.id == Some(a) => ends += 1,
                Ok(EngineFrame::Done(d)) if d.id == b => busy_answered = true,
                Ok(EngineFrame::Error(e)) if e.id == Some(b) => busy_answered = true,
                _ => {}
            }
            frames.push(g);
        }
        frames.extend(self.conn.drain(Duration::from_millis(100)));
        self.book_known = false;
        let first_a_end = frames.iter().position(|g| {
            matches!(&g.frame, Ok(EngineFrame::Done(d)) if d.id == a)
                || matches!(&g.frame, Ok(EngineFrame::Error(e)) if e.id == Some(a) && e.code != ErrorCode::DuplicateId)
        });
        let Some(end) = first_a_end else {
            self.violation(
                "concurrency",
                "no DONE for a request while other frames arrived",
                frames.first(),
                Some(&bytes),
            );
            return;
        };
        let busy = frames.iter().position(|g| g.id() == Some(b) && !matches!(g.frame, Ok(EngineFrame::Data(_))));
        match busy.map(|i| (i, &frames[i])) {
            Some((_, g)) if frame_error(g, &ErrorCode::SlotBusy) => {
                self.pass("concurrency", "a SUBMIT for the generating slot answered SLOT_BUSY")
            }
            Some((i, g)) if i > end && matches!(g.frame, Ok(EngineFrame::Done(_))) => {
                self.pass("concurrency", "a SUBMIT for the generating slot ran after it (input read between requests)")
            }
            other => {
                let g = other.map(|(_, g)| g.clone());
                self.violation(
                    "concurrency",
                    "a SUBMIT for the slot that is generating is answered SLOT_BUSY (or runs after it ends)",
                    g.as_ref(),
                    Some(&bytes),
                );
            }
        }
        let dup_error = frames.iter().any(|g| g.id() == Some(a) && frame_error(g, &ErrorCode::DuplicateId));
        let second_done =
            frames.iter().filter(|g| matches!(&g.frame, Ok(EngineFrame::Done(d)) if d.id == a)).count() == 2;
        if dup_error || second_done {
            self.pass(
                "concurrency",
                "a SUBMIT reusing the generating id answered DUPLICATE_ID (or ran after it ended)",
            );
        } else {
            self.violation(
                "concurrency",
                "a SUBMIT reusing the id of the generating request is answered DUPLICATE_ID",
                frames.get(end),
                Some(&bytes),
            );
        }
    }

    fn text_checks(&mut self) {
        if !self.section() {
            return;
        }
        let echo = self.caps.echo();
        let id = self.id();
        let text = b"hello there";
        let mut bytes =
            format!("SUBMIT {id} 0 {} 4 0 1{}\n", text.len(), if echo { " echo=1" } else { "" }).into_bytes();
        bytes.extend_from_slice(text);
        bytes.push(b'\n');
        let ans = self.request(id, bytes.clone());
        self.check_done(&ans, &Expect::reply(None, 4));
        let Some(done) = ans.done().cloned() else {
            let g = ans.end_frame().cloned();
            self.violation(
                "submit-text",
                "a text payload (ids=0) is tokenized by the engine and answered",
                g.as_ref(),
                Some(&bytes),
            );
            self.book_known = false;
            return;
        };
        if done.prompt_tokens == Some(0) {
            let g = ans.end_frame().cloned();
            self.violation("submit-text", "prompt_tokens 0 for a non-empty text", g.as_ref(), Some(&bytes));
        } else {
            self.pass("submit-text", "a text SUBMIT answered with DATA and DONE");
        }
        if !echo {
            self.skip("echo", "CAPS does not declare echo=1");
            self.book_known = false;
            return;
        }
        let Some((g, ids)) = ans.prompt.clone() else {
            self.no_prompt_frame(ans.data.first().or(ans.end_frame()), &bytes);
            self.book_known = false;
            return;
        };
        if done.prompt_tokens.is_some_and(|n| n != ids.len()) {
            self.violation(
                "echo",
                format!("PROMPT lists {} ids, DONE says prompt_tokens {:?}", ids.len(), done.prompt_tokens),
                Some(&g),
                Some(&bytes),
            );
        }
        self.restart_book_after(id, &ids, 4, &ans.tokens);
        let again = self.run_ids("the echoed ids of a text prompt", &ids, 4, false);
        if again.done().is_some() && again.tokens == ans.tokens {
            self.pass("echo", "the echoed ids give the same reply as the text they came from");
        } else if again.done().is_some() {
            let g = again.end_frame().cloned();
            self.violation(
                "echo",
                format!("the text gave {:?}, its echoed ids {:?}", ans.tokens, again.tokens),
                g.as_ref(),
                None,
            );
        }
    }

    fn chat_checks(&mut self) {
        if !self.section_needing(self.caps.chat(), "chat", &["chat"]) {
            return;
        }
        let echo = self.caps.echo();
        let mut messages = vec![
            TextMessage { role: "system".into(), content: "be brief".into() },
            TextMessage { role: "user".into(), content: "hello there".into() },
        ];
        let turn1 = self.chat(&messages, echo);
        let Some(d1) = turn1.done().cloned() else {
            let g = turn1.end_frame().cloned();
            self.violation("chat", "a chat=1 SUBMIT of two messages is answered", g.as_ref(), Some(&turn1.sent));
            return;
        };
        self.pass("chat", "chat=1 answered with DATA and DONE");
        let ended_at_eos = d1.length_limited == Some(false);
        let mut pieces = turn1.pieces.clone();
        if ended_at_eos {
            pieces.pop();
        }
        let reply: Vec<u8> = pieces.concat();
        messages.push(TextMessage { role: "assistant".into(), content: String::from_utf8_lossy(&reply).into_owned() });
        messages.push(TextMessage { role: "user".into(), content: "and more".into() });
        let Some((_, ids1)) = turn1.prompt.clone() else {
            if echo {
                self.no_prompt_frame(turn1.data.first(), &turn1.sent);
            }
            self.book_known = false;
            let turn2 = self.chat(&messages, false);
            if turn2.done().is_some() {
                self.pass("chat", "a second chat turn answered (its reuse needs echo=1 to be checked)");
            }
            return;
        };
        self.restart_book_after(turn1.id, &ids1, 8, &turn1.tokens);
        let fed = self.book.slot(0).fed;
        let turn2 = self.chat(&messages, true);
        if let (Some(_), Some((_, ids2))) = (turn2.done(), turn2.prompt.clone()) {
            self.check_reuse("chat turn 2", &Self::request_of(turn2.id, &ids2, 8), &turn2);
            if ids2.starts_with(&fed) {
                self.pass("chat", "the template is prefix-stable: turn 2's ids begin with everything turn 1 fed");
            } else {
                self.pass(
                    "chat",
                    "turn 2's ids do not begin with what turn 1 fed (the reply's text did not render back to its ids): \
                     reuse across such turns cannot fire",
                );
            }
        }
    }

    fn chat(&mut self, messages: &[TextMessage], echo: bool) -> Answer {
        let id = self.id();
        let mut frame = kvproof_engines::serve::request::chat_frame(id, 0, messages, 8, false);
        frame.echo = echo;
        let bytes = kvproof_engines::serve::Command::Submit(frame).to_bytes();
        let ans = self.request(id, bytes);
        let prompt_len = ans.prompt.as_ref().map(|(_, ids)| ids.len());
        self.check_done(&ans, &Expect::reply(prompt_len, 8));
        ans
    }

    /// Every error code on a malformed or invalid frame, each followed by a valid request that must be answered in
    /// step.
    fn error_checks(&mut self) {
        if !self.section() {
            return;
        }
        let vocab = self.vocab;
        let slots = self.slots;
        let mut cases: Vec<(Vec<u8>, Option<u64>, ErrorCode, &str)> = vec![
            (b"HELLO\n".to_vec(), None, ErrorCode::BadFrame, "an unknown verb"),
            (b"\n".to_vec(), None, ErrorCode::BadFrame, "an empty line"),
            (b"SUBMIT x 0 2 4 0 1\nhi\n".to_vec(), None, ErrorCode::BadFrame, "an id that is not a number"),
            (b"SUBMIT 905 0 2 4 0\nhi\n".to_vec(), Some(905), ErrorCode::BadFrame, "too few fields (payload consumed)"),
            (b"SUBMIT 906 0 1 4 0 1\nhi\n".to_vec(), Some(906), ErrorCode::BadFrame, "a byte count one short"),
            (b"STOP\n".to_vec(), None, ErrorCode::BadFrame, "STOP without an id"),
            (b"SUBMIT 907 0 2 4 -1 1\nhi\n".to_vec(), Some(907), ErrorCode::BadRequest, "a negative temperature"),
            (b"SUBMIT 908 0 2 0 0 1\nhi\n".to_vec(), Some(908), ErrorCode::BadRequest, "max_tokens 0"),
            (b"SUBMIT 909 0 2 4 0 1.5\nhi\n".to_vec(), Some(909), ErrorCode::BadRequest, "top_p above 1"),
            (b"SUBMIT 910 0 2 4 0 1 colour=red\nhi\n".to_vec(), Some(910), ErrorCode::BadRequest, "an unknown option"),
            (
                format!("SUBMIT 911 0 {} 4 0 1 ids=1\n{vocab}\n", vocab.to_string().len()).into_bytes(),
                Some(911),
                ErrorCode::BadRequest,
                "an id outside the vocabulary",
            ),
            (
                format!("SUBMIT 912 {slots} 2 4 0 1\nhi\n").into_bytes(),
                Some(912),
                ErrorCode::BadRequest,
                "a slot out of range",
            ),
            (
                b"SUBMIT 913 0 2 4 0 1 3\nhiabc\n".to_vec(),
                Some(913),
                ErrorCode::BadRequest,
                "ext bytes without audio ids",
            ),
            (b"SUBMIT 914 0 0 4 0 1\n\n".to_vec(), Some(914), ErrorCode::EmptyPrompt, "an empty payload"),
            (b"SUBMIT 915 0 2 4 0 1 ids=1\n  \n".to_vec(), Some(915), ErrorCode::EmptyPrompt, "ids=1 with no ids"),
        ];
        if self.caps.flag("stop") {
            cases.push((b"STOP 916\n".to_vec(), Some(916), ErrorCode::NotFound, "STOP of an unknown id"));
        }
        if self.caps.flag("cancel") {
            cases.push((b"CANCEL 917\n".to_vec(), Some(917), ErrorCode::NotFound, "CANCEL of an unknown id"));
        }
        if self.caps.dump() {
            cases.push((b"DUMP 918 0\n".to_vec(), Some(918), ErrorCode::BadFrame, "DUMP without a path"));
        }
        if self.caps.reset() {
            cases.push((b"RESET\n".to_vec(), None, ErrorCode::BadFrame, "RESET without an id"));
        }
        if self.caps.chat() {
            cases.push((
                b"SUBMIT 919 0 3 4 0 1 chat=1\n[1]\n".to_vec(),
                Some(919),
                ErrorCode::BadRequest,
                "a chat payload that is not messages",
            ));
            cases.push((
                b"SUBMIT 920 0 3 4 0 1 chat=1 ids=1\n1 2\n".to_vec(),
                Some(920),
                ErrorCode::BadRequest,
                "chat=1 with ids=1",
            ));
        }
        let mut in_step = 0;
        for (bad, id, code, what) in cases {
            if self.gone {
                return;
            }
            let valid_id = self.id();
            let prompt = self.ids(4);
            let valid = submit_bytes(valid_id, 0, &prompt, 1, "");
            let mut bytes = bad.clone();
            bytes.extend_from_slice(&valid);
            let mut ans = self.start(valid_id, bytes);
            self.read(&mut ans, false);
            // a DATA written after an earlier DONE is that request's fault, not this frame's
            let (late, others): (Vec<Got>, Vec<Got>) = ans.others.drain(..).partition(
                |g| matches!(&g.frame, Ok(EngineFrame::Data(d)) if self.finished.contains(&d.id) && d.id != valid_id),
            );
            ans.others = others;
            for g in &late {
                self.stray(g);
            }
            let want = format!("ERROR {} {code}", id.map_or_else(|| "-".to_string(), |i| i.to_string()));
            let mut errors = ans.others.iter().filter(|g| matches!(g.frame, Ok(EngineFrame::Error(_))));
            match errors.next() {
                Some(g)
                    if frame_error(g, &code) && g.id() == id && ans.others.first().is_some_and(|f| f.raw == g.raw) =>
                {
                    *self.error_codes.entry(code.name().to_string()).or_insert(0) += 1;
                }
                Some(g) => {
                    let g = g.clone();
                    self.violation("errors", format!("{what} is answered {want}"), Some(&g), Some(&bad));
                }
                None => self.violation(
                    "errors",
                    format!("{what} is answered {want}; no ERROR came"),
                    ans.end_frame(),
                    Some(&bad),
                ),
            }
            let extra: Vec<Got> = ans.others.iter().skip(1).cloned().collect();
            let answered = ans.done().is_some();
            if !extra.is_empty() {
                self.violation(
                    "sync",
                    format!("after {what}: more than one answer to one bad frame"),
                    extra.first(),
                    Some(&bad),
                );
            } else if !answered {
                let g = ans.end_frame().cloned();
                self.violation(
                    "sync",
                    format!("after {what}: the next valid SUBMIT was not answered DONE (the stream lost step)"),
                    g.as_ref(),
                    Some(&bad),
                );
            } else {
                in_step += 1;
            }
            self.check_done(&ans, &Expect::reply(Some(prompt.len()), 1));
        }
        if in_step > 0 && !self.violated("sync") {
            self.pass(
                "sync",
                format!("every bad frame answered once; the {in_step} valid SUBMITs after them answered in step"),
            );
        }
    }

    fn summaries(&mut self) {
        if self.data_frames > 0 && !self.violated("data") {
            self.pass("data", format!("{} DATA frames with tid= and gap=", self.data_frames));
        }
        if self.done_frames > 0 && !self.violated("done") {
            self.pass("done", format!("{} DONE frames consistent with their DATA and prompts", self.done_frames));
        }
        if self.done_frames > 0 && !self.violated("tok-s") {
            self.pass("tok-s", "tok_s agrees with the clock");
        }
        if !self.reuse_matched.is_empty() && self.rule.is_some() && self.caps.reuse() {
            let n = self.reuse_matched.len();
            let rule = self.rule_name.clone();
            let range = match (self.reuse_values.iter().min(), self.reuse_values.iter().max()) {
                (Some(lo), Some(hi)) => format!(", from {lo} to {hi}"),
                _ => String::new(),
            };
            self.pass("reuse", format!("{n} reuse counts as `{rule}` expects{range}"));
        }
        if !self.error_codes.is_empty() {
            let n: usize = self.error_codes.values().sum();
            let codes: Vec<String> = self.error_codes.iter().map(|(c, k)| format!("{c} x{k}")).collect();
            self.pass("errors", format!("{n} bad frames answered with their codes ({})", codes.join(", ")));
        }
    }

    fn eof_check(&mut self) {
        if self.gone {
            return;
        }
        let id = self.id();
        let prompt = self.ids(6);
        let bytes = submit_bytes(id, 0, &prompt, 3, "");
        self.send(&bytes);
        let (status, frames) = self.conn.close(self.timeout);
        let done = frames.iter().any(|g| matches!(&g.frame, Ok(EngineFrame::Done(d)) if d.id == id));
        match status {
            Some(s) if s.success() && done => self.pass("eof", "EOF finished the request already read, then exit 0"),
            Some(s) if s.success() => self.violation(
                "eof",
                "EOF: the request read before it is answered before the exit",
                frames.last(),
                Some(&bytes),
            ),
            Some(s) => self.violation(
                "eof",
                format!("EOF is a graceful shutdown: exit 0, not {s}"),
                frames.last(),
                Some(&bytes),
            ),
            None => {
                self.violation("eof", format!("no exit within {:?} of EOF", self.timeout), frames.last(), Some(&bytes))
            }
        }
    }
}
