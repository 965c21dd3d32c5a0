//! The request loop every bundled engine runs, written once: `BundledEngine<A>` implements `Engine` for any
//! `A: Arch`, and each arch supplies only what is its own — its forward pass, its slot state, its reuse rule and
//! the points where one of its faults changes what happens.
//!
//! One request, in order:
//! 1. validation: the slot, the prompt's length and ids, then the arch's audio rule (`Arch::audio_rows`);
//! 2. an over-long prompt is refused up front, tainting the slot (`Arch::REFUSES_OVERFLOW`; inkling instead
//!    prefills until a segment no longer fits, where the record refuses the write);
//! 3. capacity growth: at least doubling, never past `max_ctx` (`Slot::grow`);
//! 4. the reuse decision (`Arch::decide`) and its `[PREFIX]` line, then the slot is cut back to it (`Arch::resume`);
//! 5. segmented prefill (`Arch::segments`, `Arch::prefill`), recording each segment as it completes and polling
//!    the observer after each one. STOP and CANCEL there follow one policy for every arch (see `Observer`):
//!    CANCEL fails the request and taints the record; STOP lets the segment under way finish, then ends the
//!    request with an empty reply (`Stopped`) when prompt positions are left — the segments fed stay recorded —
//!    or goes on to decode when the whole prompt was fed;
//! 6. decode: every id but the last emitted is fed back (`Arch::decode_step`) and recorded as it is fed;
//! 7. every failure path taints the slot's record: a half-updated state is never reused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::RowMeta;
use crate::config::{ArchConfig, BaseConfig};
use crate::decode::Decoded;
use crate::dump::{DumpTensor, StateDump, Writer, WriterKind};
use crate::engine::{Engine, EngineInfo, Flow, Observer, Reply, Request, StopReason, Timings};
use crate::error::{EngineError, Result};
use crate::fault::Fault;
use crate::fixture::TensorSpec;
use crate::prefix::{Decision, NoReuse, PrefixRecord};
use crate::tensors::{Load, Source, SpecList};
use crate::weights::Weights;

/// One bundled engine family, as `kvproof list` describes it.
#[derive(Debug, Clone, Copy)]
pub struct ArchInfo {
    pub name: &'static str,
    pub modelled_on: &'static str,
    pub state: &'static str,
    pub reuse_rule: &'static str,
    /// The rule as the protocol declares it (CAPS `reuse_rule=`): the one statement of it both transports and the
    /// harness's oracle read.
    pub declares: DeclaredReuse,
    pub faults: &'static [Fault],
}

/// How a bundled arch declares its reuse rule (docs/protocol.md, `reuse_rule=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredReuse {
    /// `strict`: the longest prefix of the prompt that the state was built from.
    Strict,
    /// `lcp`: the longest common prefix with what the state was built from.
    Lcp,
    /// `grid:R`: a common prefix rounded down to the engine's `prompt_rows` grid (none when it has no grid).
    Grid,
}

impl ArchInfo {
    /// The CAPS `reuse_rule=` value of an engine of this arch described by `info`.
    pub fn declared_rule(&self, info: &EngineInfo) -> Option<String> {
        match self.declares {
            DeclaredReuse::Strict => Some("strict".into()),
            DeclaredReuse::Lcp => Some("lcp".into()),
            DeclaredReuse::Grid => info.prompt_rows.filter(|&r| r > 0).map(|r| format!("grid:{r}")),
        }
    }
}

/// The cached state of one slot, as an arch lays it out (its layers' caches, recurrences, drafter, ...).
pub trait Layers: Send {
    /// Forget every position: the state is rebuilt from position 0.
    fn reset(&mut self);
    /// Re-allocate for `capacity` positions, keeping positions `0..keep`.
    fn grow(&mut self, capacity: usize, keep: usize, fault: Option<Fault>);
    /// Bytes the buffers hold.
    fn bytes(&self) -> usize;
    /// Every cached tensor, row by row with writers.
    fn dump(&self) -> Vec<DumpTensor>;
}

/// A slot: the arch's layers plus what every arch keeps about them.
#[derive(Debug, Clone)]
pub struct Slot<L> {
    pub layers: L,
    /// The ids the state was built from, recorded where they were fed.
    pub record: PrefixRecord,
    /// Positions the state covers.
    pub len: usize,
    pub capacity: usize,
    /// Logits after the last fed position: what a reuse of a whole prompt would sample from (empty for an arch
    /// that never reuses a whole prompt).
    pub last_logits: Vec<f32>,
    /// Prompt and generated counts of the last request (what `counter-reuse` derives reuse from).
    pub last_prompt: usize,
    pub last_generated: usize,
}

impl<L: Layers> Slot<L> {
    fn new(layers: L, capacity: usize, logits: usize, fault: Option<Fault>) -> Self {
        Slot {
            layers,
            record: PrefixRecord::with_capacity(capacity).with_fault(fault),
            len: 0,
            capacity,
            last_logits: vec![0.0; logits],
            last_prompt: 0,
            last_generated: 0,
        }
    }

    /// Forget everything: the state is rebuilt from position 0.
    pub fn reset(&mut self) {
        self.layers.reset();
        self.record.clear();
        self.len = 0;
    }

    /// Grow capacity to `capacity`, keeping the positions held and the record (`drop-grow-record`: the record
    /// is re-allocated empty, so reuse silently stops).
    pub fn grow(&mut self, capacity: usize, fault: Option<Fault>) {
        let keep = self.len;
        self.layers.grow(capacity, keep, fault);
        self.capacity = capacity;
        if fault == Some(Fault::DropGrowRecord) {
            self.record.alloc(capacity);
        } else if !self.record.grow(capacity, keep) {
            self.len = 0;
        }
    }

    /// `counter-reuse`: the reusable length derived from the previous request's counts, ids never compared.
    pub fn counter_reuse(&self, prompt_len: usize) -> Decision {
        if self.len == 0 || self.record.is_tainted() {
            return Decision::Fresh(NoReuse::Empty);
        }
        let n = (self.last_prompt + self.last_generated).saturating_sub(1).min(prompt_len - 1);
        if n > 0 {
            Decision::Reuse(n)
        } else {
            Decision::Fresh(NoReuse::Empty)
        }
    }

    fn bytes(&self) -> usize {
        self.layers.bytes() + self.record.capacity() * 4 + self.last_logits.len() * 4
    }
}

/// What a request starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Keep the first `reused` positions of the request's own slot (`Fresh`: start over).
    Own(Decision),
    /// Copy the first `n` positions of slot `from` into the request's (empty) slot.
    Copy { from: usize, n: usize },
}

impl Start {
    pub fn decision(self) -> Decision {
        match self {
            Start::Own(d) => d,
            Start::Copy { n, .. } => Decision::Reuse(n),
        }
    }
}

/// One batch of consecutive positions a forward pass feeds: `ids` at positions `pos0..pos0 + ids.len()`, every
/// row written by `writer` — a prefill segment, or the one id of a decode step (`Step::segment`).
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    pub ids: &'a [u32],
    pub pos0: usize,
    pub writer: Writer,
    /// The audio payload of each position that is an audio frame (empty for an arch without audio).
    pub audio: &'a [Option<&'a [u8]>],
}

impl<'a> Segment<'a> {
    /// A segment of ids alone, no audio.
    pub fn of_ids(ids: &'a [u32], pos0: usize, writer: Writer) -> Self {
        Segment { ids, pos0, writer, audio: &[] }
    }

    pub fn end(&self) -> usize {
        self.pos0 + self.ids.len()
    }

    /// The meta of the row written for the segment's `i`-th position.
    pub fn row(&self, i: usize) -> RowMeta {
        RowMeta { pos: (self.pos0 + i) as i64, writer: Some(self.writer) }
    }
}

/// One decode step: id `id` fed at `pos` as step `index` of request `req`, its rows written by `writer`.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    pub id: u32,
    pub pos: usize,
    pub index: usize,
    pub req: &'a Request,
    pub writer: Writer,
}

impl Step<'_> {
    /// The one id fed, as a batch.
    pub fn ids(&self) -> &[u32] {
        std::slice::from_ref(&self.id)
    }

    /// The step as the forward passes feed it: a segment of its one id (a decode step carries no audio).
    pub fn segment(&self) -> Segment<'_> {
        Segment::of_ids(self.ids(), self.pos, self.writer)
    }
}

/// The observer, as a segment that can be abandoned part way sees it.
pub struct Progress<'a> {
    observer: &'a mut dyn Observer,
    stop: bool,
}

impl Progress<'_> {
    /// Poll the observer: false on CANCEL (abandon the segment); a STOP lets the segment finish.
    pub fn go_on(&mut self) -> bool {
        match self.observer.on_progress() {
            Flow::Continue => true,
            Flow::Stop => {
                self.stop = true;
                true
            }
            Flow::Cancel => false,
        }
    }
}

/// The audio payload of each prompt position (empty for an arch without audio).
pub type AudioRows<'r> = Vec<Option<&'r [u8]>>;

/// What an arch supplies to the request loop. The defaults are the shared behaviour; an arch overrides a hook
/// where it (or one of its faults) differs.
pub trait Arch: Send + Sync + Sized + 'static {
    /// The arch's config: the shared base plus its own options.
    type Config: ArchConfig;
    type Layers: Layers;
    /// State one request's decode carries from step to step (glm53: the verified draft proposals).
    type Decoding: Default + Send;

    const INFO: ArchInfo;
    /// Whether a prompt longer than `max_ctx` is refused before anything runs. False: prefill runs until a
    /// segment no longer fits, and the record refuses that write (inkling).
    const REFUSES_OVERFLOW: bool = true;
    /// Whether a slot keeps the logits after its last fed position: what a request reusing its whole prompt
    /// samples from (only a fault reuses a whole prompt; an arch whose reuse can never reach it keeps none).
    const KEEPS_LOGITS: bool = true;

    /// The model from its tensors, each named once (`SpecList` lists them for a fixture, `Load` reads them).
    fn build(config: Self::Config, src: &mut dyn Source, hash: String) -> Result<Self>;
    fn config(&self) -> &BaseConfig;
    /// Short hash of config + weights.
    fn hash(&self) -> &str;
    /// What feeding one position costs the model (`ArchConfig::cost` of its config).
    fn cost(&self) -> crate::model_cost::ModelCost;
    /// A fresh slot's layers, sized for `config().initial_capacity` positions.
    fn new_layers(&self) -> Self::Layers;

    /// The arch's fields of `EngineInfo` (audio, window, prompt grid) on top of the shared ones.
    fn info(&self, base: EngineInfo) -> EngineInfo {
        base
    }

    /// Check the request's audio frames; the payload of each prompt position that is an audio frame.
    fn audio_rows<'r>(&self, req: &'r Request) -> Result<AudioRows<'r>> {
        if req.audio.is_empty() {
            return Ok(Vec::new());
        }
        Err(EngineError::BadRequest(format!("{} takes no audio frames ({} given)", Self::INFO.name, req.audio.len())))
    }

    /// Before anything of the request touches the slot (kimi's `kv-leak` re-allocates here).
    fn before_request(&self, _slot: &mut Slot<Self::Layers>, _fault: Option<Fault>) {}

    /// The reuse decision for `req` on its slot. Shared rule: the record's strict prefix (`counter-reuse`: the
    /// previous request's counts instead).
    fn decide(&self, slots: &[Slot<Self::Layers>], req: &Request, fault: Option<Fault>) -> Start {
        let slot = &slots[req.slot];
        if fault == Some(Fault::CounterReuse) {
            return Start::Own(slot.counter_reuse(req.prompt.len()));
        }
        Start::Own(slot.record.decide(&req.prompt))
    }

    /// Cut the request's slot back to what `start` keeps. Shared rule: no reuse starts over; otherwise the state
    /// stands as it is (it cannot be rewound) and covers the reused positions.
    fn resume(&self, slots: &mut [Slot<Self::Layers>], req: &Request, start: Start, _fault: Option<Fault>) {
        let slot = &mut slots[req.slot];
        match start.decision().reused() {
            0 => slot.reset(),
            reused => slot.len = reused,
        }
    }

    /// Prefill segments `[start, end)` covering positions `from..to`: `prefill_chunk` rows each from `from`.
    fn segments(&self, from: usize, to: usize, _fault: Option<Fault>) -> Vec<(usize, usize)> {
        let chunk = self.config().prefill_chunk.max(1);
        (from..to).step_by(chunk).map(|a| (a, (a + chunk).min(to))).collect()
    }

    /// Feed one prefill segment; the logits after its last position, or `None` when the segment was abandoned
    /// part way (only an arch that polls `progress` inside a segment abandons one).
    fn prefill(
        &self,
        slot: &mut Slot<Self::Layers>,
        seg: &Segment,
        progress: &mut Progress,
        fault: Option<Fault>,
    ) -> Option<Vec<f32>>;

    /// A segment was abandoned part way: shared rule, the record is tainted.
    fn abandoned(&self, slot: &mut Slot<Self::Layers>, _seg: &Segment, _fault: Option<Fault>) {
        slot.record.taint();
    }

    /// A CANCEL after a completed segment: shared rule, the record is tainted.
    fn cancelled(&self, slot: &mut Slot<Self::Layers>, _fault: Option<Fault>) {
        slot.record.taint();
    }

    /// After prefill ends (completed or stopped): inkling taints a record that took audio in.
    fn after_prefill(&self, _slot: &mut Slot<Self::Layers>, _audio: &AudioRows, _fault: Option<Fault>) {}

    /// The slot's length once position `pos` has been fed (glm's `stale-slot` never lowers it).
    fn len_after(&self, _len: usize, pos: usize, _fault: Option<Fault>) -> usize {
        pos + 1
    }

    /// Feed one decoded id; the logits after it.
    fn decode_step(
        &self,
        slot: &mut Slot<Self::Layers>,
        decoding: &mut Self::Decoding,
        step: &Step,
        fault: Option<Fault>,
    ) -> Vec<f32>;

    /// Whether decode records each id as it is fed (`bulk-record`: the reply is recorded after decode instead).
    fn records_in_decode(&self, fault: Option<Fault>) -> bool {
        fault != Some(Fault::BulkRecord)
    }

    /// Which ids decode may emit and which ends a reply (the bundled byte tokenizer's rule unless the model
    /// brings its own vocabulary).
    fn generable(&self) -> crate::decode::Generable {
        crate::decode::Generable::BYTES
    }

    /// The model's text side (the bundled byte tokenizer unless the model brings its own vocabulary).
    fn text(&self) -> Arc<dyn crate::text_tokenizer::TextTokenizer> {
        Arc::new(crate::tokenizer::Tokenizer)
    }

    /// After decode, failed or not (glm53 forgets the rows of proposals that were never fed).
    fn after_decode(&self, _slot: &mut Slot<Self::Layers>) {}
}

/// The `Arch` items every model provides the same way, inside `impl Arch for Model`: its `Config` type, its slot
/// layers, its decode state and its description; `build` is the model's own `build`, and `config` and `hash` read its
/// `config` and `hash` fields.
#[macro_export]
macro_rules! model_parts {
    ($layers:ty, $decoding:ty, $info:expr) => {
        type Config = Config;
        type Layers = $layers;
        type Decoding = $decoding;
        const INFO: $crate::engine_loop::ArchInfo = $info;

        fn build(
            config: Self::Config,
            src: &mut dyn $crate::tensors::Source,
            hash: String,
        ) -> $crate::error::Result<Self> {
            Model::build(config, src, hash)
        }

        fn config(&self) -> &$crate::config::BaseConfig {
            &self.config.base
        }

        fn hash(&self) -> &str {
            &self.hash
        }

        fn cost(&self) -> $crate::model_cost::ModelCost {
            $crate::config::ArchConfig::cost(&self.config)
        }
    };
}

/// An engine of arch `A`: shared weights plus the state of its slots.
pub struct BundledEngine<A: Arch> {
    arch: Arc<A>,
    fault: Option<Fault>,
    slots: Vec<Slot<A::Layers>>,
}

impl<A: Arch> BundledEngine<A> {
    pub fn new(arch: Arc<A>, fault: Option<Fault>) -> Self {
        let c = arch.config();
        let logits = if A::KEEPS_LOGITS { c.vocab } else { 0 };
        let slots = (0..c.slots).map(|_| Slot::new(arch.new_layers(), c.initial_capacity, logits, fault)).collect();
        BundledEngine { arch, fault, slots }
    }

    /// The arch (its weights and config).
    pub fn arch(&self) -> &A {
        &self.arch
    }

    /// The slots' states (tests read an arch's statistics here).
    pub fn slots(&self) -> &[Slot<A::Layers>] {
        &self.slots
    }

    pub fn slots_mut(&mut self) -> &mut [Slot<A::Layers>] {
        &mut self.slots
    }
}

/// The checks every engine makes before it touches a slot, in order: the slot, the prompt's length, its ids.
/// Runs `f` on a thread of rayon's pool (the caller waits): a decode step is a few dozen small parallel kernels,
/// and each one started from outside the pool is a hand-off to a sleeping worker and back, where from inside it
/// is a push onto the worker's own queue that it starts on at once. The engine loop runs each decode step this
/// way, and every arch each prefill segment; deepseek, which polls its observer between layers (an observer need
/// not be `Send`), runs each layer this way and polls on the calling thread.
pub fn on_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

fn check_request(req: &Request, slots: usize, vocab: usize) -> Result<()> {
    if req.slot >= slots {
        return Err(EngineError::NoSuchSlot { slot: req.slot, slots });
    }
    if req.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if let Some(&bad) = req.prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::BadRequest(format!("token id {bad} outside the vocabulary ({vocab})")));
    }
    Ok(())
}

/// The reply of a request that fed its whole prompt: what decode emitted and why it ended.
fn reply(decoded: Decoded, reused: usize, prompt_tokens: usize, timings: Timings, prefix_log: String) -> Reply {
    Reply {
        tokens: decoded.tokens,
        gaps: decoded.gaps,
        reused,
        prompt_tokens,
        timings,
        stop: decoded.stop.unwrap_or(StopReason::Length),
        prefix_log,
    }
}

impl<A: Arch> Engine for BundledEngine<A> {
    fn info(&self) -> EngineInfo {
        let c = self.arch.config();
        self.arch.info(EngineInfo {
            arch: c.arch.clone(),
            preset: c.preset.clone(),
            slots: c.slots,
            max_ctx: c.max_ctx,
            vocab: c.vocab,
            audio: false,
            audio_frame_bytes: 0,
            window: None,
            prompt_rows: None,
            initial_capacity: c.initial_capacity,
            fault: self.fault.map(|f| f.name().to_string()),
            model_hash: self.arch.hash().to_string(),
            cost: Some(self.arch.cost()),
        })
    }

    fn generate(&mut self, req: &Request, observer: &mut dyn Observer) -> Result<Reply> {
        let arch = Arc::clone(&self.arch);
        let c = arch.config();
        let fault = self.fault;
        check_request(req, self.slots.len(), c.vocab)?;
        let audio = arch.audio_rows(req)?;
        let len = req.prompt.len();
        if len > c.max_ctx && A::REFUSES_OVERFLOW {
            // a failed request leaves nothing reusable
            self.slots[req.slot].record.taint();
            return Err(EngineError::ContextExceeded { used: len, limit: c.max_ctx });
        }
        arch.before_request(&mut self.slots[req.slot], fault);
        let t0 = Instant::now();
        let slot = &mut self.slots[req.slot];
        let needed = len.saturating_add(req.max_tokens).min(c.max_ctx);
        if needed > slot.capacity {
            slot.grow(needed.max(slot.capacity * 2).min(c.max_ctx), fault);
        }

        let start = arch.decide(&self.slots, req, fault);
        let decision = start.decision();
        let prefix_log = self.slots[req.slot].record.log_line(len, decision);
        let mut reused = decision.reused();
        arch.resume(&mut self.slots, req, start, fault);
        let slot = &mut self.slots[req.slot];
        slot.last_prompt = len;
        slot.last_generated = 0;

        // prefill the tail segment by segment, recording each as it completes
        let mut logits = slot.last_logits.clone();
        let (mut pos, mut stop) = (reused, false);
        for (chunk, (a, b)) in arch.segments(reused, len, fault).into_iter().enumerate() {
            let ids = &req.prompt[a..b];
            if b > slot.capacity {
                // the state cannot hold this segment: the record refuses the write (and drops itself)
                slot.record.record(a, ids);
                return Err(EngineError::ContextExceeded { used: len, limit: c.max_ctx });
            }
            let writer = Writer {
                request: req.id,
                kind: WriterKind::Prefill { chunk: chunk as u32, chunk_rows: ids.len() as u32 },
            };
            let seg = Segment { ids, pos0: a, writer, audio: audio.get(a..b).unwrap_or(&[]) };
            let mut progress = Progress { observer: &mut *observer, stop: false };
            let Some(out) = arch.prefill(slot, &seg, &mut progress, fault) else {
                arch.abandoned(slot, &seg, fault);
                return Err(EngineError::Cancelled);
            };
            stop |= progress.stop;
            logits = out;
            slot.len = arch.len_after(slot.len, b - 1, fault);
            slot.record.record(a, ids);
            pos = b;
            match observer.on_progress() {
                Flow::Continue => {}
                Flow::Stop => stop = true,
                Flow::Cancel => {
                    arch.cancelled(slot, fault);
                    return Err(EngineError::Cancelled);
                }
            }
            if stop {
                break;
            }
        }
        arch.after_prefill(slot, &audio, fault);
        let prefill = t0.elapsed();
        if pos < len {
            // stopped mid-prefill: the segments fed stay recorded; there are no prompt logits to sample from
            if A::KEEPS_LOGITS {
                slot.last_logits = logits;
            }
            let timings = Timings { prefill, decode: Duration::default() };
            let decoded = Decoded { stop: Some(StopReason::Stopped), ..Decoded::default() };
            return Ok(reply(decoded, reused, len, timings, prefix_log));
        }

        let t1 = Instant::now();
        let capacity = slot.capacity;
        let records = arch.records_in_decode(fault);
        let mut decoding = A::Decoding::default();
        let decoded =
            crate::decode::decode_with(arch.generable(), logits, req, len, capacity, observer, |id, pos, index| {
                let writer = Writer { request: req.id, kind: WriterKind::Decode { step: index as u32 } };
                let step = Step { id, pos, index, req, writer };
                let next = crate::decode_team::run(|| arch.decode_step(slot, &mut decoding, &step, fault));
                if records {
                    slot.record.record(pos, &[id]);
                }
                slot.len = arch.len_after(slot.len, pos, fault);
                next
            });
        arch.after_decode(slot);
        // a failed decode leaves a half-updated state: nothing in it may be reused
        let mut decoded = decoded.inspect_err(|_| slot.record.taint())?;
        if !records {
            // bulk-record: the whole reply recorded after decode, claiming the never-fed last token
            slot.record.record(len, &decoded.tokens);
        }
        if A::KEEPS_LOGITS {
            slot.last_logits = std::mem::take(&mut decoded.last_logits);
        }
        slot.last_generated = decoded.tokens.len();
        reused = reused.min(slot.len);
        Ok(reply(decoded, reused, len, Timings { prefill, decode: t1.elapsed() }, prefix_log))
    }

    fn dump(&self, slot: usize) -> Result<StateDump> {
        let st = self.slots.get(slot).ok_or(EngineError::NoSuchSlot { slot, slots: self.slots.len() })?;
        Ok(StateDump::of_slot(self.info(), slot, (st.len, st.capacity), &st.record, st.layers.dump()))
    }

    fn reset(&mut self) {
        // exactly the state a new engine starts with
        *self = BundledEngine::new(Arc::clone(&self.arch), self.fault);
    }

    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(BundledEngine::new(Arc::clone(&self.arch), self.fault))
    }

    fn state_bytes(&self) -> usize {
        self.slots.iter().map(Slot::bytes).sum()
    }

    fn fault(&self) -> Option<Fault> {
        self.fault
    }

    fn text(&self) -> Arc<dyn crate::text_tokenizer::TextTokenizer> {
        self.arch.text()
    }
}

/// The tensors an `A` checkpoint holds, in checkpoint order.
pub fn tensors<A: Arch>(config: &A::Config) -> Result<Vec<TensorSpec>> {
    let mut list = SpecList::default();
    A::build(config.clone(), &mut list, String::new())?;
    Ok(list.0)
}

/// An engine of arch `A` over `weights` (every tensor's shape checked against the config).
pub fn open<A: Arch>(config: A::Config, weights: &Weights, fault: Option<Fault>) -> Result<Box<dyn Engine>> {
    config.validate().map_err(|message| EngineError::Config { path: weights.path().into(), message })?;
    let hash = crate::arch::model_hash::model_hash(&config, weights);
    let model = A::build(config, &mut Load(weights), hash)?;
    Ok(Box::new(BundledEngine::new(Arc::new(model), fault)))
}
