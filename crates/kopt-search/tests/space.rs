//! Space enumeration: the valid points are exactly those a brute-force filter keeps.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use kopt_search::space::{AxisKind, Limits, OptionAxes, Space};
use kopt_search::synthetic;
use kopt_spec::expr;

/// Every combination of the tunables, filtered by evaluating each constraint and the
/// launch rule on every shape with `Expr::eval_named`, independently of `Space`.
fn brute_force(spec: &kopt_spec::KernelSpec, limits: &Limits) -> BTreeSet<Vec<i64>> {
    let mut out = BTreeSet::new();
    let names: Vec<&str> = spec.tunables.iter().map(|t| t.name.as_str()).collect();
    let mut combos: Vec<Vec<i64>> = vec![vec![]];
    for t in &spec.tunables {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                t.values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push(*v);
                    c
                })
            })
            .collect();
    }
    'combo: for c in combos {
        for s in &spec.shapes {
            let mut vals: Vec<(&str, i64)> = spec
                .scalars()
                .map(|sc| (sc.name.as_str(), s.values[&sc.name].as_i64().unwrap_or(0)))
                .collect();
            vals.extend(names.iter().copied().zip(c.iter().copied()));
            for k in &spec.constraints {
                if k.eval_named(&vals) != Ok(1) {
                    continue 'combo;
                }
            }
            let ev = |e: &expr::Expr| e.eval_named(&vals);
            let block: Vec<i64> = spec
                .launch
                .block
                .iter()
                .map(|e| ev(e).unwrap_or(0))
                .collect();
            let grid: Vec<i64> = spec
                .launch
                .grid
                .iter()
                .map(|e| ev(e).unwrap_or(0))
                .collect();
            let smem = ev(&spec.launch.smem).unwrap_or(-1);
            if block.iter().chain(&grid).any(|v| *v <= 0) || smem < 0 {
                continue 'combo;
            }
            if block.iter().product::<i64>() > limits.max_threads_per_block as i64
                || smem > limits.max_shared_per_block_optin as i64
                || block[2] > 64
                || grid[1] > 65535
            {
                continue 'combo;
            }
        }
        out.insert(c);
    }
    out
}

fn defines_of(space: &Space) -> BTreeSet<Vec<i64>> {
    (0..space.len())
        .map(|i| space.defines(i))
        .map(|d: BTreeMap<String, i64>| {
            space
                .axes
                .iter()
                .filter(|a| a.kind == AxisKind::Define)
                .map(|a| d[&a.name])
                .collect()
        })
        .collect()
}

#[test]
fn the_row_space_has_216_valid_points_of_288() {
    let space = row_space();
    assert_eq!(space.raw, 288);
    assert_eq!(space.len(), 216);
    assert_eq!(defines_of(&space), brute_force(&row_spec(), &limits()));
    assert_eq!(space.pruned.constraints, 288 - 216);
    assert!(
        space.pruned.examples[0].contains("fails on"),
        "{:?}",
        space.pruned
    );
}

#[test]
fn constraints_hold_on_every_declared_shape_and_device_limits_prune() {
    // cols % VEC holds for VEC 1, 2 on the second shape only; shared memory grows with
    // TILE and exceeds the device's opt-in limit at the top.
    let spec = synthetic::spec(
        "tunables = { BLOCK: 256 in [64, 256, 1024, 2048], VEC: [1, 2, 4, 8], TILE: [1, 64, 4096] }, constraints = [cols % VEC == 0, BLOCK >= 64 * VEC]",
        "grid = ceil_div(rows, 4), block = BLOCK, smem = TILE * 64",
        &[(16, 4096), (3, 1002)],
    );
    let space = Space::build(&spec, &limits(), &OptionAxes::none()).unwrap();
    let expected = brute_force(&spec, &limits());
    assert_eq!(defines_of(&space), expected);
    assert!(!expected.is_empty());
    assert!(
        space.pruned.device_limits > 0,
        "BLOCK=2048 and TILE=4096 exceed the device"
    );
    for d in defines_of(&space) {
        assert!(d[1] <= 2, "VEC {} fails on cols=1002", d[1]);
        assert!(d[0] <= 1024 && d[2] <= 64, "{d:?}");
    }
    // A smaller device prunes more, never less.
    let mut small = limits();
    small.max_threads_per_block = 256;
    let s2 = Space::build(&spec, &small, &OptionAxes::none()).unwrap();
    assert_eq!(defines_of(&s2), brute_force(&spec, &small));
    assert!(s2.len() < space.len());
}

#[test]
fn option_axes_multiply_the_space_and_register_caps_fit_the_block() {
    let spec = row_spec();
    let space = Space::build(&spec, &limits(), &OptionAxes::standard()).unwrap();
    let names: Vec<&str> = space.axes.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "BLOCK",
            "VEC",
            "ROWS_PER_BLOCK",
            "UNROLL",
            "fast-math",
            "extra-device-vectorization",
            "maxrregcount"
        ]
    );
    // Brute force: each valid define combination times every option combination whose
    // register cap a block of its size can hold (R rounded up to 8, times the threads).
    let mut expected = 0;
    for d in brute_force(&spec, &limits()) {
        let threads = d[0];
        for r in [0i64, 32, 64, 128, 255] {
            let fits = r == 0 || (r + 7) / 8 * 8 * threads <= 65536;
            if fits {
                expected += 2 * 2;
            }
        }
    }
    assert_eq!(space.len(), expected);
    assert!(
        space.pruned.registers > 0,
        "255 registers x 1024 threads cannot fit"
    );
    // Fast math is offered only for floating-point outputs.
    let int_spec = kopt_spec::spec::parse_kernel(
        "reference = \"k.cu\", x: [n] range(0..9), y: [n], grid = n, block = B, shapes = [{ n: 64 }], tunables = { B: [32, 64] }"
            .parse()
            .unwrap(),
        &kopt_spec::spec::parse_item(
            "fn k(s: &CudaStream, x: &CudaSlice<i32>, y: &mut CudaSlice<i32>, n: u32);".parse().unwrap(),
        )
        .unwrap(),
    )
    .unwrap()
    .0;
    let s = Space::build(&int_spec, &limits(), &OptionAxes::standard()).unwrap();
    assert!(s.axis("fast-math").is_none() && s.axis("maxrregcount").is_some());
}

#[test]
fn neighbours_and_nearest_stay_valid() {
    let space = row_space();
    for id in [0, space.len() / 2, space.len() - 1] {
        for n in space
            .neighbours(id, 1)
            .into_iter()
            .chain(space.pair_neighbours(id))
        {
            assert!(n < space.len());
            let diff = space
                .point(id)
                .0
                .iter()
                .zip(&space.point(n).0)
                .filter(|(a, b)| a != b)
                .count();
            assert!((1..=2).contains(&diff));
        }
    }
    // BLOCK=32 with 8 rows per block is invalid: the nearest valid point changes one axis.
    let mut p = space.point(space.default_point().unwrap()).clone();
    p.0[0] = 0; // BLOCK=32
    p.0[2] = 3; // ROWS_PER_BLOCK=8
    let n = space.nearest(&p);
    assert_eq!(
        p.0.iter()
            .zip(&space.point(n).0)
            .filter(|(a, b)| a != b)
            .count(),
        1
    );
}

#[test]
fn refusals_name_the_fix() {
    let none = synthetic::spec(
        "constraints = [cols >= 1]",
        "grid = rows, block = 256",
        &[(4, 64)],
    );
    let e = Space::build(&none, &limits(), &OptionAxes::none())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("declares no tunables") && e.contains("tunables = {"),
        "{e}"
    );
    // The annotation guarantees the defaults satisfy the constraints; the device can
    // still refuse every point.
    let empty = synthetic::spec(
        "tunables = { B: [2048, 4096] }",
        "grid = rows, block = B",
        &[(4, 4096)],
    );
    let e = Space::build(&empty, &limits(), &OptionAxes::none())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no point") && e.contains("threads per block"),
        "{e}"
    );
}
