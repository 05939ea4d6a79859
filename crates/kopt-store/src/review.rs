//! What a reviewer is shown for a pending variant, as data: the accept plan (or why it
//! cannot be accepted), and the source diff against what it would replace: the accepted
//! variant for its architecture, else the reference. `cargo kopt review` renders it.

use similar::{ChangeTag, TextDiff};

use crate::accept::{plan_accept, AcceptAs, AcceptPlan, KernelTarget};
use crate::layout::KoptDir;
use crate::pending::PendingVariant;
use crate::Error;

/// One line of a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffLine {
    /// `@@ -1,5 +1,7 @@`
    Hunk(String),
    Context(String),
    Removed(String),
    Added(String),
}

/// A unified diff of two sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceDiff {
    pub old_label: String,
    pub new_label: String,
    pub lines: Vec<DiffLine>,
    pub added: usize,
    pub removed: usize,
}

/// The unified diff of `old` and `new` by lines, with `context` lines around changes.
pub fn source_diff(
    old_label: &str,
    old: &str,
    new_label: &str,
    new: &str,
    context: usize,
) -> SourceDiff {
    let diff = TextDiff::from_lines(old, new);
    let mut lines = Vec::new();
    let (mut added, mut removed) = (0, 0);
    for hunk in diff.unified_diff().context_radius(context).iter_hunks() {
        lines.push(DiffLine::Hunk(hunk.header().to_string()));
        for change in hunk.iter_changes() {
            let text = change.value().trim_end_matches(['\n', '\r']).to_string();
            lines.push(match change.tag() {
                ChangeTag::Equal => DiffLine::Context(text),
                ChangeTag::Delete => {
                    removed += 1;
                    DiffLine::Removed(text)
                }
                ChangeTag::Insert => {
                    added += 1;
                    DiffLine::Added(text)
                }
            });
        }
    }
    SourceDiff {
        old_label: old_label.to_string(),
        new_label: new_label.to_string(),
        lines,
        added,
        removed,
    }
}

/// The amalgamated reference as a person would read it: without the `#line` markers
/// that only the compiler needs.
pub fn reference_for_display(amalgamated: &str) -> String {
    amalgamated
        .lines()
        .filter(|l| !l.trim_start().starts_with("#line "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Everything review shows for one pending variant.
#[derive(Debug)]
pub struct ReviewItem {
    pub pending: PendingVariant,
    /// The accept plan, or why it cannot be accepted (stale, unusable, conflict).
    pub plan: Result<AcceptPlan, Error>,
    pub diff: SourceDiff,
}

/// Prepares the review of a pending variant for today's kernel.
pub fn prepare(t: &KernelTarget, kopt: &KoptDir, pending: PendingVariant) -> ReviewItem {
    let plan = plan_accept(t, kopt, &pending, AcceptAs::default());
    let displaced = plan.as_ref().ok().and_then(|p| displaced(t, p));
    let new_label = format!("pending `{}` kernel.cu", pending.meta.variant);
    let diff = match displaced {
        Some((variant, arch, source, replaced)) => source_diff(
            &format!(
                "kopt/{}/{variant}/kernel.cu (accepted for {arch}, {})",
                t.kernel(),
                if replaced {
                    "would be replaced"
                } else {
                    "runs there today"
                }
            ),
            &source,
            &new_label,
            &pending.source,
            3,
        ),
        None => source_diff(
            &format!("{} (reference, includes inlined)", t.spec.reference),
            &reference_for_display(&t.reference.text),
            &new_label,
            &pending.source,
            3,
        ),
    };
    ReviewItem {
        pending,
        plan,
        diff,
    }
}

/// The accepted variant the pending one takes over from: the one that runs today on most
/// of the shapes where it would run after the accept (ties: the first such shape's), with
/// its architecture, its source and whether the accept removes it. `None`: the reference.
fn displaced(t: &KernelTarget, plan: &AcceptPlan) -> Option<(String, String, String, bool)> {
    let mine = &plan.entry.variant;
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for row in plan.region_map.iter().filter(|r| r.after == *mine) {
        match counts.iter_mut().find(|(v, _)| *v == row.before) {
            Some(c) => c.1 += 1,
            None => counts.push((&row.before, 1)),
        }
    }
    // `max_by_key` keeps the last of equals: over the reversed list, the first.
    let most = counts.iter().rev().max_by_key(|(_, n)| *n).map(|(v, _)| *v);
    let variant = match most {
        Some("reference") => return None,
        Some(v) => v.to_string(),
        // It runs on no known shape: show what it replaces, if anything.
        None => plan.replaces.first()?.entry.variant.clone(),
    };
    let replaced = plan.replaces.iter().find(|r| r.entry.variant == variant);
    let source = match replaced {
        Some(r) => r.source.clone()?,
        None => std::fs::read_to_string(
            t.kernel_dir()
                .join(&variant)
                .join(kopt_spec::files::SOURCE_FILE),
        )
        .ok()?,
    };
    Some((variant, plan.entry.key(), source, replaced.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_diff_counts_and_hunks() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nC\nd\ne\nf\ng\nh\ni\n";
        let d = source_diff("old", old, "new", new, 1);
        assert_eq!((d.added, d.removed), (2, 1));
        assert_eq!(
            d.lines,
            vec![
                DiffLine::Hunk("@@ -2,3 +2,3 @@".into()),
                DiffLine::Context("b".into()),
                DiffLine::Removed("c".into()),
                DiffLine::Added("C".into()),
                DiffLine::Context("d".into()),
                DiffLine::Hunk("@@ -8 +8,2 @@".into()),
                DiffLine::Context("h".into()),
                DiffLine::Added("i".into()),
            ]
        );
        assert!(source_diff("a", old, "b", old, 3).lines.is_empty());
    }

    #[test]
    fn line_markers_are_hidden() {
        assert_eq!(
            reference_for_display("#line 1 \"k.cu\"\nint x;\n#line 3 \"k.cu\"\n"),
            "int x;\n"
        );
    }
}
