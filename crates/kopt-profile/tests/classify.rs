//! The classification rules and the findings on the five H200 captures (Nsight Compute
//! raw pages, kopt's own timings of the same day, the sources), on each collector alone,
//! and on hand-made figures for the classes the captures do not show.

mod common;

use kopt_profile::classify::{self, Classification};
use kopt_profile::measure::{Measure, Measurements, Source};
use kopt_profile::snapshot::{self, Collected, CollectorStatus, Snapshot, Status};
use kopt_store::cases::CaseLibrary;

#[derive(Clone, Copy)]
struct With {
    engine: bool,
    ncu: bool,
}

const ALL: With = With {
    engine: true,
    ncu: true,
};

fn snapshot_of(stem: &'static str, with: With) -> Snapshot {
    let (_, kernel, version) = common::CAPTURES
        .iter()
        .find(|c| c.0 == stem)
        .copied()
        .unwrap();
    let c = common::capture(stem);
    let mut collectors = vec![];
    if with.engine {
        collectors.push(CollectorStatus {
            name: "engine".into(),
            status: Status::Ran,
            detail: "cargo kopt bench on the H200, 2026-11-29 (tests/fixtures/h200-bench.json)"
                .into(),
            artefacts: vec![],
        });
    }
    if with.ncu {
        collectors.push(CollectorStatus {
            name: "ncu".into(),
            status: Status::Ran,
            detail: format!("tests/fixtures/{stem}.csv (H200, 2026-11-29, --section ...)"),
            artefacts: vec![],
        });
    }
    collectors.push(CollectorStatus {
        name: "structure".into(),
        status: Status::Ran,
        detail: format!("the source in tests/fixtures/{stem}.job.json"),
        artefacts: vec![],
    });
    snapshot::build(Collected {
        kernel: kernel.into(),
        version: version.into(),
        shape: c.job.shapes[0].label.clone(),
        engine: with.engine.then(|| common::engine_figures(&c)),
        ncu: with.ncu.then(|| c.ncu.kernels[0].clone()),
        ncu_collection: None,
        sass: None,
        ptx: None,
        structure: Some(common::structure(&c)),
        collectors,
    })
}

fn class(s: &Snapshot) -> &Classification {
    s.classification.as_ref().expect("classified")
}

fn ids(s: &Snapshot) -> Vec<&str> {
    s.findings.iter().map(|f| f.id.as_str()).collect()
}

fn evidence(s: &Snapshot, finding: &str, key: &str) -> f64 {
    s.findings
        .iter()
        .find(|f| f.id == finding)
        .and_then(|f| f.evidence.iter().find(|e| e.key == key))
        .unwrap_or_else(|| panic!("{finding} has no {key}"))
        .value
}

#[test]
fn softmax_reference_is_memory_bound_below_the_roof_with_three_passes() {
    let s = snapshot_of("softmax-shape0", ALL);
    let c = class(&s);
    assert_eq!(c.class, "memory-bound");
    assert!(
        c.qualifier.starts_with(
            "below the bandwidth roof: 70% of warp cycles wait on memory, 50% of copy bandwidth"
        ),
        "{}",
        c.qualifier
    );
    assert_eq!((c.score, c.margin), (0.7, 0.7));
    assert_eq!(c.runner_up, None, "no other class scores above 0");
    let keys: Vec<&str> = c.evidence().iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "stall_long_scoreboard_pct",
            "occupancy_achieved_pct",
            "dram_pct",
            "l2_pct",
            "copy_bw_pct"
        ]
    );
    assert_eq!(
        ids(&s)[..4],
        ["memory-stalls", "bandwidth", "passes", "narrow-accesses"]
    );
    assert_eq!(
        evidence(&s, "memory-stalls", "stall_long_scoreboard_pct"),
        69.5
    );
    assert_eq!(evidence(&s, "passes", "read_passes"), 3.0);
    assert_eq!(evidence(&s, "passes", "l2_hit_pct"), 62.45);
    assert_eq!(evidence(&s, "bandwidth", "copy_bw_pct"), 49.55);
    assert_eq!(evidence(&s, "narrow-accesses", "global_load_bits"), 32.0);
    assert_eq!(s.confidence.as_ref().unwrap().source, "rules-margin");
}

#[test]
fn the_online_vec4_variant_is_at_the_bandwidth_roof() {
    let s = snapshot_of("softmax-shape0-online-vec4", ALL);
    let c = class(&s);
    assert_eq!(c.class, "memory-bound");
    assert_eq!(
        c.qualifier,
        "at the bandwidth roof: DRAM 64%, L2 81%, 82% of copy bandwidth"
    );
    assert_eq!(c.score, 1.0);
    assert!(c.margin >= 0.85, "{}", c.margin);
    assert_eq!(ids(&s)[..3], ["bandwidth", "memory-stalls", "passes"]);
    assert_eq!(evidence(&s, "passes", "read_passes"), 2.0);
    assert!(
        !ids(&s).contains(&"narrow-accesses"),
        "float4: 128-bit loads"
    );
    assert!(ids(&s).contains(&"barrier-stalls"), "14.5% at barriers");
}

#[test]
fn rmsnorm_is_memory_bound_below_the_roof_with_16_bit_loads() {
    let s = snapshot_of("rmsnorm-shape0", ALL);
    let c = class(&s);
    assert_eq!(c.class, "memory-bound");
    assert!(
        c.qualifier.starts_with(
            "below the bandwidth roof: 68% of warp cycles wait on memory, 36% of copy bandwidth"
        ),
        "{}",
        c.qualifier
    );
    assert_eq!(c.runner_up.as_deref(), Some("latency-bound"));
    assert_eq!((c.score, c.margin), (0.68, 0.52));
    assert_eq!(
        ids(&s)[..4],
        ["memory-stalls", "narrow-accesses", "bandwidth", "passes"]
    );
    assert_eq!(evidence(&s, "narrow-accesses", "global_load_bits"), 16.0);
    assert_eq!(
        evidence(&s, "narrow-accesses", "global_sectors_per_request"),
        2.0
    );
}

#[test]
fn reduce_sum_is_memory_bound_below_the_roof_and_its_atomics_are_not_a_problem() {
    let s = snapshot_of("reduce_sum-shape0", ALL);
    let c = class(&s);
    assert_eq!(c.class, "memory-bound");
    assert!(
        c.qualifier.starts_with(
            "below the bandwidth roof: 93% of warp cycles wait on memory, 54% of copy bandwidth"
        ),
        "{}",
        c.qualifier
    );
    assert_eq!((c.score, c.margin), (0.93, 0.93));
    assert_eq!(
        ids(&s)[..3],
        ["memory-stalls", "bandwidth", "narrow-accesses"]
    );
    assert!(ids(&s).contains(&"idle-issue"));
    assert!(
        !ids(&s).contains(&"atomics"),
        "one atomicAdd per block: L2 atomics 0.02% busy"
    );
    assert_eq!(s.metrics["atomic_throughput_pct"], 0.02);
    assert!(
        !ids(&s).contains(&"parallelism"),
        "0.97 waves at 94% occupancy"
    );
}

#[test]
fn gqa_decode_is_latency_bound_for_lack_of_parallelism_not_memory_bound() {
    let s = snapshot_of("gqa_decode-shape0", ALL);
    let c = class(&s);
    assert_eq!(c.class, "latency-bound");
    assert_eq!(
        c.qualifier,
        "too little parallelism: 0.16 waves, 12% achieved occupancy of 75%"
    );
    assert_eq!(c.score, 1.0);
    assert_eq!(c.runner_up.as_deref(), Some("memory-bound"));
    assert_eq!(
        c.margin, 0.7,
        "memory-bound scores 0.3 for an L1 58.9% busy with uncoalesced loads"
    );
    assert_eq!(c.scores[1].parts[0].name, "L1 throughput");
    assert_eq!(
        ids(&s)[..4],
        ["parallelism", "memory-stalls", "uncoalesced", "serial-loop"]
    );
    assert_eq!(evidence(&s, "parallelism", "waves"), 0.16);
    assert_eq!(evidence(&s, "parallelism", "occupancy_achieved_pct"), 11.97);
    assert_eq!(evidence(&s, "uncoalesced", "global_sectors_excess"), 8.49);
    assert_eq!(evidence(&s, "serial-loop", "serial_loop_trips"), 1024.0);
    assert_eq!(s.measurements["dram_pct"].value, 2.98);
}

#[test]
fn each_collector_alone_gives_the_same_classes() {
    let expected = [
        ("softmax-shape0", "memory-bound"),
        ("softmax-shape0-online-vec4", "memory-bound"),
        ("rmsnorm-shape0", "memory-bound"),
        ("reduce_sum-shape0", "memory-bound"),
        ("gqa_decode-shape0", "latency-bound"),
    ];
    for (stem, want) in expected {
        for with in [
            With {
                engine: true,
                ncu: false,
            },
            With {
                engine: false,
                ncu: true,
            },
        ] {
            let s = snapshot_of(stem, with);
            assert_eq!(
                class(&s).class,
                want,
                "{stem}, engine {} ncu {}",
                with.engine,
                with.ncu
            );
        }
    }
    // Without counters the rules see less, and say so in the margin.
    let e = snapshot_of(
        "rmsnorm-shape0",
        With {
            engine: true,
            ncu: false,
        },
    );
    let c = class(&e);
    assert!(
        c.qualifier
            .contains("without ncu the reason is not measured"),
        "{}",
        c.qualifier
    );
    assert!(c.margin < 0.52);
}

#[test]
fn the_metric_vector_uses_the_case_librarys_names() {
    let s = snapshot_of("softmax-shape0", ALL);
    let names: Vec<&str> = s.metrics.keys().map(String::as_str).collect();
    let mut expected: Vec<&str> = snapshot::VECTOR.iter().map(|(n, _)| *n).collect();
    expected.sort();
    assert_eq!(
        names, expected,
        "every name measured on the softmax capture"
    );
    // The same names as the case library's committed fixtures.
    let library = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kopt-store/tests/fixtures/cases.jsonl"),
    )
    .unwrap();
    let mut known = std::collections::BTreeSet::new();
    for line in library.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        known.extend(
            v["features"]["metrics"]
                .as_object()
                .unwrap()
                .keys()
                .cloned(),
        );
    }
    let ours: std::collections::BTreeSet<String> = s.metrics.keys().cloned().collect();
    assert_eq!(ours, known);
    assert_eq!(s.metrics["dram_throughput_pct"], 37.91);
    assert_eq!(s.metrics["stall_long_scoreboard_pct"], 69.5);
    assert_eq!(s.metrics["waves_per_sm"], 3.88);
    assert!(s.metric_sources["dram_throughput_pct"].starts_with("ncu: gpu__dram_throughput"));
    // Without ncu the DRAM figure is the engine's, and says so.
    let e = snapshot_of(
        "softmax-shape0",
        With {
            engine: true,
            ncu: false,
        },
    );
    assert_eq!(e.metrics["dram_throughput_pct"], 49.55);
    assert!(e.metric_sources["dram_throughput_pct"].starts_with("engine: copy_bandwidth_pct"));
    let r = s.for_rationale();
    assert_eq!(r.classification, "memory-bound");
    assert_eq!(r.metrics, s.metrics);
}

#[test]
fn confidence_comes_from_past_cases_when_the_library_has_them() {
    let mut lib = CaseLibrary::open_in_memory().unwrap();
    let jsonl = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kopt-store/tests/fixtures/cases.jsonl"),
    )
    .unwrap();
    lib.import_jsonl(&jsonl).unwrap();
    for (stem, kind, expect_case) in [
        ("softmax-shape0", "softmax", "softmax"),
        ("gqa_decode-shape0", "attention", "gqa_decode/split-k"),
    ] {
        let mut s = snapshot_of(stem, ALL);
        let c = common::capture(stem);
        let text = format!(
            "{} {}",
            kopt_store::features::structural_summary(&c.job.candidate.source),
            kopt_store::features::source_tokens(&c.job.candidate.source)
        );
        assert!(s.use_case_library(&lib, kind, &text).unwrap(), "{stem}");
        let conf = s.confidence.as_ref().unwrap();
        assert_eq!(conf.source, "case-library");
        assert!(conf.score > 0.0 && conf.score <= 1.0, "{conf:?}");
        assert!(
            conf.cases.iter().any(|id| id.contains(expect_case)),
            "{stem}: {conf:?}"
        );
        assert!(s.render(3).contains("(case library: "), "{}", s.render(3));
    }
    // A library without an accepted case of the class leaves the rules' margin, and says so.
    let empty = CaseLibrary::open_in_memory().unwrap();
    let mut s = snapshot_of("reduce_sum-shape0", ALL);
    assert!(!s
        .use_case_library(&empty, "reduction", "reduce_sum")
        .unwrap());
    let conf = s.confidence.as_ref().unwrap();
    assert_eq!(conf.source, "rules-margin");
    assert_eq!(conf.score, 0.93);
    assert!(
        conf.note
            .contains("has no accepted reduction case diagnosed memory-bound"),
        "{}",
        conf.note
    );
}

#[test]
fn snapshots_of_the_five_captures() {
    for (stem, _, _) in common::CAPTURES {
        let s = snapshot_of(stem, ALL);
        insta::assert_snapshot!(format!("render-{stem}"), s.render(8));
    }
    let s = snapshot_of("gqa_decode-shape0", ALL);
    insta::assert_json_snapshot!("snapshot-gqa_decode-shape0", s);
}

// ---------------------------------------------------------------------------------------
// The classes the captures do not show, on hand-made figures.

fn figures(items: &[(&str, f64)]) -> Measurements {
    items
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                Measure {
                    value: *v,
                    unit: String::new(),
                    source: Source::Ncu,
                    from: format!("test {k}"),
                },
            )
        })
        .collect()
}

#[test]
fn hand_made_figures_reach_every_class() {
    let cases: [(&str, Vec<(&str, f64)>); 6] = [
        (
            "launch-bound",
            vec![
                ("duration_us", 1.5),
                ("launch_overhead_pct", 82.7),
                ("copy_bw_pct", 0.1),
                ("waves", 1.0),
            ],
        ),
        (
            "compute-bound",
            vec![
                ("duration_us", 900.0),
                ("sm_sol_pct", 88.0),
                ("issue_pct", 84.0),
                ("dram_pct", 20.0),
                ("l2_pct", 25.0),
                ("occupancy_achieved_pct", 60.0),
                ("occupancy_theoretical_pct", 62.5),
                ("stall_math_pipe_throttle_pct", 30.0),
            ],
        ),
        (
            "occupancy-limited",
            vec![
                ("duration_us", 300.0),
                ("sm_sol_pct", 20.0),
                ("issue_pct", 18.0),
                ("dram_pct", 22.0),
                ("l2_pct", 20.0),
                ("occupancy_achieved_pct", 18.0),
                ("occupancy_theoretical_pct", 18.75),
                ("stall_long_scoreboard_pct", 55.0),
                ("stall_wait_pct", 15.0),
                ("occupancy_limit_registers", 1.0),
                ("occupancy_limit_warps", 2.0),
            ],
        ),
        (
            "shared-memory-bank-bound",
            vec![
                ("duration_us", 200.0),
                ("sm_sol_pct", 35.0),
                ("issue_pct", 30.0),
                ("dram_pct", 30.0),
                ("l2_pct", 30.0),
                ("l1_pct", 85.0),
                ("occupancy_achieved_pct", 88.0),
                ("occupancy_theoretical_pct", 100.0),
                ("shared_excess_wavefronts", 15.0),
                ("stall_short_scoreboard_pct", 45.0),
                ("stall_mio_throttle_pct", 10.0),
            ],
        ),
        (
            "memory-bound",
            vec![
                ("duration_us", 500.0),
                ("dram_pct", 91.0),
                ("l2_pct", 70.0),
                ("sm_sol_pct", 15.0),
                ("issue_pct", 12.0),
                ("occupancy_achieved_pct", 80.0),
                ("occupancy_theoretical_pct", 100.0),
                ("stall_long_scoreboard_pct", 80.0),
            ],
        ),
        (
            "latency-bound",
            vec![
                ("duration_us", 150.0),
                ("dram_pct", 4.0),
                ("l2_pct", 6.0),
                ("sm_sol_pct", 9.0),
                ("issue_pct", 8.0),
                ("occupancy_achieved_pct", 90.0),
                ("occupancy_theoretical_pct", 100.0),
                ("stall_short_scoreboard_pct", 20.0),
                ("stall_wait_pct", 45.0),
                ("stall_barrier_pct", 20.0),
            ],
        ),
    ];
    for (want, items) in cases {
        let m = figures(&items);
        let c = classify::classify(&m).unwrap();
        assert_eq!(c.class, want, "{c:#?}");
        assert!(c.margin > 0.2, "{want}: margin {}", c.margin);
    }
    let c = classify::classify(&figures(&[
        ("duration_us", 300.0),
        ("occupancy_limit_registers", 1.0),
        ("occupancy_limit_warps", 2.0),
        ("occupancy_theoretical_pct", 18.75),
        ("occupancy_achieved_pct", 18.0),
        ("stall_long_scoreboard_pct", 60.0),
        ("dram_pct", 22.0),
        ("sm_sol_pct", 20.0),
    ]))
    .unwrap();
    assert_eq!(
        c.qualifier,
        "theoretical occupancy 19%, limited by registers"
    );
    // Nothing measured: no classification; measured but nothing stands out: unclassified.
    assert!(classify::classify(&figures(&[("read_passes", 3.0)])).is_none());
    let c = classify::classify(&figures(&[
        ("duration_us", 80.0),
        ("dram_pct", 25.0),
        ("sm_sol_pct", 30.0),
    ]))
    .unwrap();
    assert_eq!(c.class, "unclassified");
}
