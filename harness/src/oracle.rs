//! The expected reuse of a turn: what a correct engine of each arch must take from a warm slot's state.
//!
//! This is the one place the reuse rules live in the harness. The runner keeps, per warm slot, what the harness
//! knows was fed (never what the engine claims) in a `SlotBook`, and asks the arch's rule for the count a correct
//! engine reports. Rules (DESIGN.md, seeds 000 and 004):
//! - strict prefix (inkling, kimi, deepseek): the whole fed length when the prompt is strictly longer and begins
//!   with every fed id, else 0. Audio (inkling): a request carrying frames is never reused, and a state that
//!   consumed frames is tainted.
//! - longest common prefix (glm): truncate to the LCP, bounded by prompt length - 1. With cross-slot sharing on,
//!   a request on a slot that was never used adopts min(LCP(fed_o, prompt), prompt length - 1) from the other
//!   untainted slot o where that is largest.
//! - grid (glm53): min(LCP, previous prompt length, prompt length - 1), rounded down to `prompt_rows`.
//! - blocks (vLLM, SGLang): a cache shared by every request of the instance, in blocks of B tokens: the longest
//!   common prefix with anything cached, bounded by prompt length - 1, rounded down to B.
//! - never: the engine keeps no state between requests (reuse is always 0).
//!
//! An engine that is not bundled declares its rule (CAPS `reuse_rule=`, or `engine.reuse_rule` in the scenario;
//! `Rule::from_str` reads both). With no rule, the exact reuse check is skipped, but `reuse-fired` still holds
//! an engine that reports counts to the one claim every prefix cache makes: a turn whose prompt strictly extends
//! everything its slot fed must reuse something (`SlotBook::must_reuse`).
//!
//! A request that fails mid-way (cancelled, context exceeded, engine error) taints its slot: its state is
//! half-updated, so nothing is reusable there — unless the engine declares that a failure with that code leaves
//! the slot as it was (CAPS `keeps_state_on=`, `SlotBook::keeping_state_on`). A request refused before it starts
//! (bad request, empty prompt) leaves the slot as it was. A block cache keeps what earlier requests cached whatever
//! a later one does. docs/protocol.md ("What kvproof assumes of an engine") states these rules for engine authors.

use kvproof_engines::engine::{EngineInfo, Request};
use kvproof_engines::tokenizer::AUDIO;

use crate::driver::Caps;
use crate::scenario::DeclaredRule;

/// What the harness knows about one warm slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotHistory {
    /// The ids the last completed request fed: its prompt and every reply id but the last.
    pub fed: Vec<u32>,
    /// The last completed request's prompt length (glm53's canonical prefill frontier).
    pub prompt_len: usize,
    /// Whether the state may be reused at all (false: fresh, failed, cancelled, or audio-tainted).
    pub reusable: bool,
    /// The slot was used and is unusable (failed, cancelled, audio-tainted): unlike a fresh slot, it is not
    /// empty, so cross-slot sharing never fills it.
    pub tainted: bool,
}

impl SlotHistory {
    /// A slot no request has touched.
    pub fn is_fresh(&self) -> bool {
        !self.reusable && !self.tainted
    }

    fn tainted() -> Self {
        SlotHistory { tainted: true, ..SlotHistory::default() }
    }
}

/// How a request ended, as far as the state is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    Completed {
        reply: &'a [u32],
    },
    /// Refused or failed with this protocol error code (`DriverError::code`).
    Failed {
        code: &'a str,
    },
}

/// Whether a request that failed with `code` touched the state. Cancelled and context-exceeded requests fail
/// mid-way (or taint on purpose); an engine error leaves an unknown state. Validation errors are raised before
/// anything is fed.
pub fn failure_taints(code: &str) -> bool {
    matches!(code, "CANCELLED" | "CONTEXT_EXCEEDED" | "INTERNAL" | "DIED" | "TIMEOUT")
}

/// The ids a completed request fed: the prompt, then every emitted id but the last (never fed back).
pub fn fed_ids(prompt: &[u32], reply: &[u32]) -> Vec<u32> {
    let mut fed = prompt.to_vec();
    if let Some((_, fed_reply)) = reply.split_last() {
        fed.extend_from_slice(fed_reply);
    }
    fed
}

fn carries_audio(req: &Request) -> bool {
    !req.audio.is_empty() || req.prompt.contains(&AUDIO)
}

pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The reuse rule of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Whole record or nothing; `audio_taints` for engines whose audio frames share one id.
    StrictPrefix { audio_taints: bool },
    /// Truncate to the longest common prefix, bounded by prompt length - 1; `share`: a fresh slot adopts the
    /// best common prefix of another slot.
    CommonPrefix { share: bool },
    /// min(LCP, previous prompt length, prompt length - 1), rounded down to the grid.
    Grid { prompt_rows: usize },
    /// A cache shared by every request, in blocks of `block` tokens: min(longest common prefix with anything
    /// cached, prompt length - 1), rounded down to the block.
    Blocks { block: usize },
    /// No state is kept between requests.
    Never,
}

/// The rule a declaration names for an engine with `caps`: audio taints a strict prefix where frames share one
/// id, and an LCP engine that copies prefixes across slots shares.
pub fn declared(d: DeclaredRule, caps: &Caps) -> Rule {
    match d {
        DeclaredRule::Strict => Rule::StrictPrefix { audio_taints: caps.audio_frame_bytes.is_some() },
        DeclaredRule::Lcp => Rule::CommonPrefix { share: caps.kv_share },
        DeclaredRule::Grid(prompt_rows) => Rule::Grid { prompt_rows },
        DeclaredRule::Blocks(block) => Rule::Blocks { block },
        DeclaredRule::None => Rule::Never,
    }
}

/// The rule of a bundled arch, as the arch itself declares it (the registry's `declares`; for glm, whether the
/// driver says sharing is on).
fn bundled_rule(info: &EngineInfo, caps: &Caps) -> Option<Rule> {
    let d = kvproof_engines::bundled::declared_rule(info)?.parse::<DeclaredRule>().ok()?;
    Some(match declared(d, caps) {
        // an arch that hears audio taints with it, whatever the transport says of frames
        Rule::StrictPrefix { audio_taints } => Rule::StrictPrefix { audio_taints: audio_taints || info.audio },
        rule => rule,
    })
}

/// The rule for an engine: the one the engine declares in its capabilities, else its bundled arch's; `None` when
/// there is neither (the exact reuse check is then skipped with that reason, never passed).
pub fn rule_for(info: &EngineInfo, caps: &Caps) -> Option<Rule> {
    caps.reuse_rule.map(|d| declared(d, caps)).or_else(|| bundled_rule(info, caps))
}

/// Why an engine has no rule, as skipped checks say it.
pub fn no_rule(info: &EngineInfo) -> String {
    format!(
        "no reuse rule for arch `{}`: the engine declares none (CAPS reuse_rule=) and the scenario sets none \
         (engine.reuse_rule)",
        info.arch
    )
}

impl Rule {
    /// Positions a correct engine reuses for `req` on a slot with `history`, from that slot alone.
    pub fn expected(&self, history: &SlotHistory, req: &Request) -> usize {
        if !history.reusable || history.fed.is_empty() {
            return 0;
        }
        let (fed, prompt) = (&history.fed, &req.prompt);
        match *self {
            Rule::StrictPrefix { audio_taints } => {
                if audio_taints && carries_audio(req) {
                    return 0;
                }
                if prompt.len() > fed.len() && prompt.starts_with(fed) {
                    fed.len()
                } else {
                    0
                }
            }
            Rule::CommonPrefix { .. } => common_prefix(fed, prompt).min(prompt.len().saturating_sub(1)),
            Rule::Grid { prompt_rows } => {
                let r = common_prefix(fed, prompt).min(history.prompt_len).min(prompt.len().saturating_sub(1));
                r / prompt_rows * prompt_rows
            }
            // the book looks across every cached sequence (`SlotBook::expected`); one history alone:
            Rule::Blocks { block } => common_prefix(fed, prompt).min(prompt.len().saturating_sub(1)) / block * block,
            Rule::Never => 0,
        }
    }

    /// The slot's history after `req` ended with `outcome`, given what it was before.
    pub fn after(&self, before: &SlotHistory, req: &Request, outcome: Outcome<'_>) -> SlotHistory {
        match outcome {
            Outcome::Failed { .. } if *self == Rule::Never => SlotHistory::default(),
            Outcome::Failed { code } if failure_taints(code) => SlotHistory::tainted(),
            Outcome::Failed { .. } => before.clone(),
            Outcome::Completed { reply } => {
                let tainted = matches!(self, Rule::StrictPrefix { audio_taints: true }) && carries_audio(req);
                SlotHistory {
                    fed: fed_ids(&req.prompt, reply),
                    prompt_len: req.prompt.len(),
                    reusable: !tainted,
                    tainted,
                }
            }
        }
    }

    /// Whether a correct engine's record is tainted after a completed request, when the rule says.
    pub fn expected_tainted(&self, req: &Request) -> Option<bool> {
        match self {
            Rule::StrictPrefix { audio_taints: true } => Some(carries_audio(req)),
            _ => None,
        }
    }

    /// The record a correct engine holds after a completed request, when the rule pins it down exactly.
    pub fn expected_record(&self, req: &Request, reply: &[u32]) -> Option<Vec<u32>> {
        match self {
            Rule::StrictPrefix { .. } | Rule::CommonPrefix { .. } => Some(fed_ids(&req.prompt, reply)),
            // glm53 keeps a conservative record; its exact length is the engine's choice. A block cache or an
            // engine without state has no record kvproof knows of.
            Rule::Grid { .. } | Rule::Blocks { .. } | Rule::Never => None,
        }
    }
}

/// Every slot of one warm instance, as the harness knows it: what the expected reuse of a request depends on
/// when a rule looks past the request's own slot (cross-slot sharing, a shared block cache). Kept without a rule
/// too: `must_reuse` needs only what each slot fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotBook {
    rule: Option<Rule>,
    slots: Vec<SlotHistory>,
    /// Every sequence a completed request fed, for a block cache shared by all requests.
    cached: Vec<Vec<u32>>,
    /// Failure codes after which the engine declares the slot unchanged.
    keeps_state_on: Vec<String>,
}

impl SlotBook {
    pub fn new(rule: Option<Rule>) -> Self {
        SlotBook { rule, slots: Vec::new(), cached: Vec::new(), keeps_state_on: Vec::new() }
    }

    /// The engine declares that a request failing with one of `codes` leaves its slot exactly as it was
    /// (e.g. `CONTEXT_EXCEEDED` checked before anything is fed).
    pub fn keeping_state_on(mut self, codes: &[String]) -> Self {
        self.keeps_state_on = codes.to_vec();
        self
    }

    pub fn rule(&self) -> Option<Rule> {
        self.rule
    }

    /// The history of `slot` (fresh when nothing ran there).
    pub fn slot(&self, slot: usize) -> SlotHistory {
        self.slots.get(slot).cloned().unwrap_or_default()
    }

    /// Positions a correct engine reuses for `req` on `req.slot`; `None` without a rule.
    pub fn expected(&self, req: &Request) -> Option<usize> {
        let rule = self.rule?;
        let own = self.slot(req.slot);
        Some(match rule {
            Rule::CommonPrefix { share: true } if own.is_fresh() => self.share_source(req).map_or(0, |(_, n)| n),
            Rule::Blocks { block } => {
                let bound = req.prompt.len().saturating_sub(1);
                let best = self.cached.iter().map(|fed| common_prefix(fed, &req.prompt)).max().unwrap_or(0);
                best.min(bound) / block * block
            }
            _ => rule.expected(&own, req),
        })
    }

    /// Whether any prefix cache must reuse something for `req`: its prompt strictly extends everything its slot
    /// fed last, and that state is reusable.
    pub fn must_reuse(&self, req: &Request) -> bool {
        let own = self.slot(req.slot);
        own.reusable && !own.fed.is_empty() && req.prompt.len() > own.fed.len() && req.prompt.starts_with(&own.fed)
    }

    /// With sharing: the other slot a fresh slot copies from and how many rows, when any row matches
    /// (the lowest slot among equals, as the engine picks).
    pub fn share_source(&self, req: &Request) -> Option<(usize, usize)> {
        let bound = req.prompt.len().saturating_sub(1);
        let mut best: Option<(usize, usize)> = None;
        for (o, h) in self.slots.iter().enumerate() {
            if o == req.slot || !h.reusable {
                continue;
            }
            let n = common_prefix(&h.fed, &req.prompt).min(bound);
            if n > best.map_or(0, |(_, b)| b) {
                best = Some((o, n));
            }
        }
        best
    }

    /// Record how `req` ended on its slot.
    pub fn after(&mut self, req: &Request, outcome: Outcome<'_>) {
        if self.slots.len() <= req.slot {
            self.slots.resize(req.slot + 1, SlotHistory::default());
        }
        if let Outcome::Failed { code } = outcome {
            if self.keeps_state_on.iter().any(|c| c == code) {
                return;
            }
        }
        // Without a rule, what a slot fed is tracked as a strict-prefix engine tracks it.
        let rule = self.rule.unwrap_or(Rule::StrictPrefix { audio_taints: false });
        let next = rule.after(&self.slots[req.slot], req, outcome);
        if matches!(rule, Rule::Blocks { .. }) && next.reusable {
            self.cached.push(next.fed.clone());
        }
        self.slots[req.slot] = next;
    }

    /// The instance was replaced by a fresh one: every slot is fresh.
    pub fn reset(&mut self) {
        self.slots.clear();
        self.cached.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt: &[u32]) -> Request {
        Request { prompt: prompt.to_vec(), max_tokens: 4, ..Request::default() }
    }

    fn on(slot: usize, prompt: &[u32]) -> Request {
        Request { slot, ..req(prompt) }
    }

    fn history(fed: &[u32]) -> SlotHistory {
        SlotHistory { fed: fed.to_vec(), prompt_len: fed.len(), reusable: true, tainted: false }
    }

    fn ids(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    const INK: Rule = Rule::StrictPrefix { audio_taints: true };
    const GLM: Rule = Rule::CommonPrefix { share: false };
    const FRESH: SlotHistory = SlotHistory { fed: Vec::new(), prompt_len: 0, reusable: false, tainted: false };

    #[test]
    fn strict_prefix_takes_all_or_nothing() {
        let h = history(&[1, 2, 3, 4]);
        assert_eq!(INK.expected(&h, &req(&[1, 2, 3, 4, 5])), 4, "extend");
        assert_eq!(INK.expected(&h, &req(&[1, 2, 3, 4])), 0, "exact repeat");
        assert_eq!(INK.expected(&h, &req(&[1, 2, 3])), 0, "shorter");
        assert_eq!(INK.expected(&h, &req(&[9, 2, 3, 4, 5])), 0, "first");
        assert_eq!(INK.expected(&h, &req(&[1, 2, 9, 4, 5])), 0, "middle");
        assert_eq!(INK.expected(&h, &req(&[1, 2, 3, 9, 5])), 0, "last");
        assert_eq!(INK.expected(&SlotHistory::default(), &req(&[1, 2])), 0, "fresh");
    }

    #[test]
    fn the_last_reply_id_is_never_fed() {
        let r = req(&[1, 2]);
        let h = INK.after(&FRESH, &r, Outcome::Completed { reply: &[7, 8, 9] });
        assert_eq!(h.fed, vec![1, 2, 7, 8]);
        // prompt + the whole reply: one id left to prefill, everything fed is reused
        assert_eq!(INK.expected(&h, &req(&[1, 2, 7, 8, 9])), 4);
        let h = INK.after(&FRESH, &r, Outcome::Completed { reply: &[] });
        assert_eq!(h.fed, vec![1, 2]);
    }

    #[test]
    fn audio_taints_and_is_never_reused() {
        let h = history(&[1, 2, 3]);
        let mut with_audio = req(&[1, 2, 3, AUDIO, 5]);
        with_audio.audio = vec![vec![0; 8]];
        assert_eq!(INK.expected(&h, &with_audio), 0, "a request carrying audio");
        let after = INK.after(&h, &with_audio, Outcome::Completed { reply: &[6, 7] });
        assert!(!after.reusable && after.tainted && !after.is_fresh());
        assert_eq!(INK.expected(&after, &req(&[1, 2, 3, AUDIO, 5, 6, 7, 8])), 0, "tainted state");
        // engines whose audio has no shared id are not tainted
        let plain = Rule::StrictPrefix { audio_taints: false };
        assert!(plain.after(&h, &with_audio, Outcome::Completed { reply: &[6] }).reusable);
    }

    #[test]
    fn failures_mid_way_taint_and_refusals_leave_the_slot_alone() {
        let h = history(&[1, 2]);
        for code in ["CANCELLED", "CONTEXT_EXCEEDED", "INTERNAL"] {
            let after = INK.after(&h, &req(&[1, 2, 3]), Outcome::Failed { code });
            assert!(after.tainted && !after.reusable, "{code}");
            assert_eq!(INK.expected(&after, &req(&[1, 2, 3])), 0, "{code}");
        }
        for code in ["BAD_REQUEST", "EMPTY_PROMPT", "SLOT_BUSY"] {
            assert_eq!(INK.after(&h, &req(&[1, 2, 3]), Outcome::Failed { code }), h, "{code}");
        }
    }

    #[test]
    fn a_failure_the_engine_declares_harmless_leaves_the_slot_alone() {
        let mut book = SlotBook::new(Some(INK)).keeping_state_on(&["CONTEXT_EXCEEDED".to_string()]);
        book.after(&req(&[1, 2]), Outcome::Completed { reply: &[3, 4] });
        book.after(&req(&[1, 2, 3, 4, 5, 6]), Outcome::Failed { code: "CONTEXT_EXCEEDED" });
        assert_eq!(book.expected(&req(&[1, 2, 3, 9])), Some(3), "what turn 1 fed is still reusable");
        book.after(&req(&[1, 2, 3, 4, 5]), Outcome::Failed { code: "CANCELLED" });
        assert_eq!(book.expected(&req(&[1, 2, 3, 9])), Some(0), "an undeclared failure spoils the slot");
    }

    #[test]
    fn common_prefix_truncates_and_keeps_one_to_prefill() {
        let h = history(&[1, 2, 3, 4]);
        assert_eq!(GLM.expected(&h, &req(&[1, 2, 9])), 2);
        assert_eq!(GLM.expected(&h, &req(&[1, 2, 3, 4])), 3, "bounded by len - 1");
        assert_eq!(GLM.expected(&h, &req(&[1, 2, 3])), 2, "shorter: L' - 1");
        assert_eq!(GLM.expected(&h, &req(&[1, 2, 3, 4, 5])), 4, "extend");
        assert_eq!(GLM.expected(&h, &req(&[9])), 0);
    }

    #[test]
    fn grid_bounds_by_previous_prompt_and_rounds_down() {
        let grid = Rule::Grid { prompt_rows: 4 };
        // previous prompt 10 ids, reply fed 3 more: decode-written rows 10..13 are not reusable
        let mut h = history(&(0..13).collect::<Vec<_>>());
        h.prompt_len = 10;
        let next: Vec<u32> = (0..20).collect();
        assert_eq!(grid.expected(&h, &req(&next)), 8, "min(13, 10, 19) = 10, rounded down to 8");
        assert_eq!(grid.expected(&h, &req(&[0, 1, 2])), 0, "min(3, 10, 2) = 2 -> 0");
    }

    /// The glm53 boundary values at the tiny grid of 16, as the engine's authors specified them.
    #[test]
    fn grid_boundaries_at_sixteen() {
        let grid = Rule::Grid { prompt_rows: 16 };
        let reply = [900, 901, 902, 903, 904, 905, 906, 907];
        let after = |prompt: &[u32], reply: &[u32]| grid.after(&FRESH, &req(prompt), Outcome::Completed { reply });
        // a 64-id prompt, then a prompt diverging at d
        let h = after(&ids(0..64), &reply);
        for (d, want) in [(30, 16), (31, 16), (32, 32), (33, 32), (34, 32), (47, 32), (48, 48)] {
            let mut p = h.fed.clone();
            p[d] = 5000;
            p.extend([1, 2, 3]);
            assert_eq!(grid.expected(&h, &req(&p)), want, "diverge at {d}");
        }
        // exact repeats
        assert_eq!(grid.expected(&after(&ids(0..50), &reply), &req(&ids(0..50))), 48);
        assert_eq!(grid.expected(&after(&ids(0..48), &reply), &req(&ids(0..48))), 32);
        // shorter prompts after 50
        let h = after(&ids(0..50), &reply);
        for (n, want) in [(40, 32), (33, 32), (32, 16), (16, 0)] {
            assert_eq!(grid.expected(&h, &req(&ids(0..n))), want, "shorter {n}");
        }
        // a reply crossing a grid boundary is never reused past the prompt
        for (prompt, replies, want) in [(30u32, 6usize, 16), (32, 20, 32), (40, 4, 32)] {
            let h = after(&ids(0..prompt), &reply.repeat(3)[..replies]);
            let mut next = h.fed.clone();
            next.extend([1, 2, 3, 4]);
            assert_eq!(grid.expected(&h, &req(&next)), want, "prompt {prompt} + {replies}");
        }
    }

    #[test]
    fn a_fresh_slot_adopts_the_best_prefix_of_another_slot_when_sharing() {
        let share = Rule::CommonPrefix { share: true };
        let mut book = SlotBook::new(Some(share));
        let a = ids(0..20);
        // slot 0 fed 0..20, 50; slot 1 fed 0..8, 70..73
        book.after(&on(0, &a), Outcome::Completed { reply: &[50, 51] });
        let mut b = ids(0..8);
        b.extend([70, 71, 72]);
        book.after(&on(1, &b), Outcome::Completed { reply: &[60] });
        // slot 2 is fresh: it copies the longest match (slot 0, 12 ids)
        let mut c = ids(0..12);
        c.extend([99, 98]);
        assert_eq!(book.share_source(&on(2, &c)), Some((0, 12)));
        assert_eq!(book.expected(&on(2, &c)), Some(12));
        // bounded by the prompt length - 1
        assert_eq!(book.expected(&on(2, &ids(0..5))), Some(4));
        // equal matches: the lowest slot
        assert_eq!(book.share_source(&on(2, &[0, 1, 2, 3, 4, 5, 6, 7, 200])), Some((0, 8)));
        // nothing in common: no share
        assert_eq!(book.expected(&on(2, &[300, 301])), Some(0));
        // a used slot never shares; its own prefix rules
        assert_eq!(book.expected(&on(1, &c)), Some(8));
        // a tainted slot is neither a donor nor fresh
        book.after(&on(0, &a), Outcome::Failed { code: "CONTEXT_EXCEEDED" });
        assert_eq!(book.share_source(&on(2, &c)), Some((1, 8)));
        book.after(&on(2, &c), Outcome::Failed { code: "CANCELLED" });
        assert_eq!(book.expected(&on(2, &c)), Some(0));
        // without sharing a fresh slot reuses nothing
        let mut plain = SlotBook::new(Some(GLM));
        plain.after(&on(0, &a), Outcome::Completed { reply: &[50] });
        assert_eq!(plain.expected(&on(1, &a)), Some(0));
        assert_eq!(plain.expected(&on(0, &a)), Some(19));
        plain.reset();
        assert_eq!(plain.expected(&on(0, &a)), Some(0));
    }

    /// A one-slot text engine of `arch` with no window, grid, fault or cost; a test sets what it needs.
    fn info_of(arch: &str, vocab: usize) -> EngineInfo {
        EngineInfo {
            arch: arch.into(),
            preset: None,
            slots: 1,
            max_ctx: 64,
            vocab,
            audio: false,
            audio_frame_bytes: 0,
            window: None,
            prompt_rows: None,
            initial_capacity: 16,
            fault: None,
            model_hash: String::new(),
            cost: None,
        }
    }

    #[test]
    fn rules_by_arch() {
        let mut info = EngineInfo { audio: true, audio_frame_bytes: 8, window: Some(8), ..info_of("inkling", 264) };
        let mut caps = crate::cases::boundary_matrix::tests::caps(None);
        assert_eq!(rule_for(&info, &caps), Some(INK));
        info.arch = "glm53".into();
        assert_eq!(rule_for(&info, &caps), None, "glm53 needs its grid");
        info.prompt_rows = Some(16);
        assert_eq!(rule_for(&info, &caps), Some(Rule::Grid { prompt_rows: 16 }));
        info.arch = "glm".into();
        assert_eq!(rule_for(&info, &caps), Some(GLM));
        caps.kv_share = true;
        assert_eq!(rule_for(&info, &caps), Some(Rule::CommonPrefix { share: true }));
        info.arch = "llama".into();
        info.audio = false;
        assert_eq!(rule_for(&info, &caps), Some(Rule::StrictPrefix { audio_taints: false }));
        info.arch = "llama-gguf".into();
        assert_eq!(rule_for(&info, &caps), None);
    }

    #[test]
    fn a_block_cache_matches_anything_cached_in_whole_blocks() {
        let mut book = SlotBook::new(Some(Rule::Blocks { block: 4 }));
        let a = ids(0..10);
        book.after(&req(&a), Outcome::Completed { reply: &[50, 51, 52] });
        // fed 0..10, 50, 51: a continuation matches 12 ids, bounded by len - 1, rounded down to 12
        let mut next = book.slot(0).fed.clone();
        next.extend([7, 7]);
        assert_eq!(book.expected(&req(&next)), Some(12));
        // another conversation came in between: the first one's blocks are still cached
        book.after(&req(&ids(100..120)), Outcome::Completed { reply: &[9] });
        assert_eq!(book.expected(&req(&next)), Some(12));
        // an exact repeat of 10 ids: at most 9, rounded down to 8
        assert_eq!(book.expected(&req(&a)), Some(8));
        // a failure does not evict what earlier requests cached
        book.after(&req(&ids(0..3)), Outcome::Failed { code: "CANCELLED" });
        assert_eq!(book.expected(&req(&next)), Some(12));
        assert_eq!(book.expected(&req(&[1, 2, 3])), Some(0));
    }

    #[test]
    fn an_engine_without_state_reuses_nothing_and_without_a_rule_only_extensions_must_reuse() {
        let mut never = SlotBook::new(Some(Rule::Never));
        never.after(&req(&ids(0..10)), Outcome::Completed { reply: &[1] });
        assert_eq!(never.expected(&req(&ids(0..20))), Some(0));

        let mut unknown = SlotBook::new(None);
        assert!(!unknown.must_reuse(&req(&ids(0..5))), "nothing fed yet");
        unknown.after(&req(&ids(0..10)), Outcome::Completed { reply: &[50, 51] });
        assert_eq!(unknown.expected(&req(&ids(0..20))), None);
        let mut next = ids(0..10);
        next.extend([50, 60]);
        assert!(unknown.must_reuse(&req(&next)), "prompt + reply + more strictly extends");
        assert!(!unknown.must_reuse(&req(&ids(0..10))), "a repeat does not");
        assert!(!unknown.must_reuse(&req(&ids(1..30))), "a divergence does not");
        unknown.after(&req(&next), Outcome::Failed { code: "CONTEXT_EXCEEDED" });
        let mut after_failure = next.clone();
        after_failure.push(9);
        assert!(!unknown.must_reuse(&req(&after_failure)), "a failed turn leaves nothing reusable");
    }

    #[test]
    fn a_declared_rule_wins_over_the_arch_table() {
        let info = info_of("llama.cpp", 49152);
        let mut caps = crate::cases::boundary_matrix::tests::caps(None);
        assert_eq!(rule_for(&info, &caps), None);
        caps.reuse_rule = Some(DeclaredRule::Lcp);
        assert_eq!(rule_for(&info, &caps), Some(GLM));
        caps.reuse_rule = Some(DeclaredRule::Blocks(16));
        assert_eq!(rule_for(&info, &caps), Some(Rule::Blocks { block: 16 }));
        caps.reuse_rule = Some(DeclaredRule::Strict);
        assert_eq!(rule_for(&info, &caps), Some(Rule::StrictPrefix { audio_taints: false }));
        caps.audio_frame_bytes = Some(8);
        assert_eq!(rule_for(&info, &caps), Some(INK));
    }
}
