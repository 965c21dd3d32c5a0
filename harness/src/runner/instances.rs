//! The instance layer every kind drives: which instance runs a request (the warm one living through a plan, or a
//! fresh cold one), the one request-id scheme, launching and replacing instances, and a turn row for every
//! request any instance runs.

use std::time::Duration;

use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Request, Sampling};

use crate::check::turn::Observed;
use kvproof_engines::chat::TextMessage;

use crate::driver::{ChatRequest, Driver, DriverError, Generation, Launcher};
use crate::record::{Sink, TurnRow};

/// Which instance ran a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Role {
    /// The instance that lives through the plan and reuses its state.
    Warm,
    /// A fresh instance given the turn's prompt alone.
    Cold,
    /// A second fresh instance: cold vs control tells noise from a reuse bug.
    Control,
    /// A fresh instance given a hypothetical prompt (semantic staleness: what a stale context would produce).
    Probe,
}

impl Role {
    pub fn name(self) -> &'static str {
        self.into()
    }

    fn code(self) -> u64 {
        match self {
            Role::Warm => 1,
            Role::Cold => 2,
            Role::Control => 3,
            Role::Probe => 4,
        }
    }
}

/// The id of a request, unique per plan, step, instance and repeat, and readable in a dump's writers:
/// plan 5, step 1, cold, repeat 0 is 5_001_200.
pub fn request_id(plan_index: usize, step_index: usize, role: Role, repeat: usize) -> u64 {
    plan_index as u64 * 1_000_000 + step_index as u64 * 1_000 + role.code() * 100 + repeat as u64
}

/// A turn's request before an instance and an id are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRequest {
    pub slot: usize,
    /// The prompt's ids (empty for a conversation sent as text).
    pub prompt: Vec<u32>,
    pub audio: Vec<Vec<u8>>,
    /// The conversation as text, for the engine to render with its own template (`Driver::generate_chat`).
    pub chat: Option<Vec<TextMessage>>,
    pub max_tokens: usize,
    /// Generate past eos (fixed-length replies for growth curves and staleness).
    pub ignore_eos: bool,
    /// Cancel at this prefill poll: a deterministic mid-prefill failure.
    pub cancel_at_poll: Option<usize>,
}

impl TurnRequest {
    /// The request as sent: greedy, because identity of warm and cold must not depend on a sampler's stream.
    pub fn with_id(&self, id: u64) -> Request {
        Request {
            id,
            slot: self.slot,
            prompt: self.prompt.clone(),
            audio: self.audio.clone(),
            max_tokens: self.max_tokens,
            sampling: Sampling::default(),
            logprobs: 0,
            ignore_eos: self.ignore_eos,
        }
    }
}

/// One request as an instance ran it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub role: Role,
    /// The request as sent; for a conversation sent as text, its prompt holds the ids the engine reported it fed
    /// (empty when it reported none: `prompt_known` is false).
    pub request: Request,
    pub prompt_known: bool,
    pub result: Result<Generation, DriverError>,
    /// The slot's state after the request, when a dump was asked for and the instance survived.
    pub dump: Option<Result<StateDump, DriverError>>,
    /// `Driver::state_bytes` after the request, when the driver reports them.
    pub bytes: Option<usize>,
}

impl Sent {
    /// Whether the instance is gone (died or hung, while running or dumping): it must be replaced.
    pub fn instance_lost(&self) -> bool {
        matches!(&self.result, Err(e) if e.is_fatal()) || matches!(&self.dump, Some(Err(e)) if e.is_fatal())
    }

    /// Why this request could not run or be checked at all, if so (a refusal is an outcome the checks compare,
    /// not this): the instance died, hung or could not start, or its dump could not be read.
    pub fn fatal(&self) -> Option<(String, Option<String>)> {
        let who = self.role.name();
        if let Err(e) = &self.result {
            if e.is_fatal() || matches!(e, DriverError::Start { .. } | DriverError::Unsupported(_)) {
                return Some((format!("{who}: {e}"), e.stderr_tail().map(str::to_string)));
            }
        }
        if let Some(Err(e)) = &self.dump {
            if e.is_fatal() || matches!(e, DriverError::Malformed { .. }) {
                return Some((format!("{who} (dump): {e}"), e.stderr_tail().map(str::to_string)));
            }
        }
        None
    }

    /// The request's outcome as the checks see it.
    pub fn observed(&self) -> Observed<'_> {
        Observed { result: &self.result, dump: self.dump.as_ref(), bytes: self.bytes }
    }

    pub fn wall(&self) -> Option<Duration> {
        self.result.as_ref().ok().map(|g| g.wall)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The instances of one plan: its warm instance and the fresh ones its cold runs start.
pub struct Instances<'a> {
    launcher: &'a dyn Launcher,
    sink: &'a dyn Sink,
    scenario: &'a str,
    plan: &'a str,
    plan_index: usize,
    warm: Option<Box<dyn Driver>>,
}

impl<'a> Instances<'a> {
    pub fn new(
        launcher: &'a dyn Launcher,
        sink: &'a dyn Sink,
        scenario: &'a str,
        plan: &'a str,
        plan_index: usize,
    ) -> Self {
        Instances { launcher, sink, scenario, plan, plan_index, warm: None }
    }

    pub fn launcher(&self) -> &'a dyn Launcher {
        self.launcher
    }

    /// Start a new warm instance (replacing the current one, whose state is then gone).
    pub fn launch_warm(&mut self) -> Result<(), DriverError> {
        self.warm = None;
        self.warm = Some(self.launcher.launch()?);
        Ok(())
    }

    /// Run `turn` as step `step_index` on the instance `role` names: the warm one (launched first if there is
    /// none) or a fresh one. `dump`: take the slot's state afterwards. `row_label` names the turn in turns.csv.
    pub fn send(
        &mut self,
        role: Role,
        step_index: usize,
        repeat: usize,
        row_label: &str,
        turn: &TurnRequest,
        dump: bool,
    ) -> Sent {
        let request = turn.with_id(request_id(self.plan_index, step_index, role, repeat));
        let mut fresh: Box<dyn Driver>;
        let driver: &mut dyn Driver = match role {
            Role::Warm => {
                if self.warm.is_none() {
                    if let Err(e) = self.launch_warm() {
                        return self.refused_to_start(request, row_label, role, e);
                    }
                }
                match self.warm.as_deref_mut() {
                    Some(w) => w,
                    None => unreachable!("launched above"),
                }
            }
            _ => match self.launcher.launch_cold() {
                Ok(d) => {
                    fresh = d;
                    fresh.as_mut()
                }
                Err(e) => return self.refused_to_start(request, row_label, role, e),
            },
        };
        let mut request = request;
        let mut prompt_known = true;
        let result = match (&turn.chat, turn.cancel_at_poll) {
            (Some(messages), _) => {
                let chat = ChatRequest {
                    id: request.id,
                    slot: request.slot,
                    messages: messages.clone(),
                    max_tokens: request.max_tokens,
                    ignore_eos: request.ignore_eos,
                };
                let result = driver.generate_chat(&chat);
                match result.as_ref().ok().and_then(|g| g.prompt_ids.clone()) {
                    Some(ids) => request.prompt = ids,
                    None => prompt_known = false,
                }
                result
            }
            (None, Some(poll)) => driver.generate_cancel_at(&request, poll),
            (None, None) => driver.generate(&request),
        };
        let alive = !matches!(&result, Err(e) if e.is_fatal());
        let dump = (dump && alive).then(|| driver.dump(request.slot));
        let bytes = if alive { driver.state_bytes() } else { None };
        self.row(row_label, role, &request, &result);
        let sent = Sent { role, request, prompt_known, result, dump, bytes };
        if role == Role::Warm && sent.instance_lost() {
            self.warm = None;
        }
        sent
    }

    fn refused_to_start(&self, request: Request, row_label: &str, role: Role, e: DriverError) -> Sent {
        let result = Err(e);
        self.row(row_label, role, &request, &result);
        Sent { role, prompt_known: !request.prompt.is_empty(), request, result, dump: None, bytes: None }
    }

    fn row(&self, label: &str, role: Role, req: &Request, res: &Result<Generation, DriverError>) {
        // a text turn's prompt ids may be unknown (req.prompt empty): the engine's own count then
        let prompt = match res {
            Ok(g) if req.prompt.is_empty() => g.prompt_tokens,
            _ => req.prompt.len(),
        };
        let (reused, emitted, prefill_ms, decode_ms, wall_ms, outcome) = match res {
            Ok(g) => (g.reused, g.tokens.len(), ms(g.prefill), ms(g.decode), ms(g.wall), "ok".to_string()),
            Err(e) => (None, 0, 0.0, 0.0, 0.0, e.code()),
        };
        self.sink.turn(&TurnRow {
            scenario: self.scenario.to_string(),
            plan: self.plan.to_string(),
            step: label.to_string(),
            instance: role.name().into(),
            prompt_tokens: prompt,
            reused,
            prefilled: reused.map(|r| prompt.saturating_sub(r)),
            emitted,
            prefill_ms,
            decode_ms,
            wall_ms,
            outcome,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_the_harness_cannot_read_makes_the_trial_an_error() {
        let dir = std::env::temp_dir().join(format!("kvproof-unreadable-dump-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let path = dir.join("dump.safetensors");
        std::fs::write(&path, b"\x10\0\0\0\0\0\0\0{}").expect("write");
        let unreadable = kvproof_engines::dump::read_file(&path).expect_err("not a dump");
        let sent = Sent {
            role: Role::Warm,
            request: Request::default(),
            prompt_known: true,
            result: Err(DriverError::Refused { code: "X".into(), detail: String::new() }),
            dump: Some(Err(DriverError::Malformed { what: "DUMP of slot 0".into(), detail: unreadable.to_string() })),
            bytes: None,
        };
        let (why, _) = sent.fatal().expect("an error trial");
        assert!(why.starts_with("warm (dump)") && why.contains("dump.safetensors"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn request_ids_are_unique_and_readable() {
        assert_eq!(request_id(5, 1, Role::Cold, 0), 5_001_200);
        assert_eq!(request_id(0, 3, Role::Warm, 2), 3_102);
        let mut seen = std::collections::BTreeSet::new();
        for plan in 0..3 {
            for step in 0..300 {
                for role in [Role::Warm, Role::Cold, Role::Control, Role::Probe] {
                    for repeat in 0..99 {
                        assert!(seen.insert(request_id(plan, step, role, repeat)));
                    }
                }
            }
        }
    }
}
