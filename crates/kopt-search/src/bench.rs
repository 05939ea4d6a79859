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

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::interesting::Interesting;
use crate::run::{self, Budget, Evaluator, PointOutcome, PointSpec, Prior, Quiet, Settings};
use crate::seed::Guide;
use crate::space::Space;
use crate::strategy::StrategyKind;

/// The landscape an exhaustive run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Landscape {
    pub valid: usize,
    pub evaluated: usize,
    pub passed: usize,
    pub best: Option<usize>,
    pub best_label: Option<String>,
    pub best_cost: Option<f64>,
    pub median_cost: Option<f64>,
    /// Median cost over best cost: how much faster the best is than the median point.
    pub best_over_median: Option<f64>,
    /// Points within the target of the best.
    pub near_best: usize,
}

pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

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

/// One search until the target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trial {
    pub strategy: StrategyKind,
    pub seeded: bool,
    pub seed: u64,
    /// Evaluations until the best was within the target (None: never).
    pub evaluations: Option<usize>,
    /// Seconds until then (see the module's documentation for what they count).
    pub seconds: Option<f64>,
    pub total_evaluations: usize,
    pub total_seconds: f64,
    /// The best cost after each evaluation, in order (None until a point passed): the
    /// convergence curve. The trial stops at the target, so it is as long as
    /// `total_evaluations`.
    #[serde(default)]
    pub best_so_far: Vec<Option<f64>>,
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

/// A row of the convergence table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub strategy: StrategyKind,
    pub seeded: bool,
    pub seeds: usize,
    /// Trials that reached the target.
    pub reached: usize,
    pub median_evaluations: Option<f64>,
    pub median_seconds: Option<f64>,
    /// Evaluations per second over all the row's trials.
    pub evaluations_per_second: f64,
    pub trials: Vec<Trial>,
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
