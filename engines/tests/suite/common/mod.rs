//! Helpers every engines test file shares: opening an engine, building requests, observers, and the one state
//! comparison (`diff`, through `kvproof_engines::state_diff`).

use kvproof_engines::bundled::{self, ModelConfig};
use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::config::Preset;
use kvproof_engines::dump::StateDump;
use kvproof_engines::engine::{Engine, Flow, NoObserver, Observer, Reply, Request, TokenEvent};
use kvproof_engines::fault::Fault;
use kvproof_engines::fixture;
use kvproof_engines::state_diff::{self, StateDiff};

/// `arch`'s tiny config with `overrides` (a JSON object, e.g. `{"kv_share": true}`).
pub fn config(arch: &str, overrides: &str) -> ModelConfig {
    let o: serde_json::Map<String, serde_json::Value> = serde_json::from_str(overrides).expect("overrides JSON");
    ModelConfig::with_overrides(arch, Preset::Tiny, &o).unwrap_or_else(|e| panic!("{arch} {overrides}: {e}"))
}

/// An engine of `config` over its seed-0 fixture.
pub fn open_config(config: impl Into<ModelConfig>, fault: Option<Fault>) -> Box<dyn Engine> {
    let config = config.into();
    let weights = fixture::generate_weights(&config, 0).expect("fixture");
    bundled::open(config, weights, fault).expect("open")
}

/// `arch` at tiny with `overrides`, over its seed-0 fixture.
pub fn open(arch: &str, overrides: &str, fault: Option<Fault>) -> Box<dyn Engine> {
    open_config(config(arch, overrides), fault)
}

pub fn text(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Deterministic byte ids, different per salt.
pub fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt.wrapping_mul(97)) >> 9) % 256).collect()
}

pub fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, prompt, max_tokens, ..Default::default() }
}

/// A request on `slot` generating exactly `max_tokens` (eos ignored).
pub fn exact_on(id: u64, slot: usize, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, slot, prompt, max_tokens, ignore_eos: true, ..Default::default() }
}

/// A request on slot 0 generating exactly `max_tokens` (eos ignored).
pub fn exact(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    exact_on(id, 0, prompt, max_tokens)
}

/// What a slot fed for `prompt` and `reply`: the prompt and every reply id but the last.
pub fn fed(prompt: &[u32], reply: &[u32]) -> Vec<u32> {
    let mut f = prompt.to_vec();
    f.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
    f
}

/// Every tensor's rows, bit for bit, with positions (writers excluded: they name requests and chunks).
pub fn rows_of(d: &StateDump) -> Vec<(usize, String, Vec<i64>, Vec<u32>)> {
    d.tensors
        .iter()
        .map(|t| (t.layer, t.name.clone(), t.positions.clone(), t.data.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

/// The longest common prefix of two id lists.
pub fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Every emitted token's top logits (ids and bits).
#[derive(Default)]
pub struct Logits(pub Vec<Vec<(u32, u32)>>);

impl Observer for Logits {
    fn on_token(&mut self, e: &TokenEvent) -> Flow {
        self.0.push(e.top.iter().map(|&(i, l)| (i, l.to_bits())).collect());
        Flow::Continue
    }
}

/// The reply to `r` with every emitted token's full logit list (`logprobs` raised to cover the vocabulary).
pub fn logits_of(engine: &mut dyn Engine, r: &Request) -> (Reply, Vec<Vec<(u32, u32)>>) {
    let mut obs = Logits::default();
    let reply = engine.generate(&Request { logprobs: 300, ..r.clone() }, &mut obs).expect("generate");
    (reply, obs.0)
}

/// Answers `flow` at the `at`-th progress poll (0-based), `Continue` otherwise.
pub struct ProgressAt {
    pub at: usize,
    pub flow: Flow,
    pub polls: usize,
}

impl Observer for ProgressAt {
    fn on_progress(&mut self) -> Flow {
        self.polls += 1;
        if self.polls - 1 == self.at {
            self.flow
        } else {
            Flow::Continue
        }
    }
}

/// Cancels at the `at`-th progress poll.
pub struct CancelAt;

impl CancelAt {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(at: usize) -> ProgressAt {
        ProgressAt { at, flow: Flow::Cancel, polls: 0 }
    }
}

/// Answers `flow` at the `at`-th emitted token.
pub struct TokenAt {
    pub at: usize,
    pub flow: Flow,
    pub seen: usize,
}

impl Observer for TokenAt {
    fn on_token(&mut self, _: &TokenEvent) -> Flow {
        self.seen += 1;
        if self.seen - 1 == self.at {
            self.flow
        } else {
            Flow::Continue
        }
    }
}

/// The one state comparison: rows matched by absolute position, records and lengths compared.
pub fn diff(a: &StateDump, b: &StateDump) -> StateDiff {
    state_diff::compare(a, b).unwrap_or_else(|e| panic!("incomparable states: {e}"))
}

/// The first row both states hold with different bits, with both writers (`a` is "warm", `b` "cold").
pub fn first_difference(a: &StateDump, b: &StateDump) -> Option<String> {
    diff(a, b).first.map(|f| f.describe("warm", "cold"))
}

/// `first_difference` of two states of the same weights served with different configs (a chunk grid, the cache
/// switch): the model hash names the config too, so `b` is compared as if it named `a`'s.
pub fn first_difference_across_configs(a: &StateDump, b: &StateDump) -> Option<String> {
    let mut b = b.clone();
    b.meta.model_hash.clone_from(&a.meta.model_hash);
    first_difference(a, &b)
}

/// Every position `a` holds is held by `b` with the same bits; returns how many rows were compared.
pub fn assert_same_rows(a: &StateDump, b: &StateDump) -> usize {
    let d = diff(a, b);
    assert_eq!(d.first, None, "{}", d.headline("a", "b"));
    let only_a: usize = d.tensors.iter().map(|t| t.only_in_a).sum();
    assert_eq!(only_a, 0, "positions held by one side only: {}", d.headline("a", "b"));
    d.rows_compared()
}

/// The positions the first tensor holds, ascending as dumped.
pub fn held(d: &StateDump) -> Vec<i64> {
    d.tensors[0].positions.iter().copied().filter(|&p| p >= 0).collect()
}

/// Run `r` on `warm` and on a fresh engine (same slot): same tokens, and identical states (rows, lengths,
/// records); returns warm's reply.
pub fn warm_equals_cold(warm: &mut dyn Engine, r: &Request) -> Reply {
    let w = warm.generate(r, &mut NoObserver).expect("warm");
    let mut cold = warm.fresh();
    let c = cold.generate(r, &mut NoObserver).expect("cold");
    assert_eq!(c.reused, 0);
    assert_eq!(w.tokens, c.tokens, "warm and cold tokens differ (reused {})", w.reused);
    let d = diff(&warm.dump(r.slot).expect("dump"), &cold.dump(r.slot).expect("dump"));
    assert!(d.identical(), "warm and cold states differ (reused {}): {}", w.reused, d.headline("warm", "cold"));
    w
}

/// Turn 1 (`first`, after a system prompt) on `warm`, then turn 2 continuing it (prompt + reply + `second`) on
/// `warm` and on a fresh engine; the record after turn 1 must hold exactly what was fed, and the two states must
/// hold the same rows. Returns warm's and cold's turn 2 replies and what turn 1 fed.
pub fn continue_conversation(
    warm: &mut dyn Engine,
    first: &str,
    second: &str,
    max_tokens: usize,
) -> (Reply, Reply, usize) {
    let mut transcript = vec![Message::new(Role::System, text("be brief")), Message::new(Role::User, text(first))];
    let p1 = render(&transcript, true);
    let r1 = warm.generate(&req(1, p1.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    let fed1 = fed(&p1, &r1.tokens);
    assert_eq!(warm.dump(0).expect("dump").record.ids, fed1, "the record holds exactly what was fed");
    transcript.push(Message::from_reply(&r1.tokens));
    transcript.push(Message::new(Role::User, text(second)));
    let p2 = render(&transcript, true);
    let r2 = warm.generate(&req(2, p2.clone(), max_tokens), &mut NoObserver).expect("turn 2 warm");
    let mut cold = warm.fresh();
    let c2 = cold.generate(&req(2, p2, max_tokens), &mut NoObserver).expect("turn 2 cold");
    assert_same_rows(&warm.dump(0).expect("dump"), &cold.dump(0).expect("dump"));
    (r2, c2, fed1.len())
}
