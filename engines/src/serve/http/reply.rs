//! The JSON the server answers with: completion and chat-completion objects, their streamed chunks, log
//! probabilities from the engine's top-K logits, `usage` (with vLLM's and SGLang's
//! `prompt_tokens_details.cached_tokens`) and `timings` (with llama.cpp's `cache_n` / `prompt_n`).

use serde_json::{json, Map, Value};

use crate::engine::{Reply, StopReason, TokenEvent};
use crate::serve::text::ServeText;

use super::api::{Endpoint, Generate};

/// What every object of one answer shares.
#[derive(Debug, Clone)]
pub struct Format {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub logprobs: Option<usize>,
    pub return_tokens: bool,
    pub return_token_ids: bool,
    pub tokens_as_ids: bool,
    /// The engine's tokenizer: the reply's text and the tokens' spelling.
    pub text: ServeText,
}

impl Format {
    pub fn new(g: &Generate, request: u64, model: &str, text: ServeText) -> Self {
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let prefix = match g.endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Format {
            endpoint: g.endpoint,
            id: format!("{prefix}-{request}"),
            created,
            model: model.to_string(),
            logprobs: g.logprobs,
            return_tokens: g.return_tokens,
            return_token_ids: g.return_token_ids,
            tokens_as_ids: g.tokens_as_ids,
            text,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), Value::Array(choices));
        m
    }

    /// How a token is spelled in log probabilities: `token_id:N` when the request asked for ids, else as the
    /// engine's tokenizer spells it (`ServeText::token_string`: the byte tokenizer's `<0xNN>` for a byte that is
    /// no text alone, a BPE token's text).
    pub fn token_string(&self, id: u32) -> String {
        if self.tokens_as_ids {
            return format!("token_id:{id}");
        }
        self.text.token_string(id)
    }

    /// The log probabilities of one emitted token: chat's `content` entry, or the legacy completion arrays.
    fn logprob_entry(&self, event: &TokenEvent) -> Option<TokenLogprobs> {
        let k = self.logprobs?;
        // the engine reports every id's logit (most likely first): normalise over all of them
        let max = event.top.first().map_or(0.0, |&(_, l)| f64::from(l));
        let sum: f64 = event.top.iter().map(|&(_, l)| (f64::from(l) - max).exp()).sum();
        let lse = max + sum.ln();
        // -inf (an id that may not be generated) cannot travel in JSON: the lowest finite value stands for it
        let lp = |l: f32| {
            let v = f64::from(l) - lse;
            if v.is_finite() {
                v
            } else {
                f64::from(f32::MIN)
            }
        };
        let chosen = event.top.iter().find(|&&(i, _)| i == event.id).map_or(f64::from(f32::MIN), |&(_, l)| lp(l));
        let top = event.top.iter().take(k).map(|&(i, l)| (i, lp(l))).collect();
        Some(TokenLogprobs { id: event.id, logprob: chosen, top })
    }

    fn chat_entry(&self, t: &TokenLogprobs) -> Value {
        let item = |id: u32, lp: f64| json!({"id": id, "token": self.token_string(id), "logprob": lp, "bytes": self.text.token_bytes(id)});
        let mut entry = item(t.id, t.logprob);
        entry["top_logprobs"] = Value::Array(t.top.iter().map(|&(i, lp)| item(i, lp)).collect());
        entry
    }

    /// Legacy completion logprobs for `tokens`, their text starting at `offset` bytes into the reply.
    fn legacy(&self, tokens: &[TokenLogprobs], mut offset: usize) -> Value {
        let mut strings = Vec::new();
        let mut lps = Vec::new();
        let mut tops = Vec::new();
        let mut offsets = Vec::new();
        for t in tokens {
            strings.push(json!(self.token_string(t.id)));
            lps.push(json!(t.logprob));
            let mut top = Map::new();
            for &(i, lp) in &t.top {
                top.insert(self.token_string(i), json!(lp));
            }
            tops.push(Value::Object(top));
            offsets.push(json!(offset));
            offset += self.text.text_bytes(t.id).len();
        }
        json!({"tokens": strings, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }

    fn logprobs_value(&self, tokens: &[TokenLogprobs], offset: usize) -> Value {
        match self.endpoint {
            Endpoint::Completions => self.legacy(tokens, offset),
            Endpoint::Chat => json!({"content": tokens.iter().map(|t| self.chat_entry(t)).collect::<Vec<_>>()}),
        }
    }
}

/// One token's log probability and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// Text from bytes that arrive a token at a time: a character split across tokens is held back until it is
/// whole, and a byte that can start no character becomes U+FFFD, as `String::from_utf8_lossy` makes it.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held back (an incomplete character at the end of the reply).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::Length => "length",
        StopReason::Eos | StopReason::Stopped => "stop",
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `usage`, with the reused prompt positions as `prompt_tokens_details.cached_tokens`.
pub fn usage(reply: &Reply) -> Value {
    let completion = reply.tokens.len();
    json!({
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": reply.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": reply.reused},
    })
}

/// llama.cpp's `timings`: `cache_n` prompt positions reused, `prompt_n` prefilled.
pub fn timings(reply: &Reply) -> Value {
    let per = |n: usize, d: std::time::Duration| {
        let ms = ms(d);
        let per_token = if n > 0 { ms / n as f64 } else { 0.0 };
        let per_second = if ms > 0.0 { 1000.0 * n as f64 / ms } else { 0.0 };
        (ms, per_token, per_second)
    };
    let prompt_n = reply.prompt_tokens - reply.reused;
    let (prompt_ms, prompt_per_token_ms, prompt_per_second) = per(prompt_n, reply.timings.prefill);
    let predicted_n = reply.tokens.len();
    let (predicted_ms, predicted_per_token_ms, predicted_per_second) = per(predicted_n, reply.timings.decode);
    json!({
        "cache_n": reply.reused,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_per_token_ms,
        "prompt_per_second": prompt_per_second,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_per_token_ms,
        "predicted_per_second": predicted_per_second,
    })
}

/// Builds the answer token by token: the whole object at the end, or one chunk per token.
#[derive(Debug)]
pub struct Answer {
    pub format: Format,
    prompt: Vec<u32>,
    text: Utf8Stream,
    content: String,
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprobs>,
    /// Bytes of reply text before the current token (legacy `text_offset`).
    offset: usize,
}

impl Answer {
    pub fn new(format: Format, prompt: Vec<u32>) -> Self {
        Answer {
            format,
            prompt,
            text: Utf8Stream::default(),
            content: String::new(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            offset: 0,
        }
    }

    /// The chunk that opens a stream, if the endpoint has one (chat: the assistant's role).
    pub fn opening_chunk(&self) -> Option<Value> {
        if self.format.endpoint != Endpoint::Chat {
            return None;
        }
        let choice = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                            "finish_reason": null});
        let mut m = self.format.envelope(true, vec![choice]);
        if self.format.return_token_ids {
            m.insert("prompt_token_ids".into(), json!(self.prompt));
        }
        Some(Value::Object(m))
    }

    /// Take one emitted token; returns its chunk.
    pub fn token(&mut self, event: &TokenEvent) -> Value {
        let bytes = self.format.text.text_bytes(event.id);
        let piece = self.text.push(&bytes);
        self.content.push_str(&piece);
        let lp = self.format.logprob_entry(event);
        let first = self.ids.is_empty();
        self.ids.push(event.id);
        let logprobs = match &lp {
            Some(t) => self.format.logprobs_value(std::slice::from_ref(t), self.offset),
            None => Value::Null,
        };
        self.offset += bytes.len();
        if let Some(t) = lp {
            self.logprobs.push(t);
        }
        let mut choice = match self.format.endpoint {
            Endpoint::Completions => json!({"index": 0, "text": piece, "logprobs": logprobs, "finish_reason": null}),
            Endpoint::Chat => json!({"index": 0, "delta": {"content": piece}, "logprobs": logprobs,
                                     "finish_reason": null}),
        };
        if self.format.return_token_ids {
            choice["token_ids"] = json!([event.id]);
            if first && self.format.endpoint == Endpoint::Completions {
                choice["prompt_token_ids"] = json!(self.prompt);
            }
        }
        let mut m = self.format.envelope(true, vec![choice]);
        if self.format.return_tokens {
            m.insert("tokens".into(), json!([event.id]));
        }
        Value::Object(m)
    }

    /// The chunks that end a stream: the finish reason (with any held-back text and the timings), then `usage`
    /// when asked.
    pub fn closing_chunks(&mut self, reply: &Reply, include_usage: bool) -> Vec<Value> {
        let rest = self.text.finish();
        self.content.push_str(&rest);
        let reason = finish_reason(reply.stop);
        let choice = match self.format.endpoint {
            Endpoint::Completions => json!({"index": 0, "text": rest, "logprobs": null, "finish_reason": reason}),
            Endpoint::Chat => {
                let delta = if rest.is_empty() { json!({}) } else { json!({"content": rest}) };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        };
        let mut last = self.format.envelope(true, vec![choice]);
        last.insert("timings".into(), timings(reply));
        let mut out = vec![Value::Object(last)];
        if include_usage {
            let mut u = self.format.envelope(true, Vec::new());
            u.insert("usage".into(), usage(reply));
            out.push(Value::Object(u));
        }
        out
    }

    /// The whole answer as one object.
    pub fn whole(mut self, reply: &Reply) -> Value {
        let rest = self.text.finish();
        self.content.push_str(&rest);
        let logprobs =
            if self.format.logprobs.is_some() { self.format.logprobs_value(&self.logprobs, 0) } else { Value::Null };
        let reason = finish_reason(reply.stop);
        let mut choice = match self.format.endpoint {
            Endpoint::Completions => {
                json!({"index": 0, "text": self.content, "logprobs": logprobs, "finish_reason": reason})
            }
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": self.content},
                                     "logprobs": logprobs, "finish_reason": reason}),
        };
        let mut extra = Vec::new();
        if self.format.return_token_ids {
            choice["token_ids"] = json!(self.ids);
            match self.format.endpoint {
                Endpoint::Completions => choice["prompt_token_ids"] = json!(self.prompt),
                Endpoint::Chat => extra.push(("prompt_token_ids", json!(self.prompt))),
            }
        }
        let mut m = self.format.envelope(false, vec![choice]);
        m.insert("usage".into(), usage(reply));
        m.insert("timings".into(), timings(reply));
        if self.format.return_tokens {
            m.insert("tokens".into(), json!(self.ids));
        }
        for (k, v) in extra {
            m.insert(k.into(), v);
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::EOS;

    #[test]
    fn utf8_stream_matches_lossy_decoding() {
        let cases: &[&[u8]] = &[b"plain", "é€𝄞".as_bytes(), b"\xe2\x82", b"a\x80b\xffc", b"\xf0\x9d\x84\x9e\xc3", b""];
        for bytes in cases {
            let mut s = Utf8Stream::default();
            let mut out = String::new();
            for b in bytes.iter() {
                out.push_str(&s.push(&[*b]));
            }
            out.push_str(&s.finish());
            assert_eq!(out, String::from_utf8_lossy(bytes), "{bytes:?}");
        }
        // a split character is held back until it is whole
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[0xc3]), "");
        assert_eq!(s.push(&[0xa9]), "é");
    }

    #[test]
    fn token_strings_are_distinct() {
        let g = Format {
            endpoint: Endpoint::Completions,
            id: "x".into(),
            created: 0,
            model: "m".into(),
            logprobs: None,
            return_tokens: false,
            return_token_ids: false,
            tokens_as_ids: false,
            text: ServeText::bytes(),
        };
        let all: std::collections::BTreeSet<String> = (0..264).map(|i| g.token_string(i)).collect();
        assert_eq!(all.len(), 264);
        assert_eq!(
            (g.token_string(104), g.token_string(0x8d), g.token_string(EOS)),
            ("h".into(), "<0x8D>".into(), "<|eos|>".into())
        );
        let ids = Format { tokens_as_ids: true, ..g };
        assert_eq!(ids.token_string(7), "token_id:7");
    }

    #[test]
    fn logprobs_are_normalised_and_keep_the_gap() {
        let g = Format {
            endpoint: Endpoint::Chat,
            id: "x".into(),
            created: 0,
            model: "m".into(),
            logprobs: Some(2),
            return_tokens: false,
            return_token_ids: false,
            tokens_as_ids: false,
            text: ServeText::bytes(),
        };
        let event = TokenEvent { id: 3, gap: 1.5, top: vec![(3, 2.0), (5, 0.5), (1, -1.0), (2, f32::NEG_INFINITY)] };
        let t = g.logprob_entry(&event).expect("asked");
        let total: f64 = [2.0f64, 0.5, -1.0].iter().map(|l| l.exp()).sum();
        assert!((t.logprob - (2.0 - total.ln())).abs() < 1e-9);
        assert_eq!(t.top.len(), 2);
        assert!((t.top[0].1 - t.top[1].1 - 1.5).abs() < 1e-9, "{t:?}");
    }
}
