//! Two id sequences compared with `similar` (Myers' diff): the record against the ids fed, warm tokens against
//! cold. Where they first part, and a grouped diff of the ids with their text, as summary.md shows it.

use std::fmt::Write as _;

use similar::{capture_diff_slices, group_diff_ops, Algorithm, ChangeTag, DiffOp};

/// The edit script from `old` to `new`.
#[derive(Debug, Clone)]
pub struct IdDiff<'a> {
    old: &'a [u32],
    new: &'a [u32],
    ops: Vec<DiffOp>,
}

impl<'a> IdDiff<'a> {
    pub fn new(old: &'a [u32], new: &'a [u32]) -> Self {
        IdDiff { old, new, ops: capture_diff_slices(Algorithm::Myers, old, new) }
    }

    pub fn is_equal(&self) -> bool {
        self.ops.iter().all(|op| matches!(op, DiffOp::Equal { .. }))
    }

    /// The index of the first id where the sequences part (in `old`; the same index in `new`, since everything
    /// before it is equal), or None when they are equal.
    pub fn first_difference(&self) -> Option<usize> {
        self.ops.iter().find(|op| !matches!(op, DiffOp::Equal { .. })).map(|op| op.old_range().start)
    }

    /// A unified diff of the ids, `context` equal ids around each change: ` id text` for equal ids, `-` for ids
    /// only `old` has, `+` for ids only `new` has; hunks headed `@@ -a,n +b,m @@` (1-based, as diff(1) writes).
    pub fn grouped(&self, context: usize, text: impl Fn(u32) -> String) -> String {
        let mut out = String::new();
        for group in group_diff_ops(self.ops.clone(), context) {
            let (Some(first), Some(last)) = (group.first(), group.last()) else { continue };
            let (o, n) = (first.old_range().start..last.old_range().end, first.new_range().start..last.new_range().end);
            let _ = writeln!(out, "@@ -{},{} +{},{} @@", o.start + 1, o.len(), n.start + 1, n.len());
            for op in &group {
                for change in op.iter_changes(self.old, self.new) {
                    let sign = match change.tag() {
                        ChangeTag::Equal => ' ',
                        ChangeTag::Delete => '-',
                        ChangeTag::Insert => '+',
                    };
                    let id = change.value();
                    let _ = writeln!(out, "{sign} {id:>6} {}", text(id));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(id: u32) -> String {
        format!("<{id}>")
    }

    #[test]
    fn equal_sequences_have_no_difference() {
        let d = IdDiff::new(&[1, 2, 3], &[1, 2, 3]);
        assert!(d.is_equal());
        assert_eq!(d.first_difference(), None);
        assert_eq!(d.grouped(2, show), "");
    }

    #[test]
    fn the_first_difference_is_where_they_part() {
        assert_eq!(IdDiff::new(&[1, 2, 3, 4], &[1, 2, 9, 4]).first_difference(), Some(2));
        assert_eq!(IdDiff::new(&[1, 2], &[1, 2, 3]).first_difference(), Some(2), "an extra id");
        assert_eq!(IdDiff::new(&[1, 2, 3], &[1, 2]).first_difference(), Some(2), "a missing id");
        assert_eq!(IdDiff::new(&[5], &[6]).first_difference(), Some(0));
    }

    #[test]
    fn a_grouped_diff_shows_context_and_both_sides() {
        let old = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let new = [1, 2, 3, 4, 50, 6, 7, 8, 9];
        let g = IdDiff::new(&old, &new).grouped(1, show);
        assert_eq!(g, "@@ -4,3 +4,3 @@\n       4 <4>\n-      5 <5>\n+     50 <50>\n       6 <6>\n");
    }
}
