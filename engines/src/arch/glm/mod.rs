//! glm (modelled on colibri.c, GLM-5.2): MLA attention caching the latent per position (a `kv_lora` row and a
//! `qk_rope` row), a MoE FFN, and several slots, each pinned to its conversation.
//!
//! Reuse: a request on slot s truncates s to the longest common prefix of s's record and the prompt, bounded by
//! prompt length - 1, and extends it — so an exact repeat or a shorter prompt reuses too. With `kv_share` on, a
//! request on an empty slot adopts the longest matching prefix another slot holds by copying its rows (writer
//! `Copied{from_slot}`). Both are exact because the rows are position-addressed and batch-invariant.

mod forward;
mod model;
mod reuse;
mod state;

pub use model::{Config, Model};
use state::State;

use crate::dump::{Writer, WriterKind};
use crate::engine::Request;
use crate::engine_loop::{on_worker, Arch, ArchInfo, DeclaredReuse, Progress, Segment, Slot, Start, Step};
use crate::error::Result;
use crate::fault::Fault;

pub const INFO: ArchInfo = ArchInfo {
    name: "glm",
    modelled_on: "colibri.c (GLM-5.2)",
    state: "MLA latent rows (kv_lora + qk_rope per position, position-addressed) in several pinned slots",
    reuse_rule: "truncate the slot to the longest common prefix with its record, bounded by prompt length - 1, \
                 and extend; with kv_share, an empty slot copies the longest matching prefix of another slot",
    declares: DeclaredReuse::Lcp,
    faults: &[
        Fault::CounterReuse,
        Fault::BulkRecord,
        Fault::MemcmpShort,
        Fault::ReuseEqual,
        Fault::DropGrowRecord,
        Fault::StaleSlot,
        Fault::ShareOffByOne,
    ],
};

impl Arch for Model {
    crate::model_parts!(State, (), INFO);

    fn new_layers(&self) -> State {
        State::new(&self.config)
    }

    /// glm takes no audio frames (its refusal does not count them).
    fn audio_rows<'r>(&self, req: &'r Request) -> Result<crate::engine_loop::AudioRows<'r>> {
        if !req.audio.is_empty() {
            return Err(crate::error::EngineError::BadRequest("glm takes no audio frames".into()));
        }
        Ok(Vec::new())
    }

    /// With `kv_share` on and an empty slot, the longest prefix another slot holds; else the slot's own LCP.
    fn decide(&self, slots: &[Slot<State>], req: &Request, fault: Option<Fault>) -> Start {
        if self.config.kv_share {
            if let Some((from, n)) = reuse::share_source(slots, req.slot, &req.prompt, fault) {
                return Start::Copy { from, n };
            }
        }
        Start::Own(reuse::own(&slots[req.slot], &req.prompt, fault))
    }

    /// Truncate the slot to what it keeps, or copy another slot's rows into it (writer `Copied`); the record then
    /// holds the prompt's first n ids.
    fn resume(&self, slots: &mut [Slot<State>], req: &Request, start: Start, fault: Option<Fault>) {
        let to = req.slot;
        let (from, n) = match start {
            Start::Own(d) => return slots[to].truncate(d.reused(), fault),
            Start::Copy { from, n } => (from, n),
        };
        let writer = Writer { request: req.id, kind: WriterKind::Copied { from_slot: from as u32 } };
        let (donor, target) = if from < to {
            let (a, b) = slots.split_at_mut(to);
            (&a[from], &mut b[0])
        } else {
            let (a, b) = slots.split_at_mut(from);
            (&b[0], &mut a[to])
        };
        target.truncate(0, fault);
        target.layers.copy_from(&donor.layers, n, writer);
        target.len = n;
        target.record.record(0, &req.prompt[..n]);
    }

    fn prefill(&self, slot: &mut Slot<State>, seg: &Segment, _: &mut Progress, _: Option<Fault>) -> Option<Vec<f32>> {
        Some(on_worker(|| self.forward(&mut slot.layers.kv, seg, None)))
    }

    /// `stale-slot`: the kv length is never lowered, so decode attends to the previous conversation's rows.
    fn len_after(&self, len: usize, pos: usize, fault: Option<Fault>) -> usize {
        if fault == Some(Fault::StaleSlot) {
            len.max(pos + 1)
        } else {
            pos + 1
        }
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, fault: Option<Fault>) -> Vec<f32> {
        // the slot's kv length after this id: decode attends to all of it
        let kv_len = self.len_after(slot.len, s.pos, fault);
        self.forward(&mut slot.layers.kv, &s.segment(), Some(kv_len))
    }
}
