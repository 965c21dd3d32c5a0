//! Memory: the bytes an engine's state holds must follow its capacity, never the number of turns it has served.
//! An engine that re-allocates its buffers every turn and keeps the old ones (kimi_k3.c's per-turn `kv_alloc`)
//! still answers every turn right — only its memory tells.
//!
//! After each compared turn the warm instance's state bytes are recorded with the slot capacity its dump reports.
//! The check fails when the warm instance holds a different number of bytes than
//! - a fresh (cold) instance that ran the same prompt to the same capacity, or
//! - itself at an earlier turn of the conversation with the same capacity.
//!
//! `Engine::state_bytes` covers every slot, so the comparison needs the other slots to be as fresh as a cold
//! instance's: plans that use several slots skip it.

use std::collections::BTreeMap;

use crate::record::{CheckName, CheckResult};

/// One instance's state size after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// The slot capacity the dump reports (positions).
    pub capacity: usize,
    /// `Engine::state_bytes()` (every slot).
    pub bytes: usize,
}

/// The warm instance's footprints so far in one plan, by capacity.
#[derive(Debug, Clone, Default)]
pub struct MemoryBook {
    /// capacity -> (bytes, the turn that first held that capacity)
    seen: BTreeMap<usize, (usize, String)>,
}

impl MemoryBook {
    /// The warm instance was replaced: what it held says nothing about the new one.
    pub fn reset(&mut self) {
        self.seen.clear();
    }

    /// Check `warm` after turn `turn`, against `cold` (a fresh instance after the same prompt) and every earlier
    /// turn at the same capacity; `Err(why)` when a footprint is unknown.
    pub fn check(
        &mut self,
        turn: &str,
        warm: Result<Footprint, String>,
        cold: Result<Footprint, String>,
    ) -> CheckResult {
        let warm = match warm {
            Ok(w) => w,
            Err(why) => return CheckResult::skipped(CheckName::Memory, why),
        };
        let mut problems = Vec::new();
        let mut compared = Vec::new();
        if let Ok(c) = &cold {
            if c.capacity == warm.capacity {
                compared.push("a fresh instance");
                if c.bytes != warm.bytes {
                    problems.push(format!(
                        "holds {} bytes at capacity {}, a fresh instance {} at the same capacity",
                        warm.bytes, warm.capacity, c.bytes
                    ));
                }
            }
        }
        match self.seen.get(&warm.capacity) {
            Some((bytes, first)) => {
                compared.push("an earlier turn");
                if *bytes != warm.bytes {
                    problems.push(format!(
                        "holds {} bytes at capacity {} after {turn}, {bytes} after {first} at the same capacity: \
                         the state grows with the turns",
                        warm.bytes, warm.capacity
                    ));
                }
            }
            None => {
                self.seen.insert(warm.capacity, (warm.bytes, turn.to_string()));
            }
        }
        if !problems.is_empty() {
            return CheckResult::fail(CheckName::Memory, problems.join("; "));
        }
        if compared.is_empty() {
            let why = match cold {
                Err(why) => format!("first turn at capacity {} and no fresh footprint ({why})", warm.capacity),
                Ok(c) => format!(
                    "first turn at capacity {}; the fresh instance grew to {} (nothing at the same capacity)",
                    warm.capacity, c.capacity
                ),
            };
            return CheckResult::skipped(CheckName::Memory, why);
        }
        CheckResult::pass(
            CheckName::Memory,
            format!("{} bytes at capacity {}, as {}", warm.bytes, warm.capacity, compared.join(" and ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Status;

    fn fp(capacity: usize, bytes: usize) -> Result<Footprint, String> {
        Ok(Footprint { capacity, bytes })
    }

    #[test]
    fn equal_capacity_means_equal_bytes() {
        let mut book = MemoryBook::default();
        assert_eq!(book.check("turn 2", fp(64, 1000), fp(64, 1000)).status, Status::Pass);
        assert_eq!(book.check("turn 3", fp(64, 1000), fp(128, 1800)).status, Status::Pass, "an earlier turn");
        // growth with the context is fine
        assert_eq!(book.check("turn 4", fp(128, 1800), fp(128, 1800)).status, Status::Pass);
    }

    #[test]
    fn bytes_that_follow_the_turns_fail() {
        let mut book = MemoryBook::default();
        book.check("turn 2", fp(64, 1000), fp(64, 1000));
        let r = book.check("turn 3", fp(64, 1400), fp(128, 1800));
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("1400 bytes at capacity 64 after turn 3, 1000 after turn 2"), "{}", r.detail);
        // a warm instance that leaked once already differs from a fresh one
        let mut book = MemoryBook::default();
        let r = book.check("turn 2", fp(64, 1400), fp(64, 1000));
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("a fresh instance 1000"), "{}", r.detail);
    }

    #[test]
    fn nothing_to_compare_is_skipped_not_passed() {
        let mut book = MemoryBook::default();
        assert_eq!(book.check("turn 2", fp(64, 1000), fp(128, 1800)).status, Status::Skipped);
        assert_eq!(book.check("turn 2", Err("stdio: no state bytes".into()), fp(64, 1)).status, Status::Skipped);
        assert_eq!(book.check("turn 3", fp(256, 1), Err("no dump".into())).status, Status::Skipped);
        book.reset();
        assert_eq!(book.check("turn 4", fp(64, 1400), Err("no dump".into())).status, Status::Skipped);
    }
}
