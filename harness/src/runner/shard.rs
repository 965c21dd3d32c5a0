//! `--shard K/N`: which units of a scenario set one of N shards runs. A unit is a plan — a boundary case, a stress
//! or staleness conversation, an agentic session, a whole growth curve (its passes share the transcript the first
//! warm pass builds, and their medians make each turn's record) — because a plan is the largest thing that shares a
//! warm instance's state and the smallest that runs on its own. A unit belongs to shard `unit_hash(scenario name,
//! plan index) mod N`: it depends on nothing else, so the assignment is stable when scenarios or files are given in
//! another order, and the same on every machine.

use std::fmt;
use std::str::FromStr;

/// One shard of N (`index` is 1-based, as the command line writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("--shard `{0}`: expected K/N, two whole numbers with 1 <= K <= N (e.g. 2/4)")]
    Syntax(String),
    #[error("--shard `{0}`: N must be at least 1")]
    NoShards(String),
    #[error("--shard `{0}`: K must be between 1 and N")]
    OutOfRange(String),
}

impl FromStr for Shard {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Self, ShardError> {
        let syntax = || ShardError::Syntax(s.to_string());
        let (k, n) = s.split_once('/').ok_or_else(syntax)?;
        let number = |t: &str| -> Result<usize, ShardError> {
            // digits only: no sign, no spaces, no `0x`
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            t.parse().map_err(|_| syntax())
        };
        let (index, count) = (number(k)?, number(n)?);
        if count == 0 {
            return Err(ShardError::NoShards(s.to_string()));
        }
        if index == 0 || index > count {
            return Err(ShardError::OutOfRange(s.to_string()));
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether plan `plan_index` of scenario `scenario` is this shard's.
    pub fn owns(&self, scenario: &str, plan_index: usize) -> bool {
        owner(scenario, plan_index, self.count) == self.index
    }
}

/// The 1-based shard of `count` that runs plan `plan_index` of scenario `scenario`.
pub fn owner(scenario: &str, plan_index: usize, count: usize) -> usize {
    (unit_hash(scenario, plan_index) % count.max(1) as u64) as usize + 1
}

/// FNV-1a (64-bit) over the scenario name's bytes, a 0 byte and the plan index as 8 little-endian bytes, then the
/// splitmix64 finalizer so that neighbouring indexes spread over every residue. Fixed forever: shards of one set
/// built by different kvproof binaries must agree (std's hasher is seeded per process and may change).
pub fn unit_hash(scenario: &str, plan_index: usize) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let index = (plan_index as u64).to_le_bytes();
    for &b in scenario.as_bytes().iter().chain(&[0u8]).chain(&index) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_of_n_parses_and_bad_ones_say_why() {
        assert_eq!("2/4".parse(), Ok(Shard { index: 2, count: 4 }));
        assert_eq!("1/1".parse(), Ok(Shard { index: 1, count: 1 }));
        for bad in ["", "3", "a/b", "1/", "/2", "-1/2", "+1/2", " 1/2", "1/2/3", "1.0/2", "99999999999999999999999/2"] {
            assert_eq!(bad.parse::<Shard>(), Err(ShardError::Syntax(bad.into())), "{bad}");
        }
        assert_eq!("0/0".parse::<Shard>(), Err(ShardError::NoShards("0/0".into())));
        assert_eq!("1/0".parse::<Shard>(), Err(ShardError::NoShards("1/0".into())));
        assert_eq!("0/3".parse::<Shard>(), Err(ShardError::OutOfRange("0/3".into())));
        assert_eq!("4/3".parse::<Shard>(), Err(ShardError::OutOfRange("4/3".into())));
    }

    /// The hash decides which shard runs a unit, so shards built by different kvproof binaries must agree: these
    /// values (computed by an independent implementation of the documented function) must never change.
    #[test]
    fn the_unit_hash_is_fixed() {
        let got = [unit_hash("inkling-stress", 0), unit_hash("inkling-stress", 1), unit_hash("a", 7)];
        assert_eq!(got, [0x64a2_258b_c4a7_56b5, 0xa314_6b87_cfcc_24a8, 0xde41_1db1_8835_eab3]);
    }

    #[test]
    fn every_unit_has_exactly_one_shard_and_shards_are_balanced() {
        for n in 1..=7 {
            let mut sizes = vec![0usize; n];
            for i in 0..3000 {
                let owners: Vec<usize> = (1..=n).filter(|&k| Shard { index: k, count: n }.owns("stress", i)).collect();
                assert_eq!(owners.len(), 1, "plan {i} of {n} shards");
                sizes[owners[0] - 1] += 1;
            }
            let ideal = 3000 / n;
            assert!(sizes.iter().all(|&s| s.abs_diff(ideal) < ideal / 5 + 10), "{n} shards: {sizes:?}");
        }
    }
}
