//! An engine reached over an OpenAI-compatible HTTP API (`"engine": {"url": ...}`): where it is, how a cold
//! instance is had and how the warm one is made fresh. docs/http.md says what to declare for vLLM, SGLang,
//! llama.cpp's `llama-server`, Ollama and `kvproof-engine --http`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::DeclaredRule;

/// Which endpoint the engine is driven through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HttpApi {
    /// `/v1/completions` with token-id prompts (conversations as text go to `/v1/chat/completions`).
    Completions,
    /// `/v1/chat/completions` only: the server takes no token-id prompts (Ollama), so scenarios whose prompts
    /// are token ids cannot run.
    Chat,
}

impl HttpApi {
    pub fn name(self) -> &'static str {
        match self {
            HttpApi::Completions => "completions",
            HttpApi::Chat => "chat",
        }
    }
}

/// How the warm instance starts from a fresh state before each plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ResetKind {
    /// `POST /slots/{id}?action=erase` for each slot a plan uses (llama.cpp's `llama-server`, `kvproof-engine`).
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// `POST /reset_prefix_cache` (vLLM; its dev-mode endpoints must be on: `VLLM_SERVER_DEV_MODE=1`).
    #[serde(rename = "vllm")]
    Vllm,
    /// `POST /flush_cache` (SGLang).
    #[serde(rename = "sglang")]
    Sglang,
    /// Nothing: each plan meets whatever the server kept from the one before.
    #[serde(rename = "none")]
    None,
}

impl ResetKind {
    pub const ALL: [ResetKind; 4] = [ResetKind::LlamaCpp, ResetKind::Vllm, ResetKind::Sglang, ResetKind::None];

    pub fn name(self) -> &'static str {
        match self {
            ResetKind::LlamaCpp => "llama.cpp",
            ResetKind::Vllm => "vllm",
            ResetKind::Sglang => "sglang",
            ResetKind::None => "none",
        }
    }
}

/// The word `"bypass"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Bypass {
    Bypass,
}

/// Where a cold run happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(deny_unknown_fields)]
pub enum ColdSpec {
    /// `"bypass"`: the warm server itself, each cold request sent with its per-request cache bypass
    /// (`cache_prompt: false`, and a cache salt no other request uses) on the request's own slot. A weaker cold
    /// than a separate process: the cold run shares the server's process and memory with the warm instance.
    Bypass(Bypass),
    /// The bypass on a slot warm requests never use (`llama-server -np 2` with `{"bypass_slot": 1}`: a bypassed
    /// request there overwrites the slot it runs on, so it must not be a warm one).
    BypassSlot {
        #[schemars(range(min = 1))]
        bypass_slot: usize,
    },
    /// A second server with the same model, reset (as `reset` says) before every cold run.
    Server {
        /// The second server's API base URL.
        url: String,
        /// The model name there (default: the warm instance's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
}

impl ColdSpec {
    /// What the cold instance is, as labels and run.json say it.
    pub fn describe(&self) -> String {
        match self {
            ColdSpec::Bypass(_) => {
                "cold: per-request cache bypass on the same server (weaker than a separate process)".into()
            }
            ColdSpec::BypassSlot { bypass_slot } => format!(
                "cold: per-request cache bypass on slot {bypass_slot} of the same server (weaker than a separate \
                 process)"
            ),
            ColdSpec::Server { url, .. } => format!("cold: a second server at {url}, reset before each cold run"),
        }
    }

    /// Whether cold runs share the warm server (and so are weaker than a separate process).
    pub fn is_bypass(&self) -> bool {
        !matches!(self, ColdSpec::Server { .. })
    }

    fn parse(v: &Value) -> Result<ColdSpec, String> {
        let shapes = "expected \"bypass\", {\"bypass_slot\": N} or {\"url\": \"http://...\", \"model\": \"...\"}";
        match v {
            Value::String(s) if s == "bypass" => Ok(ColdSpec::Bypass(Bypass::Bypass)),
            Value::Object(o) if o.contains_key("bypass_slot") => {
                if let Some(k) = o.keys().find(|k| *k != "bypass_slot") {
                    return Err(format!("engine.cold.{k}: unknown field beside `bypass_slot`"));
                }
                match o.get("bypass_slot").and_then(Value::as_u64) {
                    Some(s) if s >= 1 => Ok(ColdSpec::BypassSlot { bypass_slot: s as usize }),
                    _ => Err("engine.cold.bypass_slot: must be a slot number >= 1 (slot 0 is the warm one)".into()),
                }
            }
            Value::Object(o) if o.contains_key("url") => {
                if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "url" | "model")) {
                    return Err(format!("engine.cold.{k}: unknown field (known: url, model)"));
                }
                let url = match o.get("url") {
                    Some(Value::String(u)) => base_url(u).map_err(|e| format!("engine.cold.url: {e}"))?,
                    _ => return Err("engine.cold.url: must be a string".into()),
                };
                let model = match o.get("model") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(m)) if !m.is_empty() => Some(m.clone()),
                    Some(_) => return Err("engine.cold.model: must be a non-empty string".into()),
                };
                Ok(ColdSpec::Server { url, model })
            }
            other => Err(format!("engine.cold: {shapes}; got {other}")),
        }
    }
}

/// An engine behind an OpenAI-compatible HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpEngine {
    /// The API's base URL, e.g. http://127.0.0.1:8080/v1 (`/completions`, `/chat/completions` and `/models`
    /// are under it; llama.cpp's and vLLM's reset endpoints under the server's root).
    #[schemars(length(min = 1))]
    pub url: String,
    /// The model name requests carry (default: the first model `GET {url}/models` lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `completions` (default) or `chat`.
    #[serde(default = "completions")]
    #[schemars(with = "Option<HttpApi>")]
    pub api: HttpApi,
    /// Where cold runs happen: "bypass", {"bypass_slot": N} or {"url": ...}. Required: the run manifest records
    /// how cold the cold instance was.
    pub cold: ColdSpec,
    /// How the warm instance is made fresh before each plan: llama.cpp, vllm, sglang or none. Required.
    pub reset: ResetKind,
    /// Slots the warm instance uses (default: what the server describes, else 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub slots: Option<usize>,
    /// Per-request timeout in milliseconds (default 60000).
    #[serde(default = "default_timeout_ms")]
    #[schemars(with = "Option<u64>", range(min = 1))]
    pub timeout_ms: u64,
    /// How often a request is sent again when the connection fails before any answer (default 2); an answer,
    /// even an error, is never retried.
    #[serde(default = "default_retries")]
    #[schemars(with = "Option<u32>")]
    pub retries: u32,
    /// The engine's reuse rule (strict, lcp, grid:R, block:B, none); the oracle's exact reuse check needs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub reuse_rule: Option<DeclaredRule>,
    /// Fields added to every request body, over the driver's own (e.g. {"cache_prompt": false} turns the prompt
    /// cache off for the warm instance too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_body: Option<Map<String, Value>>,
}

fn completions() -> HttpApi {
    HttpApi::Completions
}

/// `engine.timeout_ms` as every engine kind reads it: the default when absent, and never zero.
pub(super) fn parse_timeout_ms(raw: Option<u64>) -> Result<u64, String> {
    let timeout_ms = raw.unwrap_or_else(default_timeout_ms);
    if timeout_ms == 0 {
        return Err("engine.timeout_ms: must be positive".into());
    }
    Ok(timeout_ms)
}

/// `engine.reuse_rule` as every engine kind reads it.
pub(super) fn parse_reuse_rule(raw: Option<String>) -> Result<Option<DeclaredRule>, String> {
    raw.map(|r| r.parse::<DeclaredRule>().map_err(|e| format!("engine.reuse_rule: {e}"))).transpose()
}

pub fn default_timeout_ms() -> u64 {
    60_000
}

fn default_retries() -> u32 {
    2
}

/// The HTTP fields of a scenario's engine object, as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawHttp {
    pub url: String,
    pub model: Option<String>,
    pub api: Option<String>,
    pub cold: Option<Value>,
    pub reset: Option<String>,
    pub slots: Option<usize>,
    pub timeout_ms: Option<u64>,
    pub retries: Option<u32>,
    pub reuse_rule: Option<String>,
    pub extra_body: Option<Map<String, Value>>,
}

/// `http://host:port/path` without a trailing slash; `https` is refused (the driver speaks plain HTTP to
/// servers it can reach directly).
pub fn base_url(url: &str) -> Result<String, String> {
    let rest = match url.strip_prefix("http://") {
        Some(rest) => rest,
        None if url.starts_with("https://") => {
            return Err(format!("`{url}`: https is not supported (the driver speaks plain HTTP)"))
        }
        None => return Err(format!("`{url}` is not an http:// URL")),
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains(['?', '#', ' ', '@']) {
        return Err(format!("`{url}`: no host[:port] after http://"));
    }
    if rest.contains(['?', '#']) {
        return Err(format!("`{url}`: a base URL has no query or fragment"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

impl HttpEngine {
    /// Check the fields as written; errors name the field.
    pub fn from_raw(raw: RawHttp) -> Result<HttpEngine, String> {
        let url = base_url(&raw.url).map_err(|e| format!("engine.url: {e}"))?;
        let model = match raw.model {
            Some(m) if m.is_empty() => return Err("engine.model: must not be empty".into()),
            m => m,
        };
        let api = match raw.api.as_deref() {
            None | Some("completions") => HttpApi::Completions,
            Some("chat") => HttpApi::Chat,
            Some(other) => return Err(format!("engine.api: `{other}` is not an API (completions, chat)")),
        };
        let cold = match &raw.cold {
            Some(v) => ColdSpec::parse(v)?,
            None => {
                return Err("engine.cold: missing: declare \"bypass\" (the server's per-request cache bypass), \
                            {\"bypass_slot\": N} or {\"url\": ...} (a second server)"
                    .into())
            }
        };
        let reset = match raw.reset.as_deref() {
            Some(r) => ResetKind::ALL.into_iter().find(|k| k.name() == r).ok_or_else(|| {
                let known: Vec<&str> = ResetKind::ALL.iter().map(|k| k.name()).collect();
                format!("engine.reset: `{r}` is not a reset ({})", known.join(", "))
            })?,
            None => {
                return Err("engine.reset: missing: how the warm instance starts fresh before each plan (llama.cpp, \
                            vllm, sglang, none)"
                    .into())
            }
        };
        if reset == ResetKind::None && matches!(cold, ColdSpec::Server { .. }) {
            return Err("engine.cold: a second server must be reset before each cold run; declare engine.reset".into());
        }
        if raw.slots == Some(0) {
            return Err("engine.slots: must be at least 1".into());
        }
        if let (ColdSpec::BypassSlot { bypass_slot }, Some(slots)) = (&cold, raw.slots) {
            if *bypass_slot < slots {
                return Err(format!(
                    "engine.cold.bypass_slot: slot {bypass_slot} is one of the warm instance's (0..{slots})"
                ));
            }
        }
        let timeout_ms = parse_timeout_ms(raw.timeout_ms)?;
        let reuse_rule = parse_reuse_rule(raw.reuse_rule)?;
        Ok(HttpEngine {
            url,
            model,
            api,
            cold,
            reset,
            slots: raw.slots,
            timeout_ms,
            retries: raw.retries.unwrap_or_else(default_retries),
            reuse_rule,
            extra_body: raw.extra_body,
        })
    }

    /// The fields as a scenario file writes them.
    pub fn to_raw(&self) -> RawHttp {
        RawHttp {
            url: self.url.clone(),
            model: self.model.clone(),
            api: Some(self.api.name().into()),
            cold: serde_json::to_value(&self.cold).ok(),
            reset: Some(self.reset.name().into()),
            slots: self.slots,
            timeout_ms: Some(self.timeout_ms),
            retries: Some(self.retries),
            reuse_rule: self.reuse_rule.map(|r| r.to_string()),
            extra_body: self.extra_body.clone(),
        }
    }

    /// A short label: the URL, the model when named, and how cold the cold runs are.
    pub fn label(&self) -> String {
        let model = self.model.as_deref().map(|m| format!(" model {m}")).unwrap_or_default();
        format!("{}{model} (HTTP {}; {}; reset {})", self.url, self.api.name(), self.cold.describe(), self.reset.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(cold: Value, reset: &str) -> RawHttp {
        RawHttp {
            url: "http://127.0.0.1:8080/v1/".into(),
            cold: Some(cold),
            reset: Some(reset.into()),
            ..RawHttp::default()
        }
    }

    #[test]
    fn reads_and_writes_back() {
        for cold in
            [json!("bypass"), json!({"bypass_slot": 1}), json!({"url": "http://127.0.0.1:8081/v1", "model": "m"})]
        {
            let spec = HttpEngine::from_raw(raw(cold.clone(), "llama.cpp")).expect("valid");
            assert_eq!(spec.url, "http://127.0.0.1:8080/v1");
            assert_eq!(serde_json::to_value(&spec.cold).expect("json"), cold);
            assert_eq!(HttpEngine::from_raw(spec.to_raw()).expect("round trip"), spec);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(RawHttp, &str)> = vec![
            (RawHttp { url: "https://x/v1".into(), ..raw(json!("bypass"), "none") }, "engine.url"),
            (RawHttp { url: "localhost:8080".into(), ..raw(json!("bypass"), "none") }, "engine.url"),
            (RawHttp { cold: None, ..raw(json!("bypass"), "none") }, "engine.cold: missing"),
            (raw(json!("cold"), "none"), "engine.cold"),
            (raw(json!({"bypass_slot": 0}), "none"), "engine.cold.bypass_slot"),
            (raw(json!({"url": "http://x/v1", "colour": 1}), "vllm"), "engine.cold.colour"),
            (raw(json!({"url": "http://x/v1"}), "none"), "engine.cold"),
            (raw(json!("bypass"), "reboot"), "engine.reset"),
            (RawHttp { reset: None, ..raw(json!("bypass"), "none") }, "engine.reset: missing"),
            (RawHttp { api: Some("responses".into()), ..raw(json!("bypass"), "none") }, "engine.api"),
            (RawHttp { slots: Some(2), ..raw(json!({"bypass_slot": 1}), "none") }, "engine.cold.bypass_slot"),
            (RawHttp { timeout_ms: Some(0), ..raw(json!("bypass"), "none") }, "engine.timeout_ms"),
            (RawHttp { reuse_rule: Some("prefix".into()), ..raw(json!("bypass"), "none") }, "engine.reuse_rule"),
        ];
        for (r, needle) in cases {
            let e = HttpEngine::from_raw(r.clone()).expect_err(needle);
            assert!(e.starts_with(needle), "{r:?}: {e}");
        }
    }
}
