//! The stdio driver: any command that speaks the serve protocol (docs/protocol.md), through the engines crate's
//! client. The warm instance is one long-lived process; every cold instance is a fresh process. A process that
//! dies or hangs past the per-request timeout becomes a `Died`/`Timeout` error carrying the tail of its stderr.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{EngineInfo, Request};
use kvproof_engines::serve::{self, ClientError, StdioEngine};

use super::{Caps, Driver, DriverError, Generation, Launcher};
use crate::scenario::DeclaredRule;

/// Starts engine processes from one command line.
#[derive(Debug)]
pub struct StdioLauncher {
    command: Vec<String>,
    timeout: Duration,
    info: EngineInfo,
    caps: Caps,
    dump_dir: PathBuf,
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

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// `name` in the folder of `exe`, or in its parent (test binaries live in target/<profile>/deps).
pub fn sibling_binary(exe: &Path, name: &str) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)].into_iter().find(|p| p.is_file())
}

fn start_error(command: &[String], e: impl std::fmt::Display) -> DriverError {
    DriverError::Start { engine: format!("`{}`", command.join(" ")), detail: e.to_string() }
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
    }
}

impl StdioLauncher {
    /// Start the command once to read its CAPS (the process is shut down again).
    pub fn start(command: &[String], timeout_ms: u64) -> Result<Self, DriverError> {
        let command = resolve_program(command);
        let timeout = Duration::from_millis(timeout_ms);
        let probe = StdioEngine::spawn(&command, &[], timeout).map_err(|e| start_error(&command, e))?;
        let engine_caps = probe.caps().clone();
        let _ = probe.shutdown();
        let info = info_from_caps(&engine_caps);
        if !engine_caps.ids() {
            return Err(start_error(&command, "CAPS lacks ids=1: the harness sends token ids, not text"));
        }
        let reuse_rule = match engine_caps.get("reuse_rule") {
            None | Some("-") => None,
            Some(v) => {
                Some(v.parse::<DeclaredRule>().map_err(|e| start_error(&command, format!("CAPS reuse_rule: {e}")))?)
            }
        };
        let caps = Caps {
            token_ids: true,
            reuse_count: engine_caps.reuse(),
            gaps: true,
            dumps: engine_caps.dump(),
            audio_frame_bytes: (info.audio && info.audio_frame_bytes > 0).then_some(info.audio_frame_bytes),
            // a CANCEL frame races the engine: no deterministic mid-prefill cancel; DONE carries no state bytes
            cancel_at_poll: false,
            state_bytes: false,
            // an engine that shares prefixes across slots says so (the bundled engines' CAPS do not yet)
            kv_share: engine_caps.get("kv_share") == Some("1"),
            reuse_rule,
        };
        let dump_dir = std::env::temp_dir().join(format!("kvproof-dumps-{}", std::process::id()));
        Ok(StdioLauncher { command, timeout, info, caps, dump_dir })
    }
}

impl Launcher for StdioLauncher {
    fn launch(&self) -> Result<Box<dyn Driver>, DriverError> {
        let engine = StdioEngine::spawn(&self.command, &[], self.timeout).map_err(|e| match e {
            // A command that started before and fails now died on start-up: the trial's error, not the run's.
            ClientError::Spawn { .. } | ClientError::EmptyCommand => start_error(&self.command, e),
            other => client_error(other, self.timeout),
        })?;
        Ok(Box::new(StdioDriver {
            engine,
            info: self.info.clone(),
            caps: self.caps.clone(),
            timeout: self.timeout,
            dump_dir: self.dump_dir.clone(),
        }))
    }
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
    fn label(&self) -> String {
        format!("`{}` (stdio)", self.command.join(" "))
    }
}

/// One engine process.
pub struct StdioDriver {
    engine: StdioEngine,
    info: EngineInfo,
    caps: Caps,
    timeout: Duration,
    dump_dir: PathBuf,
}

fn client_error(e: ClientError, timeout: Duration) -> DriverError {
    match e {
        ClientError::Engine { frame } => {
            DriverError::Refused { code: frame.code.name().to_string(), detail: frame.detail }
        }
        ClientError::Timeout { stderr, waiting_for, .. } => {
            let _ = waiting_for;
            DriverError::Timeout { after_ms: timeout.as_millis() as u64, stderr_tail: stderr }
        }
        ClientError::Exited { status, waiting_for, stderr, .. } => DriverError::Died {
            detail: format!("exited ({status}) while waiting for {waiting_for}"),
            stderr_tail: stderr,
        },
        ClientError::Protocol { waiting_for, message, stderr, .. } => DriverError::Died {
            detail: format!("protocol error while waiting for {waiting_for}: {message}"),
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

impl Driver for StdioDriver {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn generate(&mut self, req: &Request) -> Result<Generation, DriverError> {
        let reply = self.engine.submit(req).map_err(|e| client_error(e, self.timeout))?;
        if !reply.ids_complete {
            return Err(DriverError::Unsupported("the engine's DATA frames carry no tid=: token ids unknown".into()));
        }
        let as_reply = reply.to_reply().map_err(|e| client_error(e, self.timeout))?;
        let gaps = (!reply.gaps.iter().all(|g| g.is_nan())).then(|| reply.gaps.clone());
        Ok(Generation {
            tokens: reply.tokens.clone(),
            gaps,
            reused: reply.reused(),
            prompt_tokens: as_reply.prompt_tokens,
            prefill: as_reply.timings.prefill,
            decode: as_reply.timings.decode,
            wall: reply.wall,
            stop: as_reply.stop,
        })
    }

    fn dump(&mut self, slot: usize) -> Result<StateDump, DriverError> {
        if !self.caps.dumps {
            return Err(DriverError::Unsupported("the engine's CAPS do not offer DUMP".into()));
        }
        std::fs::create_dir_all(&self.dump_dir)
            .map_err(|e| DriverError::Unsupported(format!("{}: {e}", self.dump_dir.display())))?;
        let n = DUMPS.fetch_add(1, Ordering::Relaxed);
        let path = self.dump_dir.join(format!("dump-{}-{n}.json", self.engine.pid()));
        let path_str = path.to_string_lossy().into_owned();
        self.engine.dump(slot, &path_str).map_err(|e| client_error(e, self.timeout))?;
        let dump = kvproof_engines::dump::read_file(&path);
        let _ = std::fs::remove_file(&path);
        dump.map_err(|e| DriverError::Refused { code: "DUMP_FAILED".into(), detail: e.to_string() })
    }
}

impl Drop for StdioLauncher {
    fn drop(&mut self) {
        // Dump files are removed as soon as they are read; only the (then empty) folder is left.
        let _ = std::fs::remove_dir(&self.dump_dir);
    }
}
