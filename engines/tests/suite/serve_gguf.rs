//! Both servers speak a GGUF model's own tokenizer and chat template: SmolLM2-135M-Instruct (llama arch) served
//! in-process over stdio and over HTTP renders a conversation with the file's ChatML template, answers with the
//! text of the ids it generated, and a second turn that re-sends the transcript reuses what the first one fed.
//!
//! The tests need the model (`bash ci/fetch-smollm2.sh`, then `KVPROOF_CACHE=<cache> cargo test -- --ignored`);
//! without it they fail naming that command. Replies are kept short: the model decodes ~10 tokens/s in debug.

use std::io::{BufReader, Cursor, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use kvproof_engines::arch::llama;
use kvproof_engines::chat::TextMessage;
use kvproof_engines::engine::Engine;
use kvproof_engines::gguf::smollm2_path;
use kvproof_engines::serve::frame::EngineFrameReader;
use kvproof_engines::serve::request::chat_frame;
use kvproof_engines::serve::{serve, serve_http, Command, EngineFrame, HttpOptions, ServeOptions};
use serde_json::{json, Value};

const MAX_TOKENS: usize = 8;

fn smollm2() -> Box<dyn Engine> {
    let path = smollm2_path().unwrap_or_else(|e| panic!("{e}"));
    llama::open_gguf(&path, &serde_json::Map::new(), None).expect("SmolLM2 opens")
}

fn msg(role: &str, content: &str) -> TextMessage {
    TextMessage { role: role.into(), content: content.into() }
}

/// What one stdio turn answered: CAPS `vocab`, the echoed prompt, the DATA ids and texts, DONE's reuse count.
struct Turn {
    vocab: Option<usize>,
    eos: Option<u32>,
    prompt: Vec<u32>,
    ids: Vec<u32>,
    text: Vec<u8>,
    reused: Option<usize>,
}

/// One `chat=1 echo=1` SUBMIT served in-process on `engine` (its state carries over to the next call).
fn stdio_turn(engine: &mut dyn Engine, id: u64, messages: &[TextMessage]) -> Turn {
    let mut frame = chat_frame(id, 0, messages, MAX_TOKENS, false);
    frame.echo = true;
    let mut out = Vec::new();
    serve(engine, Cursor::new(Command::Submit(frame).to_bytes()), &mut out, std::io::sink(), ServeOptions::default())
        .expect("serve");
    let mut reader = EngineFrameReader::new(BufReader::new(&out[..]));
    let mut turn = Turn { vocab: None, eos: None, prompt: Vec::new(), ids: Vec::new(), text: Vec::new(), reused: None };
    let mut done = false;
    while let Some(frame) = reader.next_frame().expect("read") {
        match frame.expect("a well-formed frame") {
            EngineFrame::Caps(c) => (turn.vocab, turn.eos) = (c.vocab(), c.eos()),
            EngineFrame::Prompt(p) => turn.prompt = p.ids,
            EngineFrame::Data(d) => {
                turn.ids.push(d.tid.expect("tid"));
                turn.text.extend_from_slice(&d.text);
            }
            EngineFrame::Done(d) => {
                turn.reused = d.reused;
                done = true;
            }
            EngineFrame::Error(e) => panic!("turn {id}: {e:?}"),
            _ => {}
        }
    }
    assert!(done, "turn {id} ended without DONE: {}", String::from_utf8_lossy(&out));
    turn
}

#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn stdio_chat_uses_the_models_template_and_tokenizer() {
    let mut engine = smollm2();
    let text = engine.text();
    let mut messages = vec![msg("user", "What is the capital of France?")];
    let t1 = stdio_turn(&mut *engine, 1, &messages);
    assert_eq!(t1.vocab, Some(text.vocab()), "CAPS reports the model's vocabulary");
    assert_eq!(t1.eos, text.eos(), "CAPS reports the model's eos, so a client knows a reply that stopped there");
    let p1 = text.render_chat(&messages).expect("render");
    assert_eq!(t1.prompt, p1, "PROMPT carries the ids the ChatML template made");
    let rendered =
        String::from_utf8_lossy(&p1.iter().flat_map(|&id| text.token_bytes(id)).collect::<Vec<_>>()).into_owned();
    assert!(rendered.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>"), "{rendered}");
    assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered}");
    assert!(!t1.ids.is_empty() && t1.ids.len() <= MAX_TOKENS);
    let decoded: Vec<u8> = t1.ids.iter().flat_map(|&id| text.token_bytes(id)).collect();
    assert_eq!(t1.text, decoded, "DATA text is the model's text of the ids");

    // turn 2 re-sends the transcript: the reply as text (without its eos), then a user message
    let reply: Vec<u8> =
        t1.ids.iter().filter(|&&id| Some(id) != text.eos()).flat_map(|&id| text.token_bytes(id)).collect();
    messages.push(msg("assistant", &String::from_utf8_lossy(&reply)));
    messages.push(msg("user", "And of Italy?"));
    let t2 = stdio_turn(&mut *engine, 2, &messages);
    assert_eq!(t2.prompt, text.render_chat(&messages).expect("render"));
    let fed = p1.len() + t1.ids.len() - 1;
    assert!(t2.prompt.len() > fed, "turn 2 extends turn 1");
    assert_eq!(t2.reused, Some(fed), "turn 2 reuses the prompt and the reply but its last id");
}

/// A server on `engine` in a thread of its own (it serves until the test process ends); its port.
fn http_server(mut engine: Box<dyn Engine>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || serve_http(&mut *engine, listener, HttpOptions::default()));
    port
}

fn post(port: u16, path: &str, body: &Value) -> Value {
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).and_then(|()| s.write_all(body.as_bytes())).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    assert!(raw.starts_with(b"HTTP/1.1 200 "), "{}", String::from_utf8_lossy(&raw));
    serde_json::from_slice(&raw[at..]).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&raw)))
}

fn ids(v: &Value) -> Vec<u32> {
    let ids = v.as_array().unwrap_or_else(|| panic!("not an array of ids: {v}"));
    ids.iter().map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()).expect("an id")).collect()
}

#[test]
#[ignore = "needs SmolLM2: bash ci/fetch-smollm2.sh, then KVPROOF_CACHE=<cache> cargo test -- --ignored"]
fn http_chat_uses_the_models_template_and_tokenizer() {
    let engine = smollm2();
    let text = engine.text();
    let port = http_server(engine);
    let chat = |messages: &[TextMessage]| {
        let body = json!({"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": true,
                          "logprobs": true, "top_logprobs": 2});
        post(port, "/v1/chat/completions", &body)
    };
    let mut messages = vec![msg("user", "What is the capital of France?")];
    let a1 = chat(&messages);
    let p1 = text.render_chat(&messages).expect("render");
    assert_eq!(ids(&a1["prompt_token_ids"]), p1, "the prompt is the ChatML template's ids");
    assert_eq!(a1["usage"]["prompt_tokens"], json!(p1.len()));
    let r1 = ids(&a1["choices"][0]["token_ids"]);
    assert!(!r1.is_empty() && r1.len() <= MAX_TOKENS);
    // the content is the model's text of the ids; the eos adds none
    let decoded: Vec<u8> =
        r1.iter().filter(|&&id| Some(id) != text.eos()).flat_map(|&id| text.token_bytes(id)).collect();
    let content = a1["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    assert_eq!(content, String::from_utf8_lossy(&decoded));
    // log probabilities spell each token by the model's text of it
    let entries = a1["choices"][0]["logprobs"]["content"].as_array().expect("logprobs").clone();
    assert_eq!(entries.len(), r1.len());
    for (entry, &id) in entries.iter().zip(&r1) {
        let bytes = text.token_bytes(id);
        assert_eq!(entry["id"], json!(id));
        assert_eq!(entry["bytes"], json!(bytes));
        assert_eq!(entry["token"], json!(String::from_utf8_lossy(&bytes)), "{entry}");
    }

    messages.push(msg("assistant", &content));
    messages.push(msg("user", "And of Italy?"));
    let a2 = chat(&messages);
    let p2 = ids(&a2["prompt_token_ids"]);
    assert_eq!(p2, text.render_chat(&messages).expect("render"));
    let fed = p1.len() + r1.len() - 1;
    assert!(p2.len() > fed, "turn 2 extends turn 1");
    assert_eq!(a2["usage"]["prompt_tokens_details"]["cached_tokens"], json!(fed), "{a2}");
    assert_eq!(a2["timings"]["cache_n"], json!(fed));
}
