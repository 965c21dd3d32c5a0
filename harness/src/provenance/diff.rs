//! Row-by-row diff of two state dumps: rows matched by the absolute position they hold, layers compared in
//! parallel, and for the first divergent row of every tensor the writers on both sides.

use kvproof_engines::dump::{CacheKind, Writer};
use kvproof_engines::dump_file::TensorEntry;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{MappedDump, ProvenanceError};

/// One cached tensor compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDiff {
    pub layer: usize,
    pub name: String,
    pub kind: CacheKind,
    pub rows_compared: usize,
    pub rows_identical: usize,
    /// Positions held (and covered) by one side only.
    pub only_in_a: usize,
    pub only_in_b: usize,
    pub first_divergent_pos: Option<i64>,
    pub writer_a: Option<Writer>,
    pub writer_b: Option<Writer>,
    pub max_abs: f32,
    pub max_ulp: u64,
    /// Ring rows stored where their position does not map (row index != pos % window), per side, and the
    /// rotation of the first such row: (row index - pos % window) mod window.
    pub misplaced_a: usize,
    pub misplaced_b: usize,
    pub rotation_a: Option<usize>,
    pub rotation_b: Option<usize>,
    /// (position, max |diff|) of every divergent row, for the heatmap.
    pub divergent: Vec<(i64, f32)>,
    /// The positions compared (held by both sides), as half-open runs `[start, end)`: a ring holds only its
    /// window, and the heatmap must not paint positions nobody compared as identical.
    #[serde(default)]
    pub compared: Vec<(i64, i64)>,
}

/// Sorted positions as half-open runs of consecutive ones.
fn runs(mut positions: Vec<i64>) -> Vec<(i64, i64)> {
    positions.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for p in positions {
        match out.last_mut() {
            Some((_, end)) if *end == p => *end = p + 1,
            Some((_, end)) if *end > p => {}
            _ => out.push((p, p + 1)),
        }
    }
    out
}

/// All tensors of one layer together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerDiff {
    pub layer: usize,
    pub rows_compared: usize,
    pub rows_identical: usize,
    pub first_divergent_pos: Option<i64>,
    /// The tensor whose row diverged first, and the writers of that row.
    pub first_tensor: Option<String>,
    pub writer_a: Option<Writer>,
    pub writer_b: Option<Writer>,
    pub max_abs: f32,
    pub max_ulp: u64,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpDiff {
    pub a: String,
    pub b: String,
    pub arch: String,
    pub len_a: usize,
    pub len_b: usize,
    /// Positions compared: those both states cover.
    pub covered: usize,
    pub record_equal: bool,
    pub record_first_diff: Option<usize>,
    pub tainted_a: bool,
    pub tainted_b: bool,
    pub layers: Vec<LayerDiff>,
    pub tensors: Vec<TensorDiff>,
}

impl DumpDiff {
    pub fn identical(&self) -> bool {
        self.record_equal
            && self.tensors.iter().all(|t| t.first_divergent_pos.is_none() && t.only_in_a + t.only_in_b == 0)
    }

    /// The first divergent layer (lowest index) and its first divergent position.
    pub fn first_divergence(&self) -> Option<&LayerDiff> {
        self.layers.iter().find(|l| l.first_divergent_pos.is_some())
    }

    /// "layer 3, pos 8: warm row by decode (req 2, step 3), cold row by prefill (req 3, chunk 0 of 16 rows)"
    pub fn headline(&self, a_name: &str, b_name: &str) -> String {
        match self.first_divergence() {
            None if self.identical() => "states identical".into(),
            None => match self.record_first_diff {
                Some(i) => format!("rows identical; records differ from id {i}"),
                None => "rows identical; positions held differ".into(),
            },
            Some(l) => {
                let w = |w: &Option<Writer>| w.map(|w| w.to_string()).unwrap_or_else(|| "nobody (unwritten)".into());
                format!(
                    "layer {}, pos {}: {a_name} row by {}, {b_name} row by {}",
                    l.layer,
                    l.first_divergent_pos.unwrap_or(-1),
                    w(&l.writer_a),
                    w(&l.writer_b)
                )
            }
        }
    }
}

/// Distance in units in the last place between two floats (0 for bit-equal, huge across signs or NaN).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    let key = |x: f32| {
        let bits = x.to_bits() as i32;
        if bits < 0 {
            i32::MIN as i64 - bits as i64
        } else {
            bits as i64
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]])
}

fn misplaced(kind: CacheKind, positions: &[i64]) -> (usize, Option<usize>) {
    if kind != CacheKind::Ring || positions.is_empty() {
        return (0, None);
    }
    let w = positions.len() as i64;
    let mut count = 0;
    let mut first = None;
    for (i, &p) in positions.iter().enumerate() {
        if p >= 0 && p % w != i as i64 {
            count += 1;
            first.get_or_insert(((i as i64 - p % w).rem_euclid(w)) as usize);
        }
    }
    (count, first)
}

fn diff_tensor(
    a: &MappedDump,
    b: &MappedDump,
    ea: &TensorEntry,
    eb: &TensorEntry,
    covered: i64,
) -> Result<TensorDiff, ProvenanceError> {
    let (pa, pb) = (a.positions(ea), b.positions(eb));
    let (wa, wb) = (a.writers(ea)?, b.writers(eb)?);
    // B's row for each covered position
    let mut b_row = vec![usize::MAX; covered.max(0) as usize];
    for (i, &p) in pb.iter().enumerate() {
        if (0..covered).contains(&p) {
            b_row[p as usize] = i;
        }
    }
    let mut seen_in_a = vec![false; b_row.len()];
    let mut t = TensorDiff {
        layer: ea.layer,
        name: ea.name.clone(),
        kind: ea.kind,
        rows_compared: 0,
        rows_identical: 0,
        only_in_a: 0,
        only_in_b: 0,
        first_divergent_pos: None,
        writer_a: None,
        writer_b: None,
        max_abs: 0.0,
        max_ulp: 0,
        misplaced_a: 0,
        misplaced_b: 0,
        rotation_a: None,
        rotation_b: None,
        divergent: Vec::new(),
        compared: Vec::new(),
    };
    let mut compared = Vec::new();
    (t.misplaced_a, t.rotation_a) = misplaced(ea.kind, &pa);
    (t.misplaced_b, t.rotation_b) = misplaced(eb.kind, &pb);
    for (i, &p) in pa.iter().enumerate() {
        if !(0..covered).contains(&p) {
            continue;
        }
        seen_in_a[p as usize] = true;
        let j = b_row[p as usize];
        if j == usize::MAX {
            t.only_in_a += 1;
            continue;
        }
        t.rows_compared += 1;
        compared.push(p);
        let (ra, rb) = (a.row_bytes(ea, i), b.row_bytes(eb, j));
        if ra == rb {
            t.rows_identical += 1;
            continue;
        }
        let (mut abs, mut ulp) = (0.0f32, 0u64);
        for k in 0..ea.width {
            let (x, y) = (f32_at(ra, k), f32_at(rb, k));
            if x.to_bits() != y.to_bits() {
                let d = (x - y).abs();
                abs = if d.is_nan() { f32::INFINITY } else { abs.max(d) };
                ulp = ulp.max(ulp_distance(x, y));
            }
        }
        t.max_abs = t.max_abs.max(abs);
        t.max_ulp = t.max_ulp.max(ulp);
        t.divergent.push((p, abs));
        if t.first_divergent_pos.is_none_or(|f| p < f) {
            t.first_divergent_pos = Some(p);
            t.writer_a = wa.get(i).copied().flatten();
            t.writer_b = wb.get(j).copied().flatten();
        }
    }
    t.only_in_b = b_row.iter().zip(&seen_in_a).filter(|(&j, &seen)| j != usize::MAX && !seen).count();
    t.divergent.sort_by_key(|&(p, _)| p);
    t.compared = runs(compared);
    Ok(t)
}

/// Compare dump `a` with dump `b`.
pub fn diff(a: &MappedDump, b: &MappedDump) -> Result<DumpDiff, ProvenanceError> {
    let (ha, hb) = (&a.header, &b.header);
    if ha.meta.arch != hb.meta.arch {
        return Err(ProvenanceError::Incomparable(format!("arch {} vs {}", ha.meta.arch, hb.meta.arch)));
    }
    if ha.meta.model_hash != hb.meta.model_hash {
        return Err(ProvenanceError::Incomparable(format!(
            "different models (config/weights hash {} vs {}): same arch, other preset, seed or config",
            ha.meta.model_hash, hb.meta.model_hash
        )));
    }
    if ha.tensors.len() != hb.tensors.len() {
        return Err(ProvenanceError::Incomparable(format!(
            "{} cached tensors vs {}",
            ha.tensors.len(),
            hb.tensors.len()
        )));
    }
    for (x, y) in ha.tensors.iter().zip(&hb.tensors) {
        if (x.layer, &x.name, x.kind, x.width) != (y.layer, &y.name, y.kind, y.width) {
            return Err(ProvenanceError::Incomparable(format!(
                "tensor layers.{}.{} ({:?}, width {}) vs layers.{}.{} ({:?}, width {})",
                x.layer, x.name, x.kind, x.width, y.layer, y.name, y.kind, y.width
            )));
        }
    }
    let covered = ha.meta.len.min(hb.meta.len) as i64;
    let tensors: Vec<TensorDiff> = ha
        .tensors
        .par_iter()
        .zip(hb.tensors.par_iter())
        .map(|(ea, eb)| diff_tensor(a, b, ea, eb, covered))
        .collect::<Result<_, _>>()?;

    let n_layers = tensors.iter().map(|t| t.layer + 1).max().unwrap_or(0);
    let layers = (0..n_layers)
        .map(|l| {
            let mine: Vec<&TensorDiff> = tensors.iter().filter(|t| t.layer == l).collect();
            let first = mine.iter().filter(|t| t.first_divergent_pos.is_some()).min_by_key(|t| t.first_divergent_pos);
            LayerDiff {
                layer: l,
                rows_compared: mine.iter().map(|t| t.rows_compared).sum(),
                rows_identical: mine.iter().map(|t| t.rows_identical).sum(),
                first_divergent_pos: first.and_then(|t| t.first_divergent_pos),
                first_tensor: first.map(|t| t.name.clone()),
                writer_a: first.and_then(|t| t.writer_a),
                writer_b: first.and_then(|t| t.writer_b),
                max_abs: mine.iter().map(|t| t.max_abs).fold(0.0, f32::max),
                max_ulp: mine.iter().map(|t| t.max_ulp).max().unwrap_or(0),
            }
        })
        .collect();
    let (ra, rb) = (a.record_ids(), b.record_ids());
    let record_first_diff = if ra == rb {
        None
    } else {
        Some(ra.iter().zip(&rb).position(|(x, y)| x != y).unwrap_or(ra.len().min(rb.len())))
    };
    Ok(DumpDiff {
        a: a.path.display().to_string(),
        b: b.path.display().to_string(),
        arch: ha.meta.arch.clone(),
        len_a: ha.meta.len,
        len_b: hb.meta.len,
        covered: covered as usize,
        record_equal: record_first_diff.is_none() && ha.record_tainted == hb.record_tainted,
        record_first_diff,
        tainted_a: ha.record_tainted,
        tainted_b: hb.record_tainted,
        layers,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulp_distance_counts_representable_steps() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulp_distance(-0.0, 0.0), 0);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(ulp_distance(f32::NAN, 1.0), u64::MAX);
    }

    #[test]
    fn compared_positions_become_runs() {
        assert_eq!(runs(vec![5, 3, 4, 9, 10, 0]), vec![(0, 1), (3, 6), (9, 11)]);
        assert_eq!(runs(vec![2, 2, 3]), vec![(2, 4)]);
        assert!(runs(Vec::new()).is_empty());
    }

    #[test]
    fn misplaced_ring_rows_report_their_rotation() {
        // window 4, positions 8..12 stored one row late: row 1 holds 8, row 2 holds 9, ...
        assert_eq!(misplaced(CacheKind::Ring, &[11, 8, 9, 10]), (4, Some(1)));
        assert_eq!(misplaced(CacheKind::Ring, &[8, 9, 10, 11]), (0, None));
        assert_eq!(misplaced(CacheKind::Full, &[3, 2]), (0, None));
    }
}
