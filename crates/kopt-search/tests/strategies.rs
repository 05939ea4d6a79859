//! Strategies on objective functions with known optima, determinism under a seed, the
//! profile seed, interesting points, fast math, the compile pool.

mod common;

use std::collections::BTreeMap;

use common::*;
use kopt_search::interesting::Interesting;
use kopt_search::run::{self, Budget, Prior, Quiet, Settings, StopReason, Summary};
use kopt_search::seed::{self, Bottleneck, Guide, ParameterMatrix, SnapshotHints};
use kopt_search::space::{OptionAxes, Space};
use kopt_search::strategy::{MakeStrategy, StrategyKind};
use kopt_search::synthetic::Synthetic;

fn settings(evals: usize) -> Settings {
    Settings {
        budget: Budget {
            evaluations: Some(evals),
            ..Budget::default()
        },
        compile_threads: 2,
        compile_ahead: 32,
    }
}

fn search(
    space: &Space,
    kind: StrategyKind,
    seed: u64,
    eval: &mut Synthetic,
    guide: Option<&Guide>,
    s: &Settings,
) -> Summary {
    let mut space = space.clone();
    let mut strategy = kind.make(seed);
    let interesting = match guide {
        Some(g) => Interesting::new(g.goals().to_vec(), BTreeMap::new(), 3),
        None => Interesting::none(),
    };
    run::run(
        &mut space,
        strategy.as_mut(),
        eval,
        guide,
        interesting,
        s,
        Prior::default(),
        &mut Quiet,
    )
}

fn labels(s: &Summary) -> Vec<String> {
    s.records.iter().map(|r| r.label.clone()).collect()
}

/// The evaluations until the best cost is within 0.1% of `optimum`.
fn evals_to(s: &Summary, optimum: f64) -> Option<usize> {
    s.records
        .iter()
        .find(|r| r.outcome.cost.is_some_and(|c| c <= optimum * 1.001))
        .map(|r| r.seq)
}

fn optimum(space: &Space, eval: &mut Synthetic) -> (f64, String) {
    let s = search(
        space,
        StrategyKind::Exhaustive,
        0,
        eval,
        None,
        &settings(usize::MAX),
    );
    assert_eq!(s.stop, StopReason::Exhausted);
    assert_eq!(
        s.evaluations,
        space.len(),
        "exhaustive evaluates every point once"
    );
    let b = s.best_record().unwrap();
    (b.outcome.cost.unwrap(), b.label.clone())
}

#[test]
fn every_strategy_finds_the_bottom_of_a_bowl_within_budget() {
    let space = row_space();
    let at = [
        ("BLOCK", 512),
        ("VEC", 4),
        ("ROWS_PER_BLOCK", 2),
        ("UNROLL", 2),
    ];
    let (best, label) = optimum(&space, &mut bowl(&space, &at));
    assert_eq!(best, 1.0);
    assert_eq!(label, "BLOCK=512 VEC=4 ROWS_PER_BLOCK=2 UNROLL=2");
    // Budgets well under the 216 points for the adaptive strategies.
    for (kind, budget) in [
        (StrategyKind::Hill, 40),
        (StrategyKind::Evolution, 90),
        (StrategyKind::Random, 216),
        (StrategyKind::Exhaustive, 216),
    ] {
        for seed in 0..5 {
            let s = search(
                &space,
                kind,
                seed,
                &mut bowl(&space, &at),
                None,
                &settings(budget),
            );
            let b = s.best_record().unwrap();
            assert_eq!(
                (b.outcome.cost.unwrap(), b.label.as_str()),
                (1.0, label.as_str()),
                "{kind} seed {seed} within {budget} evaluations: {:?}",
                labels(&s)
            );
        }
    }
}

#[test]
fn restarts_and_evolution_escape_local_minima() {
    let space = row_space();
    let at = [("BLOCK", 4usize), ("VEC", 2), ("UNROLL", 1)];
    let (best, _) = optimum(&space, &mut rastrigin(&space, &at));
    for (kind, budget) in [(StrategyKind::Hill, 150), (StrategyKind::Evolution, 150)] {
        let mut found = 0;
        for seed in 0..10 {
            let s = search(
                &space,
                kind,
                seed,
                &mut rastrigin(&space, &at),
                None,
                &settings(budget),
            );
            if s.best_record().unwrap().outcome.cost.unwrap() <= best {
                found += 1;
            }
        }
        assert!(
            found >= 9,
            "{kind} found the global minimum in {found}/10 runs of {budget} evaluations"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_sequence_and_another_seed_another() {
    let space = Space::build(&row_spec(), &limits(), &OptionAxes::standard()).unwrap();
    let hints = SnapshotHints {
        class: Bottleneck::MemoryBound,
        global_load_bytes: Some(4),
        grid_blocks_per_sm: Some(0.12),
        ..SnapshotHints::default()
    };
    let guide = Guide::new(&space, seed::heuristic(&space, &row_spec(), &hints)).unwrap();
    for kind in StrategyKind::ALL {
        for g in [None, Some(&guide)] {
            let a = labels(&search(
                &space,
                kind,
                7,
                &mut row_evaluator(),
                g,
                &settings(60),
            ));
            let b = labels(&search(
                &space,
                kind,
                7,
                &mut row_evaluator(),
                g,
                &settings(60),
            ));
            assert_eq!(a, b, "{kind} seeded={} is deterministic", g.is_some());
            assert_eq!(a.len(), 60);
            let mut uniq = a.clone();
            uniq.sort();
            uniq.dedup();
            assert_eq!(uniq.len(), 60, "{kind}: no point evaluated twice");
            if kind != StrategyKind::Exhaustive {
                let c = labels(&search(
                    &space,
                    kind,
                    8,
                    &mut row_evaluator(),
                    g,
                    &settings(60),
                ));
                assert_ne!(
                    a,
                    c,
                    "{kind} seeded={}: another seed, another sequence",
                    g.is_some()
                );
            }
        }
    }
    // With the compile pool on, the sequence is the same.
    let mut pooled = row_evaluator();
    pooled.with_compiler = true;
    let a = labels(&search(
        &space,
        StrategyKind::Hill,
        3,
        &mut pooled,
        Some(&guide),
        &settings(40),
    ));
    let b = labels(&search(
        &space,
        StrategyKind::Hill,
        3,
        &mut row_evaluator(),
        Some(&guide),
        &settings(40),
    ));
    assert_eq!(a, b, "compiling ahead changes nothing the search decides");
    assert!(pooled.compiles() >= 40);
}

/// The hints of the row landscape's reference (BLOCK=256, VEC=1, one row per block):
/// 16 blocks on 132 SMs, scalar loads.
fn row_hints() -> SnapshotHints {
    SnapshotHints {
        class: Bottleneck::LatencyBound,
        occupancy_pct: Some(100.0),
        registers: Some(18),
        global_load_bytes: Some(4),
        grid_blocks_per_sm: Some(16.0 / 132.0),
        copy_bandwidth_pct: Some(0.6),
        local_bytes: Some(0),
    }
}

#[test]
fn the_heuristic_reads_the_snapshot_into_a_matrix() {
    let space = Space::build(&row_spec(), &limits(), &OptionAxes::standard()).unwrap();
    let roles = seed::roles(&space, &row_spec());
    use seed::Role::*;
    assert_eq!(
        roles,
        [
            BlockSize,
            VectorWidth,
            WorkPerBlock,
            Unroll,
            FastMath,
            Vectorizer,
            RegisterCap
        ]
    );
    let m = seed::heuristic(&space, &row_spec(), &row_hints());
    let row = |axis: &str| m.rows.iter().find(|r| r.axis == axis).unwrap();
    assert_eq!(
        row("ROWS_PER_BLOCK").prefer,
        [1, 2, 4, 8],
        "tiny grid: more blocks"
    );
    assert_eq!(
        row("VEC").prefer,
        [8, 4, 2, 1],
        "scalar loads: widest first"
    );
    assert_eq!(row("BLOCK").prefer[0], 1024);
    assert_eq!(row("UNROLL").prefer[0], 4);
    assert!(row("ROWS_PER_BLOCK")
        .reason
        .contains("0.12 blocks per multiprocessor"));
    assert!(
        m.rows.windows(2).all(|w| w[0].priority >= w[1].priority),
        "sorted by priority"
    );
    let g = Guide::new(&space, m.clone()).unwrap();
    assert_eq!(
        space.label(g.starts[0]),
        "BLOCK=1024 VEC=8 ROWS_PER_BLOCK=1 UNROLL=4 extra-device-vectorization",
        "the first start takes every row's first preference"
    );
    assert!(g.starts.len() > 1 && g.starts.len() <= seed::MAX_STARTS);
    // Occupancy-limited with many registers: a register cap and smaller blocks.
    let occ = SnapshotHints {
        class: Bottleneck::OccupancyLimited,
        occupancy_pct: Some(25.0),
        registers: Some(128),
        ..SnapshotHints::default()
    };
    let m = seed::heuristic(&space, &row_spec(), &occ);
    let row = |axis: &str| m.rows.iter().find(|r| r.axis == axis).unwrap().clone();
    assert_eq!(row("maxrregcount").prefer[0], 64);
    assert_eq!(row("BLOCK").prefer[0], 128);
    assert!(m.goals.iter().any(|g| g.metric == "occupancy_pct"));
}

#[test]
fn agent_matrices_are_checked_against_the_space() {
    let space = row_space();
    let m: ParameterMatrix = serde_json::from_str(
        r#"{"source": "agent", "rows": [{"axis": "VEC", "prefer": [4, 8], "priority": 0.9, "reason": "float4"}],
            "starts": [{"BLOCK": 512, "VEC": 4}]}"#,
    )
    .unwrap();
    let g = Guide::new(&space, m).unwrap();
    assert_eq!(
        space.label(g.starts[0]),
        "BLOCK=512 VEC=4 ROWS_PER_BLOCK=1 UNROLL=1"
    );
    let bad: ParameterMatrix = serde_json::from_str(
        r#"{"source": "agent", "rows": [{"axis": "VECTOR", "prefer": [4], "priority": 0.9, "reason": ""}]}"#,
    )
    .unwrap();
    let e = Guide::new(&space, bad).unwrap_err();
    assert!(
        e.contains("`VECTOR`") && e.contains("VEC in [1, 2, 4, 8]"),
        "{e}"
    );
    let bad: ParameterMatrix = serde_json::from_str(
        r#"{"source": "agent", "rows": [{"axis": "VEC", "prefer": [16], "priority": 0.9, "reason": ""}]}"#,
    )
    .unwrap();
    let e = Guide::new(&space, bad).unwrap_err();
    assert!(e.contains("VEC=16"), "{e}");
}

#[test]
fn the_profile_seed_beats_random_sampling_where_the_hints_are_informative() {
    let space = row_space();
    let (best, label) = optimum(&space, &mut row_evaluator());
    assert!(label.starts_with("BLOCK=1024"), "{label}");
    let guide = Guide::new(&space, seed::heuristic(&space, &row_spec(), &row_hints())).unwrap();
    let median = |kind: StrategyKind, g: Option<&Guide>| {
        let mut v: Vec<usize> = (0..11)
            .map(|seed| {
                let s = search(&space, kind, seed, &mut row_evaluator(), g, &settings(216));
                evals_to(&s, best).expect("every strategy gets there within the space")
            })
            .collect();
        v.sort();
        v[5]
    };
    let random = median(StrategyKind::Random, None);
    for kind in [
        StrategyKind::Hill,
        StrategyKind::Evolution,
        StrategyKind::Random,
    ] {
        let seeded = median(kind, Some(&guide));
        assert!(
            3 * seeded <= random,
            "seeded {kind} needs {seeded} evaluations (median), random sampling {random}"
        );
    }
}

#[test]
fn interesting_points_are_kept_and_climbed_from() {
    // A plateau: every point costs 2 except a ridge reached only through wide loads that
    // are not faster yet: VEC=8 costs 2.2 unless UNROLL=4 too (then 1.0).
    let space = row_space();
    let cost = |d: &BTreeMap<String, i64>| {
        if d["VEC"] == 8 && d["UNROLL"] == 4 && d["BLOCK"] == 256 && d["ROWS_PER_BLOCK"] == 1 {
            1.0
        } else if d["VEC"] == 8 {
            2.2
        } else {
            2.0
        }
    };
    let mk = move || {
        Synthetic::new(move |d, _| Some(cost(d))).with_metrics(|d, _| {
            let mut m = BTreeMap::new();
            m.insert(
                "global_load_bytes".to_string(),
                4.0 * d["VEC"].min(4) as f64,
            );
            m
        })
    };
    let hints = SnapshotHints {
        class: Bottleneck::MemoryBound,
        global_load_bytes: Some(4),
        ..SnapshotHints::default()
    };
    // A matrix that says nothing about where to go, only what to watch.
    let matrix = ParameterMatrix {
        source: "test".into(),
        rows: vec![],
        starts: vec![],
        goals: seed::heuristic(&space, &row_spec(), &hints).goals,
    };
    assert!(matrix.goals.iter().any(|g| g.metric == "global_load_bytes"));
    let guide = Guide::new(&space, matrix).unwrap();
    let mut found_with = 0;
    let mut kept = 0;
    for seed in 0..10 {
        let mut space_ = space.clone();
        let mut strategy = StrategyKind::Hill.make(seed);
        let s = run::run(
            &mut space_,
            strategy.as_mut(),
            &mut mk(),
            Some(&guide),
            Interesting::new(guide.goals().to_vec(), hints.metrics(), 20),
            &settings(60),
            Prior::default(),
            &mut Quiet,
        );
        kept += s.records.iter().filter(|r| r.interesting.is_some()).count();
        if s.best_record().unwrap().outcome.cost == Some(1.0) {
            found_with += 1;
        }
    }
    let mut found_without = 0;
    for seed in 0..10 {
        let s = search(
            &space,
            StrategyKind::Hill,
            seed,
            &mut mk(),
            None,
            &settings(60),
        );
        if s.best_record().unwrap().outcome.cost == Some(1.0) {
            found_without += 1;
        }
    }
    assert!(kept > 0, "wide-load points were kept as interesting");
    assert!(
        found_with > found_without,
        "keeping interesting points finds the ridge more often: {found_with}/10 against {found_without}/10"
    );
}

#[test]
fn fast_math_is_dropped_when_it_breaks_the_tolerance() {
    let spec = row_spec();
    let space = Space::build(
        &spec,
        &limits(),
        &OptionAxes {
            fast_math: true,
            extra_device_vectorization: false,
            maxrregcount: vec![],
        },
    )
    .unwrap();
    // Fast math would be 10% faster everywhere, but it breaks the tolerance.
    let mut eval = Synthetic::new(|d, o| {
        let fm = o.iter().any(|x| x == "--use_fast_math");
        Some(row_time(d) * if fm { 0.9 } else { 1.0 })
    });
    eval.breaks_tolerance = vec!["--use_fast_math".into()];
    let mut sp = space.clone();
    let mut strategy = StrategyKind::Exhaustive.make(0);
    let s = run::run(
        &mut sp,
        strategy.as_mut(),
        &mut eval,
        None,
        Interesting::none(),
        &settings(usize::MAX),
        Prior::default(),
        &mut Quiet,
    );
    let fm = s
        .records
        .iter()
        .filter(|r| r.label.contains("fast-math"))
        .count();
    assert_eq!(
        fm, 1,
        "after the first failure no fast-math point is evaluated"
    );
    assert_eq!(s.dropped.len(), 1);
    assert!(
        s.dropped[0].contains("--use_fast_math dropped"),
        "{:?}",
        s.dropped
    );
    assert!(!s.best_record().unwrap().label.contains("fast-math"));
    assert_eq!(s.evaluations, space.len() / 2 + 1);
}

#[test]
fn compile_failures_never_reach_the_device() {
    let space = row_space();
    // UNROLL=4 with VEC=8 "does not compile" (too many registers, say), and the compiler
    // itself crashes on BLOCK=32 VEC=8 UNROLL=4.
    let mut eval = Synthetic::new(|d, _| {
        if d["UNROLL"] == 4 && d["VEC"] == 8 && d["BLOCK"] == 32 {
            Some(f64::NEG_INFINITY)
        } else if d["UNROLL"] == 4 && d["VEC"] == 8 {
            Some(f64::INFINITY)
        } else {
            Some(row_time(d))
        }
    });
    eval.with_compiler = true;
    let s = search(
        &space,
        StrategyKind::Exhaustive,
        0,
        &mut eval,
        None,
        &settings(usize::MAX),
    );
    let failures = s
        .records
        .iter()
        .filter(|r| r.outcome.failure.as_deref() == Some("compile"))
        .count();
    assert_eq!(failures, s.compile_failures);
    assert_eq!(
        failures, 18,
        "18 (BLOCK, ROWS_PER_BLOCK) pairs x VEC=8 x UNROLL=4"
    );
    assert_eq!(
        eval.evaluated.len(),
        space.len() - failures,
        "the device saw only what compiled"
    );
    assert!(s
        .records
        .iter()
        .any(|r| r.outcome.detail.contains("does not compile")));
    assert!(
        s.records
            .iter()
            .any(|r| r.outcome.detail.contains("the compiler panicked")),
        "a compiler crash fails its point and the run goes on"
    );
    assert_eq!(
        eval.compiles(),
        space.len(),
        "every point compiled exactly once"
    );
}
