//! Held-out shapes catch shape-specialised candidates of every kernel of
//! `examples/llm-kernels`, at the reference's defines and at every define set one tunable
//! away from them (a search point's held-out shapes are drawn at its own defines).
//!
//! Two families of cheats, each correct on the declared shapes and on any shape where its
//! assumption holds, wrong elsewhere:
//!
//! - *tail skipping*: for each integer dimension `d` and `k` in `1..=12`, wrong unless
//!   `d % 2^k == 0` (a candidate that assumes `cols % 1024 == 0` and skips the tail). Only
//!   for the `k` the constraints do not already force: where every valid held-out shape has
//!   `d % 2^k == 0` (`cols % VEC == 0` with `VEC = 4` forces `k = 2`), the assumption is
//!   the spec's, not a cheat;
//! - *first N*: for each dimension `d`, wrong unless `d` is at most its largest declared
//!   value (a candidate that handles the first N rows, or sizes a buffer to the declared
//!   shapes). Only where a valid shape above that value exists under the byte cap.
//!
//! The probability that a cheat passes every held-out shape, over the seed (the per-workspace
//! secret from which the seeded shapes are drawn), is computed as follows: it is exactly 0
//! when one of the seed-independent shapes (`seed_independent_held_out_shapes`, which every
//! draw starts with, whatever the seed) is one the cheat gets wrong. Otherwise the test
//! counts the seeds, of [`SAMPLED_SEEDS`], under which the cheat passes the whole draw; a
//! count over a sample only resolves probabilities down to about `1 / SAMPLED_SEEDS`, far
//! above 1e-6, so any cheat not caught exactly fails the test, with that fraction reported.
//!
//! Feasibility (whether a valid shape exists on which the cheat is wrong) is decided by
//! scanning, for each declared shape and dimension, the sizes 1 to [`SCAN`] and within
//! [`SCAN`] of the declared size, with every other dimension as declared, under the same
//! validity rule as the drawing (`kopt_spec::shapes::shape_is_valid`: lengths, launch rule,
//! constraints at the defines, byte cap).

use std::collections::{BTreeMap, BTreeSet};

use kopt_spec::shapes::{
    held_out_byte_cap, held_out_shapes_for, seed_independent_held_out_shapes, shape_is_valid,
};
use kopt_spec::spec::{KernelSpec, Number, Shape};
use kopt_tests::repo_root;

const SAMPLED_SEEDS: u64 = 1_000;
const SCAN: i64 = 512;
/// Seeded held-out shapes per declared shape, as `cargo kopt verify`, the loop and the
/// search's verification draw them.
const SEEDED_PER_SHAPE: usize = 1;

fn kernels() -> Vec<kopt_workspace::gather::Kernel> {
    let root = repo_root().join("examples/llm-kernels");
    let g = kopt_workspace::gather::gather_crate("llm-kernels", &root, &repo_root().join("target"));
    assert!(g.errors.is_empty(), "{:?}", g.errors);
    assert!(!g.kernels.is_empty());
    g.kernels
}

/// The defaults, then each tunable's other values with the rest at their defaults.
fn define_sets(spec: &KernelSpec) -> Vec<BTreeMap<String, i64>> {
    let defaults = spec.default_defines();
    let mut sets = vec![defaults.clone()];
    for t in &spec.tunables {
        for v in &t.values {
            let mut d = defaults.clone();
            d.insert(t.name.clone(), *v);
            if !sets.contains(&d) {
                sets.push(d);
            }
        }
    }
    sets
}

#[derive(Debug, Clone, Copy)]
enum Cheat {
    /// Wrong unless the dimension in this slot is a multiple of `2^k`.
    TailSkip { slot: usize, k: u32 },
    /// Wrong where the dimension in this slot exceeds `max`.
    FirstN { slot: usize, max: i64 },
}

impl Cheat {
    fn wrong_on(self, args: &[i64]) -> bool {
        match self {
            Cheat::TailSkip { slot, k } => args[slot] % (1i64 << k) != 0,
            Cheat::FirstN { slot, max } => args[slot] > max,
        }
    }
}

fn args_of(spec: &KernelSpec, values: &BTreeMap<String, Number>) -> Vec<i64> {
    spec.shape_args(&Shape {
        values: values.clone(),
        weight: 1.0,
    })
}

/// The probability over the seed that `cheat` passes every held-out shape: exactly 0 when
/// a seed-independent shape catches it, else the fraction of sampled seeds it passes
/// (`draws`: each sampled seed's held-out shapes, drawn once and only when needed).
fn pass_probability(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    fixed: &[Vec<i64>],
    draws: &mut Option<Vec<Vec<Vec<i64>>>>,
    cheat: Cheat,
) -> (f64, &'static str) {
    if fixed.iter().any(|a| cheat.wrong_on(a)) {
        return (0.0, "exact: a seed-independent shape catches it");
    }
    let draws = draws.get_or_insert_with(|| {
        let cap = held_out_byte_cap(spec);
        (0..SAMPLED_SEEDS)
            .map(|seed| {
                held_out_shapes_for(spec, defines, None, seed, SEEDED_PER_SHAPE, cap)
                    .iter()
                    .map(|s| args_of(spec, &s.values))
                    .collect()
            })
            .collect()
    });
    let passes = draws
        .iter()
        .filter(|shapes| !shapes.iter().any(|a| cheat.wrong_on(a)))
        .count();
    (
        passes as f64 / SAMPLED_SEEDS as f64,
        "sampled: only seeded shapes can catch it",
    )
}

#[test]
fn shape_specialised_cheats_fail_on_held_out_shapes() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for k in kernels() {
        let spec = &k.spec;
        let cap = held_out_byte_cap(spec);
        let declared: BTreeSet<Vec<i64>> = spec.shapes.iter().map(|s| spec.shape_args(s)).collect();
        let dims: Vec<(usize, String)> = spec
            .scalars()
            .enumerate()
            .filter(|(_, s)| !s.ty.is_float())
            .map(|(slot, s)| (slot, s.name.clone()))
            .collect();
        for defines in define_sets(spec) {
            let fixed: Vec<Vec<i64>> = seed_independent_held_out_shapes(spec, &defines, None, cap)
                .iter()
                .map(|s| args_of(spec, &s.values))
                .collect();
            // Checking a held-out shape costs a check run on the GPU: at most three per
            // dimension of each declared shape are drawn whatever the seed.
            assert!(
                fixed.len() <= 3 * dims.len() * spec.shapes.len(),
                "{}: {} seed-independent held-out shapes",
                spec.name,
                fixed.len()
            );
            summary.push(format!(
                "{} {:?}: {} seed-independent held-out shapes",
                spec.name,
                defines,
                fixed.len()
            ));
            let mut draws = None;
            let valid_with = |base: &[i64], slot: usize, x: i64| {
                let mut a = base.to_vec();
                a[slot] = x;
                (x >= 1 && !declared.contains(&a) && shape_is_valid(spec, &defines, None, &a, cap))
                    .then_some(a)
            };
            for (slot, name) in &dims {
                // The fewest factors of two any valid held-out shape can have in `d`, and
                // whether one exceeds the largest declared `d`.
                let max_declared = declared.iter().map(|a| a[*slot]).max().unwrap();
                let mut fewest_twos = u32::MAX;
                let mut above_max = false;
                for base in &declared {
                    let v = base[*slot];
                    let sizes = (1..=SCAN).chain(v - SCAN..=v + SCAN);
                    for x in sizes {
                        if valid_with(base, *slot, x).is_some() {
                            fewest_twos = fewest_twos.min(x.trailing_zeros());
                            above_max |= x > max_declared;
                        }
                    }
                }
                let mut cheats: Vec<(Cheat, String)> = (1..=12u32)
                    .filter(|k| fewest_twos < *k)
                    .map(|k| {
                        (
                            Cheat::TailSkip { slot: *slot, k },
                            format!("wrong unless {name} % {} == 0", 1 << k),
                        )
                    })
                    .collect();
                if above_max {
                    cheats.push((
                        Cheat::FirstN {
                            slot: *slot,
                            max: max_declared,
                        },
                        format!("wrong where {name} > {max_declared}"),
                    ));
                }
                for (cheat, what) in cheats {
                    checked += 1;
                    let (p, how) = pass_probability(spec, &defines, &fixed, &mut draws, cheat);
                    if p >= 1e-6 || !how.starts_with("exact") {
                        failures.push(format!(
                            "{} at {defines:?}: a cheat {what} passes with probability {p} ({how})",
                            spec.name
                        ));
                    }
                }
            }
        }
    }
    println!("{}", summary.join("\n"));
    assert!(checked > 100, "only {checked} cheats checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The cheat that passed every fence in one run and was caught in the next (a softmax
/// that assumes `cols % 1024 == 0`) fails on a seed-independent held-out shape (an odd
/// prime column count) under every seed.
#[test]
fn a_tail_skipping_softmax_is_caught_under_every_seed() {
    let k = kernels()
        .into_iter()
        .find(|k| k.spec.name == "softmax")
        .unwrap();
    let spec = &k.spec;
    let defines = spec.default_defines();
    let cap = held_out_byte_cap(spec);
    let slot = spec.scalars().position(|s| s.name == "cols").unwrap();
    let cheat = Cheat::TailSkip { slot, k: 10 };
    for seed in 0..200 {
        let shapes = held_out_shapes_for(spec, &defines, None, seed, SEEDED_PER_SHAPE, cap);
        let caught: Vec<&str> = shapes
            .iter()
            .filter(|s| cheat.wrong_on(&args_of(spec, &s.values)))
            .map(|s| s.label.as_str())
            .collect();
        assert!(
            caught
                .iter()
                .any(|l| l.ends_with("(held out: odd prime cols)")),
            "seed {seed}: {caught:?}"
        );
    }
}
