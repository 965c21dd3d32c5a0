//! Provenance diffs on real dumps: identical states, a rotated ring (inkling `ring-linear-copy`), unreadable
//! and incomparable dumps, and the heatmap.

use std::path::{Path, PathBuf};

use kvproof::provenance::{diff_files, render, MappedDump, ProvenanceError};
use kvproof_engines::bundled::ModelConfig;
use kvproof_engines::chat::{render as chat, Message, Role};
use kvproof_engines::config::Preset;
use kvproof_engines::engine::{Engine, NoObserver, Request};
use kvproof_engines::fault::Fault;
use kvproof_engines::tokenizer::{EOS, ROLE_ASSISTANT, ROLE_USER};
use kvproof_engines::{bundled, dump, fixture};

use crate::support;
use support::tmp;

fn inkling(fault: Option<Fault>) -> Box<dyn Engine> {
    let overrides = serde_json::json!({"initial_capacity": 32});
    let c = ModelConfig::with_overrides("inkling", Preset::Tiny, overrides.as_object().expect("object")).expect("tiny");
    let w = fixture::generate_weights(&c, 0).expect("fixture");
    bundled::open(c, w, fault).expect("open")
}

/// Turn 1 wraps the window of 8 (29 positions fed); turn 2 grows the slot past 32 with a 6-id tail, so part of
/// the ring is still as the grow left it. Returns (warm dump path, cold dump path).
fn grown_ring(fault: Option<Fault>, dir: &Path) -> (PathBuf, PathBuf) {
    let user: Vec<u32> = b"tell me about ring buffe".iter().map(|&b| b as u32).collect();
    let p1 = chat(&[Message::new(Role::User, user)], true);
    assert_eq!(p1.len(), 28);
    let mut warm = inkling(fault);
    let r1 = warm
        .generate(
            &Request { id: 1, prompt: p1.clone(), max_tokens: 2, ignore_eos: true, ..Default::default() },
            &mut NoObserver,
        )
        .expect("turn 1");
    let mut p2 = p1;
    p2.extend(&r1.tokens);
    p2.extend([EOS, ROLE_USER, b'?' as u32, EOS, ROLE_ASSISTANT]);
    let req2 = Request { id: 2, prompt: p2, max_tokens: 1, ..Default::default() };
    warm.generate(&req2, &mut NoObserver).expect("turn 2 warm");
    let mut cold = warm.fresh();
    cold.generate(&req2, &mut NoObserver).expect("turn 2 cold");
    let (w, c) = (dir.join("warm.safetensors"), dir.join("cold.safetensors"));
    dump::write_file(&warm.dump(0).expect("dump"), &w).expect("write warm");
    dump::write_file(&cold.dump(0).expect("dump"), &c).expect("write cold");
    (w, c)
}

#[test]
fn clean_engine_gives_identical_states() {
    let dir = tmp("clean");
    let (w, c) = grown_ring(None, &dir);
    let d = diff_files(&w, &c).expect("diff");
    assert!(d.identical(), "{}", render::table(&d, ("warm", "warm.safetensors"), ("cold", "cold.safetensors")));
    assert!(d.layers.iter().all(|l| l.rows.rows_compared > 0));
    assert_eq!(d.headline("warm", "cold"), "states identical");
    // what the heatmap greys as identical: a ring layer only its window (8 positions, the last ones), a global
    // layer every position
    for t in &d.tensors {
        let held: i64 = t.compared.iter().map(|(a, b)| b - a).sum();
        assert_eq!(held as usize, t.rows.rows_compared, "layer {} {}: {:?}", t.layer, t.name, t.compared);
        use kvproof_engines::dump::CacheKind;
        let end = d.covered as i64;
        if t.kind == CacheKind::Ring {
            assert_eq!(t.compared, vec![(end - 8, end)], "layer {} {}", t.layer, t.name);
        } else if t.kind == CacheKind::Conv {
            // the short convolution keeps its last few inputs
            assert_eq!(t.compared, vec![(end - t.rows.rows_compared as i64, end)], "layer {} {}", t.layer, t.name);
            assert!(t.rows.rows_compared < 8, "layer {} {}: {:?}", t.layer, t.name, t.compared);
        } else {
            assert_eq!(t.compared, vec![(0, d.covered as i64)], "layer {} {}", t.layer, t.name);
        }
    }
}

#[test]
fn ring_linear_copy_shows_the_rotation_and_the_first_divergent_layer() {
    let dir = tmp("rotated");
    let (w, c) = grown_ring(Some(Fault::RingLinearCopy), &dir);
    let d = diff_files(&w, &c).expect("diff");
    let table = render::table(&d, ("warm", "warm.safetensors"), ("cold", "cold.safetensors"));
    let ring = d.tensors.iter().find(|t| t.layer == 0 && t.name == "k").expect("layer 0 k");
    assert!(ring.misplaced_a > 0, "the warm ring holds rows where their position does not map:\n{table}");
    assert_eq!(ring.misplaced_b, 0, "the cold ring is laid out by position:\n{table}");
    // 29 positions fed before the grow: the linear copy put position 21 at row 0, i.e. rotated by 3
    assert_eq!(ring.rotation_a, Some(3), "{table}");
    assert!(table.contains("rotation warm 3"), "{table}");
    // layer 0's new k/v rows come straight from the embeddings, so they agree; its attention read the rotated
    // ring, so every later layer's rows diverge from the first position turn 2 wrote
    let first = d.first.as_ref().expect("states diverge");
    assert_eq!((first.layer, Some(first.position)), (1, Some(29)), "{table}");
    assert_eq!(
        d.headline("warm", "cold"),
        "layer 1 `k`, pos 29: warm row by prefill (req 2, chunk 0 of 6 rows), cold row by prefill (req 2, chunk 1 of 16 rows)"
    );
    assert!(!d.identical());
    // heatmap in both formats
    for name in ["heatmap.svg", "heatmap.png"] {
        let path = dir.join(name);
        kvproof::plot::heatmap::draw(&d, &path, "warm vs cold, inkling ring-linear-copy").expect("draw");
        assert!(std::fs::metadata(&path).expect("plot written").len() > 1000);
    }
    render::write_csv(&d, &dir.join("diff.csv")).expect("csv");
    let csv = std::fs::read_to_string(dir.join("diff.csv")).expect("csv");
    assert!(csv.starts_with("layer,rows_compared"));
}

#[test]
fn truncated_and_foreign_files_are_explained() {
    let dir = tmp("bad");
    let (w, _) = grown_ring(None, &dir);
    let bytes = std::fs::read(&w).expect("read");
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    let err = MappedDump::open(&cut).expect_err("truncated").to_string();
    assert!(err.contains("cut.safetensors") && err.contains("truncated"), "{err}");
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"definitely not a dump").expect("write");
    let err = MappedDump::open(&junk).expect_err("junk").to_string();
    assert!(err.contains("junk.safetensors"), "{err}");
}

#[test]
fn dumps_of_different_models_are_incomparable_not_a_panic() {
    let dir = tmp("other");
    let (w, _) = grown_ring(None, &dir);
    let mut other = bundled::open_preset("inkling", Preset::Small, 0, None).expect("small");
    other
        .generate(&Request { id: 1, prompt: vec![65; 10], max_tokens: 1, ..Default::default() }, &mut NoObserver)
        .expect("gen");
    let o = dir.join("small.safetensors");
    dump::write_file(&other.dump(0).expect("dump"), &o).expect("write");
    let err = diff_files(&w, &o).expect_err("incomparable");
    assert!(matches!(err, ProvenanceError::Incomparable(_)), "{err}");
}
