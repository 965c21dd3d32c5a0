//! Every glm53 fault is caught by a warm/cold comparison (tokens, or the dumps matched row by row by absolute
//! position, with the writers of the first differing row) or by the reuse count — and the same scenario passes
//! with the fault off.

use kvproof_engines::arch::glm53::Config as ModelConfig;
use kvproof_engines::config::{ArchConfig, Preset};
use kvproof_engines::dump::{DumpTensor, StateDump};
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::{bundled, fixture};

fn open(fault: Option<Fault>) -> Box<dyn Engine> {
    let c = ModelConfig::preset(Preset::Tiny);
    let weights = fixture::generate_weights(&c.clone().into(), 0).expect("fixture");
    bundled::open(c.into(), weights, fault).expect("open")
}

/// Deterministic byte ids, different per salt.
fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt.wrapping_mul(97)) >> 9) % 256).collect()
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { id, prompt, max_tokens, ignore_eos: true, ..Default::default() }
}

/// The first row both dumps hold at the same absolute position with different bits, and who wrote each.
fn first_difference(a: &StateDump, b: &StateDump) -> Option<String> {
    let writer = |t: &DumpTensor, r: usize| t.writers[r].map(|w| w.to_string()).unwrap_or_else(|| "nobody".into());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        for i in 0..x.rows() {
            let p = x.positions[i];
            let Some(j) = (p >= 0).then(|| y.row_of_position(p)).flatten() else { continue };
            if x.row(i).iter().zip(y.row(j)).any(|(u, v)| u.to_bits() != v.to_bits()) {
                return Some(format!(
                    "layer {} {} position {p}: warm row by {}, cold row by {}",
                    x.layer,
                    x.name,
                    writer(x, i),
                    writer(y, j)
                ));
            }
        }
    }
    None
}

/// What the checks saw on the compared turn.
#[derive(Debug, Default)]
struct Seen {
    reused: usize,
    reuse_wrong: bool,
    tokens_differ: bool,
    /// The first differing row, with the writers of both.
    state_differs: Option<String>,
}

impl Seen {
    fn caught(&self) -> bool {
        self.reuse_wrong || self.tokens_differ || self.state_differs.is_some()
    }
}

/// Turn 1 = `first` (replying `max_tokens`), turn 2 = `first` + the whole reply + `more` on the warm engine, and
/// turn 2 alone on a cold one.
fn run(fault: Option<Fault>, first: Vec<u32>, max_tokens: usize, more: Vec<u32>, expected_reuse: usize) -> Seen {
    let mut warm = open(fault);
    let r1 = warm.generate(&req(1, first.clone(), max_tokens), &mut NoObserver).expect("turn 1");
    let mut second = first;
    second.extend_from_slice(&r1.tokens);
    second.extend(more);
    let r2 = req(2, second, 5);
    let w = warm.generate(&r2, &mut NoObserver).expect("warm turn 2");
    let mut cold = warm.fresh();
    let c = cold.generate(&r2, &mut NoObserver).expect("cold turn 2");
    Seen {
        reused: w.reused,
        reuse_wrong: w.reused != expected_reuse,
        tokens_differ: w.tokens != c.tokens,
        state_differs: first_difference(&warm.dump(0).expect("dump"), &cold.dump(0).expect("dump")),
    }
}

fn assert_caught(fault: Fault, first: Vec<u32>, max_tokens: usize, more: Vec<u32>, expected: usize) -> Seen {
    let clean = run(None, first.clone(), max_tokens, more.clone(), expected);
    assert!(!clean.caught(), "{fault}: the clean engine must pass the same scenario: {clean:?}");
    assert_eq!(clean.reused, expected);
    let broken = run(Some(fault), first, max_tokens, more, expected);
    assert!(broken.caught(), "{fault} survived: {broken:?}");
    broken
}

#[test]
fn variable_chunks_is_caught_by_the_rows_of_the_reused_prefix() {
    // 40 ids are cut 14/14/12 by the original chunker, 47 ids 16/16/15: the reused rows 0..32 were written by
    // chunks a cold run of the second prompt never uses. (The split follows the row count, and 13 to 15 rows
    // happen to tile a 64-wide reduction alike, so lengths cut into those sizes would hide it: as on a GPU.)
    let seen = assert_caught(Fault::VariableChunks, ids(40, 1), 4, ids(3, 2), 32);
    let diff = seen.state_differs.expect("rows differ");
    assert!(
        diff.contains("position 0") && diff.contains("chunk 0 of 14 rows") && diff.contains("chunk 0 of 16 rows"),
        "{diff}"
    );
    assert!(!seen.reuse_wrong, "the reuse count alone does not show this fault");
}

#[test]
fn no_canonical_bound_is_caught_on_a_reply_that_crosses_the_grid() {
    // prompt 32 + 20 replies: decode wrote rows 32..51; the fault reuses 48 where the rule says 32
    let seen = assert_caught(Fault::NoCanonicalBound, ids(32, 3), 20, ids(5, 4), 32);
    assert_eq!(seen.reused, 48);
    assert_eq!(
        seen.state_differs.as_deref(),
        Some("layer 0 k position 32: warm row by decode (req 1, step 0), cold row by prefill (req 2, chunk 2 of 16 rows)")
    );
}

#[test]
fn no_grid_quantize_is_caught_by_the_reuse_count_and_the_rows() {
    // the previous prompt (40) ends mid-grid: rows 32..40 were written by an 8-row chunk, cold writes 16
    let seen = assert_caught(Fault::NoGridQuantize, ids(40, 5), 4, ids(10, 6), 32);
    assert_eq!(seen.reused, 40);
    let diff = seen.state_differs.expect("rows differ");
    assert!(diff.contains("position 32") && diff.contains("chunk 2 of 8 rows"), "{diff}");
}

#[test]
fn drafter_not_resumed_is_caught_by_the_drafters_rows() {
    // verification is exact, so the tokens survive it: the drafter's own rows show it
    let seen = assert_caught(Fault::DrafterNotResumed, ids(40, 7), 6, ids(10, 8), 32);
    let diff = seen.state_differs.expect("rows differ");
    assert!(diff.contains("draft_"), "{diff}");
}

#[test]
fn every_glm53_fault_has_a_test_here() {
    let tested = [Fault::VariableChunks, Fault::NoCanonicalBound, Fault::NoGridQuantize, Fault::DrafterNotResumed];
    assert_eq!(bundled::arch("glm53").expect("glm53").faults, &tested);
}
