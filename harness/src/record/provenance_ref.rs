//! Where a run kept a failing comparison's dumps and diff.

use serde::{Deserialize, Serialize};

/// What a run keeps about a captured case (carried in results.jsonl, so reports rebuild from artifacts alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceRef {
    /// The case folder, relative to the run folder.
    pub dir: String,
    /// "layer 3, pos 8: warm row by decode (req 2, step 3), cold row by prefill (req 3, chunk 0 of 16 rows)"
    pub headline: String,
}
