//! The state after a turn, through dumps: warm vs cold row by row, matched by the absolute position each row
//! holds (bitwise first, then max |diff| and ULPs); the record against the ids the harness knows were fed; and
//! the layout of each dump on its own (every claimed position has its row where the cache kind puts it).

use std::collections::HashMap;

use kvproof_engines::dump::{CacheKind, DumpTensor, StateDump, Writer};
use serde::{Deserialize, Serialize};

use super::{CheckName, CheckResult};

/// The first differing row, in position order then layer order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowDivergence {
    pub layer: usize,
    pub tensor: String,
    pub kind: CacheKind,
    /// Absolute position the row holds.
    pub position: i64,
    pub warm_writer: Option<Writer>,
    pub cold_writer: Option<Writer>,
    pub max_abs_diff: f32,
}

impl RowDivergence {
    pub fn describe(&self) -> String {
        let w = |x: &Option<Writer>| x.map_or_else(|| "no writer".to_string(), |w| w.to_string());
        format!(
            "layer {} `{}` position {}: max |diff| {:.4e}; warm row by {}, cold row by {}",
            self.layer,
            self.tensor,
            self.position,
            self.max_abs_diff,
            w(&self.warm_writer),
            w(&self.cold_writer)
        )
    }
}

/// Warm vs cold state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StateDiff {
    pub tensors: usize,
    pub rows_compared: usize,
    pub rows_differing: usize,
    pub max_abs_diff: f32,
    pub max_ulps: u64,
    /// Layers with at least one differing row, ascending.
    pub layers_differing: Vec<usize>,
    pub first: Option<RowDivergence>,
    /// Structural mismatches: a tensor or a position only one side has, or different lengths.
    pub missing: Vec<String>,
}

impl StateDiff {
    pub fn identical(&self) -> bool {
        self.rows_differing == 0 && self.missing.is_empty()
    }
}

/// Distance in representable floats (0 for bitwise-equal values, including equal NaN bit patterns).
pub fn ulps(a: f32, b: f32) -> u64 {
    fn key(x: f32) -> i64 {
        let bits = x.to_bits();
        if bits & 0x8000_0000 != 0 {
            -((bits & 0x7fff_ffff) as i64)
        } else {
            bits as i64
        }
    }
    key(a).abs_diff(key(b))
}

/// Why a dumped tensor cannot be read row by row (an external engine may send anything).
fn malformed(t: &DumpTensor) -> Option<String> {
    let rows = t.positions.len();
    if t.data.len() != rows * t.width || t.writers.len() != rows {
        return Some(format!(
            "layer {} `{}`: malformed dump ({} floats and {} writers for {rows} rows of width {})",
            t.layer,
            t.name,
            t.data.len(),
            t.writers.len(),
            t.width
        ));
    }
    None
}

/// Rows by the position they hold, for positions in `0..len` (rows past the state's length are not state).
fn rows_by_position(t: &DumpTensor, len: usize) -> HashMap<i64, usize> {
    t.positions.iter().enumerate().filter(|(_, &p)| p >= 0 && (p as usize) < len).map(|(i, &p)| (p, i)).collect()
}

const MAX_LISTED: usize = 8;

pub fn compare(warm: &StateDump, cold: &StateDump) -> StateDiff {
    let mut diff = StateDiff::default();
    let len = warm.meta.len.min(cold.meta.len);
    if warm.meta.len != cold.meta.len {
        diff.missing.push(format!("state length: warm {} positions, cold {}", warm.meta.len, cold.meta.len));
    }
    let cold_tensors: HashMap<(usize, &str), &DumpTensor> =
        cold.tensors.iter().map(|t| ((t.layer, t.name.as_str()), t)).collect();
    let mut seen = 0usize;
    let mut layers = std::collections::BTreeSet::new();
    for w in &warm.tensors {
        let Some(c) = cold_tensors.get(&(w.layer, w.name.as_str())) else {
            diff.missing.push(format!("layer {} `{}`: only warm has it", w.layer, w.name));
            continue;
        };
        seen += 1;
        if let Some(bad) = malformed(w).or_else(|| malformed(c)) {
            diff.missing.push(bad);
            continue;
        }
        if w.width != c.width || w.kind != c.kind {
            diff.missing.push(format!("layer {} `{}`: shape or kind differs", w.layer, w.name));
            continue;
        }
        diff.tensors += 1;
        let (wrows, crows) = (rows_by_position(w, len), rows_by_position(c, len));
        let mut positions: Vec<i64> = wrows.keys().chain(crows.keys()).copied().collect();
        positions.sort_unstable();
        positions.dedup();
        for p in positions {
            let (Some(&wi), Some(&ci)) = (wrows.get(&p), crows.get(&p)) else {
                if diff.missing.len() < MAX_LISTED {
                    let side = if wrows.contains_key(&p) { "warm" } else { "cold" };
                    diff.missing.push(format!("layer {} `{}` position {p}: only {side} holds it", w.layer, w.name));
                }
                continue;
            };
            diff.rows_compared += 1;
            let (wr, cr) = (w.row(wi), c.row(ci));
            let mut row_max = 0f32;
            let mut row_differs = false;
            for (&a, &b) in wr.iter().zip(cr) {
                if a.to_bits() != b.to_bits() {
                    row_differs = true;
                    let d = if a.is_nan() || b.is_nan() { f32::INFINITY } else { (a - b).abs() };
                    row_max = row_max.max(d);
                    diff.max_ulps = diff.max_ulps.max(ulps(a, b));
                }
            }
            if row_differs {
                diff.rows_differing += 1;
                diff.max_abs_diff = diff.max_abs_diff.max(row_max);
                layers.insert(w.layer);
                let earlier = diff.first.as_ref().is_none_or(|f| (p, w.layer) < (f.position, f.layer));
                if earlier {
                    diff.first = Some(RowDivergence {
                        layer: w.layer,
                        tensor: w.name.clone(),
                        kind: w.kind,
                        position: p,
                        warm_writer: w.writers.get(wi).copied().flatten(),
                        cold_writer: c.writers.get(ci).copied().flatten(),
                        max_abs_diff: row_max,
                    });
                }
            }
        }
    }
    if seen < cold.tensors.len() {
        diff.missing.push(format!("cold has {} tensors warm lacks", cold.tensors.len() - seen));
    }
    diff.layers_differing = layers.into_iter().collect();
    diff
}

pub fn state_check(diff: &StateDiff) -> CheckResult {
    if diff.identical() {
        return CheckResult::pass(
            CheckName::State,
            format!("{} rows in {} tensors bitwise identical", diff.rows_compared, diff.tensors),
        );
    }
    let mut parts = Vec::new();
    if diff.rows_differing > 0 {
        parts.push(format!(
            "{} of {} rows differ (max |diff| {:.4e}, {} ulps) in layers {:?}",
            diff.rows_differing, diff.rows_compared, diff.max_abs_diff, diff.max_ulps, diff.layers_differing
        ));
    }
    if let Some(f) = &diff.first {
        parts.push(format!("first: {}", f.describe()));
    }
    parts.extend(diff.missing.iter().take(3).cloned());
    CheckResult::fail(CheckName::State, parts.join("; "))
}

/// Problems with one dump's layout: positions the state or record claims without a row where its cache kind
/// keeps it. Full/latent rows sit at their position; ring and conv rows at `position % rows`.
pub fn coverage(dump: &StateDump) -> Vec<String> {
    let mut problems = Vec::new();
    let rec = dump.record.ids.len();
    if rec > dump.meta.len {
        problems.push(format!("record claims {rec} positions, the state covers {}", dump.meta.len));
    }
    let covered = dump.meta.len.max(rec);
    for t in &dump.tensors {
        if let Some(bad) = malformed(t) {
            problems.push(bad);
            continue;
        }
        let rows = t.rows();
        let needed: std::ops::Range<usize> = match t.kind {
            CacheKind::Full | CacheKind::Latent => 0..covered,
            CacheKind::Ring | CacheKind::Conv => covered.saturating_sub(rows)..covered,
            // One row per `ratio` positions, or a whole matrix: no per-position placement to check.
            CacheKind::Compressed | CacheKind::Recurrent => 0..0,
        };
        for p in needed {
            let row = match t.kind {
                CacheKind::Full | CacheKind::Latent => p,
                _ if rows == 0 => usize::MAX,
                _ => p % rows,
            };
            let holds = t.positions.get(row).copied();
            let written = t.writers.get(row).is_some_and(|w| w.is_some());
            if holds != Some(p as i64) || !written {
                let what = match holds {
                    None => "no such row".to_string(),
                    Some(-1) => "empty".to_string(),
                    Some(q) if !written => format!("position {q} without a writer"),
                    Some(q) => format!("position {q}"),
                };
                problems.push(format!(
                    "layer {} `{}`: position {p} should be at row {row}, which holds {what}",
                    t.layer, t.name
                ));
                break; // one per tensor is enough to locate it
            }
        }
        if problems.len() >= MAX_LISTED {
            break;
        }
    }
    problems
}

/// The coverage check over the instances of one turn.
pub fn coverage_check(dumps: &[(&str, &StateDump)]) -> CheckResult {
    let mut problems = Vec::new();
    for (who, d) in dumps {
        problems.extend(coverage(d).into_iter().map(|p| format!("{who}: {p}")));
    }
    if problems.is_empty() {
        CheckResult::pass(CheckName::Coverage, "every claimed position has its row")
    } else {
        let n = problems.len();
        problems.truncate(3);
        CheckResult::fail(CheckName::Coverage, format!("{n} layout problem(s): {}", problems.join("; ")))
    }
}

/// The record after a completed turn: exactly the ids fed, and tainted exactly when it must be.
/// `dumps`: each instance with the ids it fed (`None`: the rule does not pin the record down).
pub fn record_check(expected_tainted: Option<bool>, dumps: &[(&str, &StateDump, Option<&[u32]>)]) -> CheckResult {
    let mut problems = Vec::new();
    for (who, d, fed) in dumps {
        if let Some(fed) = fed {
            let got = &d.record.ids;
            if got.as_slice() != *fed {
                let at = got.iter().zip(fed.iter()).take_while(|(a, b)| a == b).count();
                let what = if got.len() > fed.len() && got.starts_with(fed) {
                    format!(
                        "claims {} id(s) never fed, starting with {} at position {at}",
                        got.len() - fed.len(),
                        super::tokens::printable(got[fed.len()])
                    )
                } else if got.len() < fed.len() && fed.starts_with(got) {
                    format!("holds {} of the {} ids fed", got.len(), fed.len())
                } else {
                    format!("differs from the ids fed at position {at} ({} ids held, {} fed)", got.len(), fed.len())
                };
                problems.push(format!("{who} record {what}"));
            }
        }
        if let Some(t) = expected_tainted {
            if d.record.tainted != t {
                problems.push(format!(
                    "{who} record is {}tainted, expected {}tainted",
                    if d.record.tainted { "" } else { "not " },
                    if t { "" } else { "not " }
                ));
            }
        }
    }
    if problems.is_empty() {
        CheckResult::pass(CheckName::Record, "records hold exactly the ids fed")
    } else {
        CheckResult::fail(CheckName::Record, problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;
    use kvproof_engines::dump::{DumpMeta, RecordDump, WriterKind};

    fn writer(request: u64) -> Option<Writer> {
        Some(Writer { request, kind: WriterKind::Prefill { chunk: 0, chunk_rows: 4 } })
    }

    fn tensor(layer: usize, kind: CacheKind, positions: &[i64], values: &[f32]) -> DumpTensor {
        DumpTensor {
            layer,
            name: "k".into(),
            kind,
            width: 1,
            data: values.to_vec(),
            positions: positions.to_vec(),
            writers: positions.iter().map(|&p| if p >= 0 { writer(1) } else { None }).collect(),
        }
    }

    fn dump(len: usize, record: &[u32], tensors: Vec<DumpTensor>) -> StateDump {
        StateDump {
            meta: DumpMeta {
                arch: "inkling".into(),
                preset: None,
                model_hash: String::new(),
                fault: None,
                slot: 0,
                len,
                capacity: 8,
            },
            record: RecordDump { ids: record.to_vec(), tainted: false, capacity: 8 },
            tensors,
        }
    }

    #[test]
    fn rows_are_matched_by_position_not_index() {
        // a ring of 4 after 6 positions: warm and cold hold the same positions at the same rows
        let w = dump(6, &[0; 6], vec![tensor(0, CacheKind::Ring, &[4, 5, 2, 3], &[4.0, 5.0, 2.0, 3.0])]);
        let mut c = w.clone();
        assert!(compare(&w, &c).identical());
        // same rows, stored in another order: still identical
        c.tensors[0] = tensor(0, CacheKind::Ring, &[2, 3, 4, 5], &[2.0, 3.0, 4.0, 5.0]);
        let d = compare(&w, &c);
        assert!(d.identical(), "{d:?}");
        assert_eq!(d.rows_compared, 4);
    }

    #[test]
    fn first_divergence_is_lowest_position_then_layer() {
        let w = dump(
            3,
            &[0; 3],
            vec![
                tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
                tensor(1, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
            ],
        );
        let mut c = w.clone();
        c.tensors[0].data[2] = 3.5; // layer 0, position 2
        c.tensors[1].data[1] = 2.25; // layer 1, position 1
        let d = compare(&w, &c);
        assert_eq!(d.rows_differing, 2);
        let f = d.first.as_ref().expect("first");
        assert_eq!((f.layer, f.position), (1, 1));
        assert_eq!(d.max_abs_diff, 0.5);
        assert_eq!(d.layers_differing, vec![0, 1]);
        let r = state_check(&d);
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("layer 1 `k` position 1"), "{}", r.detail);
    }

    #[test]
    fn a_position_one_side_lacks_is_a_difference() {
        let w = dump(3, &[0; 3], vec![tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0])]);
        let c = dump(3, &[0; 3], vec![tensor(0, CacheKind::Full, &[0, 1, -1], &[1.0, 2.0, 0.0])]);
        let d = compare(&w, &c);
        assert!(!d.identical());
        assert!(d.missing[0].contains("position 2: only warm"), "{:?}", d.missing);
    }

    #[test]
    fn rows_past_the_state_length_are_ignored() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 9.0])]);
        let c = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1, -1], &[1.0, 2.0, 0.0])]);
        assert!(compare(&w, &c).identical());
    }

    #[test]
    fn malformed_dumps_are_reported_not_indexed() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1], &[1.0, 2.0])]);
        let mut c = w.clone();
        c.tensors[0].data.pop();
        let d = compare(&w, &c);
        assert!(!d.identical() && d.missing[0].contains("malformed dump"), "{d:?}");
        assert!(coverage(&c).iter().any(|p| p.contains("malformed dump")));
    }

    #[test]
    fn ulps_count_representable_steps() {
        assert_eq!(ulps(1.0, 1.0), 0);
        assert_eq!(ulps(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulps(0.0, -0.0), 0);
        assert_eq!(ulps(f32::from_bits(1), -f32::from_bits(1)), 2);
    }

    #[test]
    fn coverage_finds_a_record_past_the_state_and_a_rotated_ring() {
        let ok = dump(
            6,
            &[0; 6],
            vec![
                tensor(0, CacheKind::Full, &[0, 1, 2, 3, 4, 5, -1, -1], &[0.0; 8]),
                tensor(1, CacheKind::Ring, &[4, 5, 2, 3], &[0.0; 4]),
            ],
        );
        assert!(coverage(&ok).is_empty(), "{:?}", coverage(&ok));
        // the record claims two positions the state never wrote
        let mut over = ok.clone();
        over.record.ids = vec![0; 8];
        let p = coverage(&over);
        assert!(p.iter().any(|p| p.contains("record claims 8 positions")), "{p:?}");
        assert!(p.iter().any(|p| p.contains("position 6 should be at row 6")), "{p:?}");
        // a ring copied linearly: position 4 sits at row 2
        let mut rotated = ok.clone();
        rotated.tensors[1] = tensor(1, CacheKind::Ring, &[2, 3, 4, 5], &[0.0; 4]);
        let p = coverage(&rotated);
        assert!(
            p.iter().any(|p| p.contains("layer 1 `k`: position 2 should be at row 2, which holds position 4")),
            "{p:?}"
        );
    }

    #[test]
    fn record_names_the_never_fed_token() {
        let fed = [1u32, 2, 104];
        let d = dump(3, &[1, 2, 104, 105], vec![]);
        let r = record_check(None, &[("warm", &d, Some(&fed[..]))]);
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("claims 1 id(s) never fed, starting with 'i' at position 3"), "{}", r.detail);
        let mut tainted = dump(3, &fed, vec![]);
        tainted.record.tainted = false;
        let r = record_check(Some(true), &[("warm", &tainted, Some(&fed[..]))]);
        assert!(r.detail.contains("not tainted, expected tainted"), "{}", r.detail);
    }
}
