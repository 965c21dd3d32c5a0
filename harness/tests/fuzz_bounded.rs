//! Bounded fuzzing on every `cargo test`: each fuzz target (the functions fuzz/fuzz_targets/ hand to libFuzzer)
//! runs its seed corpus (fuzz/corpus/<target>/) and then structured mutations of those seeds — flipped and
//! interesting bytes, length and count fields rewritten to huge values, truncations, splices — under an
//! allocator that counts what the target allocates. A target must return (errors are fine) without panicking,
//! and its peak live memory must stay within a small multiple of the input's size: that is the "nothing is
//! allocated because a header says so" rule, checked on every input rather than only on the ones a test author
//! thought of. `KVPROOF_FUZZ_CASES` sets the mutations per target (default 20000, about 5 s for all targets); long runs use cargo-fuzz
//! (docs/fuzzing.md).

// The counting allocator below is the only unsafe code in the workspace: a GlobalAlloc impl cannot be written
// without it. It forwards every call to the system allocator unchanged and only keeps counters.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Live and peak bytes allocated by this thread (targets run on the test's own thread; the counters are per
/// thread so that tests running side by side do not see each other's memory).
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// Larger single requests are refused outright (the process then aborts naming the size): no target may
/// ever need this much, and on an overcommitting kernel such a request would otherwise "succeed".
const REFUSE_OVER: usize = 1 << 32;

fn on_alloc(size: usize) {
    // try_with: the thread-locals may already be gone while a thread exits
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn on_free(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        on_alloc(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        on_alloc(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        on_free(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        on_free(layout.size());
        on_alloc(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak live bytes while `f` runs, above what was live when it started.
fn peak_during(f: impl FnOnce()) -> usize {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    f();
    PEAK.with(Cell::get).saturating_sub(base)
}

/// What a target may allocate for an input of `len` bytes: a fixed allowance for tables, buffers and error
/// messages, plus a generous multiple of the input (a dump's f32 rows decoded, a parsed JSON tree).
fn budget(len: usize) -> usize {
    (48 << 20) + 64 * len
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> =
        files.iter().map(|f| std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()))).collect();
    // small seeds keep the bounded run fast and the mutations near the structure
    for (f, seed) in files.iter().zip(&seeds) {
        assert!(seed.len() < 64 << 10, "{}: {} bytes, seeds stay under 64 KiB", f.display(), seed.len());
    }
    assert!(!seeds.is_empty(), "{}: no seed inputs", dir.display());
    seeds
}

/// One edit of an input. Offsets and lengths are taken modulo the input's length when applied.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        value: u8,
    },
    /// Overwrite 8 bytes (a u64/usize/f64 field, or two u32s) with a value that breaks size arithmetic.
    SetWord {
        at: usize,
        value: u64,
    },
    /// Rewrite the digits of the decimal number at or after `at` (JSON lengths, frame counts).
    SetNumber {
        at: usize,
        value: u64,
    },
    Truncate {
        at: usize,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// Copy a piece of another seed in (keeps structure that random bytes never reach).
    Splice {
        at: usize,
        seed: usize,
        from: usize,
        len: usize,
    },
    Duplicate {
        at: usize,
        len: usize,
    },
}

const INTERESTING_WORDS: [u64; 10] =
    [0, 1, 0x7f, 0xff, 0x7fff_ffff, 0xffff_ffff, 1_000_000_000_000, 1 << 62, i64::MAX as u64, u64::MAX];

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![proptest::sample::select(INTERESTING_WORDS.to_vec()), any::<u64>()];
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (any::<usize>(), prop_oneof![Just(0u8), Just(0xff), Just(b'"'), Just(b'\n'), Just(b'['), any::<u8>()])
            .prop_map(|(at, value)| Mutation::SetByte { at, value }),
        (any::<usize>(), word.clone()).prop_map(|(at, value)| Mutation::SetWord { at, value }),
        (any::<usize>(), word).prop_map(|(at, value)| Mutation::SetNumber { at, value }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), any::<usize>(), any::<usize>(), 1usize..256)
            .prop_map(|(at, seed, from, len)| Mutation::Splice { at, seed, from, len }),
        (any::<usize>(), 1usize..512).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
    ]
}

fn apply(input: &mut Vec<u8>, m: &Mutation, seeds: &[Vec<u8>]) {
    let n = input.len();
    let pos = |at: usize| if n == 0 { 0 } else { at % n };
    match m {
        Mutation::FlipBit { at, bit } if n > 0 => input[pos(*at)] ^= 1 << bit,
        Mutation::SetByte { at, value } if n > 0 => input[pos(*at)] = *value,
        Mutation::SetWord { at, value } if n >= 8 => {
            let at = at % (n - 7);
            input[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        Mutation::SetNumber { at, value } if n > 0 => {
            let Some(start) = input[pos(*at)..].iter().position(u8::is_ascii_digit).map(|i| i + pos(*at)) else {
                return;
            };
            let end = input[start..].iter().position(|b| !b.is_ascii_digit()).map_or(n, |i| i + start);
            input.splice(start..end, value.to_string().into_bytes());
        }
        Mutation::Truncate { at } => input.truncate(if n == 0 { 0 } else { at % (n + 1) }),
        Mutation::Delete { at, len } if n > 0 => {
            let at = pos(*at);
            input.drain(at..(at + len).min(n));
        }
        Mutation::Insert { at, bytes } => {
            let at = if n == 0 { 0 } else { at % (n + 1) };
            input.splice(at..at, bytes.iter().copied());
        }
        Mutation::Splice { at, seed, from, len } => {
            let other = &seeds[seed % seeds.len()];
            if other.is_empty() {
                return;
            }
            let from = from % other.len();
            let piece = other[from..(from + len).min(other.len())].to_vec();
            let at = if n == 0 { 0 } else { at % (n + 1) };
            input.splice(at..at, piece);
        }
        Mutation::Duplicate { at, len } if n > 0 => {
            let at = pos(*at);
            let piece = input[at..(at + len).min(n)].to_vec();
            input.splice(at..at, piece);
        }
        _ => {}
    }
}

fn cases() -> u32 {
    std::env::var("KVPROOF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

/// Run `target` over its seeds, then over `cases()` mutated seeds; fail on a panic or on memory beyond
/// `budget`, naming the input (proptest shrinks it to the fewest edits first).
fn fuzz(name: &str, target: fn(&[u8])) {
    fuzz_seeds(name, &corpus(name), target);
}

fn fuzz_seeds(name: &str, seeds: &[Vec<u8>], target: fn(&[u8])) {
    for (i, seed) in seeds.iter().enumerate() {
        let peak = peak_during(|| target(seed));
        assert!(peak <= budget(seed.len()), "{name}: seed {i} ({} bytes) peaked at {peak} bytes", seed.len());
    }
    let strategy = (0..seeds.len(), proptest::collection::vec(mutation(), 1..6));
    let config = Config { cases: cases(), failure_persistence: None, ..Config::default() };
    // a fixed RNG: a CI failure reproduces on every machine
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&strategy, |(seed, edits)| {
        let mut input = seeds[seed].clone();
        for m in &edits {
            apply(&mut input, m, seeds);
        }
        let outcome = std::panic::catch_unwind(|| peak_during(|| target(&input)));
        match outcome {
            Err(_) => Err(TestCaseError::fail(format!("{name}: panicked on {} bytes", input.len()))),
            Ok(peak) if peak > budget(input.len()) => {
                Err(TestCaseError::fail(format!("{name}: {peak} bytes peak on a {}-byte input", input.len())))
            }
            Ok(_) => Ok(()),
        }
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

// One test per fuzz target, the same function fuzz/fuzz_targets/<name>.rs hands to libFuzzer.

#[test]
fn dump() {
    fuzz("dump", kvproof::provenance::fuzz::fuzz_dump);
}

#[test]
fn diff() {
    fuzz("diff", kvproof::provenance::fuzz::fuzz_diff);
}

#[test]
fn gguf() {
    fuzz("gguf", kvproof_engines::gguf::fuzz_gguf);
}

#[test]
fn safetensors() {
    fuzz("safetensors", kvproof_engines::weights::fuzz_safetensors);
}

#[test]
fn frames() {
    fuzz("frames", kvproof_engines::serve::fuzz::fuzz_frames);
}

#[test]
fn submit() {
    fuzz("submit", kvproof_engines::serve::fuzz::fuzz_submit);
}

#[test]
fn scenario() {
    fuzz("scenario", kvproof::scenario::fuzz_scenario);
}

#[test]
fn results() {
    fuzz("results", kvproof::report::results::fuzz_results);
}

/// The harness itself can fail: a target that believes a length field, and one that panics on a byte, are
/// both caught from a seed that does neither.
#[test]
fn a_believed_length_and_a_panic_are_caught() {
    fn believes_its_header(data: &[u8]) {
        let Some(head) = data.get(..4) else { return };
        let claimed = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
        // what a reader must not do: size a buffer by the header before checking it against the data
        let buffer: Vec<u8> = Vec::with_capacity(claimed.min(1 << 30));
        std::hint::black_box(buffer);
    }
    fn panics_on_a_byte(data: &[u8]) {
        assert!(!data.contains(&0xff), "0xff");
    }
    let seed = vec![vec![16u8, 0, 0, 0, b'a', b'b', b'c', b'd']];
    fuzz_seeds("honest", &seed, |_| {});
    for (name, target) in [("believes", believes_its_header as fn(&[u8])), ("panics", panics_on_a_byte)] {
        let caught = std::panic::catch_unwind(|| fuzz_seeds(name, &seed, target));
        assert!(caught.is_err(), "{name}: the run found nothing");
    }
}
