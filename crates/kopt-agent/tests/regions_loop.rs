//! The loop per region: a proposal that claims a region is judged on that region's shapes
//! and kept for it; a candidate faster on some shapes and slower on others becomes the
//! winner of the region kopt finds where it wins, verified again there; the best keeps
//! the other shapes, and the agent's context lists the regions' winners.

use std::collections::BTreeMap;

use kopt_agent::proposal::{self, Resolved};
use kopt_agent::run::{Budget, Evaluate, LoopState, Round, Rules, Stop, Unreviewed};
use kopt_engine::job::KernelVersion;
use kopt_engine::stats::watchdog;
use kopt_engine::verdict::{Failure, Fence, ShapeFigures, Verdict};

/// Declared shapes and the reference's time on each (µs).
const SHAPES: [(i64, f64); 3] = [(1024, 2.0), (4096, 6.0), (65536, 80.0)];
/// A held-out shape, checked but not timed.
const HELD_OUT: i64 = 2048;

fn spec() -> kopt_spec::KernelSpec {
    let item = kopt_spec::spec::parse_item(
        "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    kopt_spec::spec::parse_kernel("reference = \"k.cu\", x: [n], y: [n], grid = ceil_div(n, 256), block = 256, shapes = [{ n: 1024 }, { n: 4096 }, { n: 65536 }]".parse().unwrap(), &item).unwrap().0
}

const REFERENCE: &str = "extern \"C\" __global__ void scale(const float* x, float* y, unsigned n) {\n    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = 2.0f * x[i];\n}\n";

/// A candidate whose source says its time on each declared shape as a factor of the
/// reference's: `// times 0.5 0.5 2.0` (for n = 1024, 4096, 65536).
fn candidate(factors: [f64; 3], region: Option<&str>) -> Resolved {
    let marker = format!("times {} {} {}", factors[0], factors[1], factors[2]);
    let mut p = serde_json::json!({
        "diagnosis": { "bottleneck": "launch-bound", "summary": marker, "evidence": ["few blocks"] },
        "changes": [{ "what": "a change", "why": "a reason" }],
        "risks": [],
        "expected": [{ "metric": "time", "change": "lower" }],
        "candidate": { "source": format!("{REFERENCE}// {marker}\n") },
    });
    if let Some(r) = region {
        p["region"] = r.into();
    }
    let text = serde_json::json!({ "proposals": [p] }).to_string();
    proposal::parse(&text, &spec(), REFERENCE)
        .expect("a valid proposal")
        .remove(0)
}

/// Judges by the marker, on the declared shapes inside the region and the held-out one
/// when inside too, with the watchdog against `best_us` as the engine's judge does.
#[derive(Default)]
struct Timed {
    /// `(candidate, region)` of every evaluation, in order.
    calls: Vec<(String, Option<String>)>,
}

fn label(n: i64) -> String {
    format!("n={n}")
}

impl Evaluate for Timed {
    fn evaluate(
        &mut self,
        v: &mut KernelVersion,
        best_us: Option<&BTreeMap<String, f64>>,
        region: Option<&str>,
    ) -> Verdict {
        self.calls.push((v.id.clone(), region.map(String::from)));
        let spec = spec();
        let inside =
            |n: i64| region.is_none_or(|r| spec.region_holds(&spec.parse_region(r).unwrap(), &[n]));
        let marker = v
            .source
            .lines()
            .last()
            .unwrap()
            .trim_start_matches("// times ");
        let factors: Vec<f64> = marker.split(' ').map(|f| f.parse().unwrap()).collect();
        let mut timed = Vec::new();
        let mut shapes = Vec::new();
        for (i, &(n, reference)) in SHAPES.iter().enumerate() {
            if !inside(n) {
                continue;
            }
            let us = reference * factors[i];
            let best = best_us
                .and_then(|b| b.get(&label(n)))
                .copied()
                .unwrap_or(reference);
            timed.push((label(n), best, us));
            shapes.push(serde_json::json!({
                "shape": label(n), "held_out": false, "reference_us": reference,
                "candidate_us": us, "speedup": reference / us,
                "max_abs_error": 0.0, "max_rel_error": 0.0
            }));
        }
        if inside(HELD_OUT) {
            shapes.push(serde_json::json!({
                "shape": label(HELD_OUT), "held_out": true,
                "max_abs_error": 0.0, "max_rel_error": 0.0
            }));
        }
        let comparisons = watchdog(&timed, 0.03);
        let failures: Vec<Failure> = comparisons
            .iter()
            .filter(|c| c.regression)
            .map(|c| Failure {
                fence: Fence::Watchdog,
                shape: Some(c.shape.clone()),
                message: "slower than the best".into(),
            })
            .collect();
        Verdict {
            accepted: failures.is_empty(),
            wins: comparisons
                .iter()
                .filter(|c| c.speedup > 1.03)
                .map(|c| c.shape.clone())
                .collect(),
            failures,
            shapes: shapes
                .into_iter()
                .map(|s| serde_json::from_value::<ShapeFigures>(s).unwrap())
                .collect(),
            comparisons,
            outliers: vec![],
            notes: vec![],
            compile_log: String::new(),
            seeds: vec![],
            sanitizer: None,
        }
    }
}

fn state() -> LoopState<'static> {
    LoopState::new(
        &spec(),
        &KernelVersion::reference(&spec(), REFERENCE),
        None,
        Rules::default(),
        Budget::default(),
        None,
    )
}

fn next_round(s: &mut LoopState, eval: &mut Timed, candidates: Vec<(&str, Resolved)>) -> Round {
    let round = s.open_round(&Unreviewed, &mut |_| {}).unwrap();
    let candidates = candidates
        .into_iter()
        .map(|(id, c)| (id.to_string(), c))
        .collect();
    s.round(round, candidates, &mut Unreviewed, eval, &mut |_| {})
}

#[test]
fn a_candidate_that_wins_on_some_shapes_wins_the_region_kopt_finds_for_it() {
    let mut s = state();
    let mut eval = Timed::default();
    // Twice as fast on the two small shapes, twice as slow on the large one.
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.5, 0.5, 2.0], None))],
    );
    assert!(r.improved, "a region's winner is an improvement");
    assert_eq!(
        eval.calls,
        [
            ("c1".to_string(), None),
            ("c1-region".to_string(), Some("n <= 4096".to_string()))
        ],
        "judged on every shape, then again on the region found"
    );
    assert_eq!(
        s.best_label(),
        "reference",
        "the best keeps the other shapes"
    );
    assert_eq!(
        s.regional_lines(),
        [
            "`n <= 4096`: c1-region (2.00x over the best on those shapes; region found by kopt)",
            "region map: n=1024: c1-region; n=4096: c1-region; n=65536: reference"
        ]
    );
    let told = &s.history()[0].details;
    assert!(
        told.iter()
            .any(|d| d.contains("kept as the winner for the shapes where `n <= 4096` holds")),
        "{told:?}"
    );
    assert!(
        told.iter()
            .any(|d| d.contains("won (n=1024; n=4096)") && d.contains("lost (n=65536)")),
        "{told:?}"
    );
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert!(end.best.is_none());
    let w = &end.regional[0];
    assert_eq!(w.region, "n <= 4096");
    let found = w.found.as_ref().unwrap();
    assert_eq!(found.held_out_inside, 1, "n=2048 is inside");
    assert!(w.verdict.accepted);
    assert_eq!(w.resolved.proposal.region.as_deref(), Some("n <= 4096"));
}

#[test]
fn a_claimed_region_is_judged_on_its_shapes_and_kept_for_them_only() {
    let mut s = state();
    let mut eval = Timed::default();
    // Slow on small shapes, but the proposal claims the large one only.
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("big", candidate([3.0, 3.0, 0.5], Some("n >= 65536")))],
    );
    assert!(r.improved);
    assert_eq!(
        eval.calls,
        [("big".to_string(), Some("n >= 65536".to_string()))]
    );
    assert_eq!(s.best_label(), "reference");
    // A faster candidate for the same region replaces it; a slower one does not.
    next_round(
        &mut s,
        &mut eval,
        vec![("bigger", candidate([3.0, 3.0, 0.25], Some("n >= 65536")))],
    );
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("slower", candidate([3.0, 3.0, 0.4], Some("n >= 65536")))],
    );
    assert!(!r.improved, "judged against the region's winner");
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert_eq!(end.regional.len(), 1);
    assert_eq!(end.regional[0].version.id, "bigger");
    assert!(end.regional[0].found.is_none(), "claimed, not found");
}

#[test]
fn a_best_that_later_wins_everywhere_leaves_the_region_nothing_to_win() {
    let mut s = state();
    let mut eval = Timed::default();
    next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.5, 0.5, 2.0], None))],
    );
    // Faster than c1 on c1's region, and than the reference everywhere.
    next_round(
        &mut s,
        &mut eval,
        vec![("c2", candidate([0.4, 0.4, 0.9], None))],
    );
    assert_eq!(s.best_label(), "c2");
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert!(end.regional.is_empty(), "{:?}", end.regional);
}

#[test]
fn a_region_must_hold_on_a_declared_shape() {
    let text = serde_json::json!({ "proposals": [{
        "diagnosis": { "bottleneck": "b", "summary": "s", "evidence": ["e"] },
        "changes": [{ "what": "w", "why": "y" }],
        "risks": [], "expected": [],
        "candidate": { "source": REFERENCE },
        "region": "n > 100000",
    }]})
    .to_string();
    let errors = proposal::parse(&text, &spec(), REFERENCE).unwrap_err();
    assert!(
        errors[0]
            .contains("`region` `n > 100000` holds on no declared shape (n=1024; n=4096; n=65536)"),
        "{errors:?}"
    );
    let text = text.replace("n > 100000", "rows > 2");
    let errors = proposal::parse(&text, &spec(), REFERENCE).unwrap_err();
    assert!(errors[0].contains("`region`"), "{errors:?}");
}

/// The loop's end: narrowing to where the winners are not slower than the reference.
fn narrowed(s: &mut LoopState, eval: &mut Timed) -> Vec<String> {
    let mut said = Vec::new();
    s.narrow_to_reference(eval, &mut |e| {
        if let kopt_agent::run::Event::Narrowing { id, detail } = e {
            said.push(format!("{id}: {detail}"));
        }
    });
    said
}

#[test]
fn a_best_slower_than_the_reference_on_some_shape_is_narrowed_to_where_it_is_not() {
    let mut s = state();
    let mut eval = Timed::default();
    // Twice as fast on the small shapes, 2% slower on the large one: inside the
    // watchdog's 3%, so a new best on every shape.
    let r = next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.5, 0.5, 1.02], None))],
    );
    assert!(r.improved);
    assert_eq!(s.best_label(), "c1");
    let said = narrowed(&mut s, &mut eval);
    assert_eq!(
        eval.calls.last().unwrap(),
        &("c1-narrowed".to_string(), Some("n <= 4096".to_string())),
        "verified again on the region, against the reference"
    );
    assert!(
        said[0].starts_with("c1: slower than the reference on n=65536: 81.60 µs against the reference's 80.00 µs: narrowed to `n <= 4096` (2.00x over the reference there)"),
        "{said:?}"
    );
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert!(end.best.is_none(), "no winner on every shape is left");
    let w = &end.regional[0];
    assert_eq!(w.region, "n <= 4096");
    let n = w.narrowed.as_ref().unwrap();
    assert!(n.was_best && !n.is_start);
    assert!(!n.retires_start, "the loop started from the reference");
    let f = w.found.as_ref().unwrap();
    assert_eq!(f.lost, ["n=65536"]);
    assert_eq!(f.won, ["n=1024", "n=4096"]);
    assert!(f
        .describe(&w.region)
        .contains("not slower than the reference"));
}

#[test]
fn a_winner_within_the_noise_of_the_reference_everywhere_is_not_narrowed() {
    let mut s = state();
    let mut eval = Timed::default();
    next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.5, 0.5, 1.005], None))],
    );
    let said = narrowed(&mut s, &mut eval);
    assert!(said.is_empty(), "{said:?}");
    assert_eq!(eval.calls.len(), 1, "nothing verified again");
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert!(end.best.is_some() && end.regional.is_empty());
}

#[test]
fn a_winner_slower_in_the_middle_has_no_region_and_stays_as_it_was() {
    let mut s = state();
    let mut eval = Timed::default();
    // Slower than the reference on n=4096 only: no bound or interval over n keeps
    // n=1024 and n=65536 but not n=4096.
    next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.5, 1.02, 0.5], None))],
    );
    let said = narrowed(&mut s, &mut eval);
    assert!(
        said[0].contains("no condition over the scalar arguments separates"),
        "{said:?}"
    );
    let end = s.finish(Stop::Rounds, &Unreviewed);
    assert_eq!(end.best.unwrap().0.id, "c1", "kept for every shape");
}

/// A loop that starts from an accepted variant with these factors (verified at the start).
fn started_from(factors: [f64; 3]) -> (LoopState<'static>, Timed) {
    let mut eval = Timed::default();
    let mut version = KernelVersion::reference(&spec(), REFERENCE);
    version.id = "accepted-v1".into();
    version.source = format!(
        "{REFERENCE}// times {} {} {}\n",
        factors[0], factors[1], factors[2]
    );
    let verdict = eval.evaluate(&mut version.clone(), None, None);
    eval.calls.clear();
    let start = kopt_agent::run::Start { version, verdict };
    let s = LoopState::new(
        &spec(),
        &KernelVersion::reference(&spec(), REFERENCE),
        Some(&start),
        Rules::default(),
        Budget::default(),
        None,
    );
    (s, eval)
}

#[test]
fn an_accepted_start_that_nothing_beat_is_narrowed_and_retired() {
    let (mut s, mut eval) = started_from([0.5, 0.5, 1.02]);
    // A candidate that does not beat the start.
    next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.6, 0.6, 1.0], None))],
    );
    assert_eq!(s.best_label(), "accepted-v1");
    let said = narrowed(&mut s, &mut eval);
    assert!(
        said[0].starts_with("accepted-v1: slower than the reference on n=65536"),
        "{said:?}"
    );
    assert!(said[0].contains("retires the accepted variant"), "{said:?}");
    let end = s.finish(Stop::Rounds, &Unreviewed);
    let w = &end.regional[0];
    assert_eq!(w.version.id, "accepted-v1-narrowed");
    let n = w.narrowed.as_ref().unwrap();
    assert!(n.is_start && n.retires_start);
    // kopt's own proposal: no code changed, the evidence its verification at the start.
    let p = &w.resolved.proposal;
    assert!(p.changes[0].what.starts_with("none to the code"));
    assert!(
        p.diagnosis
            .evidence
            .iter()
            .any(|e| e == "n=65536: 81.60 µs, the reference 80.00 µs in the same job"),
        "{:?}",
        p.diagnosis.evidence
    );
    assert_eq!(p.region.as_deref(), Some("n <= 4096"));
}

#[test]
fn a_narrowed_best_keeps_a_start_that_beats_the_reference_where_it_does_not() {
    // The start is faster than the reference everywhere; the new best beats it by far on
    // the small shapes and is 1.5% slower than the reference on the large one (2.5%
    // slower than the start there: inside the watchdog's 3%).
    let (mut s, mut eval) = started_from([0.8, 0.8, 0.99]);
    next_round(
        &mut s,
        &mut eval,
        vec![("c1", candidate([0.3, 0.3, 1.015], None))],
    );
    assert_eq!(s.best_label(), "c1");
    narrowed(&mut s, &mut eval);
    let end = s.finish(Stop::Rounds, &Unreviewed);
    let n = end.regional[0].narrowed.as_ref().unwrap();
    assert!(n.was_best && !n.is_start);
    assert!(
        !n.retires_start,
        "the start is faster than the reference on n=65536: it keeps running there"
    );
}
