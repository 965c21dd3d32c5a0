//! The `params` of each scenario kind, with the range checks serde cannot express. Upper limits keep every size
//! the cases derive from them far from integer overflow.

use std::ops::RangeInclusive;

mod agentic;
mod boundary;
mod growth;
mod staleness;
mod stress;

pub use agentic::{AgentTask, AgenticParams, ToolName, TreeCheck, MAX_SESSIONS};
pub use boundary::{BoundaryParams, CaseName};
pub use growth::{GrowthParams, MAX_REPEATS, MAX_THREADS};
pub use staleness::{ContextName, StalenessParams, MAX_CASES};
pub use stress::{StressParams, MAX_PAIRS};

pub const MAX_TOKENS: usize = 65_536;
pub const MAX_TURNS: usize = 256;
pub const MAX_USER_LEN: usize = 1 << 20;

/// Reply tokens of the boundary and stress kinds unless a scenario says otherwise.
const DEFAULT_MAX_TOKENS: usize = 8;

fn check_max_tokens(m: usize) -> Result<(), String> {
    check_in("max_tokens", m, 1..=MAX_TOKENS)
}

/// `params.<name>` must lie in `range`.
fn check_in(name: &str, value: usize, range: RangeInclusive<usize>) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(format!("params.{name}: {value} is not in {}..={}", range.start(), range.end()))
}

/// `params.<name>` is a `[min, max]` range that must satisfy `least <= min <= max <= most`.
fn check_span(name: &str, [lo, hi]: [usize; 2], least: usize, most: usize) -> Result<(), String> {
    if least <= lo && lo <= hi && hi <= most {
        return Ok(());
    }
    Err(format!("params.{name}: [{lo}, {hi}] must satisfy {least} <= min <= max <= {most}"))
}
