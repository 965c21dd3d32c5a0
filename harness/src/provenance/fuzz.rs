//! Fuzz entries for the dump readers and the diff: arbitrary bytes through the same code `kvproof diff`, the
//! stdio driver's DUMP and provenance use. Errors are the expected outcome; a panic or an allocation sized by a
//! header is a bug.

use kvproof_engines::dump_file;
use kvproof_engines::state_diff::{self, DumpSource};

use super::{render, MappedDump};

/// Everything a reader hands on, touched: every tensor's arrays, the record.
fn touch(d: &impl DumpSource) {
    for i in 0..d.tensor_count() {
        if let Ok(t) = d.tensor(i) {
            let _ = t.malformed();
        }
    }
    let _ = d.record_ids();
}

/// Fuzz entry: read `data` as a state dump, through the engine's decoder and the harness's mapped reader.
pub fn fuzz_dump(data: &[u8]) {
    if let Ok(d) = dump_file::from_bytes(data) {
        touch(&d);
    }
    if let Ok(d) = MappedDump::from_bytes("<fuzz>", data.to_vec()) {
        touch(&d);
    }
}

/// Fuzz entry: split `data` in two halves, read both as dumps (both readers) and diff them, rendering the table.
pub fn fuzz_diff(data: &[u8]) {
    let (a, b) = data.split_at(data.len() / 2);
    if let (Ok(x), Ok(y)) = (dump_file::from_bytes(a), dump_file::from_bytes(b)) {
        if let Ok(d) = state_diff::compare(&x, &y) {
            let _ = render::table(&d, ("a", "a"), ("b", "b"));
        }
    }
    if let (Ok(x), Ok(y)) = (MappedDump::from_bytes("<a>", a.to_vec()), MappedDump::from_bytes("<b>", b.to_vec())) {
        if let Ok(d) = state_diff::compare(&x, &y) {
            let _ = render::table(&d, ("a", "a"), ("b", "b"));
            let _ = d.headline("a", "b");
        }
    }
}
