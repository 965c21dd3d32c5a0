//! Token identity: warm vs cold, and the cold-vs-cold control. On a mismatch, where and how close it was: a
//! difference at a near-tie (tiny top-2 gap) reads differently from one where the reference was confident.

use crate::driver::Generation;
use crate::id_diff::IdDiff;
use crate::record::{show_piece, CheckName, CheckResult, Divergence};

pub fn first_divergence(warm: &Generation, cold: &Generation) -> Option<Divergence> {
    let index = IdDiff::new(&warm.tokens, &cold.tokens).first_difference()?;
    let gap = |g: &Generation| g.gaps.as_ref().and_then(|gaps| gaps.get(index).copied());
    let text = |g: &Generation| g.pieces.as_ref().and_then(|p| p.get(index)).map(|b| show_piece(b));
    Some(Divergence {
        index,
        warm: warm.tokens.get(index).copied(),
        cold: cold.tokens.get(index).copied(),
        warm_gap: gap(warm),
        cold_gap: gap(cold),
        warm_text: text(warm),
        cold_text: text(cold),
    })
}

/// Warm vs cold token identity.
pub fn identity(warm: &Generation, cold: &Generation) -> (CheckResult, Option<Divergence>) {
    match first_divergence(warm, cold) {
        None => (CheckResult::pass(CheckName::Tokens, format!("{} tokens identical", warm.tokens.len())), None),
        Some(d) => (CheckResult::fail(CheckName::Tokens, d.describe()), Some(d)),
    }
}

/// Cold vs cold: the engine's own determinism on this prompt.
pub fn control(cold: &Generation, control: &Generation) -> CheckResult {
    match first_divergence(cold, control) {
        None => CheckResult::pass(CheckName::Control, "two cold runs identical"),
        Some(d) => CheckResult::fail(
            CheckName::Control,
            format!("two cold runs differ (noise, not reuse): {}", d.describe().replace("warm", "cold#2")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(tokens: &[u32], gaps: &[f32]) -> Generation {
        Generation { gaps: Some(gaps.to_vec()), reused: Some(0), ..Generation::for_test(tokens.to_vec(), 3) }
    }

    #[test]
    fn identical_replies_pass() {
        let (r, d) = identity(&gen(&[1, 2], &[0.5, 0.5]), &gen(&[1, 2], &[0.5, 0.5]));
        assert_eq!(r.status, super::super::Status::Pass);
        assert!(d.is_none());
    }

    #[test]
    fn first_difference_carries_the_gap_there() {
        let (r, d) = identity(&gen(&[104, 105, 7], &[1.0, 0.001, 2.0]), &gen(&[104, 101], &[1.0, 0.004]));
        let d = d.expect("diverges");
        assert_eq!((d.index, d.warm, d.cold), (1, Some(105), Some(101)));
        assert_eq!(d.gap(), Some(0.004), "the reference's gap");
        assert!(r.detail.contains("#1: warm 105 gap 0.0010, cold 101 gap 0.0040"), "{}", r.detail);
        // with the engine's own token text
        let mut w = gen(&[104, 105, 7], &[1.0, 0.001, 2.0]);
        w.pieces = Some(vec![b"h".to_vec(), b" the".to_vec(), vec![0xff]]);
        let mut c = gen(&[104, 101], &[1.0, 0.004]);
        c.pieces = Some(vec![b"h".to_vec(), vec![0xc3]]);
        let (r, _) = identity(&w, &c);
        assert!(r.detail.contains("warm 105 \" the\" gap 0.0010, cold 101 0xc3 gap"), "{}", r.detail);
    }

    #[test]
    fn a_longer_reply_diverges_where_the_shorter_ends() {
        let d = first_divergence(&gen(&[1, 2, 3], &[5.0; 3]), &gen(&[1, 2], &[5.0; 2])).expect("diverges");
        assert_eq!((d.index, d.warm, d.cold), (2, Some(3), None));
        assert!(d.describe().contains("cold (ended)"), "{}", d.describe());
    }
}
