//! `kvproof-engine --http 0` end to end, over raw sockets on 127.0.0.1: the answer's shapes, streaming and whole
//! answers agreeing token for token, reuse reported both ways, llama.cpp's slot extras, and every malformed
//! request answered with a JSON error naming what is at fault while the server goes on serving.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// A served engine, stopped when dropped.
struct Served {
    child: Child,
    port: u16,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvproof-engine"))
            .args(args)
            .arg("--http")
            .arg("0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvproof-engine");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("first line");
        let port = line
            .trim()
            .strip_prefix("listening on http://127.0.0.1:")
            .and_then(|rest| rest.strip_suffix("/v1"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("first line: {line:?}"));
        Served { child, port }
    }

    fn inkling() -> Served {
        Served::start(&["--arch", "inkling", "--preset", "tiny", "--seed", "0"])
    }

    /// Send `raw` on a fresh connection; the status, the lower-case headers and the (de-chunked) body.
    fn raw(&self, raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        // the server may refuse before it has read everything: a write error is then expected
        let _ = s.write_all(raw);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        parse_response(&out)
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut raw = head.into_bytes();
        raw.extend_from_slice(body);
        let (status, _, body) = self.raw(&raw);
        (status, body)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, body) = self.request("POST", path, body.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body))))
    }

    /// The `data:` events of a streamed answer, `[DONE]` excluded (asserted last).
    fn events(&self, path: &str, body: &Value) -> Vec<Value> {
        let (status, text) = self.request("POST", path, body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
        let text = String::from_utf8(text).expect("utf8 events");
        let data: Vec<&str> =
            text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").expect(e)).collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("event json")).collect()
    }

    /// A request that must succeed: the server is alive and well.
    fn alive(&self) {
        let (status, body) = self.post("/v1/completions", &json!({"prompt": "ok", "max_tokens": 1}));
        assert_eq!(status, 200, "{body}");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no head: {raw:?}"));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v == "chunked") {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).expect("hex"), 16).expect("size");
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest = &rest[line_end + 2 + size + 2..];
        }
        body = out;
    }
    (status, headers, body)
}

fn error_param(body: &Value) -> Option<&str> {
    body["error"]["param"].as_str()
}

const PROMPT: [u32; 6] = [256, 259, 104, 105, 257, 260];

#[test]
fn models_lists_the_engine() {
    let s = Served::inkling();
    let (status, body) = s.request("GET", "/v1/models", b"");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_slice(&body).expect("json");
    let m = &models["data"][0];
    assert_eq!(m["id"], "inkling-tiny");
    assert_eq!(m["kvproof"]["engine"]["arch"], "inkling");
    assert_eq!(m["kvproof"]["engine"]["window"], 8);
    assert_eq!(m["max_model_len"], 1024);
}

#[test]
fn a_conversation_reports_its_reuse_both_ways() {
    let s = Served::inkling();
    let (status, first) = s.post("/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 3, "return_tokens": true}));
    assert_eq!(status, 200, "{first}");
    let reply: Vec<u64> = first["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_u64).collect();
    assert_eq!(reply.len(), 3);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(first["timings"]["cache_n"], 0);
    // the next turn: prompt, reply, then a new user turn; the state held the prompt and the reply but its last
    let mut next: Vec<u64> = PROMPT.iter().map(|&t| u64::from(t)).collect();
    next.extend(&reply);
    next.extend([257, 259, 111, 107, 257, 260]);
    let (_, second) = s.post("/v1/completions", &json!({"prompt": next, "max_tokens": 3}));
    let fed = PROMPT.len() + reply.len() - 1;
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], fed);
    assert_eq!(second["timings"]["cache_n"], fed);
    assert_eq!(second["timings"]["prompt_n"], next.len() - fed);
    assert_eq!(second["usage"]["prompt_tokens"], next.len());
}

#[test]
fn streaming_and_whole_answers_agree() {
    let s = Served::inkling();
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": "<|bos|><|user|>tell me<|eos|><|assistant|>", "max_tokens": 12, "logprobs": 3,
                   "return_tokens": true, "return_token_ids": true, "cache_prompt": false}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                   "max_tokens": 12, "logprobs": true, "top_logprobs": 3, "return_tokens": true,
                   "return_token_ids": true, "cache_prompt": false}),
        ),
    ] {
        let (status, whole) = s.post(path, &body);
        assert_eq!(status, 200, "{whole}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let events = s.events(path, &streamed);
        let choice = &whole["choices"][0];
        let chat = path.contains("chat");
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"].get(0))
            .filter_map(|c| if chat { c["delta"]["content"].as_str() } else { c["text"].as_str() })
            .collect();
        let whole_text = if chat { &choice["message"]["content"] } else { &choice["text"] };
        assert_eq!(json!(text), *whole_text, "{path}");
        let ids: Vec<Value> = events.iter().filter_map(|e| e["tokens"].as_array()).flatten().cloned().collect();
        assert_eq!(json!(ids), whole["tokens"], "{path}");
        let choice_ids: Vec<Value> =
            events.iter().filter_map(|e| e["choices"][0]["token_ids"].as_array()).flatten().cloned().collect();
        assert_eq!(json!(choice_ids), choice["token_ids"], "{path}");
        let last_reason = events.iter().filter_map(|e| e["choices"][0]["finish_reason"].as_str()).next_back();
        assert_eq!(last_reason, choice["finish_reason"].as_str(), "{path}");
        let usage = events.iter().find_map(|e| e.get("usage")).expect("usage chunk");
        assert_eq!(*usage, whole["usage"], "{path}");
        let timings = events.iter().find_map(|e| e.get("timings")).expect("timings");
        assert_eq!(
            (timings["cache_n"].clone(), timings["prompt_n"].clone()),
            (whole["timings"]["cache_n"].clone(), whole["timings"]["prompt_n"].clone())
        );
        // log probabilities, token by token
        if chat {
            let streamed: Vec<Value> = events
                .iter()
                .filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array())
                .flatten()
                .cloned()
                .collect();
            assert_eq!(json!(streamed), choice["logprobs"]["content"]);
            assert_eq!(streamed.len(), ids.len());
        } else {
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let streamed: Vec<Value> = events
                    .iter()
                    .filter_map(|e| e["choices"][0]["logprobs"][key].as_array())
                    .flatten()
                    .cloned()
                    .collect();
                assert_eq!(json!(streamed), choice["logprobs"][key], "{key}");
            }
        }
    }
}

#[test]
fn cache_prompt_false_runs_on_a_fresh_state_and_leaves_the_slot() {
    let s = Served::inkling();
    let (_, first) = s.post("/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 2, "return_tokens": true}));
    let mut next: Vec<Value> = PROMPT.iter().map(|&t| json!(t)).collect();
    next.extend(first["tokens"].as_array().expect("tokens").iter().cloned());
    next.extend([json!(104)]);
    let fed = PROMPT.len() + 1;
    let (_, bypass) = s.post("/v1/completions", &json!({"prompt": next, "max_tokens": 2, "cache_prompt": false}));
    assert_eq!(bypass["timings"]["cache_n"], 0);
    let (_, salted) = s.post("/v1/completions", &json!({"prompt": next, "max_tokens": 2, "cache_salt": "x"}));
    assert_eq!(salted["timings"]["cache_n"], 0);
    let (_, warm) = s.post("/v1/completions", &json!({"prompt": next, "max_tokens": 2}));
    assert_eq!(warm["timings"]["cache_n"], fed, "the bypassed requests left the slot as it was");
    assert_eq!(warm["choices"][0]["text"], bypass["choices"][0]["text"]);
}

#[test]
fn erasing_a_slot_forgets_it() {
    let s = Served::inkling();
    let extend = |n: usize| -> Vec<u32> { PROMPT.iter().copied().chain(std::iter::repeat_n(104, n)).collect() };
    s.post("/v1/completions", &json!({"prompt": extend(0), "max_tokens": 1}));
    let (status, erased) = s.post("/slots/0?action=erase", &json!({}));
    assert_eq!(status, 200, "{erased}");
    assert_eq!(erased["n_erased"], PROMPT.len());
    let (_, after) = s.post("/v1/completions", &json!({"prompt": extend(4), "max_tokens": 1}));
    assert_eq!(after["timings"]["cache_n"], 0);
    s.post("/v1/completions", &json!({"prompt": extend(8), "max_tokens": 1}));
    assert_eq!(s.post("/reset_prefix_cache", &json!({})).0, 200);
    let (_, after) = s.post("/v1/completions", &json!({"prompt": extend(12), "max_tokens": 1}));
    assert_eq!(after["timings"]["cache_n"], 0);
    for (path, param) in
        [("/slots/1?action=erase", "id_slot"), ("/slots/0?action=save", "action"), ("/slots/0", "action")]
    {
        let (status, body) = s.post(path, &json!({}));
        assert_eq!((status, error_param(&body)), (400, Some(param)), "{path}: {body}");
    }
}

#[test]
fn slots_are_chosen_by_id_slot() {
    let s = Served::start(&["--arch", "glm", "--preset", "tiny", "--seed", "0"]);
    let (_, models) = s.request("GET", "/v1/models", b"");
    let models: Value = serde_json::from_slice(&models).expect("json");
    let slots = models["data"][0]["kvproof"]["engine"]["slots"].as_u64().expect("slots");
    assert!(slots >= 2, "glm tiny has several slots");
    let a: Vec<u32> = PROMPT.iter().copied().chain([97; 6]).collect();
    let b: Vec<u32> = PROMPT.iter().copied().chain([98; 6]).collect();
    s.post("/v1/completions", &json!({"prompt": a, "max_tokens": 1, "id_slot": 0}));
    s.post("/v1/completions", &json!({"prompt": b, "max_tokens": 1, "id_slot": 1}));
    let (_, again) = s.post("/v1/completions", &json!({"prompt": a, "max_tokens": 1, "id_slot": 0}));
    assert_eq!(again["timings"]["cache_n"], a.len() - 1, "slot 0 kept its prompt while slot 1 served another");
}

#[test]
fn refusals_name_what_is_at_fault_and_the_server_survives_them() {
    let s = Served::inkling();
    s.alive();
    let bad: &[(&str, &[u8], u16, Option<&str>)] = &[
        ("/v1/completions", b"{\"prompt\": [1, 2", 400, None),
        ("/v1/completions", b"not json at all", 400, None),
        ("/v1/completions", b"{\"prompt\": \"x\", \"colour\": \"red\"}", 400, Some("colour")),
        ("/v1/completions", b"{\"prompt\": [1, 2, 999]}", 400, Some("prompt[2]")),
        ("/v1/completions", b"{\"prompt\": [1, \"a\"]}", 400, Some("prompt")),
        ("/v1/completions", b"{\"prompt\": [1, -5]}", 400, Some("prompt[1]")),
        ("/v1/completions", b"{\"prompt\": []}", 400, Some("prompt")),
        ("/v1/completions", b"{\"prompt\": \"x\", \"max_tokens\": 0}", 400, Some("max_tokens")),
        ("/v1/completions", b"{\"prompt\": \"x\", \"id_slot\": 7}", 400, Some("id_slot")),
        ("/v1/completions", b"{\"prompt\": \"x\", \"model\": \"gpt-4\"}", 404, Some("model")),
        ("/v1/completions", b"{\"prompt\": \"<|audio|>\"}", 400, Some("prompt")),
        (
            "/v1/chat/completions",
            b"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
            400,
            Some("messages[0].role"),
        ),
        ("/v1/chat/completions", b"{\"messages\": \"hi\"}", 400, Some("messages")),
        ("/v1/nothing", b"{}", 404, None),
    ];
    for (path, body, status, param) in bad {
        let (got, answer) = s.request("POST", path, body);
        let answer: Value = serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(got, *status, "{path} {}: {answer}", String::from_utf8_lossy(body));
        assert_eq!(error_param(&answer), *param, "{answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{answer}");
        s.alive();
    }

    // a prompt past the context: 400 with a code, and the sizes
    let long = vec![104u32; 1025];
    let (status, answer) = s.post("/v1/completions", &json!({"prompt": long}));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "context_length_exceeded");
    assert_eq!(
        (answer["error"]["n_prompt_tokens"].clone(), answer["error"]["n_ctx"].clone()),
        (json!(1025), json!(1024))
    );
    // the same inside a stream: refused before the stream starts
    let (status, _) =
        s.request("POST", "/v1/completions", json!({"prompt": long, "stream": true}).to_string().as_bytes());
    assert_eq!(status, 400);
    let messages = json!([{"role": "user", "content": "x".repeat(1100)}]);
    let (status, answer) = s.post("/v1/chat/completions", &json!({"messages": messages, "stream": true}));
    assert_eq!((status, answer["error"]["param"].as_str()), (400, Some("messages")), "{answer}");
    s.alive();

    // methods, sizes and framing
    assert_eq!(s.request("GET", "/v1/completions", b"").0, 405);
    assert_eq!(s.request("DELETE", "/v1/models", b"").0, 405);
    let (status, _, body) = s.raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n{}");
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    s.alive();
    let huge = format!("GET /v1/models HTTP/1.1\r\nX-Filler: {}\r\n\r\n", "a".repeat(64 * 1024));
    assert_eq!(s.raw(huge.as_bytes()).0, 431);
    s.alive();
    let many: String = (0..100).map(|i| format!("X-{i}: 1\r\n")).collect();
    assert_eq!(s.raw(format!("GET /v1/models HTTP/1.1\r\n{many}\r\n").as_bytes()).0, 431);
    assert_eq!(s.raw(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").0, 411);
    assert_eq!(s.raw(b"\x16\x03\x01\x02\x00 not http\r\n\r\n").0, 400);
    s.alive();
    // a client that closes mid-request, and one that sends nothing
    drop(TcpStream::connect(("127.0.0.1", s.port)).expect("connect"));
    {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
        let _ = c.write_all(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro");
    }
    s.alive();
    // a streaming client that goes away after the head: generation stops, the server goes on
    {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
        let body = json!({"prompt": "x", "max_tokens": 500, "ignore_eos": true, "stream": true}).to_string();
        let _ = write!(c, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        let mut first = [0u8; 64];
        let _ = c.read(&mut first);
    }
    s.alive();
}
