//! Kimi (modelled on kimi_k3.c): about 3 of 4 layers are KDA — gated delta-rule linear attention with a
//! per-channel decay and a matrix state per head, short convolutions on q/k/v — and every `mla_every`-th layer and
//! the last are gated MLA (NoPE) caching one latent row per position. MoE FFN.
//!
//! Reuse is strict-prefix via the record: a recurrent state cannot be rewound, so a prompt that extends every id the
//! state was built from prefills only its tail, and anything else starts over. The state's buffers live as long as
//! the slot (reset in place, grown with the context), so the bytes it holds follow the context, not the turn count.

mod forward;
mod model;
mod state;

pub use model::{Config, Model};
use state::State;

use crate::engine::Request;
use crate::engine_loop::{on_worker, Arch, ArchInfo, DeclaredReuse, Progress, Segment, Slot, Start, Step};
use crate::fault::Fault;
use crate::prefix::{Decision, NoReuse};

pub const INFO: ArchInfo = ArchInfo {
    name: "kimi",
    modelled_on: "kimi_k3.c",
    state: "KDA matrix states (heads x hd x hd, f32) + q/k/v short-conv windows on ~3 of 4 layers; gated MLA \
            (NoPE) latent rows on every mla_every-th layer and the last",
    reuse_rule: "strict prefix via the record (a recurrent state cannot be rewound); buffers kept across turns and \
                 grown with the context, never leaked",
    declares: DeclaredReuse::Strict,
    faults: &[Fault::KvLeak, Fault::TruncateRecurrent],
};

impl Arch for Model {
    crate::model_parts!(State, (), INFO);

    fn new_layers(&self) -> State {
        State::new(self)
    }

    /// `kv-leak` (kimi_k3.c's per-turn kv_alloc): fresh buffers every request — a copy, so this turn still
    /// answers right — and the old ones kept alive, never freed.
    fn before_request(&self, slot: &mut Slot<State>, fault: Option<Fault>) {
        if fault == Some(Fault::KvLeak) {
            let st = &mut slot.layers;
            let copy = st.layers.clone();
            st.leaked.push(std::mem::replace(&mut st.layers, copy));
        }
    }

    /// `truncate-recurrent`: LCP truncation, as position-addressed caches allow, applied to recurrent states too.
    fn decide(&self, slots: &[Slot<State>], req: &Request, fault: Option<Fault>) -> Start {
        let record = &slots[req.slot].record;
        let decision = record.decide(&req.prompt);
        if fault == Some(Fault::TruncateRecurrent) {
            if let Decision::Fresh(NoReuse::Diverged { .. } | NoReuse::Shorter) = decision {
                let lcp = record.ids().iter().zip(&req.prompt).take_while(|(a, b)| a == b).count();
                let n = lcp.min(req.prompt.len() - 1);
                if n > 0 {
                    return Start::Own(Decision::Reuse(n));
                }
            }
        }
        Start::Own(decision)
    }

    fn resume(&self, slots: &mut [Slot<State>], req: &Request, start: Start, _: Option<Fault>) {
        let slot = &mut slots[req.slot];
        let reused = start.decision().reused();
        if reused == 0 {
            slot.reset();
        } else if reused < slot.len {
            // only reachable under truncate-recurrent
            slot.layers.truncate_latent(reused);
            slot.len = reused;
        }
    }

    fn prefill(&self, slot: &mut Slot<State>, seg: &Segment, _: &mut Progress, _: Option<Fault>) -> Option<Vec<f32>> {
        Some(on_worker(|| self.forward(&mut slot.layers, seg)))
    }

    fn decode_step(&self, slot: &mut Slot<State>, _: &mut (), s: &Step, _: Option<Fault>) -> Vec<f32> {
        self.forward(&mut slot.layers, &s.segment())
    }
}
