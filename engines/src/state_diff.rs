//! The one row matcher: two slot states compared row by row, rows matched by the absolute position they hold
//! (never by row index, so a ring's rows compare wherever they sit), bitwise first, then the largest |diff| and
//! ULP distance of each differing row. Every state comparison kvproof makes goes through `compare`: the in-run
//! state check, provenance capture, `kvproof diff`, the heatmap (which reads the `StateDiff` saved as diff.json)
//! and the engines' own tests. It lives here, beside the dump format, because the engines' tests need it and the
//! engines crate cannot depend on the harness.
//!
//! The first divergent row is the lowest position that differs, and at that position the lowest layer (then the
//! tensor's order in the dump): every later position attends to it, so it is where a divergence starts.

use std::borrow::Cow;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::dump::{CacheKind, DumpMeta, StateDump, Writer};

/// A row's floats: held in memory, or little-endian bytes read from a mapped file.
#[derive(Debug, Clone, Copy)]
pub enum RowData<'a> {
    F32(&'a [f32]),
    Le(&'a [u8]),
}

impl RowData<'_> {
    fn len_values(&self) -> usize {
        match self {
            RowData::F32(v) => v.len(),
            RowData::Le(b) => b.len() / 4,
        }
    }
}

/// The writer of each row: decoded in memory, or a dump file's `[rows, 4]` little-endian i64 array, decoded only
/// for the rows a diff reports — a diff of two equal states never reads them.
#[derive(Debug, Clone)]
pub enum RowWriters<'a> {
    Decoded(Cow<'a, [Option<Writer>]>),
    Le(&'a [u8]),
}

/// Bytes of one row of a dump file's `writers` array.
const WRITER_BYTES: usize = 4 * 8;

impl RowWriters<'_> {
    fn len(&self) -> usize {
        match self {
            RowWriters::Decoded(v) => v.len(),
            RowWriters::Le(b) => b.len() / WRITER_BYTES,
        }
    }

    /// Row `i`'s writer, `None` past the last row; an error says why the stored one cannot be read.
    pub fn get(&self, i: usize) -> Option<Result<Option<Writer>, String>> {
        match self {
            RowWriters::Decoded(v) => v.get(i).map(|w| Ok(*w)),
            RowWriters::Le(b) => {
                let row = b.get(i.checked_mul(WRITER_BYTES)?..)?.get(..WRITER_BYTES)?;
                let fields = row.as_chunks::<8>().0;
                let v: [i64; WRITER_BYTES / 8] = std::array::from_fn(|k| i64::from_le_bytes(fields[k]));
                Some(crate::dump_file::decode_writer(&v).map_err(|m| format!("writer of row {i}: {m}")))
            }
        }
    }
}

/// One cached tensor as the matcher reads it.
#[derive(Debug, Clone)]
pub struct TensorRows<'a> {
    /// The state's name in errors (a dump file's path).
    pub origin: &'a str,
    pub layer: usize,
    pub name: &'a str,
    pub kind: CacheKind,
    /// Floats per row.
    pub width: usize,
    /// The absolute position each row holds (-1: empty).
    pub positions: Cow<'a, [i64]>,
    pub writers: RowWriters<'a>,
    /// Row-major `rows x width`.
    pub data: RowData<'a>,
}

impl TensorRows<'_> {
    /// Why the arrays do not fit together, if they do not (checked before any row is indexed).
    pub fn malformed(&self) -> Option<String> {
        let rows = self.positions.len();
        let fits = self.width.checked_mul(rows) == Some(self.data.len_values())
            && self.writers.len() == rows
            && !matches!(self.data, RowData::Le(b) if b.len() % 4 != 0)
            && !matches!(self.writers, RowWriters::Le(b) if b.len() % WRITER_BYTES != 0);
        (!fits).then(|| {
            format!(
                "layer {} `{}`: {} values and {} writers for {rows} rows of width {}",
                self.layer,
                self.name,
                self.data.len_values(),
                self.writers.len(),
                self.width
            )
        })
    }

    /// Rows `i..i + n`, back to back.
    fn rows(&self, i: usize, n: usize) -> RowData<'_> {
        let w = self.width;
        match self.data {
            RowData::F32(v) => RowData::F32(&v[i * w..(i + n) * w]),
            RowData::Le(b) => RowData::Le(&b[i * w * 4..(i + n) * w * 4]),
        }
    }

    /// Row `i`'s writer; an error names the dump, tensor and row.
    fn writer(&self, i: usize) -> Result<Option<Writer>, String> {
        let w = self.writers.get(i).unwrap_or_else(|| Err(format!("no writer for row {i}")));
        w.map_err(|m| format!("{}: layer {} `{}`: {m}", self.origin, self.layer, self.name))
    }
}

/// A state as the matcher reads it: a `StateDump` in memory, or a dump file mapped by the harness.
pub trait DumpSource: Sync {
    fn meta(&self) -> &DumpMeta;
    fn record_ids(&self) -> Cow<'_, [u32]>;
    fn record_tainted(&self) -> bool;
    fn tensor_count(&self) -> usize;
    /// Tensor `i`; an error names what in it cannot be read.
    fn tensor(&self, i: usize) -> Result<TensorRows<'_>, String>;
}

impl DumpSource for StateDump {
    fn meta(&self) -> &DumpMeta {
        &self.meta
    }
    fn record_ids(&self) -> Cow<'_, [u32]> {
        Cow::Borrowed(&self.record.ids)
    }
    fn record_tainted(&self) -> bool {
        self.record.tainted
    }
    fn tensor_count(&self) -> usize {
        self.tensors.len()
    }
    fn tensor(&self, i: usize) -> Result<TensorRows<'_>, String> {
        let t = self.tensors.get(i).ok_or_else(|| format!("no tensor {i}"))?;
        Ok(TensorRows {
            origin: "the state in memory",
            layer: t.layer,
            name: &t.name,
            kind: t.kind,
            width: t.width,
            positions: Cow::Borrowed(&t.positions),
            writers: RowWriters::Decoded(Cow::Borrowed(&t.writers)),
            data: RowData::F32(&t.data),
        })
    }
}

/// Why two states cannot be compared row by row at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomparable {
    #[error("different arches: {0} vs {1}")]
    Arch(String, String),
    #[error("different models (config/weights hash {0} vs {1}): same arch, other preset, seed or config")]
    Model(String, String),
    #[error("{0} cached tensors vs {1}")]
    TensorCount(usize, usize),
    #[error("tensor {0} vs {1}")]
    Shape(String, String),
    #[error("malformed dump: {0}")]
    Malformed(String),
}

/// How far two rows lie apart: the largest |difference| of their floats and the largest ULP distance; over many
/// rows, the largest of each.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Distance {
    pub max_abs: f32,
    pub max_ulp: u64,
}

impl Distance {
    /// The larger of each of the two.
    pub fn max(self, other: Distance) -> Distance {
        Distance { max_abs: self.max_abs.max(other.max_abs), max_ulp: self.max_ulp.max(other.max_ulp) }
    }
}

/// The rows compared in some part of the state (a tensor, a layer, the whole state): how many, how many were
/// bitwise identical, and how far the others lie apart at most.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RowStats {
    pub rows_compared: usize,
    pub rows_identical: usize,
    #[serde(flatten)]
    pub distance: Distance,
}

impl RowStats {
    /// Saturating: the stats may come from a diff.json file that claims more identical rows than compared ones.
    pub fn rows_differing(&self) -> usize {
        self.rows_compared.saturating_sub(self.rows_identical)
    }

    /// The stats of all of `parts` together: counts summed (saturating, as above), distances the largest.
    pub fn total<'a>(parts: impl IntoIterator<Item = &'a RowStats>) -> RowStats {
        parts.into_iter().fold(RowStats::default(), |sum, p| RowStats {
            rows_compared: sum.rows_compared.saturating_add(p.rows_compared),
            rows_identical: sum.rows_identical.saturating_add(p.rows_identical),
            distance: sum.distance.max(p.distance),
        })
    }
}

/// The first divergent row of the whole state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstRow {
    pub layer: usize,
    pub tensor: String,
    pub kind: CacheKind,
    /// The absolute position the row holds.
    pub position: i64,
    pub writer_a: Option<Writer>,
    pub writer_b: Option<Writer>,
    /// How far this row's two sides lie apart.
    #[serde(flatten)]
    pub distance: Distance,
}

impl FirstRow {
    /// "layer 7 `k`, pos 32: warm row by decode (req 1, step 6), cold row by prefill (req 3, chunk 2 of 7 rows)"
    pub fn describe(&self, a_name: &str, b_name: &str) -> String {
        let w = |w: &Option<Writer>| w.map(|w| w.to_string()).unwrap_or_else(|| "nobody (unwritten)".into());
        format!(
            "layer {} `{}`, pos {}: {a_name} row by {}, {b_name} row by {}",
            self.layer,
            self.tensor,
            self.position,
            w(&self.writer_a),
            w(&self.writer_b)
        )
    }
}

/// One cached tensor compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDiff {
    pub layer: usize,
    pub name: String,
    pub kind: CacheKind,
    #[serde(flatten)]
    pub rows: RowStats,
    /// Positions both states cover but only one side holds a row for.
    pub only_in_a: usize,
    pub only_in_b: usize,
    pub first_divergent_pos: Option<i64>,
    pub writer_a: Option<Writer>,
    pub writer_b: Option<Writer>,
    /// Ring rows stored where their position does not map (row index != pos % rows), per side, and the rotation
    /// of the first such row: (row index - pos % rows) mod rows — what a linear copy of a wrapped ring leaves.
    pub misplaced_a: usize,
    pub misplaced_b: usize,
    pub rotation_a: Option<usize>,
    pub rotation_b: Option<usize>,
    /// (position, max |diff|) of every divergent row, in position order (the heatmap's cells).
    pub divergent: Vec<(i64, f32)>,
    /// The positions compared (held by both sides) as half-open runs `[start, end)`: a ring holds only its
    /// window, and the heatmap must not paint positions nobody compared as identical.
    pub compared: Vec<(i64, i64)>,
}

/// All tensors of one layer together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerDiff {
    pub layer: usize,
    #[serde(flatten)]
    pub rows: RowStats,
    pub rows_only_one_side: usize,
    /// The layer's lowest divergent position, the tensor holding it, and that row's writers.
    pub first_divergent_pos: Option<i64>,
    pub first_tensor: Option<String>,
    pub writer_a: Option<Writer>,
    pub writer_b: Option<Writer>,
}

/// The records of the two states.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordDiff {
    pub len_a: usize,
    pub len_b: usize,
    /// The first index where the ids differ (or the shorter length, when one is a prefix of the other).
    pub first_diff: Option<usize>,
    pub tainted_a: bool,
    pub tainted_b: bool,
}

impl RecordDiff {
    pub fn equal(&self) -> bool {
        self.first_diff.is_none() && self.tainted_a == self.tainted_b
    }
}

/// Two states compared: what `kvproof diff` prints, what the state check reports, what diff.json holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateDiff {
    pub arch: String,
    /// Positions each state covers, and those both cover (the rows compared lie below it).
    pub len_a: usize,
    pub len_b: usize,
    pub covered: usize,
    pub record: RecordDiff,
    pub first: Option<FirstRow>,
    /// One per layer the dumps list, ascending.
    pub layers: Vec<LayerDiff>,
    pub tensors: Vec<TensorDiff>,
}

impl StateDiff {
    pub fn identical(&self) -> bool {
        self.len_a == self.len_b
            && self.record.equal()
            && self.tensors.iter().all(|t| t.first_divergent_pos.is_none() && t.only_in_a + t.only_in_b == 0)
    }

    /// The rows of every tensor together.
    pub fn rows(&self) -> RowStats {
        RowStats::total(self.tensors.iter().map(|t| &t.rows))
    }

    pub fn rows_compared(&self) -> usize {
        self.rows().rows_compared
    }

    pub fn rows_differing(&self) -> usize {
        self.rows().rows_differing()
    }

    pub fn rows_only_one_side(&self) -> usize {
        self.tensors.iter().map(|t| t.only_in_a + t.only_in_b).sum()
    }

    pub fn max_abs(&self) -> f32 {
        self.rows().distance.max_abs
    }

    pub fn max_ulp(&self) -> u64 {
        self.rows().distance.max_ulp
    }

    /// Layers with at least one differing row, ascending.
    pub fn layers_differing(&self) -> Vec<usize> {
        self.layers.iter().filter(|l| l.first_divergent_pos.is_some()).map(|l| l.layer).collect()
    }

    /// One line: the first divergent row with both writers, or what else differs.
    pub fn headline(&self, a_name: &str, b_name: &str) -> String {
        if let Some(f) = &self.first {
            return f.describe(a_name, b_name);
        }
        if self.identical() {
            return "states identical".into();
        }
        let mut parts = Vec::new();
        if self.len_a != self.len_b {
            parts.push(format!("{a_name} covers {} positions, {b_name} {}", self.len_a, self.len_b));
        }
        let only = self.rows_only_one_side();
        if only > 0 {
            parts.push(format!("{only} row(s) held by one side only"));
        }
        if let Some(i) = self.record.first_diff {
            parts.push(format!("records differ from id {i}"));
        } else if self.record.tainted_a != self.record.tainted_b {
            parts.push(format!(
                "{a_name} record {}tainted, {b_name} record {}tainted",
                if self.record.tainted_a { "" } else { "not " },
                if self.record.tainted_b { "" } else { "not " }
            ));
        }
        format!("rows identical where both hold them; {}", parts.join("; "))
    }
}

/// Distance in units in the last place between two floats: 0 for bit-equal values (and for 0.0 vs -0.0),
/// u64::MAX when either is NaN.
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

fn value(row: RowData<'_>, k: usize) -> f32 {
    match row {
        RowData::F32(v) => v[k],
        RowData::Le(b) => f32::from_le_bytes([b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]]),
    }
}

/// Whether two rows hold the same bits; a byte comparison where both come from files.
fn same_bits(a: RowData<'_>, b: RowData<'_>) -> bool {
    match (a, b) {
        (RowData::Le(x), RowData::Le(y)) => x == y,
        (RowData::F32(x), RowData::F32(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        _ => (0..a.len_values()).all(|k| value(a, k).to_bits() == value(b, k).to_bits()),
    }
}

/// The distance of two rows that differ.
fn row_distance(a: RowData<'_>, b: RowData<'_>) -> Distance {
    let (mut abs, mut ulp) = (0.0f32, 0u64);
    for k in 0..a.len_values() {
        let (x, y) = (value(a, k), value(b, k));
        if x.to_bits() != y.to_bits() {
            let d = (x - y).abs();
            abs = if d.is_nan() { f32::INFINITY } else { abs.max(d) };
            ulp = ulp.max(ulp_distance(x, y));
        }
    }
    Distance { max_abs: abs, max_ulp: ulp }
}

/// Add the positions `[start, end)` to half-open runs built in ascending order, joining a run they continue.
fn push_run(runs: &mut Vec<(i64, i64)>, start: i64, end: i64) {
    match runs.last_mut() {
        Some((_, last_end)) if *last_end == start => *last_end = end,
        _ => runs.push((start, end)),
    }
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

/// (position, row) of every row holding a position below `covered`, by position (the last row wins if a
/// position repeats). Sized by the rows the tensor really has, never by what a header claims.
fn rows_by_position(positions: &[i64], covered: usize) -> Vec<(i64, usize)> {
    let mut rows: Vec<(i64, usize)> = positions
        .iter()
        .enumerate()
        .filter(|(_, &p)| p >= 0 && (p as u64) < covered as u64)
        .map(|(i, &p)| (p, i))
        .collect();
    rows.sort_by_key(|&(p, i)| (p, std::cmp::Reverse(i)));
    rows.dedup_by_key(|&mut (p, _)| p);
    rows
}

/// The first divergent row of one tensor: its position and distance.
type TensorFirst = Option<(i64, Distance)>;

/// Matched rows compared with one byte comparison at most: rows that follow each other in position and in row
/// index on both sides are compared as one block, and row by row only when the block differs. Equal states then
/// cost what a plain comparison of their bytes costs.
const BLOCK_ROWS: usize = 64;

/// How many of the matched rows from `a_rows[x]` / `b_rows[y]` on (at most `BLOCK_ROWS`) follow each other in
/// position and in row index on both sides.
fn block_len(a_rows: &[(i64, usize)], b_rows: &[(i64, usize)], x: usize, y: usize) -> usize {
    let ((p, i), (_, j)) = (a_rows[x], b_rows[y]);
    let mut n = 1;
    while n < BLOCK_ROWS {
        match (a_rows.get(x + n), b_rows.get(y + n)) {
            (Some(&(pa, ia)), Some(&(pb, ib))) if pa == p + n as i64 && pb == pa && ia == i + n && ib == j + n => {
                n += 1
            }
            _ => break,
        }
    }
    n
}

fn diff_tensor(a: &TensorRows<'_>, b: &TensorRows<'_>, covered: usize) -> Result<(TensorDiff, TensorFirst), String> {
    let a_rows = rows_by_position(&a.positions, covered);
    let b_rows = rows_by_position(&b.positions, covered);
    let (misplaced_a, rotation_a) = misplaced(a.kind, &a.positions);
    let (misplaced_b, rotation_b) = misplaced(b.kind, &b.positions);
    let mut t = TensorDiff {
        layer: a.layer,
        name: a.name.to_string(),
        kind: a.kind,
        rows: RowStats::default(),
        only_in_a: 0,
        only_in_b: 0,
        first_divergent_pos: None,
        writer_a: None,
        writer_b: None,
        misplaced_a,
        misplaced_b,
        rotation_a,
        rotation_b,
        divergent: Vec::new(),
        compared: Vec::new(),
    };
    let mut first: TensorFirst = None;
    // a merge of the two position-sorted lists
    let (mut x, mut y) = (0, 0);
    while x < a_rows.len() || y < b_rows.len() {
        let (pa, pb) = (a_rows.get(x).map(|r| r.0), b_rows.get(y).map(|r| r.0));
        match (pa, pb) {
            (Some(p), Some(q)) if p == q => {
                let (i, j) = (a_rows[x].1, b_rows[y].1);
                let n = block_len(&a_rows, &b_rows, x, y);
                x += n;
                y += n;
                t.rows.rows_compared += n;
                push_run(&mut t.compared, p, p + n as i64);
                if same_bits(a.rows(i, n), b.rows(j, n)) {
                    t.rows.rows_identical += n;
                    continue;
                }
                for k in 0..n {
                    let (ra, rb) = (a.rows(i + k, 1), b.rows(j + k, 1));
                    if same_bits(ra, rb) {
                        t.rows.rows_identical += 1;
                        continue;
                    }
                    let pos = p + k as i64;
                    let distance = row_distance(ra, rb);
                    t.rows.distance = t.rows.distance.max(distance);
                    t.divergent.push((pos, distance.max_abs));
                    if t.first_divergent_pos.is_none() {
                        // positions are visited in ascending order: the first one seen is the lowest
                        t.first_divergent_pos = Some(pos);
                        t.writer_a = a.writer(i + k)?;
                        t.writer_b = b.writer(j + k)?;
                        first = Some((pos, distance));
                    }
                }
            }
            (Some(p), q) if q.is_none_or(|q| p < q) => {
                t.only_in_a += 1;
                x += 1;
            }
            _ => {
                t.only_in_b += 1;
                y += 1;
            }
        }
    }
    Ok((t, first))
}

/// One entry per layer some tensor names, ascending: sized by the tensors a dump really lists, never by the
/// largest layer index it claims.
fn layers_of(tensors: &[TensorDiff]) -> Vec<LayerDiff> {
    let mut by_layer: std::collections::BTreeMap<usize, Vec<&TensorDiff>> = std::collections::BTreeMap::new();
    for t in tensors {
        by_layer.entry(t.layer).or_default().push(t);
    }
    by_layer
        .into_iter()
        .map(|(l, mine)| {
            let first = mine.iter().filter(|t| t.first_divergent_pos.is_some()).min_by_key(|t| t.first_divergent_pos);
            LayerDiff {
                layer: l,
                rows: RowStats::total(mine.iter().map(|t| &t.rows)),
                rows_only_one_side: mine.iter().map(|t| t.only_in_a + t.only_in_b).sum(),
                first_divergent_pos: first.and_then(|t| t.first_divergent_pos),
                first_tensor: first.map(|t| t.name.clone()),
                writer_a: first.and_then(|t| t.writer_a),
                writer_b: first.and_then(|t| t.writer_b),
            }
        })
        .collect()
}

/// Compare state `a` with state `b`. Tensors are compared in parallel; a pair of states with different models or
/// tensor layouts is `Incomparable`, never a panic.
pub fn compare(a: &impl DumpSource, b: &impl DumpSource) -> Result<StateDiff, Incomparable> {
    let (ma, mb) = (a.meta(), b.meta());
    if ma.arch != mb.arch {
        return Err(Incomparable::Arch(ma.arch.clone(), mb.arch.clone()));
    }
    if ma.model_hash != mb.model_hash {
        return Err(Incomparable::Model(ma.model_hash.clone(), mb.model_hash.clone()));
    }
    if a.tensor_count() != b.tensor_count() {
        return Err(Incomparable::TensorCount(a.tensor_count(), b.tensor_count()));
    }
    let covered = ma.len.min(mb.len);
    // positions are i64 and compared runs half-open, so the last position any state can cover is i64::MAX - 1
    let covered_positions = covered.min(i64::MAX as usize);
    let per_tensor: Vec<(TensorDiff, TensorFirst)> = (0..a.tensor_count())
        .into_par_iter()
        .map(|i| {
            let (ta, tb) =
                (a.tensor(i).map_err(Incomparable::Malformed)?, b.tensor(i).map_err(Incomparable::Malformed)?);
            if (ta.layer, ta.name, ta.kind, ta.width) != (tb.layer, tb.name, tb.kind, tb.width) {
                let shape =
                    |t: &TensorRows<'_>| format!("layers.{}.{} ({:?}, width {})", t.layer, t.name, t.kind, t.width);
                return Err(Incomparable::Shape(shape(&ta), shape(&tb)));
            }
            if let Some(bad) = ta.malformed().or_else(|| tb.malformed()) {
                return Err(Incomparable::Malformed(bad));
            }
            diff_tensor(&ta, &tb, covered_positions).map_err(Incomparable::Malformed)
        })
        .collect::<Result<_, _>>()?;

    let first = per_tensor
        .iter()
        .filter_map(|(t, f)| f.map(|(p, distance)| (p, t, distance)))
        .min_by_key(|(p, t, _)| (*p, t.layer))
        .map(|(position, t, distance)| FirstRow {
            layer: t.layer,
            tensor: t.name.clone(),
            kind: t.kind,
            position,
            writer_a: t.writer_a,
            writer_b: t.writer_b,
            distance,
        });
    let tensors: Vec<TensorDiff> = per_tensor.into_iter().map(|(t, _)| t).collect();
    let (ra, rb) = (a.record_ids(), b.record_ids());
    let first_diff =
        (ra != rb).then(|| ra.iter().zip(rb.iter()).position(|(x, y)| x != y).unwrap_or(ra.len().min(rb.len())));
    Ok(StateDiff {
        arch: ma.arch.clone(),
        len_a: ma.len,
        len_b: mb.len,
        covered,
        record: RecordDiff {
            len_a: ra.len(),
            len_b: rb.len(),
            first_diff,
            tainted_a: a.record_tainted(),
            tainted_b: b.record_tainted(),
        },
        first,
        layers: layers_of(&tensors),
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::fixtures::{dump, tensor, writer};
    use crate::dump::DumpTensor;

    fn diff(a: &StateDump, b: &StateDump) -> StateDiff {
        compare(a, b).expect("comparable")
    }

    /// A state of length `len` whose rows of `width` floats hold `positions`, values from the position.
    fn wide(len: usize, positions: &[i64], width: usize) -> StateDump {
        let data = positions.iter().flat_map(|&p| (0..width).map(move |k| (p * 31 + k as i64) as f32)).collect();
        let t = DumpTensor {
            layer: 0,
            name: "k".into(),
            kind: CacheKind::Ring,
            width,
            data,
            positions: positions.to_vec(),
            writers: positions.iter().map(|&p| (p >= 0).then_some(writer(1)).flatten()).collect(),
        };
        dump(len, &vec![0; len], vec![t])
    }

    proptest::proptest! {
        /// Blocks of rows compared at once report exactly what comparing every matched row alone reports.
        #[test]
        fn block_comparison_equals_row_by_row(
            rows in 1usize..300,
            rotate in 0usize..300,
            holes in proptest::collection::vec(0usize..300, 0..4),
            changed in proptest::collection::vec((0usize..300, 0usize..3), 0..6),
        ) {
            let width = 3;
            let mut positions: Vec<i64> = (0..rows as i64).collect();
            positions.rotate_left(rotate % rows);
            let a = wide(rows, &positions, width);
            let mut b_positions = positions.clone();
            for h in &holes {
                b_positions[h % rows] = -1;
            }
            let mut b = wide(rows, &b_positions, width);
            for &(r, k) in &changed {
                b.tensors[0].data[(r % rows) * width + k] += 0.5;
            }
            let d = diff(&a, &b);
            // the reference: every position both hold, compared alone
            let row_of = |t: &DumpTensor, p: i64| t.positions.iter().position(|&q| q == p);
            let (mut compared, mut identical, mut divergent) = (0, 0, Vec::new());
            for p in 0..rows as i64 {
                let (Some(i), Some(j)) = (row_of(&a.tensors[0], p), row_of(&b.tensors[0], p)) else { continue };
                compared += 1;
                let (x, y) = (&a.tensors[0].data[i * width..][..width], &b.tensors[0].data[j * width..][..width]);
                if x == y { identical += 1 } else { divergent.push(p) }
            }
            let t = &d.tensors[0];
            proptest::prop_assert_eq!((t.rows.rows_compared, t.rows.rows_identical), (compared, identical));
            proptest::prop_assert_eq!(t.divergent.iter().map(|r| r.0).collect::<Vec<_>>(), divergent.clone());
            proptest::prop_assert_eq!(t.first_divergent_pos, divergent.first().copied());
        }
    }

    /// Counts how often the matcher asks for each tensor.
    struct Counted<'a>(&'a StateDump, std::sync::Mutex<Vec<usize>>);

    impl DumpSource for Counted<'_> {
        fn meta(&self) -> &DumpMeta {
            self.0.meta()
        }
        fn record_ids(&self) -> Cow<'_, [u32]> {
            self.0.record_ids()
        }
        fn record_tainted(&self) -> bool {
            self.0.record_tainted()
        }
        fn tensor_count(&self) -> usize {
            self.0.tensor_count()
        }
        fn tensor(&self, i: usize) -> Result<TensorRows<'_>, String> {
            self.1.lock().expect("count")[i] += 1;
            self.0.tensor(i)
        }
    }

    #[test]
    fn every_tensor_is_read_once_per_side() {
        let w = dump(3, &[0; 3], (0..4).map(|l| tensor(l, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0])).collect());
        let (a, b) = (Counted(&w, vec![0; 4].into()), Counted(&w, vec![0; 4].into()));
        assert!(compare(&a, &b).expect("comparable").identical());
        assert_eq!(*a.1.lock().expect("count"), vec![1; 4]);
        assert_eq!(*b.1.lock().expect("count"), vec![1; 4]);
    }

    #[test]
    fn rows_are_matched_by_position_not_index() {
        // a ring of 4 after 6 positions: warm and cold hold the same positions at the same rows
        let w = dump(6, &[0; 6], vec![tensor(0, CacheKind::Ring, &[4, 5, 2, 3], &[4.0, 5.0, 2.0, 3.0])]);
        let mut c = w.clone();
        assert!(diff(&w, &c).identical());
        // same rows, stored in another order: still identical, and the rotation is reported
        c.tensors[0] = tensor(0, CacheKind::Ring, &[2, 3, 4, 5], &[2.0, 3.0, 4.0, 5.0]);
        let d = diff(&w, &c);
        assert!(d.identical(), "{d:?}");
        assert_eq!(d.rows_compared(), 4);
        assert_eq!((d.tensors[0].misplaced_b, d.tensors[0].rotation_b), (4, Some(2)));
    }

    #[test]
    fn the_first_divergent_row_is_the_lowest_position_then_the_lowest_layer() {
        let w = dump(
            3,
            &[0; 3],
            vec![
                tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
                tensor(1, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
                tensor(2, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
            ],
        );
        let mut c = w.clone();
        c.tensors[0].data[2] = 3.5; // layer 0, position 2
        c.tensors[2].data[1] = 2.25; // layer 2, position 1
        c.tensors[1].data[1] = 2.5; // layer 1, position 1
        let d = diff(&w, &c);
        assert_eq!(d.rows_differing(), 3);
        let f = d.first.as_ref().expect("first");
        assert_eq!((f.position, f.layer, f.distance.max_abs), (1, 1, 0.5));
        assert_eq!(d.max_abs(), 0.5);
        assert_eq!(d.layers_differing(), vec![0, 1, 2]);
        assert_eq!(d.layers[0].first_divergent_pos, Some(2));
        assert!(d.headline("warm", "cold").starts_with("layer 1 `k`, pos 1: warm row by prefill (req 1"));
    }

    #[test]
    fn diff_json_keeps_its_field_names_and_reads_back() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1], &[1.0, 2.0])]);
        let mut c = w.clone();
        c.tensors[0].data[1] = 2.5;
        let d = diff(&w, &c);
        let json = serde_json::to_value(&d).expect("json");
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
            k.sort();
            k
        };
        // the names diff.json has always had: the row stats are flattened into each object
        let tensor_keys = "compared divergent first_divergent_pos kind layer max_abs max_ulp misplaced_a misplaced_b \
                           name only_in_a only_in_b rotation_a rotation_b rows_compared rows_identical writer_a writer_b";
        assert_eq!(keys(&json["tensors"][0]).join(" "), tensor_keys);
        let layer_keys = "first_divergent_pos first_tensor layer max_abs max_ulp rows_compared rows_identical \
                          rows_only_one_side writer_a writer_b";
        assert_eq!(keys(&json["layers"][0]).join(" "), layer_keys);
        assert_eq!(keys(&json["first"]).join(" "), "kind layer max_abs max_ulp position tensor writer_a writer_b");
        assert_eq!(
            (json["tensors"][0]["max_abs"].as_f64(), json["layers"][0]["rows_compared"].as_u64()),
            (Some(0.5), Some(2))
        );
        assert_eq!(serde_json::from_value::<StateDiff>(json).expect("reads back"), d);
    }

    #[test]
    fn a_position_one_side_lacks_or_a_length_difference_is_a_difference() {
        let w = dump(3, &[0; 3], vec![tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0])]);
        let c = dump(3, &[0; 3], vec![tensor(0, CacheKind::Full, &[0, 1, -1], &[1.0, 2.0, 0.0])]);
        let d = diff(&w, &c);
        assert!(!d.identical());
        assert_eq!((d.tensors[0].only_in_a, d.tensors[0].only_in_b), (1, 0));
        assert!(d.headline("warm", "cold").contains("1 row(s) held by one side only"), "{}", d.headline("w", "c"));
        let longer = dump(4, &[0; 3], w.tensors.clone());
        assert!(!diff(&w, &longer).identical());
    }

    #[test]
    fn rows_past_the_covered_length_are_not_state() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 9.0])]);
        let c = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1, -1], &[1.0, 2.0, 0.0])]);
        assert!(diff(&w, &c).identical());
    }

    #[test]
    fn records_and_taint_are_compared() {
        let w = dump(2, &[1, 2], vec![]);
        let mut c = dump(2, &[1, 3], vec![]);
        assert_eq!(diff(&w, &c).record.first_diff, Some(1));
        c.record.ids = vec![1, 2];
        c.record.tainted = true;
        let d = diff(&w, &c);
        assert!(!d.identical() && d.headline("w", "c").contains("c record tainted"), "{}", d.headline("w", "c"));
    }

    #[test]
    fn malformed_and_mismatched_dumps_are_errors_not_panics() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1], &[1.0, 2.0])]);
        let mut c = w.clone();
        c.tensors[0].data.pop();
        assert!(matches!(compare(&w, &c), Err(Incomparable::Malformed(m)) if m.contains("layer 0 `k`")));
        let mut c = w.clone();
        c.tensors[0].width = 2;
        assert!(matches!(compare(&w, &c), Err(Incomparable::Shape(..))));
        let mut c = w.clone();
        c.meta.model_hash = "other".into();
        assert!(matches!(compare(&w, &c), Err(Incomparable::Model(..))));
        let mut c = w.clone();
        c.tensors.clear();
        assert_eq!(compare(&w, &c), Err(Incomparable::TensorCount(1, 0)));
    }

    #[test]
    fn a_huge_layer_index_is_one_layer_not_a_table_sized_by_it() {
        // a tensor with no rows may name any layer; the per-layer table holds the layers present, nothing more
        for layer in [1usize << 40, usize::MAX] {
            let mut w = dump(1, &[0], vec![tensor(0, CacheKind::Full, &[0], &[1.0])]);
            w.tensors.push(tensor(layer, CacheKind::Full, &[], &[]));
            let d = diff(&w, &w);
            assert!(d.identical());
            assert_eq!(d.layers.iter().map(|l| l.layer).collect::<Vec<_>>(), vec![0, layer]);
            assert_eq!(d.layers[1].rows.rows_compared, 0);
        }
    }

    #[test]
    fn positions_at_the_end_of_the_range_do_not_overflow() {
        // positions are i64 and runs half-open: i64::MAX itself lies past any state's covered length
        let p = i64::MAX;
        let w = dump(usize::MAX, &[0], vec![tensor(0, CacheKind::Full, &[p - 1, p], &[1.0, 2.0])]);
        let mut c = w.clone();
        c.tensors[0].data[0] = 3.0;
        c.tensors[0].data[1] = 4.0;
        let d = diff(&w, &c);
        assert_eq!(d.tensors[0].compared, vec![(p - 1, p)]);
        assert_eq!((d.rows_compared(), d.first.as_ref().map(|f| f.position)), (1, Some(p - 1)));
    }

    #[test]
    fn ulp_distance_counts_representable_steps() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulp_distance(-0.0, 0.0), 0);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(ulp_distance(f32::NAN, 1.0), u64::MAX);
    }

    #[test]
    fn in_memory_and_little_endian_rows_compare_alike() {
        let a = [1.0f32, -2.5, 3.25];
        let bytes: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(same_bits(RowData::F32(&a), RowData::Le(&bytes)));
        let b = [1.0f32, -2.5, 3.5];
        let expected = Distance { max_abs: 0.25, max_ulp: ulp_distance(3.25, 3.5) };
        assert_eq!(row_distance(RowData::Le(&bytes), RowData::F32(&b)), expected);
    }

    #[test]
    fn compared_positions_become_runs() {
        let mut runs = Vec::new();
        for (start, end) in [(0, 1), (3, 5), (5, 6), (9, 10), (10, 11)] {
            push_run(&mut runs, start, end);
        }
        assert_eq!(runs, vec![(0, 1), (3, 6), (9, 11)]);
    }
}
