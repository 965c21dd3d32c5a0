//! What a trial keeps of its warm-vs-cold state diff: the counts and the first divergent row. The whole diff
//! (every tensor's divergent rows) is saved as diff.json beside the dumps of a failing comparison.

use kvproof_engines::state_diff::{FirstRow, StateDiff};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StateSummary {
    pub tensors: usize,
    pub rows_compared: usize,
    pub rows_differing: usize,
    /// Rows held by one side only, at positions both cover.
    pub rows_one_side: usize,
    pub max_abs_diff: f32,
    pub max_ulps: u64,
    /// Layers with at least one differing row, ascending.
    pub layers_differing: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<FirstRow>,
    /// The diff's one-line account, warm vs cold ("states identical", or the first divergent row and writers).
    pub headline: String,
    pub identical: bool,
}

impl StateSummary {
    pub fn of(d: &StateDiff) -> Self {
        StateSummary {
            tensors: d.tensors.len(),
            rows_compared: d.rows_compared(),
            rows_differing: d.rows_differing(),
            rows_one_side: d.rows_only_one_side(),
            max_abs_diff: d.max_abs(),
            max_ulps: d.max_ulp(),
            layers_differing: d.layers_differing(),
            first: d.first.clone(),
            headline: d.headline("warm", "cold"),
            identical: d.identical(),
        }
    }
}
