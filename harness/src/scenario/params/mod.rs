//! The `params` of each scenario kind, with the range checks serde cannot express. Upper limits keep every size
//! the cases derive from them far from integer overflow.

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

fn default_max_tokens() -> usize {
    8
}

fn check_max_tokens(m: usize) -> Result<(), String> {
    if m == 0 || m > MAX_TOKENS {
        return Err(format!("params.max_tokens: {m} is not in 1..={MAX_TOKENS}"));
    }
    Ok(())
}
