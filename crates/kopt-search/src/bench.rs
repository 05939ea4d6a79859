//! The convergence benchmark: how many evaluations, and how much time, each strategy
//! needs to come within a target (2%) of the best point, with and without the profile
//! seed, as the median over seeds.
//!
//! The exhaustive run is measured once, on the device; it gives the best point and the
//! landscape (valid points, best/median ratio). Each strategy is then replayed on that
//! table: it asks for points in its own order and gets the outcomes the exhaustive run
//! measured, until its best is within the target. Its *evaluations* are exact. Its
//! *seconds* are the device seconds the exhaustive run measured for the points it asked
//! for, plus the strategy's own time, so the figures of every strategy come from one set
//! of measurements; `cargo kopt search-bench --live` re-measures every trial instead
//! (the same driver, a fresh evaluation of every point, the wall clock).
//!
//! The rows and the landscape are the data of the file it writes, defined in
//! `kopt_spec::search_bench` so that the report reads them without this crate.

use std::collections::HashMap;

pub use kopt_spec::search_bench::{median, Landscape, Row, Trial};

use crate::interesting::Interesting;
use crate::run::{self, Budget, Evaluator, PointOutcome, PointSpec, Prior, Quiet, Settings};
use crate::seed::Guide;
use crate::space::Space;
use crate::strategy::{MakeStrategy, StrategyKind};

/// The landscape of a table of outcomes (one per point).
pub fn landscape(space: &Space, table: &HashMap<usize, PointOutcome>, target: f64) -> Landscape {
    let mut costs: Vec<(usize, f64)> = table
        .iter()
        .filter_map(|(id, o)| o.cost.map(|c| (*id, c)))
        .collect();
    costs.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let best = costs.first().copied();
    let mut cs: Vec<f64> = costs.iter().map(|c| c.1).collect();
    let med = median(&mut cs);
    Landscape {
        valid: space.len(),
        evaluated: table.len(),
        passed: costs.len(),
        best: best.map(|b| b.0),
        best_label: best.map(|b| space.label(b.0)),
        best_cost: best.map(|b| b.1),
        median_cost: med,
        best_over_median: best.zip(med).map(|(b, m)| m / b.1),
        near_best: best
            .map(|b| costs.iter().filter(|c| c.1 <= b.1 * (1.0 + target)).count())
            .unwrap_or(0),
    }
}

/// Answers from a table, as measured.
pub struct Replay<'a> {
    pub table: &'a HashMap<usize, PointOutcome>,
}

impl Evaluator for Replay<'_> {
    fn evaluate(
        &mut self,
        p: &PointSpec,
        _c: Option<&run::Compiled>,
        _progress: &mut dyn FnMut(&str),
    ) -> PointOutcome {
        self.table.get(&p.id).cloned().unwrap_or_else(|| {
            PointOutcome::failed(
                run::Status::Failed,
                "not-measured",
                format!("`{}` was not measured by the exhaustive run", p.label),
            )
        })
    }
}

/// Runs one trial with `evaluator` until the best cost is at most `target_cost` (or the
/// space is exhausted). `device_seconds`: count the outcomes' own seconds (replay) rather
/// than the wall clock.
#[allow(clippy::too_many_arguments)]
pub fn trial(
    space: &Space,
    evaluator: &mut dyn Evaluator,
    strategy: StrategyKind,
    seed: u64,
    guide: Option<&Guide>,
    interesting: Interesting,
    target_cost: f64,
    settings: &Settings,
    device_seconds: bool,
) -> Trial {
    let mut space = space.clone();
    let mut s = strategy.make(seed);
    let settings = Settings {
        budget: Budget {
            target_cost: Some(target_cost),
            ..settings.budget.clone()
        },
        ..settings.clone()
    };
    let summary = run::run(
        &mut space,
        s.as_mut(),
        evaluator,
        guide,
        interesting,
        &settings,
        Prior::default(),
        &mut Quiet,
    );
    let overhead = summary.seconds_here;
    let mut device = 0.0;
    let mut reached: Option<(usize, f64)> = None;
    let mut best: Option<f64> = None;
    let mut best_so_far = Vec::with_capacity(summary.records.len());
    for r in &summary.records {
        device += r.outcome.seconds;
        if let Some(c) = r.outcome.cost {
            best = Some(best.map_or(c, |b: f64| b.min(c)));
        }
        best_so_far.push(best);
        if reached.is_none() && r.outcome.cost.is_some_and(|c| c <= target_cost) {
            let secs = if device_seconds {
                device + overhead * r.seq as f64 / summary.records.len().max(1) as f64
            } else {
                r.elapsed
            };
            reached = Some((r.seq, secs));
        }
    }
    Trial {
        strategy,
        seeded: guide.is_some(),
        seed,
        evaluations: reached.map(|r| r.0),
        seconds: reached.map(|r| r.1),
        total_evaluations: summary.records.len(),
        total_seconds: if device_seconds {
            device + overhead
        } else {
            summary.seconds
        },
        best_so_far,
    }
}

/// Summarises trials of one strategy and seeding.
pub fn row(strategy: StrategyKind, seeded: bool, trials: Vec<Trial>) -> Row {
    let mut evals: Vec<f64> = trials
        .iter()
        .filter_map(|t| t.evaluations.map(|e| e as f64))
        .collect();
    let mut secs: Vec<f64> = trials.iter().filter_map(|t| t.seconds).collect();
    let n: usize = trials.iter().map(|t| t.total_evaluations).sum();
    let s: f64 = trials.iter().map(|t| t.total_seconds).sum();
    Row {
        strategy,
        seeded,
        seeds: trials.len(),
        reached: evals.len(),
        median_evaluations: if evals.len() == trials.len() {
            median(&mut evals)
        } else {
            None
        },
        median_seconds: if secs.len() == trials.len() {
            median(&mut secs)
        } else {
            None
        },
        evaluations_per_second: if s > 0.0 { n as f64 / s } else { 0.0 },
        trials,
    }
}

/// Every strategy, unseeded and seeded, over `seeds`, replayed on `table`.
#[allow(clippy::too_many_arguments)]
pub fn convergence(
    space: &Space,
    table: &HashMap<usize, PointOutcome>,
    guide: Option<&Guide>,
    interesting: &dyn Fn() -> Interesting,
    strategies: &[StrategyKind],
    seeds: &[u64],
    target: f64,
    settings: &Settings,
) -> Vec<Row> {
    let Some(best) = landscape(space, table, target).best_cost else {
        return Vec::new();
    };
    let target_cost = best * (1.0 + target);
    let mut rows = Vec::new();
    for &k in strategies {
        for seeded in [false, true] {
            if seeded && guide.is_none() {
                continue;
            }
            // Exhaustive does not draw: one trial says everything.
            let seeds: &[u64] = if k == StrategyKind::Exhaustive {
                &seeds[..1.min(seeds.len())]
            } else {
                seeds
            };
            let trials = seeds
                .iter()
                .map(|&seed| {
                    let mut replay = Replay { table };
                    trial(
                        space,
                        &mut replay,
                        k,
                        seed,
                        if seeded { guide } else { None },
                        if seeded {
                            interesting()
                        } else {
                            Interesting::none()
                        },
                        target_cost,
                        settings,
                        true,
                    )
                })
                .collect();
            rows.push(row(k, seeded, trials));
        }
    }
    rows
}
