//! The scenario file format. Every struct rejects unknown keys; the top level is read by a hand-written visitor
//! so that `params` is parsed straight into the type its `kind` names and errors keep their line and column.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use kvproof_engines::config::Preset;
use kvproof_engines::fault::Fault;
use schemars::JsonSchema;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::engine_config::ConfigOverrides;
use super::http_engine::{self, HttpEngine, RawHttp};
use super::params::{AgenticParams, BoundaryParams, GrowthParams, StalenessParams, StressParams};
use super::DeclaredRule;

/// One scenario file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// The file it was read from (not part of the JSON).
    #[serde(skip)]
    pub path: PathBuf,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub engine: EngineSpec,
    /// Seeds everything the scenario generates (texts, lengths, orders).
    pub seed: u64,
    pub kind: Kind,
    pub params: Params,
    #[serde(rename = "assert")]
    pub assertions: Assertions,
    /// The corpus `params.corpus` names, read with the scenario (not part of the JSON).
    #[serde(skip)]
    pub corpus: Option<std::sync::Arc<super::corpus::LoadedCorpus>>,
}

/// The kinds of trial a scenario can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum Kind {
    BoundaryMatrix,
    StressPairs,
    GrowthCurve,
    SemanticStaleness,
    Agentic,
}

impl Kind {
    pub fn name(self) -> &'static str {
        self.into()
    }
    pub fn describe(self) -> &'static str {
        match self {
            Kind::BoundaryMatrix => "every edge case of the reuse decision, each with its exact expected reuse",
            Kind::StressPairs => "seeded random conversations; every turn warm vs cold; failure rate bounded",
            Kind::GrowthCurve => "a growing conversation; per-turn wall time warm vs cold, slopes, speedup vs ideal",
            Kind::SemanticStaleness => "warm replies classified fresh, stale(context) or corrupt, with bounds",
            Kind::Agentic => "tool-use sessions in a sandbox; every turn warm vs cold; per-turn assertions, bounds",
        }
    }
}

/// The parameters of the scenario's kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Params {
    BoundaryMatrix(BoundaryParams),
    StressPairs(StressParams),
    GrowthCurve(GrowthParams),
    SemanticStaleness(StalenessParams),
    Agentic(AgenticParams),
}

impl Params {
    /// The params a scenario that gives none runs with (`None`: the kind has no defaults, as agentic needs its
    /// tasks).
    fn default_for(kind: Kind) -> Option<Params> {
        Some(match kind {
            Kind::BoundaryMatrix => Params::BoundaryMatrix(BoundaryParams::default()),
            Kind::StressPairs => Params::StressPairs(StressParams::default()),
            Kind::GrowthCurve => Params::GrowthCurve(GrowthParams::default()),
            Kind::SemanticStaleness => Params::SemanticStaleness(StalenessParams::default()),
            Kind::Agentic => return None,
        })
    }
}

fn yes() -> bool {
    true
}

fn default_confidence() -> f64 {
    0.95
}

/// What the scenario requires beyond "every check passes".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Assertions {
    /// The run fails when the one-sided Clopper–Pearson upper bound on the failure rate exceeds this. When set,
    /// it replaces "no trial may fail" as the verdict of the scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub max_failure_rate: Option<f64>,
    /// Confidence of the bound.
    #[serde(default = "default_confidence")]
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub confidence: f64,
    /// Compare the state through dumps after each compared turn.
    #[serde(default = "yes")]
    pub state: bool,
    /// Run the cold-vs-cold control on every compared turn.
    #[serde(default = "yes")]
    pub control: bool,
    /// growth-curve: the warm per-turn wall time of the last turn over that of turn 2 is at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_warm_ratio: Option<f64>,
    /// growth-curve: the warm ratio (as `max_warm_ratio` measures it) over the ratio the model's own cost expects of
    /// a correct engine is at most this (above 1). The expected ratio counts the flops of the weights and of
    /// attention over the context at the reuse the oracle expects, so a model whose warm turns legitimately grow
    /// (full attention over a longer context) is not failed for it, while an engine whose reuse never engages grows
    /// like the cold ratio and is. Judged by the `warm-growth` check, which is skipped (not passed) when the engine
    /// reports no cost; `require` it to fail the scenario then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 1))]
    pub max_warm_ratio_over_expected: Option<f64>,
    /// growth-curve: the cold ratio is at least this (else the curve cannot tell reuse from no reuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub min_cold_ratio: Option<f64>,
    /// growth-curve: the prefill speedup is at least this fraction of the ideal: cold / warm prefill flops of the
    /// model's cost when the engine reports it (every bundled engine does), else cold / warm prefilled tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub min_speedup_of_ideal: Option<f64>,
    /// growth-curve: reused / prompt tokens over turns 2..T is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub min_reuse_fraction: Option<f64>,
    /// Top-2 logit gaps below this are near-ties, where a tiny numeric difference may flip the pick; absent, the
    /// engine's own 5th percentile of the gaps its cold replies showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub near_tie: Option<f32>,
    /// Checks that must run: one skipped on a trial (other than a turn refused as the case expects) fails the
    /// scenario, and so does one that ran on no trial at all. A pass in which most checks were skipped must not
    /// look like any other pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<super::CheckName>,
}

impl Default for Assertions {
    fn default() -> Self {
        Assertions {
            max_failure_rate: None,
            confidence: default_confidence(),
            state: true,
            control: true,
            max_warm_ratio: None,
            max_warm_ratio_over_expected: None,
            min_cold_ratio: None,
            min_speedup_of_ideal: None,
            min_reuse_fraction: None,
            near_tie: None,
            require: Vec::new(),
        }
    }
}

/// How a bundled engine is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::IntoStaticStr, strum::Display, strum::EnumString)]
#[strum(serialize_all = "kebab-case")]
pub enum Via {
    /// In this process (fastest; every check available).
    #[default]
    InProcess,
    /// Served by a sibling `kvproof-engine` process over the stdio protocol, as any command engine is: the serve
    /// layer (frames, the DONE reuse count, DUMP) is under test too.
    Stdio,
}

/// How a process engine's cold instances get a fresh state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::IntoStaticStr, strum::Display, strum::EnumString)]
#[strum(serialize_all = "kebab-case")]
pub enum Cold {
    /// A new process per cold run: nothing survives from earlier requests.
    #[default]
    Process,
    /// One long-lived second process, sent RESET before each cold run (engines too costly to restart; CAPS
    /// `reset=1`). Weaker: whatever RESET does not clear survives, and reports say so.
    Reset,
}

impl Cold {
    /// What engine labels say of cold instances that are not new processes.
    pub const RESET_NOTE: &'static str = "cold by RESET, weaker than a new process";
}

/// How a scenario names its engine: a bundled engine (`arch`), run in-process or served over stdio, any command
/// speaking the stdio protocol (`command`), or a server with an OpenAI-compatible HTTP API (`url`).
// The file's object is read as a `RawEngine` and checked by `TryFrom`; the schema describes the two shapes that
// check accepts rather than RawEngine's (where every field is optional). Every field but `arch` and `command`
// may be left out or null, as RawEngine's options allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "RawEngine", into = "RawEngine")]
#[schemars(!try_from, !into, untagged, deny_unknown_fields)]
pub enum EngineSpec {
    /// A bundled engine, run in-process or (`via: stdio`) served by a sibling `kvproof-engine`; `config`
    /// overrides fields of its preset's model config.
    Bundled {
        /// A bundled arch (`kvproof list`).
        #[schemars(length(min = 1))]
        arch: String,
        /// The size of its model (default tiny).
        #[schemars(with = "Option<super::schema::PresetName>")]
        preset: Preset,
        /// Seed of the random-init weights (default 0).
        #[schemars(with = "Option<u64>")]
        seed: u64,
        /// A fault of the arch (`kvproof list`), or null.
        #[schemars(with = "Option<String>")]
        fault: Option<Fault>,
        /// Overrides of the preset's model config (fields of config.json other than arch and preset), e.g.
        /// {"kv_share": true} for glm's cross-slot sharing. Unknown fields are rejected when the scenario is loaded.
        #[schemars(with = "Option<ConfigOverrides>")]
        config: ConfigOverrides,
        /// in-process (default), or stdio: a sibling `kvproof-engine --arch .. --preset .. --seed .. [--fault ..]
        /// [--config ..]` process driven over the stdio protocol.
        #[schemars(with = "Option<Via>")]
        via: Via,
        /// With via stdio: how cold instances start (process, the default, or reset).
        #[schemars(with = "Option<Cold>")]
        cold: Cold,
        /// With arch llama: the weights, tokenizer and chat template of a GGUF file instead of a random-init
        /// preset: a known model's name (`smollm2`, fetched by `bash ci/fetch-smollm2.sh`) or a path to a `.gguf`
        /// file (relative to the scenario's folder). `config` may then set only slots, initial_capacity,
        /// prefill_chunk and max_ctx; `preset` and `seed` do not apply.
        #[schemars(with = "Option<String>", length(min = 1))]
        gguf: Option<String>,
    },
    /// Any command speaking the stdio protocol (docs/protocol.md).
    Command {
        /// The program (not empty) and its arguments.
        #[schemars(length(min = 1), extend("prefixItems" = [{ "type": "string", "minLength": 1 }]))]
        command: Vec<String>,
        /// Per-request timeout in milliseconds (default 60000); a hung engine is killed.
        #[schemars(with = "Option<u64>", range(min = 1))]
        timeout_ms: u64,
        /// The engine's reuse rule (strict, lcp, grid:R, block:B, none), when its CAPS do not declare it or
        /// declare it wrong; the oracle's exact reuse check needs one.
        #[schemars(with = "Option<String>")]
        reuse_rule: Option<DeclaredRule>,
        /// How cold instances start: process (default: a new process per cold run) or reset (one long-lived
        /// second process, sent RESET before each cold run; needs CAPS reset=1; a weaker cold, and reported so).
        #[schemars(with = "Option<Cold>")]
        cold: Cold,
    },
    /// A server with an OpenAI-compatible HTTP API (docs/http.md).
    Http(HttpEngine),
}

impl EngineSpec {
    /// A short label for tables and logs.
    pub fn label(&self) -> String {
        match self {
            EngineSpec::Bundled { arch, preset, seed, fault, config, via, cold, gguf } => {
                let mut label = match gguf {
                    Some(model) => format!("{arch}/gguf {model}"),
                    None => format!("{arch}/{preset}/seed {seed}"),
                };
                if !config.is_empty() {
                    label.push_str(&format!("/config {}", super::engine_config::describe(config)));
                }
                if let Some(f) = fault {
                    label.push_str(&format!("/fault {f}"));
                }
                if *via == Via::Stdio {
                    label.push_str(" via stdio");
                    if *cold == Cold::Reset {
                        label.push_str(&format!(" ({})", Cold::RESET_NOTE));
                    }
                }
                label
            }
            EngineSpec::Command { command, cold, .. } => {
                let mut label = format!("`{}`", command.join(" "));
                if *cold == Cold::Reset {
                    label.push_str(&format!(" ({})", Cold::RESET_NOTE));
                }
                label
            }
            EngineSpec::Http(h) => h.label(),
        }
    }

    pub fn fault(&self) -> Option<Fault> {
        match self {
            EngineSpec::Bundled { fault, .. } => *fault,
            EngineSpec::Command { .. } | EngineSpec::Http(_) => None,
        }
    }
}

/// The engine object as written in the file: one shape for both variants, checked by `TryFrom`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEngine {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<ConfigOverrides>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reuse_rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cold: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slots: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    extra_body: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gguf: Option<String>,
}

impl RawEngine {
    /// The HTTP-only fields that are set, by name (`cold` is shared: a process engine's `process`|`reset`).
    fn http_fields(&self) -> Vec<&'static str> {
        let set = [
            ("model", self.model.is_some()),
            ("api", self.api.is_some()),
            ("reset", self.reset.is_some()),
            ("slots", self.slots.is_some()),
            ("retries", self.retries.is_some()),
            ("extra_body", self.extra_body.is_some()),
        ];
        set.into_iter().filter(|(_, on)| *on).map(|(name, _)| name).collect()
    }
}

impl TryFrom<RawEngine> for EngineSpec {
    type Error = String;
    fn try_from(raw: RawEngine) -> Result<Self, String> {
        const ONE_OF: &str = "engine: give only one of `arch` (bundled), `command` (stdio) and `url` (HTTP)";
        let kinds = [raw.arch.is_some(), raw.command.is_some(), raw.url.is_some()];
        if kinds.iter().filter(|k| **k).count() > 1 {
            return Err(ONE_OF.into());
        }
        if let Some(field) = raw.http_fields().first().filter(|_| raw.url.is_none()) {
            return Err(format!("engine.{field}: applies to engines reached over HTTP (`url`) only"));
        }
        if raw.gguf.is_some() && raw.arch.is_none() {
            return Err("engine.gguf: applies to bundled engines (`arch`: llama) only".into());
        }
        if let Some(url) = raw.url {
            if raw.via.is_some() {
                return Err("engine.via: applies to bundled engines (`arch`); a `url` engine is always reached over \
                            HTTP"
                    .into());
            }
            if raw.preset.is_some() || raw.seed.is_some() || raw.fault.is_some() || raw.config.is_some() {
                return Err("engine: `preset`, `seed`, `fault` and `config` apply to bundled engines (`arch`) only; \
                            a server is started with its own model"
                    .into());
            }
            let spec = HttpEngine::from_raw(RawHttp {
                url,
                model: raw.model,
                api: raw.api,
                cold: raw.cold,
                reset: raw.reset,
                slots: raw.slots,
                timeout_ms: raw.timeout_ms,
                retries: raw.retries,
                reuse_rule: raw.reuse_rule,
                extra_body: raw.extra_body,
            })?;
            return Ok(EngineSpec::Http(spec));
        }
        match (raw.arch, raw.command) {
            (Some(_), Some(_)) => Err(ONE_OF.into()),
            (None, None) => {
                Err("engine: missing field `arch` (bundled engine), `command` (stdio engine) or `url` (HTTP server)"
                    .into())
            }
            (Some(arch), None) => {
                if raw.timeout_ms.is_some() || raw.reuse_rule.is_some() {
                    return Err("engine: `timeout_ms` and `reuse_rule` apply to `command` engines only (a bundled \
                                engine's rule is its arch's)"
                        .into());
                }
                let via = match raw.via.as_deref() {
                    None => Via::InProcess,
                    Some(v) => Via::from_str(v).map_err(|_| format!("engine.via: `{v}` is not in-process or stdio"))?,
                };
                let cold = parse_cold(raw.cold.as_ref())?;
                if cold != Cold::Process && via != Via::Stdio {
                    return Err("engine.cold: applies to engines in a process of their own (`via: stdio`, or \
                                `command`); an in-process cold instance is always a fresh state"
                        .into());
                }
                kvproof_engines::bundled::arch(&arch).map_err(|e| format!("engine.arch: {e}"))?;
                if let Some(model) = &raw.gguf {
                    if arch != kvproof_engines::arch::llama::INFO.name {
                        return Err(format!("engine.gguf: a GGUF model is served by arch llama, not {arch}"));
                    }
                    if model.is_empty() {
                        return Err("engine.gguf: must name a model (smollm2) or a .gguf file".into());
                    }
                    if raw.preset.is_some() || raw.seed.is_some() {
                        return Err("engine: `preset` and `seed` make random-init weights; with `gguf` the weights \
                                    are the file's"
                            .into());
                    }
                    let keys = raw.config.iter().flat_map(|c| c.keys()).map(String::as_str);
                    kvproof_engines::config::check_only(
                        keys,
                        kvproof_engines::arch::llama::GGUF_OPTIONS,
                        "the GGUF file",
                    )?;
                }
                let preset = match raw.preset {
                    Some(p) => Preset::from_str(&p).map_err(|e| format!("engine.preset: {e}"))?,
                    None => Preset::Tiny,
                };
                let fault = match raw.fault {
                    Some(name) => {
                        let f = Fault::from_str(&name).map_err(|e| format!("engine.fault: {e}"))?;
                        kvproof_engines::bundled::check_fault(&arch, Some(f))
                            .map_err(|e| format!("engine.fault: {e}"))?;
                        Some(f)
                    }
                    None => None,
                };
                let config = raw.config.unwrap_or_default();
                // a GGUF engine's values are checked against the file when it is opened
                if raw.gguf.is_none() {
                    super::engine_config::model_config(&arch, preset, &config)?;
                }
                let seed = raw.seed.unwrap_or(0);
                Ok(EngineSpec::Bundled { arch, preset, seed, fault, config, via, cold, gguf: raw.gguf })
            }
            (None, Some(command)) => {
                if raw.preset.is_some() || raw.seed.is_some() || raw.fault.is_some() || raw.config.is_some() {
                    return Err("engine: `preset`, `seed`, `fault` and `config` apply to bundled engines (`arch`) \
                                only; pass them as arguments of the command"
                        .into());
                }
                if raw.via.is_some() {
                    return Err("engine.via: applies to bundled engines (`arch`); a command is always run over \
                                stdio"
                        .into());
                }
                let cold = parse_cold(raw.cold.as_ref())?;
                if command.is_empty() || command[0].is_empty() {
                    return Err("engine.command: must name a program".into());
                }
                let timeout_ms = http_engine::parse_timeout_ms(raw.timeout_ms)?;
                let reuse_rule = http_engine::parse_reuse_rule(raw.reuse_rule)?;
                Ok(EngineSpec::Command { command, timeout_ms, reuse_rule, cold })
            }
        }
    }
}

/// A process engine's `cold`: `process` or `reset` (an HTTP engine's `cold` takes other shapes; see http_engine.rs).
fn parse_cold(cold: Option<&serde_json::Value>) -> Result<Cold, String> {
    match cold {
        None => Ok(Cold::Process),
        Some(serde_json::Value::String(c)) => {
            Cold::from_str(c).map_err(|_| format!("engine.cold: `{c}` is not process or reset"))
        }
        Some(other) => Err(format!("engine.cold: {other} is not process or reset")),
    }
}

impl From<EngineSpec> for RawEngine {
    fn from(spec: EngineSpec) -> RawEngine {
        match spec {
            EngineSpec::Bundled { arch, preset, seed, fault, config, via, cold, gguf } => RawEngine {
                arch: Some(arch),
                preset: gguf.is_none().then(|| preset.name().into()),
                seed: gguf.is_none().then_some(seed),
                gguf,
                fault: fault.map(|f| f.name().to_string()),
                config: (!config.is_empty()).then_some(config),
                via: (via != Via::InProcess).then(|| via.to_string()),
                cold: (cold != Cold::Process).then(|| serde_json::Value::String(cold.to_string())),
                ..RawEngine::default()
            },
            EngineSpec::Command { command, timeout_ms, reuse_rule, cold } => RawEngine {
                command: Some(command),
                timeout_ms: Some(timeout_ms),
                reuse_rule: reuse_rule.map(|r| r.to_string()),
                cold: (cold != Cold::Process).then(|| serde_json::Value::String(cold.to_string())),
                ..RawEngine::default()
            },
            EngineSpec::Http(h) => {
                let r = h.to_raw();
                RawEngine {
                    url: Some(r.url),
                    model: r.model,
                    api: r.api,
                    cold: r.cold,
                    reset: r.reset,
                    slots: r.slots,
                    timeout_ms: r.timeout_ms,
                    retries: r.retries,
                    reuse_rule: r.reuse_rule,
                    extra_body: r.extra_body,
                    ..RawEngine::default()
                }
            }
        }
    }
}

/// The top-level keys; every field path a message starts with begins with one.
pub(super) const FIELDS: &[&str] = &["$schema", "name", "description", "engine", "seed", "kind", "params", "assert"];

impl<'de> Deserialize<'de> for Scenario {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ScenarioVisitor)
    }
}

struct ScenarioVisitor;

fn once<T, E: de::Error>(slot: &mut Option<T>, key: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(key));
    }
    *slot = Some(value);
    Ok(())
}

impl<'de> Visitor<'de> for ScenarioVisitor {
    type Value = Scenario;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a scenario object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scenario, A::Error> {
        let mut name: Option<String> = None;
        let mut description: Option<String> = None;
        let mut engine: Option<EngineSpec> = None;
        let mut seed: Option<u64> = None;
        let mut kind: Option<Kind> = None;
        let mut params: Option<Params> = None;
        let mut assertions: Option<Assertions> = None;
        let mut schema: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "$schema" => once(&mut schema, "$schema", map.next_value()?)?,
                "name" => once(&mut name, "name", map.next_value()?)?,
                "description" => once(&mut description, "description", map.next_value()?)?,
                "engine" => once(&mut engine, "engine", map.next_value()?)?,
                "seed" => once(&mut seed, "seed", map.next_value()?)?,
                "kind" => once(&mut kind, "kind", map.next_value()?)?,
                "params" => {
                    // Parsed straight into the kind's type: errors inside keep their exact position.
                    let Some(k) = kind else {
                        return Err(de::Error::custom("params: `kind` must come before `params`"));
                    };
                    let p = match k {
                        Kind::BoundaryMatrix => Params::BoundaryMatrix(map.next_value()?),
                        Kind::StressPairs => Params::StressPairs(map.next_value()?),
                        Kind::GrowthCurve => Params::GrowthCurve(map.next_value()?),
                        Kind::SemanticStaleness => Params::SemanticStaleness(map.next_value()?),
                        Kind::Agentic => Params::Agentic(map.next_value()?),
                    };
                    once(&mut params, "params", p)?;
                }
                "assert" => once(&mut assertions, "assert", map.next_value()?)?,
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        let name = name.ok_or_else(|| de::Error::missing_field("name"))?;
        if name.trim().is_empty() {
            return Err(de::Error::custom("name: must not be empty"));
        }
        check_name_len("name", &name).map_err(de::Error::custom)?;
        let engine = engine.ok_or_else(|| de::Error::missing_field("engine"))?;
        let kind = kind.ok_or_else(|| de::Error::missing_field("kind"))?;
        let params = match params.or_else(|| Params::default_for(kind)) {
            Some(p) => p,
            None => {
                return Err(de::Error::custom(format!("params: kind {} needs `params` (its `tasks`)", kind.name())))
            }
        };
        let assertions = assertions.unwrap_or_default();
        validate(&params, &assertions).map_err(de::Error::custom)?;
        check_bundled_slots(&engine, &params).map_err(de::Error::custom)?;
        Ok(Scenario {
            path: PathBuf::new(),
            name,
            description,
            engine,
            seed: seed.unwrap_or(0),
            kind,
            params,
            assertions,
            corpus: None,
        })
    }
}

/// A name (`field` names it in the message) no longer than `MAX_NAME_LEN` bytes.
pub(super) fn check_name_len(field: &str, name: &str) -> Result<(), String> {
    let max = super::MAX_NAME_LEN;
    if name.len() > max {
        return Err(format!("{field}: {} bytes: a name holds at most {max} bytes", name.len()));
    }
    Ok(())
}

/// A bundled engine's slot count is known from its config: a slot it does not have is an error of the file, at
/// the field. (A GGUF engine's, and any other engine's, is checked against what the engine reports once started.)
fn check_bundled_slots(engine: &EngineSpec, params: &Params) -> Result<(), String> {
    let EngineSpec::Bundled { arch, preset, config, gguf: None, .. } = engine else { return Ok(()) };
    let slots = super::engine_config::model_config(arch, *preset, config)?.base().slots;
    params.check_slots(slots, &format!("{arch}/{preset}"))
}

impl Params {
    /// Every slot the params name exists on an engine with `slots` slots (`engine` names it in the message). The
    /// other slot of a staleness scenario is checked only where the engine has one to spare: on a single-slot
    /// engine that context is skipped as one the engine cannot hold.
    pub fn check_slots(&self, slots: usize, engine: &str) -> Result<(), String> {
        let mut named = vec![("params.slot", self.slot())];
        if let Params::SemanticStaleness(p) = self {
            let wanted = p.contexts.as_ref().is_none_or(|c| c.contains(&super::ContextName::OtherSlot));
            if wanted && slots >= 2 {
                named.push(("params.other_slot", p.other_slot));
            }
        }
        for (field, slot) in named {
            if slot >= slots {
                return Err(format!(
                    "{field}: {slot} is not a slot of {engine}, which has {slots} (slots 0..={})",
                    slots.saturating_sub(1)
                ));
            }
        }
        Ok(())
    }

    /// The slot the scenario's conversations run on.
    pub fn slot(&self) -> usize {
        match self {
            Params::BoundaryMatrix(p) => p.slot,
            Params::StressPairs(p) => p.slot,
            Params::GrowthCurve(p) => p.slot,
            Params::SemanticStaleness(p) => p.slot,
            Params::Agentic(p) => p.slot,
        }
    }
}

/// Range checks serde cannot express.
fn validate(params: &Params, a: &Assertions) -> Result<(), String> {
    if !(a.confidence > 0.0 && a.confidence < 1.0) {
        return Err(format!("assert.confidence: {} is not in (0, 1)", a.confidence));
    }
    if let Some(r) = a.max_failure_rate {
        if !(0.0..1.0).contains(&r) {
            return Err(format!("assert.max_failure_rate: {r} is not in [0, 1)"));
        }
    }
    if a.require.contains(&super::CheckName::Rate) && a.max_failure_rate.is_none() {
        return Err(format!(
            "assert.require: `{}` is judged only on a scenario with assert.max_failure_rate",
            super::CheckName::Rate
        ));
    }
    if let Some(g) = a.near_tie {
        if !(g.is_finite() && g > 0.0) {
            return Err(format!("assert.near_tie: {g} must be a positive number"));
        }
    }
    match params {
        Params::BoundaryMatrix(p) => p.validate()?,
        Params::StressPairs(p) => p.validate()?,
        Params::GrowthCurve(p) => p.validate()?,
        Params::SemanticStaleness(p) => p.validate()?,
        Params::Agentic(p) => p.validate()?,
    }
    validate_growth_assertions(params, a)
}

/// The growth assertions belong to growth curves only, and each must be a positive finite number.
fn validate_growth_assertions(params: &Params, a: &Assertions) -> Result<(), String> {
    let set = [
        ("max_warm_ratio", a.max_warm_ratio),
        ("max_warm_ratio_over_expected", a.max_warm_ratio_over_expected),
        ("min_cold_ratio", a.min_cold_ratio),
        ("min_speedup_of_ideal", a.min_speedup_of_ideal),
        ("min_reuse_fraction", a.min_reuse_fraction),
    ];
    for (name, v) in set {
        let Some(v) = v else { continue };
        if !matches!(params, Params::GrowthCurve(_)) {
            return Err(format!("assert.{name}: applies to kind growth-curve only"));
        }
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("assert.{name}: {v} must be a positive number"));
        }
        if name == "min_reuse_fraction" && v > 1.0 {
            return Err(format!("assert.{name}: {v} is not in (0, 1]"));
        }
        if name == "max_warm_ratio_over_expected" && v <= 1.0 {
            return Err(format!(
                "assert.{name}: {v} must be above 1 (a correct engine's warm turns grow as the model's cost expects: \
                 a ratio of 1, before noise)"
            ));
        }
    }
    if a.require.contains(&super::CheckName::WarmGrowth) && a.max_warm_ratio_over_expected.is_none() {
        return Err(format!(
            "assert.require: `{}` is judged only on a growth curve with assert.max_warm_ratio_over_expected",
            super::CheckName::WarmGrowth
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_over_the_expected_warm_ratio_must_be_a_number_above_one() {
        let growth = Params::GrowthCurve(GrowthParams::default());
        let bound = |v: f64| Assertions { max_warm_ratio_over_expected: Some(v), ..Assertions::default() };
        for v in [f64::NAN, f64::INFINITY, -1.0, 0.0, 0.5, 1.0] {
            let e = validate_growth_assertions(&growth, &bound(v)).expect_err("refused");
            assert!(e.starts_with("assert.max_warm_ratio_over_expected: "), "{v}: {e}");
        }
        assert!(validate_growth_assertions(&growth, &bound(1.0001)).is_ok());
        let stress = Params::StressPairs(StressParams::default());
        let e = validate_growth_assertions(&stress, &bound(1.5)).expect_err("growth curves only");
        assert!(e.contains("applies to kind growth-curve only"), "{e}");
    }

    fn engine(json: &str) -> Result<EngineSpec, String> {
        serde_json::from_str::<EngineSpec>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn a_gguf_engine_is_llama_with_serving_options_only() {
        let spec = engine(r#"{"arch": "llama", "gguf": "smollm2", "config": {"slots": 2}, "fault": "bulk-record"}"#)
            .expect("a GGUF engine");
        assert_eq!(spec.label(), r#"llama/gguf smollm2/config {"slots":2}/fault bulk-record"#);
        // written back without the preset and seed a GGUF engine does not have
        let back = serde_json::to_value(&spec).expect("json");
        assert!(back.get("preset").is_none() && back.get("seed").is_none(), "{back}");
        assert_eq!(engine(&back.to_string()), Ok(spec));
        for (json, want) in [
            (r#"{"arch": "inkling", "gguf": "smollm2"}"#, "engine.gguf: a GGUF model is served by arch llama"),
            (r#"{"arch": "llama", "gguf": "smollm2", "preset": "tiny"}"#, "with `gguf` the weights are the file's"),
            (r#"{"arch": "llama", "gguf": "smollm2", "seed": 3}"#, "with `gguf` the weights are the file's"),
            (r#"{"arch": "llama", "gguf": "smollm2", "config": {"hidden": 8}}"#, "engine.config.hidden: fixed by"),
            (r#"{"arch": "llama", "gguf": ""}"#, "engine.gguf: must name"),
            (r#"{"command": ["x"], "gguf": "smollm2"}"#, "engine.gguf: applies to bundled engines"),
            (r#"{"arch": "llama", "gguf": "smollm2", "fault": "no-taint"}"#, "engine.fault"),
        ] {
            let e = engine(json).expect_err(json);
            assert!(e.contains(want), "{json}: {e}");
        }
        // without gguf, llama is a random-init preset like every bundled arch
        assert!(engine(r#"{"arch": "llama", "preset": "tiny"}"#).is_ok());
    }
}
