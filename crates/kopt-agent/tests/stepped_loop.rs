//! The loop stepped a round at a time (`LoopState::round`), as the MCP server steps it:
//! each candidate judged against the best so far, the rules and budgets read as data.

use std::collections::BTreeMap;
use std::sync::Arc;

use kopt_agent::proposal::{self, Resolved};
use kopt_agent::run::{Budget, Evaluate, LoopState, Round, Rules, Stop, Unreviewed};
use kopt_engine::job::KernelVersion;
use kopt_engine::stats::watchdog;
use kopt_engine::verdict::{Failure, Fence, ShapeFigures, Verdict};
use kopt_search::run::{Compiled, Compiler, PointSpec};

const SHAPE: &str = "n=4096";
const REFERENCE_US: f64 = 10.0;

fn spec() -> kopt_spec::KernelSpec {
    let item = kopt_spec::spec::parse_item(
        "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    kopt_spec::spec::parse_kernel("reference = \"k.cu\", x: [n], y: [n], grid = ceil_div(n, 256), block = 256, tunables = { BLOCK: [128, 256, 512] }, shapes = [{ n: 4096 }]".parse().unwrap(), &item).unwrap().0
}

const REFERENCE: &str = "extern \"C\" __global__ void scale(const float* x, float* y, unsigned n) {\n    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = 2.0f * x[i];\n}\n";

/// A candidate whose source says how it fares: `// time T` (µs), or `// fails FENCE: why`.
fn candidate(marker: &str, matrix: Option<serde_json::Value>) -> Resolved {
    let mut p = serde_json::json!({
        "diagnosis": { "bottleneck": "memory-bound", "summary": marker, "evidence": ["dram 61% of peak"] },
        "changes": [{ "what": "a change", "why": "a reason" }],
        "risks": [],
        "expected": [{ "metric": "time", "change": "lower" }],
        "candidate": { "source": format!("{REFERENCE}// {marker}\n") },
        "defines": { "BLOCK": 256, "UNROLL": 1 },
    });
    if let Some(m) = matrix {
        p["matrix"] = m;
    }
    let text = serde_json::json!({ "proposals": [p] }).to_string();
    proposal::parse(&text, &spec(), REFERENCE)
        .expect("a valid proposal")
        .remove(0)
}

/// Judges a candidate by its marker; a matrix point with `BLOCK=512` is 20% faster than
/// its candidate. With `compile_fails_on`, it has a compiler for a matrix's points that
/// fails on that `BLOCK`.
#[derive(Default)]
struct Marked {
    evaluated: Vec<String>,
    /// The points that arrived with code from the compile pool.
    compiled_ahead: Vec<String>,
    compile_fails_on: Option<i64>,
    /// A `BLOCK` whose point fails to compile in the evaluation (no compile pool).
    evaluation_fails_to_compile_on: Option<i64>,
}

struct FailsOn(i64);

impl Compiler for FailsOn {
    fn compile(&self, p: &PointSpec) -> Compiled {
        if p.defines.get("BLOCK") == Some(&self.0) {
            Compiled::Failed {
                log: format!(
                    "kernel.cu(3): error: BLOCK={} needs too many registers",
                    self.0
                ),
                seconds: 0.0,
            }
        } else {
            Compiled::Ok {
                code: format!("code of BLOCK={}", p.defines["BLOCK"]),
                seconds: 0.0,
                metrics: BTreeMap::new(),
            }
        }
    }
}

impl Evaluate for Marked {
    fn point_compiler(&self, _base: &KernelVersion) -> Option<Arc<dyn Compiler>> {
        self.compile_fails_on
            .map(|b| Arc::new(FailsOn(b)) as Arc<dyn Compiler>)
    }

    fn attach_code(&self, version: &mut KernelVersion, code: &str) {
        version.ptx = Some(code.to_string());
    }

    fn evaluate(
        &mut self,
        v: &mut KernelVersion,
        best_us: Option<&BTreeMap<String, f64>>,
        region: Option<&str>,
    ) -> Verdict {
        assert_eq!(region, None, "these candidates claim every shape");
        self.evaluated.push(v.id.clone());
        if self.evaluation_fails_to_compile_on.is_some()
            && v.defines.get("BLOCK") == self.evaluation_fails_to_compile_on.as_ref()
        {
            return Verdict::compile_rejected("kernel.cu(3): error: too many registers");
        }
        if let Some(code) = &v.ptx {
            assert_eq!(
                code,
                &format!("code of BLOCK={}", v.defines["BLOCK"]),
                "its own code"
            );
            self.compiled_ahead.push(v.id.clone());
        }
        let marker = v
            .source
            .lines()
            .last()
            .unwrap_or("")
            .trim_start_matches("// ");
        let mut verdict = Verdict {
            accepted: true,
            failures: vec![],
            shapes: vec![],
            wins: vec![],
            comparisons: vec![],
            outliers: vec![],
            notes: vec![],
            compile_log: String::new(),
            seeds: vec![],
            sanitizer: None,
        };
        if let Some(why) = marker.strip_prefix("fails ") {
            let (fence, message) = why.split_once(": ").unwrap();
            verdict.accepted = false;
            verdict.failures.push(Failure {
                fence: if fence == "compile" {
                    Fence::Compile
                } else {
                    Fence::Numerics
                },
                shape: None,
                message: message.to_string(),
            });
            return verdict;
        }
        let mut us: f64 = marker.strip_prefix("time ").unwrap().parse().unwrap();
        if v.defines.get("BLOCK") == Some(&512) {
            us *= 0.8;
        }
        let best = best_us
            .and_then(|b| b.get(SHAPE))
            .copied()
            .unwrap_or(REFERENCE_US);
        verdict.comparisons = watchdog(&[(SHAPE.to_string(), best, us)], 0.03);
        verdict.shapes.push(
            serde_json::from_value::<ShapeFigures>(serde_json::json!({
                "shape": SHAPE, "held_out": false, "candidate_us": us, "speedup": REFERENCE_US / us,
                "max_abs_error": 0.0, "max_rel_error": 0.0
            }))
            .unwrap(),
        );
        verdict
    }
}

fn state(rules: Rules, budget: Budget) -> LoopState<'static> {
    LoopState::new(
        &spec(),
        &KernelVersion::reference(&spec(), REFERENCE),
        None,
        rules,
        budget,
        None,
    )
}

/// Opens the next round and verifies `candidates` in it.
fn next_round(s: &mut LoopState, eval: &mut Marked, candidates: Vec<(&str, Resolved)>) -> Round {
    let round = s
        .open_round(&Unreviewed, &mut |_| {})
        .expect("the budgets allow another round");
    let candidates = candidates
        .into_iter()
        .map(|(id, c)| (id.to_string(), c))
        .collect();
    s.round(round, candidates, &mut Unreviewed, eval, &mut |_| {})
}

#[test]
fn each_candidate_is_judged_against_the_best_before_it() {
    let mut s = state(Rules::default(), Budget::default());
    let mut eval = Marked::default();
    let r = next_round(
        &mut s,
        &mut eval,
        vec![
            ("r1c1", candidate("time 5.0", None)),
            // 2x the reference, but slower than r1c1: no new best.
            ("r1c2", candidate("time 5.5", None)),
        ],
    );
    assert_eq!(r.stop, None);
    assert!(r.improved);
    let improved: Vec<(&str, bool)> = r
        .checked
        .iter()
        .map(|c| (c.id.as_str(), c.improved))
        .collect();
    assert_eq!(improved, [("r1c1", true), ("r1c2", false)]);
    assert_eq!(s.best_label(), "r1c1");
    assert_eq!(s.best_times().unwrap()[SHAPE], 5.0);
    assert_eq!(s.history().len(), 2);
    assert!(
        s.history()[1].details[0].contains("against the best 5.00 µs"),
        "{:?}",
        s.history()[1]
    );
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert_eq!(end.best.unwrap().0.id, "r1c1");
    assert_eq!(end.tried.len(), 2);
}

#[test]
fn the_default_rules_search_a_matrix_and_escalate_a_repeated_error() {
    let mut s = state(Rules::default(), Budget::default());
    let mut eval = Marked::default();
    let r = next_round(
        &mut s,
        &mut eval,
        vec![(
            "r1c1",
            candidate("time 8.0", Some(serde_json::json!({ "BLOCK": [256, 512] }))),
        )],
    );
    assert_eq!(eval.evaluated, ["r1c1", "r1c1-m1"]);
    assert_eq!(s.best_label(), "r1c1-m1", "BLOCK=512 is the faster point");
    assert!(r.checked.iter().all(|c| c.improved));
    let mut stop = None;
    for round in 2..=4 {
        let id = format!("r{round}c1");
        let failing = candidate("fails compile: error: BLOCK undefined", None);
        let r = next_round(&mut s, &mut eval, vec![(&id, failing)]);
        assert_eq!(r.number, round);
        stop = r.stop;
        if stop.is_some() {
            assert_eq!(round, 4, "the third time the same error is one too many");
        }
    }
    assert!(
        matches!(&stop, Some(Stop::Escalated { reason, .. }) if reason.contains("the same compile error came back 3 times")),
        "{stop:?}"
    );
}

#[test]
fn judge_only_rules_never_escalate_and_leave_a_matrix_alone() {
    let mut s = state(Rules::judge_only(0.03, 0.01), Budget::unlimited());
    let mut eval = Marked::default();
    for round in 1..=6 {
        let id = format!("m{round}");
        let wrong = candidate("fails numerics: y[3] is 2.5, not 2.0", None);
        let r = next_round(&mut s, &mut eval, vec![(&id, wrong)]);
        assert_eq!((r.number, r.stop), (round, None));
    }
    let r = next_round(
        &mut s,
        &mut eval,
        vec![(
            "m7",
            candidate("time 5.0", Some(serde_json::json!({ "BLOCK": [256, 512] }))),
        )],
    );
    assert_eq!(r.checked.len(), 1, "the matrix is not searched");
    assert_eq!(s.best_label(), "m7");
    assert_eq!(s.candidates(), 7);
}

#[test]
fn a_candidate_budget_stops_a_round_before_the_candidate_over_it() {
    let budget = Budget {
        candidates: 1,
        ..Budget::default()
    };
    let mut s = state(Rules::default(), budget);
    let mut eval = Marked::default();
    let r = next_round(
        &mut s,
        &mut eval,
        vec![
            ("r1c1", candidate("time 9.0", None)),
            ("r1c2", candidate("time 4.0", None)),
        ],
    );
    assert_eq!(
        r.stop,
        Some(Stop::Budget {
            which: "candidates".into()
        })
    );
    assert_eq!(eval.evaluated, ["r1c1"]);
    assert_eq!(
        s.open_round(&Unreviewed, &mut |_| {}),
        Err(Stop::Budget {
            which: "candidates".into()
        }),
        "and the next round does not start"
    );
}

#[test]
fn a_matrix_over_16_points_is_climbed_from_the_candidate_within_the_candidate_budget() {
    let budget = Budget {
        candidates: 8,
        ..Budget::default()
    };
    let mut s = state(Rules::default(), budget);
    let mut eval = Marked::default();
    let matrix =
        serde_json::json!({ "BLOCK": [128, 256, 512], "UNROLL": [1, 2, 3, 4, 5, 6, 7, 8] });
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("r1c1", candidate("time 8.0", Some(matrix)))],
    );
    assert_eq!(
        r.stop,
        Some(Stop::Budget {
            which: "candidates".into()
        })
    );
    // The candidate, then 7 of the other 23 points: its neighbours first, BLOCK=512 (the
    // faster block) among them.
    assert_eq!(eval.evaluated.len(), 8, "{:?}", eval.evaluated);
    assert_eq!(eval.evaluated[0], "r1c1");
    let best = s.best_version();
    assert_eq!(best.defines["BLOCK"], 512, "{:?}", best.defines);
    let sweep = s.history().last().unwrap();
    assert!(
        sweep.verdict.starts_with(
            "the loop evaluated 7 of the 23 other point(s) of your matrix, climbing from yours"
        ),
        "{}",
        sweep.verdict
    );
    assert!(
        sweep
            .verdict
            .ends_with("stopped: the candidates budget ran out"),
        "{}",
        sweep.verdict
    );
}

#[test]
fn a_matrix_compiles_in_the_search_pool_and_a_point_that_does_not_compile_is_recorded() {
    let mut s = state(Rules::default(), Budget::default());
    let mut eval = Marked {
        compile_fails_on: Some(128),
        ..Marked::default()
    };
    let round = s.open_round(&Unreviewed, &mut |_| {}).unwrap();
    let mut events = Vec::new();
    let r = s.round(
        round,
        vec![(
            "r1c1".into(),
            candidate(
                "time 8.0",
                Some(serde_json::json!({ "BLOCK": [128, 256, 512] })),
            ),
        )],
        &mut Unreviewed,
        &mut eval,
        &mut |e| events.push(e),
    );
    assert_eq!(r.stop, None);
    // The candidate itself is verified as any candidate; of its two other points, BLOCK=128
    // never reaches the evaluator, BLOCK=512 arrives compiled.
    assert_eq!(eval.evaluated, ["r1c1", "r1c1-m2"]);
    assert_eq!(eval.compiled_ahead, ["r1c1-m2"]);
    let ids: Vec<(&str, bool)> = r
        .checked
        .iter()
        .map(|c| (c.id.as_str(), c.verdict.accepted))
        .collect();
    assert_eq!(ids, [("r1c1", true), ("r1c1-m1", false), ("r1c1-m2", true)]);
    let m1 = &r.checked[1];
    assert_eq!(m1.version.defines["BLOCK"], 128);
    assert_eq!(m1.verdict.failures[0].fence, Fence::Compile);
    assert!(m1.verdict.compile_log.contains("needs too many registers"));
    assert_eq!(s.best_label(), "r1c1-m2");
    let sweep = s.history().last().unwrap();
    assert!(
        sweep
            .details
            .iter()
            .any(|l| l.starts_with("r1c1-m1 (BLOCK=128 UNROLL=1): rejected: compile")),
        "{:?}",
        sweep.details
    );
    let candidates = events
        .iter()
        .filter(|e| matches!(e, kopt_agent::run::Event::Candidate { .. }))
        .count();
    assert_eq!(candidates, 3, "every point is a candidate in the journal");
    assert_eq!(s.candidates(), 3);
}

#[test]
fn a_point_that_fails_to_compile_in_its_evaluation_is_recorded_once() {
    let mut s = state(Rules::default(), Budget::default());
    let mut eval = Marked {
        evaluation_fails_to_compile_on: Some(128),
        ..Marked::default()
    };
    let matrix = serde_json::json!({ "BLOCK": [128, 256, 512] });
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("r1c1", candidate("time 8.0", Some(matrix)))],
    );
    assert_eq!(eval.evaluated, ["r1c1", "r1c1-m1", "r1c1-m2"]);
    let ids: Vec<&str> = r.checked.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["r1c1", "r1c1-m1", "r1c1-m2"]);
    assert_eq!(r.checked[1].verdict.failures[0].fence, Fence::Compile);
    assert_eq!(s.candidates(), 3);
}
