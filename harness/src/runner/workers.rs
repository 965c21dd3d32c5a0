//! `--jobs J`: the selected units of every scenario, run by J workers side by side, each unit on its own warm
//! instance. Records reach the sink in the order of a one-worker run — scenario by scenario, plan by plan, step by
//! step — whatever order the units finish in: the unit that is next in that order streams straight through (a crash
//! loses nothing it decided), later ones are held until every unit before them is done.
//!
//! Workers are plain threads, not a rayon pool: an in-process engine's own parallel kernels keep the whole
//! machine. Growth curves run alone (no other unit in flight), as they always did: they measure time. The plans of
//! an engine whose instances share one server run one at a time, in order, as one work item.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kvproof_engines::dump::StateDump;
use kvproof_engines::state_diff::StateDiff;

use super::Prepared;
use crate::progress::Progress;
use crate::record::{ProvenanceRef, Sink, TrialRecord, TurnRow};
use crate::scenario::Kind;

/// What one worker takes at a time: plans of one scenario, run in order.
struct Item {
    scenario: usize,
    plans: Vec<usize>,
    /// Runs with no other item in flight.
    alone: bool,
}

/// The work items of `prepared` (their selected plans), in the order records are written.
fn items(prepared: &[Prepared<'_>]) -> Vec<Item> {
    let mut out = Vec::new();
    for (si, p) in prepared.iter().enumerate() {
        if p.scenario.kind == Kind::GrowthCurve {
            out.extend(p.selected.iter().map(|&i| Item { scenario: si, plans: vec![i], alone: true }));
        } else if !p.launcher.parallel_plans() {
            if !p.selected.is_empty() {
                out.push(Item { scenario: si, plans: p.selected.clone(), alone: false });
            }
        } else {
            out.extend(p.selected.iter().map(|&i| Item { scenario: si, plans: vec![i], alone: false }));
        }
    }
    out
}

/// Run the selected plans of every prepared scenario with `jobs` workers (at least one); records go to `sink` in
/// the one-worker order and are returned in it.
pub fn run_all(prepared: &[Prepared<'_>], sink: &dyn Sink, progress: &Progress, jobs: usize) -> Vec<TrialRecord> {
    let items = items(prepared);
    let ordered = Ordered::new(sink, items.len());
    let results: Vec<Mutex<Vec<TrialRecord>>> = items.iter().map(|_| Mutex::new(Vec::new())).collect();
    let run_item = |i: usize| {
        let item = &items[i];
        let p = &prepared[item.scenario];
        progress.set_prefix(&p.scenario.name);
        let tagged = Tagged { ordered: &ordered, item: i };
        let records: Vec<TrialRecord> =
            item.plans.iter().flat_map(|&plan| super::run_unit(p, plan, &tagged, progress)).collect();
        ordered.done(i);
        *results[i].lock().unwrap_or_else(|e| e.into_inner()) = records;
    };
    let mut start = 0;
    while start < items.len() {
        if items[start].alone {
            run_item(start);
            start += 1;
            continue;
        }
        let end = items[start..].iter().position(|it| it.alone).map_or(items.len(), |n| start + n);
        let next = AtomicUsize::new(start);
        std::thread::scope(|s| {
            for _ in 0..jobs.clamp(1, end - start) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    run_item(i);
                });
            }
        });
        start = end;
    }
    results.into_iter().flat_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
}

/// Passes records to the sink in item order.
struct Ordered<'a> {
    sink: &'a dyn Sink,
    state: Mutex<OrderState>,
}

struct OrderState {
    /// The first item not yet done: its records go straight through.
    head: usize,
    done: Vec<bool>,
    held: BTreeMap<usize, Vec<TrialRecord>>,
}

impl<'a> Ordered<'a> {
    fn new(sink: &'a dyn Sink, items: usize) -> Self {
        Ordered { sink, state: Mutex::new(OrderState { head: 0, done: vec![false; items], held: BTreeMap::new() }) }
    }

    fn trial(&self, item: usize, t: &TrialRecord) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if item == st.head {
            self.sink.trial(t);
        } else {
            st.held.entry(item).or_default().push(t.clone());
        }
    }

    fn done(&self, item: usize) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = st.done.get_mut(item) {
            *d = true;
        }
        while st.done.get(st.head).copied().unwrap_or(false) {
            st.head += 1;
            let head = st.head;
            for t in st.held.remove(&head).unwrap_or_default() {
                self.sink.trial(&t);
            }
        }
    }
}

/// The sink one item's runner writes to.
struct Tagged<'a, 'b> {
    ordered: &'b Ordered<'a>,
    item: usize,
}

impl Sink for Tagged<'_, '_> {
    fn trial(&self, t: &TrialRecord) {
        self.ordered.trial(self.item, t);
    }
    fn turn(&self, row: &TurnRow) {
        self.ordered.sink.turn(row);
    }
    fn provenance(&self, case: &str, warm: &StateDump, cold: &StateDump, diff: &StateDiff) -> Option<ProvenanceRef> {
        self.ordered.sink.provenance(case, warm, cold, diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Lines(Mutex<Vec<String>>);
    impl Sink for Lines {
        fn trial(&self, t: &TrialRecord) {
            self.0.lock().expect("lines").push(t.plan.clone());
        }
        fn turn(&self, _: &TurnRow) {}
    }

    fn rec(plan: &str) -> TrialRecord {
        TrialRecord::new("s", Kind::StressPairs, plan, 0, "turn 1", 0)
    }

    #[test]
    fn records_of_later_items_wait_for_the_earlier_ones() {
        let lines = Lines::default();
        let o = Ordered::new(&lines, 3);
        o.trial(2, &rec("c1"));
        o.trial(0, &rec("a1"));
        o.trial(1, &rec("b1"));
        o.done(2);
        o.trial(0, &rec("a2"));
        assert_eq!(*lines.0.lock().expect("lines"), ["a1", "a2"]);
        o.done(0);
        assert_eq!(*lines.0.lock().expect("lines"), ["a1", "a2", "b1"]);
        o.trial(1, &rec("b2"));
        o.done(1);
        assert_eq!(*lines.0.lock().expect("lines"), ["a1", "a2", "b1", "b2", "c1"]);
    }
}
