//! The case library on a fixture of hand-made cases: retrieval finds the expected
//! neighbours, import and export round-trip exactly, committed variants import.

mod common;

use std::collections::BTreeMap;

use kopt_store::cases::{self, CaseLibrary, CommittedImport, Query, Status};
use kopt_store::features;

const FIXTURE: &str = include_str!("fixtures/cases.jsonl");

fn library() -> CaseLibrary {
    let mut lib = CaseLibrary::open_in_memory().unwrap();
    let report = lib.import_jsonl(FIXTURE).unwrap();
    assert_eq!(report.added, FIXTURE.lines().count());
    lib
}

fn metrics(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn ids(n: &[cases::Neighbour]) -> Vec<&str> {
    n.iter().map(|n| n.case.id.as_str()).collect()
}

#[test]
fn the_fixture_holds_at_least_30_cases_of_every_outcome() {
    let lib = library();
    let all = lib.list(None, None).unwrap();
    assert!(all.len() >= 30, "{}", all.len());
    for status in [Status::Accepted, Status::Rejected, Status::Failed] {
        assert!(
            !lib.list(None, Some(status)).unwrap().is_empty(),
            "{status:?}"
        );
    }
    assert_eq!(lib.list(Some("transpose"), None).unwrap().len(), 4);
}

#[test]
fn export_then_import_round_trips_exactly() {
    let lib = library();
    let mut out = Vec::new();
    assert_eq!(lib.export_jsonl(&mut out).unwrap(), FIXTURE.lines().count());
    let exported = String::from_utf8(out).unwrap();
    assert_eq!(
        exported, FIXTURE,
        "the fixture is in export form: sorted, canonical"
    );

    let mut again = CaseLibrary::open_in_memory().unwrap();
    again.import_jsonl(&exported).unwrap();
    let mut out = Vec::new();
    again.export_jsonl(&mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), exported);
    assert_eq!(
        again.list(None, None).unwrap(),
        lib.list(None, None).unwrap()
    );

    // Importing the same cases again changes nothing; a changed one is updated.
    let report = again.import_jsonl(&exported).unwrap();
    assert_eq!(
        (report.added, report.updated, report.unchanged),
        (0, 0, FIXTURE.lines().count())
    );
    let changed = exported.replacen("\"speedup\":1.52", "\"speedup\":1.53", 1);
    let report = again.import_jsonl(&changed).unwrap();
    assert_eq!((report.added, report.updated), (0, 1));

    // A bad line anywhere imports nothing.
    let mut fresh = CaseLibrary::open_in_memory().unwrap();
    let broken = format!("{}{{\"id\":\"half\"\n", FIXTURE);
    let err = fresh.import_jsonl(&broken).unwrap_err().to_string();
    assert!(
        err.contains(&format!("line {}", FIXTURE.lines().count() + 1)),
        "{err}"
    );
    assert!(fresh.is_empty().unwrap());
}

/// The example's softmax reference before optimisation: memory-bound, three passes.
#[test]
fn a_three_pass_softmax_finds_the_softmax_rewrites() {
    let lib = library();
    let reference = std::fs::read_to_string(common::example().join("kernels/softmax.cu")).unwrap();
    let q = Query {
        kind: None,
        metrics: metrics(&[
            ("dram_throughput_pct", 47.5),
            ("achieved_occupancy_pct", 85.0),
            ("stall_long_scoreboard_pct", 50.0),
            ("stall_barrier_pct", 20.0),
            ("waves_per_sm", 31.0),
        ]),
        text: format!(
            "memory-bound {} {}",
            features::structural_summary(&reference),
            features::source_tokens(&reference)
        ),
        ..Default::default()
    };
    let n = lib.search(&q, 5).unwrap();
    assert_eq!(
        ids(&n)[..4],
        [
            "acme-llm/acme-kernels/softmax/online-noguard#run-20261002T101500Z-1a2b3c",
            "acme-llm/acme-kernels/softmax/online-vec4@sm_90",
            "acme-llm/acme-kernels/softmax/vec4@sm_80",
            "acme-llm/acme-kernels/softmax/smem-row@sm_90",
        ]
    );
    // The nearest is a failure, and is marked so: it teaches what broke (NaN on -inf rows).
    assert!(n[0].negative && !n[1].negative);
    assert_eq!(n[0].case.outcome.failure_class.as_deref(), Some("numerics"));
    for x in &n {
        assert!(
            (0.0..=1.0).contains(&x.metric_similarity) && (0.0..=1.0).contains(&x.text_similarity)
        );
        assert!((x.score - (0.6 * x.metric_similarity + 0.4 * x.text_similarity)).abs() < 1e-12);
    }
    // The confidence of "memory-bound" rests on the accepted softmax rewrites, not on
    // the failed one; "latency-bound" has only the long-row case, further away.
    let c = cases::confidence(&n, "memory-bound (extra passes)");
    assert_eq!(c.cases[..3], ids(&n)[1..4]);
    assert_eq!(c.score, (n[1].score * 100.0).round() / 100.0);
    let l = cases::confidence(&n, "latency-bound");
    assert_eq!(l.cases, ["acme-llm/acme-kernels/softmax/split-row@sm_90"]);
    assert!(l.score < c.score - 0.2, "{l:?} vs {c:?}");
}

#[test]
fn bank_conflicts_find_the_padding_and_the_swizzle() {
    let q = Query {
        metrics: metrics(&[
            ("bank_conflicts_per_request", 30.0),
            ("stall_short_scoreboard_pct", 45.0),
            ("dram_throughput_pct", 40.0),
            ("achieved_occupancy_pct", 88.0),
        ]),
        text: "transpose tile __shared__ bank conflicts column".into(),
        ..Default::default()
    };
    let n = library().search(&q, 3).unwrap();
    assert_eq!(
        ids(&n)[..2],
        [
            "acme-llm/acme-kernels/transpose/pad33@sm_90",
            "acme-llm/acme-kernels/transpose/swizzle@sm_90",
        ]
    );
}

#[test]
fn idle_sms_find_the_work_splitting_cases() {
    let q = Query {
        metrics: metrics(&[
            ("dram_throughput_pct", 5.0),
            ("achieved_occupancy_pct", 10.0),
            ("stall_long_scoreboard_pct", 75.0),
            ("waves_per_sm", 0.1),
        ]),
        text: "latency-bound few rows blocks idle SMs".into(),
        ..Default::default()
    };
    let n = library().search(&q, 5).unwrap();
    assert_eq!(
        ids(&n)[..3],
        [
            "acme-llm/acme-kernels/gqa_decode/split-k@sm_90",
            "acme-llm/acme-kernels/rmsnorm/split-small-batch@sm_90",
            "acme-llm/acme-kernels/softmax/split-row@sm_90",
        ]
    );
    assert!(n[..3]
        .iter()
        .all(|x| x.case.diagnosis.bottleneck == "latency-bound"));
}

#[test]
fn contended_atomics_find_the_two_stage_reduction_and_the_rejected_shortcut() {
    let q = Query {
        kind: Some("reduction".into()),
        metrics: metrics(&[
            ("atomic_throughput_pct", 80.0),
            ("dram_throughput_pct", 34.0),
            ("waves_per_sm", 8.0),
        ]),
        text: "atomicAdd reduce_sum block partial sums".into(),
        ..Default::default()
    };
    let n = library().search(&q, 5).unwrap();
    assert!(
        n.iter().all(|x| x.case.kind == "reduction"),
        "the kind filters"
    );
    assert_eq!(
        ids(&n)[..2],
        [
            "acme-llm/acme-kernels/reduce_sum/two-stage@sm_90",
            "acme-llm/acme-kernels/reduce_sum/atomic-warp#run-20261020T140000Z-4c5d6e",
        ]
    );
    assert!(n[1].negative);
    assert_eq!(n[1].case.outcome.status, Status::Rejected);
}

#[test]
fn text_alone_ranks_by_text() {
    let q = Query {
        text: "launch overhead tiny kernel fuse epilogue".into(),
        ..Default::default()
    };
    let n = library().search(&q, 2).unwrap();
    assert_eq!(
        ids(&n)[0],
        "acme-llm/acme-kernels/bias_add/fused-into-gemm-epilogue@sm_90"
    );
    assert!(n
        .iter()
        .all(|x| x.score == x.text_similarity && x.metric_similarity == 0.0));
    assert!(
        library().search(&Query::default(), 5).unwrap().is_empty(),
        "an empty query finds nothing"
    );
}

#[test]
fn committed_variants_import_as_accepted_cases() {
    let read_reference = |root: &std::path::Path, kernel: &str| {
        std::fs::read_to_string(root.join(format!("kernels/{kernel}.cu"))).ok()
    };
    let opts = CommittedImport {
        repo_name: Some("kopt".into()),
        reference_source: &read_reference,
    };
    let example = common::example_online_vec4();
    let mut lib = CaseLibrary::open_in_memory().unwrap();
    let report = lib.import_committed(example.path(), &opts).unwrap();
    assert_eq!((report.added, report.skipped.len()), (1, 0), "{report:?}");
    let c = lib
        .get("kopt/llm-kernels/softmax/online-vec4@sm_90")
        .unwrap()
        .unwrap();
    assert_eq!(c.kind, "softmax");
    assert_eq!(c.outcome.status, Status::Accepted);
    // Geometric mean of 65.98/42.11, 193.02/18.40 and 131.42/95.87.
    assert_eq!(c.outcome.speedup, Some(2.82));
    assert!(c.diagnosis.bottleneck.starts_with("memory-bound"));
    assert!(
        c.change
            .starts_with("Online max and sum in a single read of the row"),
        "{}",
        c.change
    );
    let reference = std::fs::read_to_string(example.path().join("kernels/softmax.cu")).unwrap();
    assert_eq!(
        c.features.structure,
        features::structural_summary(&reference),
        "features of the kernel before the change"
    );
    assert_eq!(c.origin.krate.as_deref(), Some("llm-kernels"));
    // Importing again is idempotent.
    let report = lib.import_committed(example.path(), &opts).unwrap();
    assert_eq!((report.added, report.unchanged), (0, 1));

    // A broken lock or rationale is skipped with why, the rest imported.
    let f = common::Fixture::new();
    let t = f.target();
    let p = f.pending("v1", "run-1", "");
    let plan =
        kopt_store::accept::plan_accept(&t, &f.kopt, &p, kopt_store::accept::AcceptAs::default())
            .unwrap();
    kopt_store::accept::apply_accept(&t, &f.kopt, &plan).unwrap();
    std::fs::write(f.path("kopt/softmax/v1/rationale.json"), "{}").unwrap();
    let (cases, skipped) =
        cases::cases_from_committed(f.crate_root.parent().unwrap(), &opts).unwrap();
    assert!(cases.is_empty());
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0].starts_with("crate/kopt/softmax/v1/rationale.json"),
        "{skipped:?}"
    );
}

#[test]
fn a_frozen_copy_answers_as_the_file_was_when_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.sqlite");
    let mut file = CaseLibrary::open(&path).unwrap();
    file.import_jsonl(FIXTURE).unwrap();
    let frozen = file.frozen().unwrap();
    assert_eq!(frozen.path(), file.path(), "messages name the file");
    // What a run records after the copy was taken reaches the file, not the copy.
    let mut later = file.list(Some("transpose"), None).unwrap()[0].clone();
    later.id = "later/run-r1c1@sm_90".into();
    file.upsert(&later).unwrap();
    let q = Query {
        kind: Some("transpose".into()),
        text: features::search_text("transpose tile smem"),
        ..Default::default()
    };
    let in_file = ids(&file.search(&q, 10).unwrap())
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    let in_copy = frozen.search(&q, 10).unwrap();
    assert!(in_file.contains(&later.id), "{in_file:?}");
    let mut in_copy = ids(&in_copy);
    in_copy.sort();
    let mut before: Vec<&str> = in_file
        .iter()
        .filter(|id| **id != later.id)
        .map(String::as_str)
        .collect();
    before.sort();
    assert_eq!(in_copy, before);
    assert_eq!(in_copy.len(), 4, "the fixture's transpose cases");
    assert_eq!(frozen.len().unwrap(), FIXTURE.lines().count());
}
