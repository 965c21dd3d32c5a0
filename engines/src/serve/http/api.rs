//! The request bodies of `/v1/completions` and `/v1/chat/completions`, read field by field so every error names
//! the field at fault, and the JSON error object every refusal carries.

use serde_json::{json, Map, Value};

use crate::chat::TextMessage;
use crate::engine::EngineInfo;

/// A refusal: the HTTP status and the OpenAI-style error object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error`, `not_found_error` or `server_error`.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Further fields of the error object (e.g. `n_prompt_tokens` and `n_ctx` for an exceeded context).
    pub extra: Vec<(&'static str, Value)>,
}

impl ApiError {
    /// 400: the value of `param` is wrong.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        ApiError {
            status: 400,
            message: format!("{param}: {}", message.into()),
            kind: "invalid_request_error",
            param: Some(param),
            code: Some("invalid_value"),
            extra: Vec::new(),
        }
    }

    /// A refusal about the request as a whole (no field at fault).
    pub fn status(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            404 => "not_found_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, param: None, code: None, extra: Vec::new() }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The response body: `{"error": {...}}`.
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("message".into(), json!(self.message));
        error.insert("type".into(), json!(self.kind));
        error.insert("param".into(), json!(self.param));
        error.insert("code".into(), json!(self.code));
        for (k, v) in &self.extra {
            error.insert((*k).into(), v.clone());
        }
        json!({ "error": error })
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Token ids, fed as they are.
    Ids(Vec<u32>),
    /// Text, tokenized as the stdio protocol's text payload is (`<|name|>` spells a special id).
    Text(String),
    /// A conversation, rendered with the engine's chat template.
    Chat(Vec<TextMessage>),
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    pub endpoint: Endpoint,
    pub input: Input,
    pub model: Option<String>,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: u64,
    pub stream: bool,
    /// Streaming: end with a chunk carrying `usage` (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Log probabilities of this many alternatives per token (`None`: no logprobs at all).
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    pub slot: usize,
    /// `false`: run on a fresh state (nothing reused, the slot untouched).
    pub cache_prompt: bool,
    /// A cache salt: the request shares no cache with any other (it runs on a fresh state).
    pub cache_salt: Option<String>,
    /// llama.cpp's `return_tokens`: the reply's token ids as a top-level `tokens` array.
    pub return_tokens: bool,
    /// vLLM's `return_token_ids`: `token_ids` (and `prompt_token_ids`) in the choice.
    pub return_token_ids: bool,
    /// vLLM's `return_tokens_as_token_ids`: logprob tokens spelled `token_id:N`.
    pub tokens_as_ids: bool,
}

/// The most alternatives a request may ask log probabilities for.
pub const MAX_TOP_LOGPROBS: usize = 20;

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stream",
    "stream_options",
    "n",
    "stop",
    "user",
    "ignore_eos",
    "id_slot",
    "cache_prompt",
    "cache_salt",
    "return_tokens",
    "return_token_ids",
    "return_tokens_as_token_ids",
];
const COMPLETIONS: &[&str] = &["prompt", "logprobs", "echo"];
const CHAT: &[&str] = &["messages", "logprobs", "top_logprobs", "max_completion_tokens"];

/// Parse a request body for `endpoint` against the engine's limits.
pub fn parse(endpoint: Endpoint, body: &[u8], info: &EngineInfo) -> Result<Generate, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::status(400, format!("malformed JSON body: {e}")).with_code("invalid_json"))?;
    let Value::Object(map) = value else {
        return Err(ApiError::status(400, "the body must be a JSON object").with_code("invalid_json"));
    };
    let own = match endpoint {
        Endpoint::Completions => COMPLETIONS,
        Endpoint::Chat => CHAT,
    };
    if let Some(unknown) = map.keys().find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        let mut known: Vec<&str> = COMMON.iter().chain(own).copied().collect();
        known.sort_unstable();
        return Err(ApiError::bad(unknown.clone(), format!("unknown field (known: {})", known.join(", ")))
            .with_code("unknown_field"));
    }
    let f = Fields(&map);

    let input = match endpoint {
        Endpoint::Completions => prompt(f.get("prompt").ok_or_else(|| missing("prompt"))?, info.vocab)?,
        Endpoint::Chat => Input::Chat(messages(f.get("messages").ok_or_else(|| missing("messages"))?)?),
    };
    let max_tokens = match endpoint {
        Endpoint::Chat => f.count("max_completion_tokens")?.or(f.count("max_tokens")?),
        Endpoint::Completions => f.count("max_tokens")?,
    }
    .unwrap_or(16);
    let max_field = if f.get("max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    if max_tokens == 0 {
        return Err(ApiError::bad(max_field, "must be at least 1"));
    }
    if max_tokens > info.max_ctx {
        return Err(ApiError::bad(max_field, format!("{max_tokens} exceeds the context ({} tokens)", info.max_ctx)));
    }

    let temperature = f.number("temperature")?.unwrap_or(0.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::bad("temperature", "must be a number in [0, 2] (0 is greedy)"));
    }
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", "must be a number in (0, 1]"));
    }
    if let Some(n) = f.count("n")? {
        if n != 1 {
            return Err(ApiError::bad("n", "only one choice per request (n = 1) is served"));
        }
    }
    match f.get("stop") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => return Err(ApiError::bad("stop", "stop sequences are not supported")),
    }
    if f.flag("echo")? == Some(true) {
        return Err(ApiError::bad("echo", "echoing the prompt is not supported"));
    }
    if let Some(v) = f.get("user") {
        if !v.is_string() {
            return Err(ApiError::bad("user", "must be a string"));
        }
    }
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::bad(format!("stream_options.{k}"), "unknown field (known: include_usage)"));
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::bad("stream_options.include_usage", "must be true or false")),
            }
        }
        Some(_) => return Err(ApiError::bad("stream_options", "must be an object")),
    };

    let logprobs = match endpoint {
        Endpoint::Completions => f.count("logprobs")?,
        Endpoint::Chat => match (f.flag("logprobs")?, f.count("top_logprobs")?) {
            (Some(true), k) => Some(k.unwrap_or(0)),
            (_, Some(_)) => return Err(ApiError::bad("top_logprobs", "needs `logprobs: true`")),
            _ => None,
        },
    };
    if let Some(k) = logprobs.filter(|&k| k > MAX_TOP_LOGPROBS.min(info.vocab)) {
        let field = if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" };
        return Err(ApiError::bad(field, format!("{k} exceeds the most this server gives ({MAX_TOP_LOGPROBS})")));
    }

    let slot = match f.get("id_slot") {
        None => 0,
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => 0,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(s) if (s as usize) < info.slots => s as usize,
            _ => {
                return Err(ApiError::bad(
                    "id_slot",
                    format!("{n} is not a slot of this engine (0..{}, or -1 for any)", info.slots),
                ))
            }
        },
        Some(_) => return Err(ApiError::bad("id_slot", "must be a slot number")),
    };
    let cache_salt = match f.get("cache_salt") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => return Err(ApiError::bad("cache_salt", "must be a non-empty string")),
    };
    let model = match f.get("model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad("model", "must be a string")),
    };

    Ok(Generate {
        endpoint,
        input,
        model,
        max_tokens,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k: f.count("top_k")?.unwrap_or(0),
        seed: f.count("seed")?.unwrap_or(0) as u64,
        stream: f.flag("stream")?.unwrap_or(false),
        include_usage,
        logprobs,
        ignore_eos: f.flag("ignore_eos")?.unwrap_or(false),
        slot,
        cache_prompt: f.flag("cache_prompt")?.unwrap_or(true),
        cache_salt,
        return_tokens: f.flag("return_tokens")?.unwrap_or(false),
        return_token_ids: f.flag("return_token_ids")?.unwrap_or(false),
        tokens_as_ids: f.flag("return_tokens_as_token_ids")?.unwrap_or(false),
    })
}

fn missing(field: &str) -> ApiError {
    ApiError::bad(field, "missing").with_code("missing_field")
}

/// The request object, with `null` read as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn flag(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::bad(key, "must be true or false")),
        }
    }

    fn count(&self, key: &str) -> Result<Option<usize>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(ApiError::bad(key, "must be a whole number >= 0")),
            },
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad(key, "must be a number")),
        }
    }
}

/// `prompt`: a string, an array of token ids, or a one-element array of either.
fn prompt(v: &Value, vocab: usize) -> Result<Input, ApiError> {
    match v {
        Value::String(s) => Ok(Input::Text(s.clone())),
        Value::Array(items) if items.len() == 1 && (items[0].is_string() || items[0].is_array()) => {
            prompt(&items[0], vocab)
        }
        Value::Array(items) if items.iter().any(|i| i.is_string() || i.is_array()) => {
            Err(ApiError::bad("prompt", "a batch of several prompts is not served: send one per request"))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                Some(id) => Err(ApiError::bad(
                    format!("prompt[{i}]"),
                    format!("token id {id} is outside the vocabulary ({vocab} ids)"),
                )),
                None => Err(ApiError::bad(format!("prompt[{i}]"), format!("{item} is not a token id"))),
            })
            .collect::<Result<Vec<u32>, ApiError>>()
            .map(Input::Ids),
        _ => Err(ApiError::bad("prompt", "must be a string or an array of token ids")),
    }
}

/// `messages`: `{"role", "content"}` objects with string contents.
fn messages(v: &Value) -> Result<Vec<TextMessage>, ApiError> {
    let Value::Array(items) = v else {
        return Err(ApiError::bad("messages", "must be an array of {\"role\", \"content\"} objects"));
    };
    if items.is_empty() {
        return Err(ApiError::bad("messages", "must hold at least one message"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let Value::Object(o) = m else {
                return Err(ApiError::bad(format!("messages[{i}]"), "must be a {\"role\", \"content\"} object"));
            };
            if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "role" | "content" | "name")) {
                return Err(ApiError::bad(at(k), "unknown field (known: role, content, name)"));
            }
            let role = match o.get("role") {
                Some(Value::String(r)) => r.clone(),
                Some(_) => return Err(ApiError::bad(at("role"), "must be a string")),
                None => return Err(ApiError::bad(at("role"), "missing")),
            };
            role.parse::<crate::chat::Role>().map_err(|e| ApiError::bad(at("role"), e))?;
            let content = match o.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(Value::Null) | None => String::new(),
                Some(_) => return Err(ApiError::bad(at("content"), "must be a string")),
            };
            Ok(TextMessage { role, content })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> EngineInfo {
        EngineInfo::test_fixture(false)
    }

    fn ok(endpoint: Endpoint, body: Value) -> Generate {
        parse(endpoint, body.to_string().as_bytes(), &info()).expect("valid")
    }

    fn refused(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes(), &info()).expect_err("refused")
    }

    #[test]
    fn reads_prompts_and_options() {
        let g = ok(
            Endpoint::Completions,
            json!({"prompt": [256, 104], "max_tokens": 3, "logprobs": 2, "stream": true,
                   "stream_options": {"include_usage": true}, "id_slot": 1, "cache_prompt": false,
                   "return_tokens": true, "ignore_eos": true, "temperature": 0, "stop": null}),
        );
        assert_eq!(g.input, Input::Ids(vec![256, 104]));
        assert_eq!((g.max_tokens, g.logprobs, g.slot, g.cache_prompt, g.ignore_eos), (3, Some(2), 1, false, true));
        assert!(g.stream && g.include_usage && g.return_tokens && !g.return_token_ids);
        assert_eq!(ok(Endpoint::Completions, json!({"prompt": "hi"})).input, Input::Text("hi".into()));
        assert_eq!(ok(Endpoint::Completions, json!({"prompt": [[1, 2]]})).input, Input::Ids(vec![1, 2]));
        let chat = ok(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2,
                   "max_completion_tokens": 5, "id_slot": -1}),
        );
        assert_eq!((chat.logprobs, chat.max_tokens, chat.slot), (Some(2), 5, 0));
        assert_eq!(chat.input, Input::Chat(vec![TextMessage { role: "user".into(), content: "hi".into() }]));
    }

    #[test]
    fn every_error_names_its_field() {
        let cases: &[(Endpoint, &str, Option<&str>)] = &[
            (Endpoint::Completions, "{\"prompt\": [1, 2", None),
            (Endpoint::Completions, "[1]", None),
            (Endpoint::Completions, r#"{"prompt": "x", "colour": 1}"#, Some("colour")),
            (Endpoint::Completions, r#"{"max_tokens": 3}"#, Some("prompt")),
            (Endpoint::Completions, r#"{"prompt": [1, 999]}"#, Some("prompt[1]")),
            (Endpoint::Completions, r#"{"prompt": [1, -2]}"#, Some("prompt[1]")),
            (Endpoint::Completions, r#"{"prompt": ["a", "b"]}"#, Some("prompt")),
            (Endpoint::Completions, r#"{"prompt": 7}"#, Some("prompt")),
            (Endpoint::Completions, r#"{"prompt": "x", "max_tokens": 0}"#, Some("max_tokens")),
            (Endpoint::Completions, r#"{"prompt": "x", "max_tokens": 65}"#, Some("max_tokens")),
            (Endpoint::Completions, r#"{"prompt": "x", "max_tokens": "3"}"#, Some("max_tokens")),
            (Endpoint::Completions, r#"{"prompt": "x", "temperature": -1}"#, Some("temperature")),
            (Endpoint::Completions, r#"{"prompt": "x", "top_p": 0}"#, Some("top_p")),
            (Endpoint::Completions, r#"{"prompt": "x", "n": 2}"#, Some("n")),
            (Endpoint::Completions, r#"{"prompt": "x", "stop": ["a"]}"#, Some("stop")),
            (Endpoint::Completions, r#"{"prompt": "x", "echo": true}"#, Some("echo")),
            (Endpoint::Completions, r#"{"prompt": "x", "logprobs": 21}"#, Some("logprobs")),
            (Endpoint::Completions, r#"{"prompt": "x", "id_slot": 2}"#, Some("id_slot")),
            (Endpoint::Completions, r#"{"prompt": "x", "stream": 1}"#, Some("stream")),
            (Endpoint::Completions, r#"{"prompt": "x", "stream_options": {"x": 1}}"#, Some("stream_options.x")),
            (Endpoint::Completions, r#"{"prompt": "x", "top_logprobs": 2}"#, Some("top_logprobs")),
            (Endpoint::Chat, r#"{"prompt": "x"}"#, Some("prompt")),
            (Endpoint::Chat, r#"{"messages": []}"#, Some("messages")),
            (Endpoint::Chat, r#"{"messages": [{"role": "bot", "content": "x"}]}"#, Some("messages[0].role")),
            (Endpoint::Chat, r#"{"messages": [{"role": "user", "content": 3}]}"#, Some("messages[0].content")),
            (Endpoint::Chat, r#"{"messages": [{"role": "user", "x": 3}]}"#, Some("messages[0].x")),
            (Endpoint::Chat, r#"{"messages": [{"role": "user"}], "top_logprobs": 2}"#, Some("top_logprobs")),
        ];
        for (endpoint, body, param) in cases {
            let e = refused(*endpoint, body);
            assert_eq!(e.status, 400, "{body}: {e:?}");
            assert_eq!(e.param.as_deref(), *param, "{body}: {e:?}");
            if let Some(p) = param {
                assert!(e.message.starts_with(&format!("{p}: ")), "{body}: {}", e.message);
            }
            assert_eq!(e.body()["error"]["param"], json!(param), "{body}");
        }
    }
}
