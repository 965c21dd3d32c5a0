//! glm53's invariants broken on purpose: the provenance diff localises the first divergent layer and position and
//! names the writers — decode vs prefill, and the chunk sizes.

use kvproof::provenance::diff_files;
use kvproof_engines::config::Preset;
use kvproof_engines::dump::{Writer, WriterKind};
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::scratch_dir::ScratchDir;
use kvproof_engines::{bundled, dump};

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 32 + (i * 7 + salt) % 90).collect()
}

/// Turn 1 (`first` ids, `replies` tokens) on a warm engine, then `second` on it and on a fresh one; the diff of
/// their states after turn 2.
fn turn_two(fault: Fault, first: Vec<u32>, replies: usize, extend: usize) -> kvproof_engines::state_diff::StateDiff {
    let mut warm = bundled::open_preset("glm53", Preset::Tiny, 0, Some(fault)).expect("glm53");
    let r1 = warm
        .generate(
            &Request { id: 1, prompt: first.clone(), max_tokens: replies, ignore_eos: true, ..Default::default() },
            &mut NoObserver,
        )
        .expect("turn 1");
    let mut second = first;
    second.extend(&r1.tokens);
    second.extend(ids(extend, 5));
    let req = Request { id: 2, prompt: second, max_tokens: 1, ..Default::default() };
    warm.generate(&req, &mut NoObserver).expect("turn 2 warm");
    let mut cold: Box<dyn Engine> = warm.fresh();
    cold.generate(&Request { id: 3, ..req }, &mut NoObserver).expect("turn 2 cold");
    let dir = ScratchDir::new(&format!("glm53-{}-{}", std::process::id(), fault.name()));
    let (w, c) = (dir.join("warm.safetensors"), dir.join("cold.safetensors"));
    dump::write_file(&warm.dump(0).expect("dump"), &w).expect("write");
    dump::write_file(&cold.dump(0).expect("dump"), &c).expect("write");
    diff_files(&w, &c).expect("diff")
}

#[test]
fn no_canonical_bound_names_the_decode_written_row() {
    // prompt 32 + 20 generated: the record reaches 51, the faulty bound reuses 48 — rows 32..48 were written by
    // decode, which a cold prefill of the same prompt writes in grid chunks of 16
    let d = turn_two(Fault::NoCanonicalBound, ids(32, 1), 20, 5);
    let first = d.first.as_ref().expect("states diverge");
    assert_eq!((first.layer, Some(first.position)), (0, Some(32)), "{}", d.headline("warm", "cold"));
    assert!(matches!(first.writer_a, Some(Writer { request: 1, kind: WriterKind::Decode { step: 0 } })), "{first:?}");
    assert!(
        matches!(first.writer_b, Some(Writer { request: 3, kind: WriterKind::Prefill { chunk: 2, chunk_rows: 16 } })),
        "{first:?}"
    );
    assert_eq!(
        d.headline("warm", "cold"),
        "layer 0 `k`, pos 32: warm row by decode (req 1, step 0), cold row by prefill (req 3, chunk 2 of 16 rows)"
    );
}

#[test]
fn variable_chunks_names_the_differently_sized_chunks() {
    // 40 ids chunked by the length-dependent chunker: 3 chunks of 14; the cold 47-id prompt: chunks of 16
    let d = turn_two(Fault::VariableChunks, ids(40, 2), 1, 6);
    let first = d.first.as_ref().expect("states diverge");
    let rows = |w: Option<Writer>| match w {
        Some(Writer { kind: WriterKind::Prefill { chunk_rows, .. }, .. }) => Some(chunk_rows),
        _ => None,
    };
    assert_eq!(first.layer, 0, "{}", d.headline("warm", "cold"));
    assert_eq!((rows(first.writer_a), rows(first.writer_b)), (Some(14), Some(16)), "{}", d.headline("warm", "cold"));
    assert!(d.headline("warm", "cold").contains("of 14 rows), cold row by prefill (req 3, chunk 0 of 16 rows)"));
}

#[test]
fn drafter_not_resumed_shows_only_in_the_drafter_rows() {
    let d = turn_two(Fault::DrafterNotResumed, ids(40, 2), 6, 6);
    // the drafter's rows are dumped at layer indices past the main model's 8 layers
    let first = d.first.as_ref().expect("drafter rows diverge");
    assert!(first.layer >= 8, "only the drafter's rows may differ: {}", d.headline("warm", "cold"));
}
