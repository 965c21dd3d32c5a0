//! The stdio driver: any command that speaks the serve protocol (docs/protocol.md), through the engines crate's
//! client. The warm instance is one long-lived process; every cold instance is a fresh process, or — for an engine
//! too costly to restart (`cold: reset`) — one long-lived second process sent RESET before each cold run. A
//! process that dies or hangs past the per-request timeout becomes a `Died`/`Timeout` error carrying the tail of
//! its stderr.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use kvproof_engines::config::Preset;
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{EngineInfo, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::serve::{self, ClientError, ClientReply, StdioEngine, SubmitExtras};

use super::{Caps, ChatRequest, Driver, DriverError, Generation, Launcher, Profile};
use crate::scenario::engine_config::{self, ConfigOverrides};
use crate::scenario::{Cold, DeclaredRule};

/// The per-request timeout of a bundled engine served over stdio (a tiny model answers in milliseconds).
pub const BUNDLED_TIMEOUT_MS: u64 = 60_000;

/// Starts engine processes from one command line.
#[derive(Debug)]
pub struct StdioLauncher {
    command: Vec<String>,
    timeout: Duration,
    profile: Profile,
    /// The engine's own CAPS, for what the driver needs beyond `Caps` (echo).
    echo: bool,
    dump_dir: PathBuf,
    /// With `cold: reset`: the one process every cold run uses, reset before each.
    cold: Option<Arc<ColdProcess>>,
}

/// `kvproof-engine` is found next to the running executable when it is not on PATH: cargo builds both binaries
/// into the same folder, so scenarios can name it without an install step.
pub fn resolve_program(command: &[String]) -> Vec<String> {
    let mut command = command.to_vec();
    if let Some(program) = command.first_mut() {
        if program == "kvproof-engine" && !on_path(program) {
            if let Some(sibling) = std::env::current_exe().ok().and_then(|exe| sibling_binary(&exe, "kvproof-engine")) {
                *program = sibling.to_string_lossy().into_owned();
            }
        }
    }
    command
}

/// The command line that serves a bundled engine over stdio: the same arch, preset, seed, fault and config overrides
/// an in-process engine gets (so the same weights).
pub fn bundled_command(
    arch: &str,
    preset: Preset,
    seed: u64,
    fault: Option<Fault>,
    config: &ConfigOverrides,
) -> Vec<String> {
    let seed = seed.to_string();
    engine_command(&["--arch", arch, "--preset", preset.name(), "--seed", &seed], fault, config)
}

/// The `kvproof-engine` command serving the GGUF model at `path` (arch llama) with `fault` and `config`.
pub fn gguf_command(path: &Path, fault: Option<Fault>, config: &ConfigOverrides) -> Vec<String> {
    let path = path.display().to_string();
    engine_command(&["--arch", "llama", "--gguf", &path], fault, config)
}

/// `kvproof-engine` with the arguments that pick its model, then the fault and config overrides.
fn engine_command(model: &[&str], fault: Option<Fault>, config: &ConfigOverrides) -> Vec<String> {
    let mut command: Vec<String> =
        std::iter::once("kvproof-engine").chain(model.iter().copied()).map(String::from).collect();
    if let Some(f) = fault {
        command.extend(["--fault".to_string(), f.name().to_string()]);
    }
    if !config.is_empty() {
        command.extend(["--config".to_string(), engine_config::describe(config)]);
    }
    command
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// `name` in the folder of `exe`, or in its parent (test binaries live in target/<profile>/deps).
pub fn sibling_binary(exe: &Path, name: &str) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)].into_iter().find(|p| p.is_file())
}

fn start_error(command: &[String], e: impl std::fmt::Display) -> DriverError {
    let mut detail = e.to_string();
    if command.first().is_some_and(|p| p == "kvproof-engine") {
        detail.push_str(
            " (kvproof-engine is looked for on PATH and next to kvproof: `cargo build --release` builds both)",
        );
    }
    DriverError::Start { engine: format!("`{}`", command.join(" ")), detail }
}

/// The engine description and capabilities the harness takes from a CAPS line, exactly as a run over stdio does
/// (`kvproof conformance` judges an engine by them).
pub fn from_caps(caps: &serve::Caps) -> Result<(EngineInfo, Caps), String> {
    let info = info_from_caps(caps);
    let driver_caps = caps_from(caps, &info)?;
    Ok((info, driver_caps))
}

/// The engine description CAPS gives (fields an older engine omits get conservative defaults).
fn info_from_caps(caps: &serve::Caps) -> EngineInfo {
    EngineInfo {
        arch: caps.arch().unwrap_or("unknown").to_string(),
        preset: caps.get("preset").filter(|p| *p != "-").map(str::to_string),
        slots: caps.slots().unwrap_or(1),
        max_ctx: caps.max_ctx().unwrap_or(usize::MAX),
        vocab: caps.vocab().unwrap_or(kvproof_engines::tokenizer::VOCAB),
        audio: caps.audio(),
        audio_frame_bytes: caps.number("audio_frame").or_else(|| caps.number("audio_frame_bytes")).unwrap_or(0),
        window: caps.window(),
        prompt_rows: caps.number("prompt_rows"),
        initial_capacity: caps.number("initial_capacity").unwrap_or(usize::MAX),
        fault: caps.fault().map(str::to_string),
        model_hash: caps.get("model").unwrap_or("").to_string(),
        // CAPS carries no cost model: a growth curve of a stdio engine is judged against the token ideal
        cost: None,
    }
}

/// What the harness can do with an engine, from its CAPS.
fn caps_from(engine_caps: &serve::Caps, info: &EngineInfo) -> Result<Caps, String> {
    let reuse_rule = match engine_caps.reuse_rule() {
        None => None,
        Some(v) => Some(v.parse::<DeclaredRule>().map_err(|e| format!("CAPS reuse_rule: {e}"))?),
    };
    Ok(Caps {
        token_ids: true,
        reuse_count: engine_caps.reuse(),
        gaps: true,
        dumps: engine_caps.dump(),
        audio_frame_bytes: (info.audio && info.audio_frame_bytes > 0).then_some(info.audio_frame_bytes),
        // a CANCEL frame races the engine: only an engine that cancels itself at a poll is deterministic
        cancel_at_poll: engine_caps.cancel_at(),
        // DONE carries no state bytes
        state_bytes: false,
        kv_share: engine_caps.get("kv_share") == Some("1"),
        reuse_rule,
        chat: engine_caps.chat(),
        keeps_state_on: engine_caps.keeps_state_on(),
    })
}

impl StdioLauncher {
    /// Start the command once to read its CAPS (the process is shut down again). With `cold: reset`, the cold
    /// process starts on the first cold run.
    pub fn start(command: &[String], timeout_ms: u64, cold: Cold) -> Result<Self, DriverError> {
        let command = resolve_program(command);
        let timeout = Duration::from_millis(timeout_ms);
        let probe = StdioEngine::spawn(&command, &[], timeout).map_err(|e| start_error(&command, e))?;
        let engine_caps = probe.caps().clone();
        let _ = probe.shutdown();
        let info = info_from_caps(&engine_caps);
        if !engine_caps.ids() {
            return Err(start_error(&command, "CAPS lacks ids=1: the harness sends token ids, not text"));
        }
        if cold == Cold::Reset && !engine_caps.reset() {
            return Err(start_error(&command, "cold \"reset\" needs RESET, and the engine's CAPS lack reset=1"));
        }
        let caps = caps_from(&engine_caps, &info).map_err(|e| start_error(&command, e))?;
        // a folder per launcher: one launcher dropped (its scenario done) removes its own folder, never the one
        // a launcher running beside it (`--jobs`) has an engine writing into
        let launcher = LAUNCHERS.fetch_add(1, Ordering::Relaxed);
        let dump_dir = std::env::temp_dir().join(format!("kvproof-dumps-{}-{launcher}", std::process::id()));
        let label = match cold {
            Cold::Process => format!("`{}` (stdio)", command.join(" ")),
            Cold::Reset => format!("`{}` (stdio, {})", command.join(" "), Cold::RESET_NOTE),
        };
        let cold = (cold == Cold::Reset).then(|| Arc::new(ColdProcess::default()));
        Ok(StdioLauncher {
            command,
            timeout,
            profile: Profile { label, info, caps },
            echo: engine_caps.echo(),
            dump_dir,
            cold,
        })
    }

    /// The scenario's rule for the engine, over whatever its CAPS declare.
    pub fn with_reuse_rule(mut self, rule: Option<DeclaredRule>) -> Self {
        if rule.is_some() {
            self.profile.caps.reuse_rule = rule;
        }
        self
    }

    /// Name the engine as the scenario does (a bundled engine served over stdio); the label keeps saying how it
    /// is reached and how cold instances start.
    pub fn with_label(mut self, label: String) -> Self {
        let mut shown = self.command.clone();
        if let Some(program) = shown.first_mut() {
            if let Some(name) = Path::new(program.as_str()).file_name() {
                *program = name.to_string_lossy().into_owned();
            }
        }
        self.profile.label = format!("{label}: {}", shown.join(" "));
        self
    }

    fn driver(&self, engine: StdioEngine) -> StdioDriver {
        StdioDriver {
            engine,
            profile: self.profile.clone(),
            echo: self.echo,
            timeout: self.timeout,
            dump_dir: self.dump_dir.clone(),
        }
    }

    fn spawn(&self) -> Result<StdioEngine, DriverError> {
        StdioEngine::spawn(&self.command, &[], self.timeout).map_err(|e| match e {
            // A command that started before and fails now died on start-up: the trial's error, not the run's.
            ClientError::Spawn { .. } | ClientError::EmptyCommand => start_error(&self.command, e),
            other => client_error(other, self.timeout),
        })
    }
}

impl Launcher for StdioLauncher {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        Ok(Box::new(self.driver(self.spawn()?)))
    }

    fn launch_cold(&self) -> Result<Box<dyn Driver>, DriverError> {
        let Some(pool) = &self.cold else {
            return self.launch();
        };
        // One cold run at a time holds the process, from its first request to its last dump.
        let held = pool.take();
        let mut engine = match held {
            Some(e) if e.is_alive() => e,
            _ => match self.spawn() {
                Ok(e) => e,
                Err(e) => {
                    pool.give_back(None);
                    return Err(e);
                }
            },
        };
        if let Err(e) = engine.reset() {
            // A failed RESET leaves a state nobody knows: this process is not used again.
            drop(engine);
            pool.give_back(None);
            return Err(client_error(e, self.timeout));
        }
        Ok(Box::new(ResetCold { driver: Some(self.driver(engine)), pool: Arc::clone(pool) }))
    }

    fn profile(&self) -> &Profile {
        &self.profile
    }
}

/// The long-lived cold process of a `cold: reset` engine, lent to one cold run at a time.
#[derive(Debug, Default)]
struct ColdProcess {
    state: Mutex<ColdState>,
    returned: Condvar,
}

#[derive(Debug, Default)]
struct ColdState {
    lent: bool,
    process: Option<StdioEngine>,
}

impl ColdProcess {
    /// Wait until no cold run holds the process, then take it (`None`: none started yet, or the last one died).
    fn take(&self) -> Option<StdioEngine> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.lent {
            state = self.returned.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.lent = true;
        state.process.take()
    }

    fn give_back(&self, process: Option<StdioEngine>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.process = process.filter(StdioEngine::is_alive);
        state.lent = false;
        self.returned.notify_one();
    }
}

/// A cold instance that is the reset cold process, returned to the launcher when the run drops it.
struct ResetCold {
    driver: Option<StdioDriver>,
    pool: Arc<ColdProcess>,
}

impl ResetCold {
    fn inner(&mut self) -> &mut StdioDriver {
        match self.driver.as_mut() {
            Some(d) => d,
            None => unreachable!("the driver is only taken on drop"),
        }
    }
}

impl Drop for ResetCold {
    fn drop(&mut self) {
        self.pool.give_back(self.driver.take().map(|d| d.engine));
    }
}

impl Driver for ResetCold {
    fn profile(&self) -> &Profile {
        match &self.driver {
            Some(d) => &d.profile,
            None => unreachable!("the driver is only taken on drop"),
        }
    }
    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        self.inner().generate(req)
    }
    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError> {
        self.inner().dump(slot)
    }
    fn generate_cancel_at(&mut self, req: &Request, poll: usize) -> Result<Generation, DriverError> {
        self.inner().generate_cancel_at(req, poll)
    }
    fn generate_chat(&mut self, req: &ChatRequest) -> Result<Generation, DriverError> {
        self.inner().generate_chat(req)
    }
}

/// One engine process.
pub struct StdioDriver {
    engine: StdioEngine,
    profile: Profile,
    echo: bool,
    timeout: Duration,
    dump_dir: PathBuf,
}

fn client_error(e: ClientError, timeout: Duration) -> DriverError {
    match e {
        ClientError::Engine { frame } => {
            DriverError::Refused { code: frame.code.name().to_string(), detail: frame.detail }
        }
        ClientError::Timeout { stderr, .. } => {
            DriverError::Timeout { after_ms: timeout.as_millis() as u64, stderr_tail: stderr }
        }
        ClientError::Exited { status, waiting_for, stderr, .. } => DriverError::Died {
            detail: format!("exited ({status}) while waiting for {waiting_for}"),
            stderr_tail: stderr,
        },
        ClientError::Protocol { waiting_for, message, stderr, .. } => DriverError::Died {
            detail: format!("killed for breaking the protocol while waiting for {waiting_for}: {message}"),
            stderr_tail: stderr,
        },
        ClientError::Dead { reason, .. } => DriverError::Died { detail: reason, stderr_tail: String::new() },
        ClientError::Request(message) => DriverError::Refused { code: "CLIENT".into(), detail: message },
        other @ (ClientError::Spawn { .. } | ClientError::EmptyCommand) => {
            DriverError::Died { detail: other.to_string(), stderr_tail: String::new() }
        }
    }
}

static DUMPS: AtomicU64 = AtomicU64::new(0);
/// Launchers made so far in this process (each names its own dump folder).
static LAUNCHERS: AtomicUsize = AtomicUsize::new(0);

impl StdioDriver {
    /// A finished request as the harness sees it.
    fn generation(&self, reply: ClientReply) -> Result<Generation, DriverError> {
        if !reply.ids_complete {
            return Err(DriverError::Unsupported("the engine's DATA frames carry no tid=: token ids unknown".into()));
        }
        let as_reply = reply.to_reply().map_err(|e| client_error(e, self.timeout))?;
        let gaps = (!reply.gaps.iter().all(|g| g.is_nan())).then(|| reply.gaps.clone());
        Ok(Generation {
            tokens: reply.tokens,
            gaps,
            reused: reply.done.reused,
            prompt_tokens: as_reply.prompt_tokens,
            prefill: as_reply.timings.prefill,
            decode: as_reply.timings.decode,
            wall: reply.wall,
            stop: as_reply.stop,
            prompt_ids: reply.prompt_ids,
            pieces: Some(reply.pieces),
        })
    }

    fn submit(&mut self, req: &Request, extras: SubmitExtras) -> Result<Generation, DriverError> {
        let reply = self.engine.submit_with(req, extras, &mut NoObserver).map_err(|e| client_error(e, self.timeout))?;
        self.generation(reply)
    }
}

impl Driver for StdioDriver {
    fn profile(&self) -> &Profile {
        &self.profile
    }

    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        self.submit(req, SubmitExtras::default())
    }

    fn generate_cancel_at(&mut self, req: &Request, poll: usize) -> Result<Generation, DriverError> {
        if !self.profile.caps.cancel_at_poll {
            return Err(DriverError::Unsupported("the engine's CAPS do not offer cancel_at=N".into()));
        }
        self.submit(req, SubmitExtras { cancel_at: Some(poll), ..SubmitExtras::default() })
    }

    fn generate_chat(&mut self, req: &ChatRequest) -> Result<Generation, DriverError> {
        if !self.profile.caps.chat {
            return Err(DriverError::Unsupported("the engine's CAPS do not offer chat=1".into()));
        }
        let reply = self
            .engine
            .submit_chat(req.id, req.slot, &req.messages, req.max_tokens, req.ignore_eos, self.echo)
            .map_err(|e| client_error(e, self.timeout))?;
        self.generation(reply)
    }

    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError> {
        if !self.profile.caps.dumps {
            return Err(DriverError::Unsupported("the engine's CAPS do not offer DUMP".into()));
        }
        std::fs::create_dir_all(&self.dump_dir)
            .map_err(|e| DriverError::Unsupported(format!("{}: {e}", self.dump_dir.display())))?;
        let n = DUMPS.fetch_add(1, Ordering::Relaxed);
        let path = self.dump_dir.join(format!("dump-{}-{n}.safetensors", self.engine.pid()));
        let path_str = path.to_string_lossy().into_owned();
        self.engine.dump(slot, &path_str).map_err(|e| client_error(e, self.timeout))?;
        let dump = kvproof_engines::dump::read_file(&path);
        let _ = std::fs::remove_file(&path);
        // The engine said it wrote the dump: a file that does not read is its fault, not a refusal.
        dump.map_err(|e| DriverError::Malformed { what: format!("DUMP of slot {slot}"), detail: e.to_string() })
    }
}

impl Drop for StdioLauncher {
    fn drop(&mut self) {
        // Dump files are removed as soon as they are read; only the (then empty) folder is left.
        let _ = std::fs::remove_dir(&self.dump_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundled_engine_is_served_with_its_whole_spec() {
        let mut config = ConfigOverrides::new();
        config.insert("kv_share".into(), true.into());
        let c = bundled_command("glm", Preset::Tiny, 3, Some(Fault::StaleSlot), &config);
        let want = ["kvproof-engine", "--arch", "glm", "--preset", "tiny", "--seed", "3", "--fault", "stale-slot"];
        assert_eq!(c[..9], want.map(String::from));
        assert_eq!(c[9..], ["--config".to_string(), r#"{"kv_share":true}"#.to_string()]);
        assert_eq!(bundled_command("kimi", Preset::Small, 0, None, &ConfigOverrides::new()).len(), 7);
    }

    #[test]
    fn caps_say_what_the_driver_can_do() {
        let mut c = serve::Caps::default();
        for (k, v) in [("ids", "1"), ("reuse", "1"), ("reuse_rule", "grid:16"), ("cancel_at", "1"), ("chat", "1")] {
            c.set(k, v);
        }
        c.set("keeps_state_on", "CONTEXT_EXCEEDED,CANCELLED");
        let caps = caps_from(&c, &info_from_caps(&c)).expect("caps");
        assert_eq!(caps.reuse_rule, Some(DeclaredRule::Grid(16)));
        assert!(caps.cancel_at_poll && caps.chat && caps.reuse_count && !caps.dumps && !caps.kv_share);
        assert_eq!(caps.keeps_state_on, ["CONTEXT_EXCEEDED", "CANCELLED"]);
        c.set("reuse_rule", "prefix");
        assert!(caps_from(&c, &info_from_caps(&c)).expect_err("bad rule").contains("reuse_rule"));
        c.set("reuse_rule", "-");
        assert_eq!(caps_from(&c, &info_from_caps(&c)).expect("no rule").reuse_rule, None);
    }
}
