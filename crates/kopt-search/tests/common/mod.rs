//! Spaces and landscapes shared by the search's tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use kopt_search::space::{Limits, OptionAxes, Space};
use kopt_search::synthetic::{self, Synthetic};
use kopt_spec::KernelSpec;

/// A row reduction's annotation: 216 valid points of 288.
pub const ROW_TUNABLES: &str = "tunables = { BLOCK: 256 in [32, 64, 128, 256, 512, 1024], VEC: 1 in [1, 2, 4, 8], ROWS_PER_BLOCK: 1 in [1, 2, 4, 8], UNROLL: 1 in [1, 2, 4] }, constraints = [BLOCK % (32 * ROWS_PER_BLOCK) == 0, cols % VEC == 0]";
pub const ROW_LAUNCH: &str = "grid = ceil_div(rows, ROWS_PER_BLOCK), block = BLOCK";

pub fn row_spec() -> KernelSpec {
    synthetic::spec(ROW_TUNABLES, ROW_LAUNCH, &[(16, 65536)])
}

pub fn limits() -> Limits {
    Limits::from_device(&kopt_engine::worker::fake::fake_device())
}

pub fn row_space() -> Space {
    Space::build(&row_spec(), &limits(), &OptionAxes::none()).unwrap()
}

pub fn d(defines: &BTreeMap<String, i64>, k: &str) -> i64 {
    defines[k]
}

/// A model of a row reduction over 16 rows of 65536 floats on a 132-SM device: one
/// block per `ROWS_PER_BLOCK` rows, bandwidth limited by the bytes each multiprocessor
/// keeps in flight. Sharp optimum at BLOCK=1024, VEC=8, ROWS_PER_BLOCK=1, UNROLL=4.
pub fn row_time(defines: &BTreeMap<String, i64>) -> f64 {
    let (b, v, r, u) = (
        d(defines, "BLOCK") as f64,
        d(defines, "VEC") as f64,
        d(defines, "ROWS_PER_BLOCK") as f64,
        d(defines, "UNROLL") as f64,
    );
    let blocks = (16.0 / r).ceil();
    let inflight = b * v * u.min(16.0 / v).max(1.0) * 4.0; // bytes per block
    let per_sm = (inflight / 700.0).min(60.0); // GB/s (bytes per ns)
    let bw = (blocks * per_sm).min(3300.0);
    let bytes = 16.0 * 65536.0 * 4.0;
    bytes / bw / 1000.0 + 2.0 + b / 512.0 + 0.3 * v / u
}

/// The landscape as an evaluator (cost = time / the reference's time).
pub fn row_evaluator() -> Synthetic {
    let reference = row_time(
        &[
            ("BLOCK", 256),
            ("VEC", 1),
            ("ROWS_PER_BLOCK", 1),
            ("UNROLL", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    );
    Synthetic::new(move |defines, _| Some(row_time(defines) / reference)).with_metrics(
        |defines, _| {
            let mut m = BTreeMap::new();
            m.insert(
                "global_load_bytes".into(),
                4.0 * d(defines, "VEC").min(4) as f64,
            );
            m.insert(
                "grid_blocks_per_sm".into(),
                (16.0 / d(defines, "ROWS_PER_BLOCK") as f64).ceil() / 132.0,
            );
            m
        },
    )
}

/// A separable bowl over value indices with its minimum at the given values.
pub fn bowl(space: &Space, at: &[(&str, i64)]) -> Synthetic {
    let targets: Vec<(String, usize)> = at
        .iter()
        .map(|(k, v)| {
            let a = space.axis(k).unwrap();
            (k.to_string(), space.axes[a].index_of(*v).unwrap())
        })
        .collect();
    let axes = space.axes.clone();
    Synthetic::new(move |defines, _| {
        let mut c = 1.0;
        for (k, t) in &targets {
            let a = axes.iter().find(|a| &a.name == k).unwrap();
            let i = a.index_of(defines[k]).unwrap();
            c += (i as f64 - *t as f64).powi(2);
        }
        Some(c)
    })
}

/// A multimodal landscape (Rastrigin over value indices): local minima everywhere, the
/// global one at the given indices.
pub fn rastrigin(space: &Space, at: &[(&str, usize)]) -> Synthetic {
    let at: Vec<(String, usize)> = at.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let axes = space.axes.clone();
    Synthetic::new(move |defines, _| {
        let mut c = 10.0;
        for (k, t) in &at {
            let a = axes.iter().find(|a| &a.name == k).unwrap();
            let x = a.index_of(defines[k]).unwrap() as f64 - *t as f64;
            c += x * x + 3.0 * (1.0 - (2.0 * std::f64::consts::PI * x / 2.0).cos());
        }
        Some(c)
    })
}
