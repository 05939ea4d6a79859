//! Finding a region: the tightest condition over the integer scalars that holds on every
//! shape where a candidate won and on none where it lost, so that a candidate faster on
//! some shapes and slower on others can be a winner where it wins.
//!
//! Tried in order, each over every integer scalar: one bound (`cols <= 1024`, `rows >=
//! 4096`), then an interval of one scalar, then the intervals of two scalars together. A
//! bound is the winning shapes' own extreme, never a midpoint: the region claims no shape
//! beyond the ones that won in that direction. Among the conditions of one kind that
//! separate, the tightest holds on the fewest of the other known shapes (the held-out
//! ones), then comes first in declaration order.

use crate::spec::KernelSpec;

/// A condition found by [`separating_region`], with the other shapes it holds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRegion {
    /// The condition, in the annotation's expression language.
    pub text: String,
    /// How many of the other shapes it holds on.
    pub others_inside: usize,
}

/// A bound on one scalar: `lo <= value <= hi`, either side open.
#[derive(Debug, Clone, Copy)]
struct Bound {
    scalar: usize,
    lo: Option<i64>,
    hi: Option<i64>,
}

impl Bound {
    fn holds(&self, args: &[i64]) -> bool {
        let v = args[self.scalar];
        self.lo.is_none_or(|lo| v >= lo) && self.hi.is_none_or(|hi| v <= hi)
    }

    fn text(&self, name: &str) -> String {
        match (self.lo, self.hi) {
            (Some(lo), Some(hi)) => format!("{name} >= {lo} && {name} <= {hi}"),
            (Some(lo), None) => format!("{name} >= {lo}"),
            (None, Some(hi)) => format!("{name} <= {hi}"),
            (None, None) => "1".to_string(),
        }
    }
}

/// The tightest condition that holds on every shape of `wins` and on none of `losses`
/// (scalar arguments in declaration order, as [`KernelSpec::shape_args`] gives them), or
/// `None` when no condition of the kinds tried separates them, or when either side is
/// empty. `others` (the held-out shapes) only break ties.
pub fn separating_region(
    spec: &KernelSpec,
    wins: &[Vec<i64>],
    losses: &[Vec<i64>],
    others: &[Vec<i64>],
) -> Option<FoundRegion> {
    if wins.is_empty() || losses.is_empty() {
        return None;
    }
    let ints: Vec<(usize, &str)> = spec
        .scalars()
        .enumerate()
        .filter(|(_, s)| !s.ty.is_float())
        .map(|(i, s)| (i, s.name.as_str()))
        .collect();
    let range = |i: usize| {
        let values = wins.iter().map(|a| a[i]);
        (values.clone().min().unwrap(), values.max().unwrap())
    };
    let mut singles = Vec::new();
    let mut intervals = Vec::new();
    for &(i, _) in &ints {
        let (lo, hi) = range(i);
        singles.push(vec![Bound {
            scalar: i,
            lo: None,
            hi: Some(hi),
        }]);
        singles.push(vec![Bound {
            scalar: i,
            lo: Some(lo),
            hi: None,
        }]);
        intervals.push(vec![Bound {
            scalar: i,
            lo: Some(lo),
            hi: Some(hi),
        }]);
    }
    let mut pairs = Vec::new();
    for (a, &(i, _)) in ints.iter().enumerate() {
        for &(j, _) in &ints[a + 1..] {
            let ((li, hi_i), (lj, hj)) = (range(i), range(j));
            pairs.push(vec![
                Bound {
                    scalar: i,
                    lo: Some(li),
                    hi: Some(hi_i),
                },
                Bound {
                    scalar: j,
                    lo: Some(lj),
                    hi: Some(hj),
                },
            ]);
        }
    }
    let holds = |c: &[Bound], args: &[i64]| c.iter().all(|b| b.holds(args));
    let name = |i: usize| {
        ints.iter()
            .find(|(k, _)| *k == i)
            .map(|(_, n)| *n)
            .unwrap_or("")
    };
    for kind in [singles, intervals, pairs] {
        let best = kind
            .iter()
            .filter(|c| wins.iter().all(|w| holds(c, w)) && !losses.iter().any(|l| holds(c, l)))
            .map(|c| (others.iter().filter(|o| holds(c, o)).count(), c))
            .min_by_key(|(inside, _)| *inside);
        if let Some((inside, c)) = best {
            let text = c
                .iter()
                .map(|b| b.text(name(b.scalar)))
                .collect::<Vec<_>>()
                .join(" && ");
            // It is a condition of the annotation's language, or nothing.
            spec.parse_region(&text).ok()?;
            return Some(FoundRegion {
                text,
                others_inside: inside,
            });
        }
    }
    None
}

/// The scalar arguments of a shape label as verdicts print them (`cols=4096 rows=16`,
/// [`crate::spec::shape_label`]), in declaration order, a float scalar as 0 (as
/// [`KernelSpec::shape_args`] gives it); `None` when an integer scalar is missing or not
/// an integer.
pub fn label_args(spec: &KernelSpec, label: &str) -> Option<Vec<i64>> {
    let values: std::collections::BTreeMap<&str, &str> = label
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    spec.scalars()
        .map(|s| match s.ty.is_float() {
            true => Some(0),
            false => values.get(s.name.as_str())?.parse().ok(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn softmax() -> KernelSpec {
        let item = crate::spec::parse_item(quote! {
            pub fn softmax(stream: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);
        })
        .unwrap();
        crate::spec::parse_kernel(
            quote! {
                reference = "kernels/softmax.cu",
                x: [rows * cols],
                y: [rows * cols],
                grid = rows,
                block = 256,
                shapes = [{ rows: 4096, cols: 4096 }, { rows: 32768, cols: 1024 }],
            },
            &item,
        )
        .unwrap()
        .0
    }

    /// `[rows, cols]`.
    fn shapes(list: &[(i64, i64)]) -> Vec<Vec<i64>> {
        list.iter().map(|&(r, c)| vec![r, c]).collect()
    }

    #[test]
    fn one_bound_at_the_winners_extreme_separates_and_the_held_out_shapes_pick_the_tighter() {
        let spec = softmax();
        // A one-warp-per-row softmax: faster on short rows, slower on long ones.
        let wins = shapes(&[(32768, 1024), (8192, 512)]);
        let losses = shapes(&[(4096, 4096), (16, 65536)]);
        // `rows >= 8192` and `cols <= 1024` both separate; the held-out shapes decide.
        let others = shapes(&[(9000, 8192), (10000, 70000), (100, 700)]);
        let found = separating_region(&spec, &wins, &losses, &others).unwrap();
        assert_eq!(found.text, "cols <= 1024");
        assert_eq!(found.others_inside, 1);
        // Without held-out shapes, declaration order: the first scalar's bound.
        let found = separating_region(&spec, &wins, &losses, &[]).unwrap();
        assert_eq!(found.text, "rows >= 8192");
        assert_eq!(found.others_inside, 0);
    }

    #[test]
    fn an_interval_when_no_one_sided_bound_separates() {
        let spec = softmax();
        let wins = shapes(&[(64, 2048), (64, 4096)]);
        let losses = shapes(&[(64, 1024), (64, 8192)]);
        let found = separating_region(&spec, &wins, &losses, &[]).unwrap();
        assert_eq!(found.text, "cols >= 2048 && cols <= 4096");
    }

    #[test]
    fn two_scalars_together_when_one_does_not_do() {
        let spec = softmax();
        // Wins at (big rows, small cols); losses share one of the two ranges each.
        let wins = shapes(&[(8192, 1024), (16384, 2048)]);
        let losses = shapes(&[(8192, 8192), (64, 2048)]);
        let found = separating_region(&spec, &wins, &losses, &[]).unwrap();
        assert_eq!(
            found.text,
            "rows >= 8192 && rows <= 16384 && cols >= 1024 && cols <= 2048"
        );
    }

    #[test]
    fn labels_give_the_scalars_in_declaration_order() {
        let spec = softmax();
        assert_eq!(
            label_args(&spec, "cols=1024 rows=32768"),
            Some(vec![32768, 1024])
        );
        assert_eq!(label_args(&spec, "cols=1024"), None);
        assert_eq!(label_args(&spec, "cols=1.5 rows=2"), None);
    }

    #[test]
    fn no_region_where_a_loss_sits_among_the_wins_or_a_side_is_empty() {
        let spec = softmax();
        let wins = shapes(&[(64, 1024), (64, 4096)]);
        let losses = shapes(&[(64, 2048)]);
        assert_eq!(separating_region(&spec, &wins, &losses, &[]), None);
        assert_eq!(separating_region(&spec, &wins, &[], &[]), None);
        assert_eq!(separating_region(&spec, &[], &losses, &[]), None);
    }
}
