//! The committed formats, snapshot-tested: a change here changes every user's files (and,
//! for the spec JSON, every hash), so it must be deliberate.

use std::collections::BTreeMap;

use kopt_spec::files::*;
use kopt_spec::spec::{self, Number};
use quote::quote;

fn sample_spec() -> kopt_spec::KernelSpec {
    let item = spec::parse_item(quote! {
        pub fn rmsnorm(stream: &CudaStream, x: &CudaSlice<f16>, w: &CudaSlice<f16>, y: &mut CudaSlice<f16>,
                       table: &CudaSlice<i32>, rows: u32, cols: u32, eps: f32);
    })
    .unwrap();
    let (spec, _) = spec::parse_kernel(
        quote! {
            reference = "kernels/rmsnorm.cu", entry = "rmsnorm_f16",
            x: [rows * cols], w: [cols] uniform(0.5..1.5), y: [rows * cols] tol(rtol = 2e-2),
            table: [rows] range(0..rows),
            grid = rows, block = BLOCK, smem = BLOCK / 32 * 4,
            defaults = { eps: 1e-5 },
            shapes = [{ rows: 8192, cols: 4096 }, { rows: 1, cols: 4096, weight: 4 }],
            flops = 4 * rows * cols,
            tunables = { BLOCK: 256 in [128, 256, 512], VEC: [1, 2, 4] },
            constraints = [cols % VEC == 0, BLOCK * VEC <= cols],
            options = ["--use_fast_math"],
        },
        &item,
    )
    .unwrap();
    spec
}

#[test]
fn spec_json_is_stable() {
    insta::assert_snapshot!(sample_spec().canonical_json());
}

fn sample_lock() -> LockFile {
    let e = |arch: &str, variant: &str, region: Option<&str>| LockEntry {
        arch: arch.into(),
        device: None,
        variant: variant.into(),
        region: region.map(Into::into),
        verified_by: VerifiedBy::Kopt,
        reference_hash: "sha256:aaaa".into(),
        spec_hash: "sha256:bbbb".into(),
        source_hash: "sha256:cccc".into(),
        variant_hash: "sha256:dddd".into(),
        ptx: None,
    };
    let on_h200 = LockEntry {
        device: Some("NVIDIA H200".into()),
        ptx: Some(PtxRecord {
            hash: "sha256:eeee".into(),
            nvrtc: "13.0".into(),
            arch: "sm_90".into(),
            symbol: None,
        }),
        ..e("sm_90", "h200-tma", Some("rows >= 4096"))
    };
    LockFile {
        format: LOCK_FORMAT,
        kernel: "rmsnorm".into(),
        // Deliberately out of order: rendering sorts by architecture, keeping the order
        // of entries within one architecture.
        accepted: vec![
            e("sm_100", "blackwell-v1", None),
            e("sm_90", "wide-rows", Some("cols >= 8192")),
            on_h200,
            e("sm_90", "vec8", Some("cols % 8 == 0")),
            e("sm_80", "ampere-v2", None),
        ],
    }
}

#[test]
fn lock_file_format() {
    let text = sample_lock().render();
    insta::assert_snapshot!(text);
    assert_eq!(LockFile::parse(&text).unwrap().render(), text, "round trip");
}

#[test]
fn a_format_1_lock_is_read_and_rewritten_as_format_2() {
    let text = sample_lock().render();
    let device_line = "device = \"NVIDIA H200\"\n";
    assert!(
        text.contains("format = 2\n") && text.contains(device_line),
        "{text}"
    );
    // Format 1: the same entries without the device-keyed one.
    let mut old = sample_lock();
    old.accepted.retain(|e| e.device.is_none());
    let v1 = old.render().replace("format = 2\n", "format = 1\n");
    let read = LockFile::parse(&v1).unwrap();
    assert_eq!(read.accepted, {
        let mut sorted = old.accepted.clone();
        sorted.sort_by_key(|e| e.arch != "sm_80");
        sorted.sort_by_key(|e| e.arch == "sm_100");
        sorted
    });
    assert!(read.render().contains("format = 2\n"));
    // A format 1 lock cannot name a device; a newer format is refused with the fix.
    let err = LockFile::parse(&text.replace("format = 2\n", "format = 1\n")).unwrap_err();
    assert!(
        err.contains("entry `h200-tma` names a device, which a format 1 lock cannot"),
        "{err}"
    );
    let err = LockFile::parse(&text.replace("format = 2\n", "format = 3\n")).unwrap_err();
    assert_eq!(
        err,
        "format 3 is not supported by this kopt (it reads format 1 and 2); upgrade cargo-kopt and the kopt crate together"
    );
}

#[test]
fn variant_file_format() {
    let v = VariantFile {
        args: None,
        format: FORMAT,
        kernel: "rmsnorm".into(),
        id: "vec8".into(),
        entry: "rmsnorm_f16".into(),
        launch: sample_spec().launch,
        defines: BTreeMap::from([("BLOCK".into(), 512), ("VEC".into(), 8)]),
        options: vec!["--use_fast_math".into()],
    };
    let text = v.render();
    insta::assert_snapshot!(text);
    assert_eq!(VariantFile::parse(&text).unwrap(), v, "round trip");
    assert_eq!(
        v.compile_options(),
        vec!["-DBLOCK=512", "-DVEC=8", "--use_fast_math"]
    );
}

#[test]
fn a_variant_with_a_cluster_set_at_launch() {
    let mut launch = sample_spec().launch;
    let parse = |t: &str| {
        kopt_spec::expr::parse_str(
            t,
            kopt_spec::expr::Ty::Int,
            &|_| Some(kopt_spec::expr::VarKind::Int),
            &["rows".to_string()],
        )
        .unwrap()
    };
    launch.cluster = Some([
        parse("if rows < 256 { CLUSTER } else { 1 }"),
        parse("1"),
        parse("1"),
    ]);
    let v = VariantFile {
        args: None,
        format: FORMAT,
        kernel: "softmax".into(),
        id: "split".into(),
        entry: "softmax_f32".into(),
        launch,
        defines: BTreeMap::from([("CLUSTER".into(), 8)]),
        options: vec![],
    };
    let text = v.render();
    insta::assert_snapshot!(text);
    assert_eq!(VariantFile::parse(&text).unwrap(), v, "round trip");
}

#[test]
fn rationale_formats() {
    let r = Rationale {
        format: FORMAT,
        kernel: "rmsnorm".into(),
        variant: "vec8".into(),
        arch: "sm_90".into(),
        claim: Some(Claim {
            region: Some("cols % 8 == 0".into()),
            device: None,
            verified_by: VerifiedBy::Kopt,
            reference_hash: "sha256:aaaa".into(),
            spec_hash: "sha256:bbbb".into(),
            source_hash: Some("sha256:cccc".into()),
            variant_hash: Some("sha256:dddd".into()),
            ptx: Some(PtxRecord {
                hash: "sha256:eeee".into(),
                nvrtc: "13.0".into(),
                arch: "sm_90".into(),
                symbol: None,
            }),
        }),
        summary: "Loads eight halves per thread.".into(),
        snapshots: Some(Snapshots {
            before: BottleneckSnapshot {
                classification: "memory-bound".into(),
                text: "dram 61% of peak\nstall: long scoreboard 48%".into(),
                metrics: BTreeMap::from([
                    ("dram_throughput_pct".into(), 61.0),
                    ("achieved_occupancy_pct".into(), 88.5),
                ]),
            },
            after: Some(BottleneckSnapshot {
                classification: "memory-bound".into(),
                text: "dram 93% of peak".into(),
                metrics: BTreeMap::from([
                    ("dram_throughput_pct".into(), 93.0),
                    ("registers".into(), 32.0),
                ]),
            }),
        }),
        diagnosis: Diagnosis {
            bottleneck: "memory-bound".into(),
            explanation: "2-byte loads | narrow".into(),
            evidence: vec!["dram 61% of peak".into()],
            confidence: Some(Confidence {
                score: 0.8125,
                cases: vec!["llm/rmsnorm/vec8@sm_90".into()],
            }),
        },
        changes: vec![Change {
            what: "uint4 loads".into(),
            why: "16 bytes per request".into(),
        }],
        risks: vec![Risk {
            risk: "misalignment".into(),
            covered_by: "region cols % 8 == 0".into(),
        }],
        verification: Verification {
            method: "kopt verify".into(),
            outputs: vec![OutputCheck {
                buffer: "y".into(),
                rtol: 1e-2,
                atol: 1e-2,
                max_abs_error: 0.0039,
                max_rel_error: 0.0081,
            }],
            seeds: vec![1, 2, 3],
        },
        figures: vec![ShapeFigures {
            shape: BTreeMap::from([
                ("cols".into(), Number::Int(4096)),
                ("rows".into(), Number::Int(8192)),
            ]),
            reference_us: 40.0,
            variant_us: 25.0,
            copy_bandwidth_pct: Some(62.5),
            registers: Some(32),
            occupancy_pct: Some(100.0),
        }],
        compile: None,
        search: None,
        provenance: Provenance {
            agent: "heuristic".into(),
            device: "NVIDIA H200".into(),
            driver: "580.159.04".into(),
            date: "2026-11-29".into(),
            copy_bandwidth_gbs: Some(4280.0),
            session: Some("target/kopt/runs/1/journal.jsonl".into()),
            budget: Some(BudgetUsed {
                rounds: Some(3),
                candidates: Some(7),
                wall_time_s: Some(412.4),
                tokens: None,
                cost_usd: None,
            }),
        },
    };
    insta::assert_snapshot!("rationale_json", r.to_json());
    insta::assert_snapshot!("rationale_md", r.render_markdown());
    assert_eq!(Rationale::parse(&r.to_json()).unwrap(), r, "round trip");
}

/// A record without the optional parts (as written before they existed) renders without
/// their sections, and its JSON has no trace of them.
#[test]
fn rationale_without_optional_parts() {
    let r = Rationale {
        format: FORMAT,
        kernel: "k".into(),
        variant: "v".into(),
        arch: "sm_80".into(),
        claim: None,
        summary: "s".into(),
        snapshots: None,
        diagnosis: Diagnosis {
            bottleneck: "b".into(),
            explanation: "e".into(),
            evidence: vec![],
            confidence: None,
        },
        changes: vec![],
        risks: vec![],
        verification: Verification {
            method: "m".into(),
            outputs: vec![],
            seeds: vec![1],
        },
        figures: vec![],
        compile: None,
        search: None,
        provenance: Provenance {
            agent: "a".into(),
            device: "d".into(),
            driver: "r".into(),
            date: "2026-01-01".into(),
            copy_bandwidth_gbs: None,
            session: None,
            budget: None,
        },
    };
    let json = r.to_json();
    for absent in [
        "claim",
        "snapshots",
        "confidence",
        "budget",
        "copy_bandwidth_gbs",
        "session",
        "search",
        "compile",
    ] {
        assert!(!json.contains(absent), "{absent} in {json}");
    }
    let md = r.render_markdown();
    assert!(md.starts_with("# `k` / `v` on sm_80\n"), "{md}");
    for absent in [
        "Bottleneck snapshot",
        "Confidence",
        "budget used",
        "Verified by",
        "Parameter search",
        "Compiled on the CPU",
    ] {
        assert!(!md.contains(absent), "{absent} in {md}");
    }
    assert!(md.contains("recorded session: none"), "{md}");

    // The search that chose the defines: its method, then a row per point.
    let mut r = r;
    let point = |id: &str, block: i64, outcome: &str, times: &[(&str, f64)]| SearchPoint {
        point: id.into(),
        defines: BTreeMap::from([("BLOCK".to_string(), block)]),
        outcome: outcome.into(),
        times_us: times.iter().map(|(s, t)| (s.to_string(), *t)).collect(),
    };
    r.search = Some(ParameterSearch {
        method: "The loop's exhaustive sweep of the agent's matrix.".into(),
        matrix: BTreeMap::from([("BLOCK".to_string(), vec![128, 256, 512])]),
        chosen: "r1c1-m1".into(),
        stopped: Some("the candidates budget ran out".into()),
        points: vec![
            point("r1c1", 128, "verified", &[("n=4096", 3.5), ("n=64", 2.0)]),
            point(
                "r1c1-m1",
                256,
                "verified",
                &[("n=4096", 2.5), ("n=64", 1.9)],
            ),
            point("r1c1-m2", 512, "numerics: y[7] | differs", &[]),
        ],
    });
    assert_eq!(Rationale::parse(&r.to_json()).unwrap(), r, "round trip");
    let md = r.render_markdown();
    let section = md
        .split("## Parameter search")
        .nth(1)
        .and_then(|s| s.split("## Verification").next())
        .expect("a search section before the verification");
    insta::assert_snapshot!("rationale_search_md", section);

    // The compile figures `check` compares with: after the figures, one sentence.
    r.compile = Some(CompileFigures {
        nvrtc: "13.0".into(),
        cuda_headers: Some("13.0".into()),
        arch: "sm_80".into(),
        registers: 40,
        spill_stores: 0,
        spill_loads: 0,
        stack_bytes: 0,
        shared_bytes: 1024,
    });
    let json = r.to_json();
    assert!(
        json.contains("\"compile\": {\n    \"nvrtc\": \"13.0\""),
        "{json}"
    );
    assert_eq!(Rationale::parse(&json).unwrap(), r, "round trip");
    let md = r.render_markdown();
    assert!(
        md.contains("Compiled on the CPU by NVRTC 13.0 (CUDA headers 13.0), sm_80: 40 registers, no spills, 0 bytes of stack, 1024 bytes of static shared memory; `cargo kopt check` compiles it again and compares.\n"),
        "{md}"
    );
    assert!(
        md.find("Compiled on the CPU").unwrap() < md.find("## Parameter search").unwrap(),
        "{md}"
    );
}
