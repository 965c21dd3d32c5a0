//! The checks every engine makes on a request before it touches a slot.
//!
//! Shared so that every arch refuses the same malformed request with the same error, in the same order: the
//! slot, then the prompt's length, then its ids. What an arch does with audio frames is its own business and
//! stays in the arch (some refuse them, inkling accepts them).

use crate::engine::Request;
use crate::error::{EngineError, Result};

/// The slot exists, the prompt is not empty, every id is below `vocab`; the first failing check answers.
pub fn check_request(req: &Request, slots: usize, vocab: usize) -> Result<()> {
    if req.slot >= slots {
        return Err(EngineError::NoSuchSlot { slot: req.slot, slots });
    }
    if req.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if let Some(&bad) = req.prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::BadRequest(format!("token id {bad} outside the vocabulary ({vocab})")));
    }
    Ok(())
}
