//! The state after a turn, through dumps: warm vs cold row by row (`kvproof_engines::state_diff`, the one row
//! matcher), the record against the ids the harness knows were fed, and the layout of each dump on its own (every
//! claimed position has its row where the cache kind puts it).

use kvproof_engines::dump::{CacheKind, StateDump};
use kvproof_engines::state_diff::{DumpSource, Incomparable, StateDiff};

use crate::id_diff::IdDiff;
use crate::record::{CheckName, CheckResult};

const MAX_LISTED: usize = 8;

/// The state check of a compared turn, from the warm-vs-cold diff.
pub fn state_check(diff: &Result<StateDiff, Incomparable>) -> CheckResult {
    let d = match diff {
        Ok(d) => d,
        Err(e) => return CheckResult::fail(CheckName::State, format!("states not comparable: {e}")),
    };
    if d.identical() {
        return CheckResult::pass(
            CheckName::State,
            format!("{} rows in {} tensors bitwise identical", d.rows_compared(), d.tensors.len()),
        );
    }
    let mut parts = Vec::new();
    let differing = d.rows_differing();
    if differing > 0 {
        parts.push(format!(
            "{differing} of {} rows differ (max |diff| {:.4e}, {} ulps) in layers {:?}",
            d.rows_compared(),
            d.max_abs(),
            d.max_ulp(),
            d.layers_differing()
        ));
    }
    parts.push(format!("first: {}", d.headline("warm", "cold")));
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
    for i in 0..dump.tensor_count() {
        let t = match dump.tensor(i) {
            Ok(t) => t,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if let Some(bad) = t.malformed() {
            problems.push(format!("malformed dump: {bad}"));
            continue;
        }
        let rows = t.positions.len();
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
            let written = matches!(t.writers.get(row), Some(Ok(Some(_))));
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
            if let Some(at) = IdDiff::new(fed, got).first_difference() {
                let what = if got.len() > fed.len() && at == fed.len() {
                    format!(
                        "claims {} id(s) never fed, starting with id {} at position {at}",
                        got.len() - fed.len(),
                        got[fed.len()]
                    )
                } else if got.len() < fed.len() && at == got.len() {
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
    use super::*;
    use crate::record::Status;
    use kvproof_engines::dump::fixtures::{dump, tensor};
    use kvproof_engines::state_diff::compare;

    #[test]
    fn malformed_dumps_are_reported_not_indexed() {
        let w = dump(2, &[0; 2], vec![tensor(0, CacheKind::Full, &[0, 1], &[1.0, 2.0])]);
        let mut c = w.clone();
        c.tensors[0].data.pop();
        let r = state_check(&compare(&w, &c));
        assert!(r.status == Status::Fail && r.detail.contains("malformed dump"), "{}", r.detail);
        assert!(coverage(&c).iter().any(|p| p.contains("malformed dump")));
    }

    #[test]
    fn the_state_check_names_the_first_divergent_row_with_both_writers() {
        let w = dump(
            3,
            &[0; 3],
            vec![
                tensor(0, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
                tensor(1, CacheKind::Full, &[0, 1, 2], &[1.0, 2.0, 3.0]),
            ],
        );
        assert_eq!(state_check(&compare(&w, &w)).status, Status::Pass);
        let mut c = w.clone();
        c.tensors[0].data[2] = 3.5;
        c.tensors[1].data[1] = 2.25;
        let r = state_check(&compare(&w, &c));
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("2 of 6 rows differ"), "{}", r.detail);
        assert!(r.detail.contains("first: layer 1 `k`, pos 1: warm row by prefill (req 1"), "{}", r.detail);
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
        assert!(r.detail.contains("claims 1 id(s) never fed, starting with id 105 at position 3"), "{}", r.detail);
        let mut tainted = dump(3, &fed, vec![]);
        tainted.record.tainted = false;
        let r = record_check(Some(true), &[("warm", &tainted, Some(&fed[..]))]);
        assert!(r.detail.contains("not tainted, expected tainted"), "{}", r.detail);
    }
}
