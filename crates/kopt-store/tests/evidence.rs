//! The rationale builder: from structured evidence to rationale.json and RATIONALE.md
//! (both snapshot-tested), and the evidence it refuses.

mod common;

use std::collections::BTreeMap;

use common::shape;
use kopt_spec::files::{
    BottleneckSnapshot, BudgetUsed, Change, Claim, Confidence, Diagnosis, OutputCheck, Risk,
    VerifiedBy,
};
use kopt_store::evidence::{
    self, Device, Evidence, NumericEvidence, NumericResult, ShapeMeasurement,
};

/// What the loop would hand over for an RMS-norm rewrite (illustrative figures).
fn sample() -> Evidence {
    Evidence {
        kernel: "rmsnorm".into(),
        variant: "half2-regs".into(),
        arch: "sm_90".into(),
        claim: Some(Claim {
            region: Some("cols % 2 == 0 && cols <= 8192".into()),
            device: None,
            verified_by: VerifiedBy::Kopt,
            reference_hash: "sha256:1111111111111111111111111111111111111111111111111111111111111111".into(),
            spec_hash: "sha256:2222222222222222222222222222222222222222222222222222222222222222".into(),
            source_hash: Some("sha256:3333333333333333333333333333333333333333333333333333333333333333".into()),
            variant_hash: Some("sha256:4444444444444444444444444444444444444444444444444444444444444444".into()),
            ptx: None,
        }),
        summary: "Loads x and the weight as half2 and keeps the row in registers between the two passes, so each row is read from DRAM once: 1.53x on 8192x4096, 1.05x on a single row (launch-dominated).".into(),
        snapshot_before: Some(BottleneckSnapshot {
            classification: "memory-bound".into(),
            text: "dram 52% of peak | l2 hit 40%\nstalls: long scoreboard 49%, barrier 14%\noccupancy 91% achieved of 100%".into(),
            metrics: BTreeMap::from([
                ("dram_throughput_pct".into(), 52.0),
                ("stall_long_scoreboard_pct".into(), 49.0),
                ("achieved_occupancy_pct".into(), 91.0),
            ]),
        }),
        snapshot_after: Some(BottleneckSnapshot {
            classification: "memory-bound".into(),
            text: "dram 81% of peak | l2 hit 12%\nstalls: long scoreboard 31%".into(),
            metrics: BTreeMap::from([
                ("dram_throughput_pct".into(), 81.0),
                ("stall_long_scoreboard_pct".into(), 31.0),
                ("achieved_occupancy_pct".into(), 74.5),
            ]),
        }),
        diagnosis: Diagnosis {
            bottleneck: "memory-bound".into(),
            explanation: "Two passes over each row with 2-byte loads: the second pass re-reads the row from L2 or DRAM, and each warp keeps few bytes in flight.".into(),
            evidence: vec![
                "dram throughput 52% of peak on 8192x4096 (62.1 µs)".into(),
                "long-scoreboard stalls 49% of issue slots".into(),
            ],
            confidence: Some(Confidence {
                score: 0.91,
                cases: vec!["acme-llm/acme-kernels/rmsnorm/half2@sm_90".into()],
            }),
        },
        changes: vec![
            Change {
                what: "half2 loads of x and the weight".into(),
                why: "Twice the bytes per memory instruction: more bytes in flight per warp, which is what the long-scoreboard stalls wait for.".into(),
            },
            Change {
                what: "The row stays in registers between the sum of squares and the write".into(),
                why: "Removes the second read of the row, a third of the DRAM traffic.".into(),
            },
        ],
        risks: vec![
            Risk {
                risk: "Odd column counts would make half2 loads straddle rows".into(),
                covered_by: "Region `cols % 2 == 0`; held-out shape 3x8191 checked to run the reference.".into(),
            },
            Risk {
                risk: "Register pressure for long rows (spills)".into(),
                covered_by: "Region `cols <= 8192`; 0 bytes of local memory reported by the compiler.".into(),
            },
        ],
        verification: NumericEvidence {
            method: "kopt verify: 3 fresh input sets per shape (N(0,1), U(-8, 8), rows of one repeated value), outputs NaN-poisoned before each run, inputs checked unmodified, declared and held-out shapes.".into(),
            outputs: vec![NumericResult {
                check: OutputCheck {
                    buffer: "y".into(),
                    rtol: 1e-2,
                    atol: 1e-2,
                    max_abs_error: 0.0039,
                    max_rel_error: 0.0082,
                },
                failing_elements: 0,
            }],
            seeds: vec![7, 11, 13],
        },
        measurements: vec![
            ShapeMeasurement {
                shape: shape(&[("cols", 4096), ("rows", 8192)]),
                reference_us: 62.1,
                variant_us: 40.7,
                ideal_bytes: Some(2 * 2 * 8192 * 4096 + 2 * 4096),
                registers: Some(40),
                occupancy_pct: Some(75.0),
            },
            ShapeMeasurement {
                shape: shape(&[("cols", 4096), ("rows", 1)]),
                reference_us: 4.1,
                variant_us: 3.9,
                ideal_bytes: None,
                registers: Some(40),
                occupancy_pct: Some(75.0),
            },
        ],
        search: None,
        compile: None,
        device: Device {
            name: "NVIDIA H200".into(),
            driver: "580.159.04".into(),
            cuda: Some("13.0".into()),
            copy_bandwidth_gbs: Some(4280.0),
        },
        agent: "openai-compatible:qwen2.5-coder-32b (reviewer: same model)".into(),
        date: "2026-12-01".into(),
        session: Some("target/kopt/runs/20261201T101500Z-3f2a9c/journal.jsonl".into()),
        budget: Some(BudgetUsed {
            rounds: Some(3),
            candidates: Some(9),
            wall_time_s: Some(611.0),
            tokens: Some(48210),
            cost_usd: None,
        }),
    }
}

#[test]
fn rationale_from_evidence() {
    let r = evidence::build(&sample()).unwrap();
    // Derived, not typed: ideal bytes over the variant's time, against the copy bandwidth.
    let f = &r.figures[0];
    let gbs: f64 = (2.0 * 2.0 * 8192.0 * 4096.0 + 8192.0) / 40.7e-6 / 1e9;
    assert_eq!(
        f.copy_bandwidth_pct,
        Some((gbs / 4280.0 * 1000.0).round() / 10.0)
    );
    assert_eq!(
        r.figures[1].copy_bandwidth_pct, None,
        "no ideal bytes, no figure"
    );
    assert_eq!(r.provenance.device, "NVIDIA H200 (sm_90)");
    assert_eq!(r.provenance.driver, "580.159.04 (CUDA 13.0)");
    insta::assert_snapshot!("rationale_from_evidence_json", r.to_json());
    insta::assert_snapshot!("rationale_from_evidence_md", r.render_markdown());
}

#[test]
fn evidence_that_does_not_support_a_rationale_is_refused() {
    let refuse = |edit: &dyn Fn(&mut Evidence), needle: &str| {
        let mut e = sample();
        edit(&mut e);
        let err = evidence::build(&e).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    };
    refuse(
        &|e| e.verification.outputs[0].failing_elements = 3,
        "3 element(s) outside its tolerance",
    );
    refuse(
        &|e| e.measurements[0].variant_us = 2.0,
        "above 110% is a measurement error",
    );
    refuse(
        &|e| e.changes[1].why = " ".into(),
        "does not say what it is and why",
    );
    refuse(&|e| e.changes.clear(), "no change is described");
    refuse(
        &|e| e.risks[0].covered_by.clear(),
        "does not say how verification covered it",
    );
    refuse(&|e| e.verification.seeds.clear(), "no seeds");
    refuse(
        &|e| e.verification.outputs.clear(),
        "no output buffer was compared",
    );
    refuse(&|e| e.measurements.clear(), "no shape was measured");
    refuse(
        &|e| e.measurements[1].reference_us = f64::NAN,
        "times must be positive",
    );
    refuse(
        &|e| e.snapshot_before = None,
        "a snapshot after the change without one before",
    );
    refuse(&|e| e.arch = "hopper".into(), "not an architecture name");
    refuse(&|e| e.summary.clear(), "`summary` is empty");
}

#[test]
fn compile_figures_pass_into_the_rationale() {
    let mut e = sample();
    let figures = kopt_spec::files::CompileFigures {
        nvrtc: "13.0".into(),
        cuda_headers: None,
        arch: "sm_90".into(),
        registers: 40,
        spill_stores: 0,
        spill_loads: 0,
        stack_bytes: 0,
        shared_bytes: 128,
    };
    e.compile = Some(figures.clone());
    let back = Evidence::parse(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back, e, "round trip");
    let r = evidence::build(&e).unwrap();
    assert_eq!(r.compile, Some(figures.clone()));
    assert!(
        r.render_markdown()
            .contains("Compiled on the CPU by NVRTC 13.0, sm_90: 40 registers, no spills"),
        "{}",
        r.render_markdown()
    );
    // Evidence written before compile figures were recorded reads without them.
    let old = serde_json::to_string(&sample()).unwrap();
    assert!(!old.contains("\"compile\""), "{old}");
    assert_eq!(Evidence::parse(&old).unwrap().compile, None);

    let mut bad = e.clone();
    bad.compile = Some(kopt_spec::files::CompileFigures {
        nvrtc: " ".into(),
        ..figures
    });
    let err = evidence::build(&bad).unwrap_err().to_string();
    assert!(err.contains("name no NVRTC version"), "{err}");
}
