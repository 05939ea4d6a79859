//! The data of the file `cargo kopt search-bench --json-out FILE` writes: the landscape an
//! exhaustive run found and one row per strategy and seeding, with its trials. The search
//! (`kopt-search`) writes these types; the report (`kopt-report`) reads them, and neither
//! depends on the other for them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A search strategy, by name (how files and command lines spell it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    Exhaustive,
    Random,
    Hill,
    Evolution,
}

impl StrategyKind {
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::Exhaustive,
        StrategyKind::Random,
        StrategyKind::Hill,
        StrategyKind::Evolution,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Exhaustive => "exhaustive",
            StrategyKind::Random => "random",
            StrategyKind::Hill => "hill",
            StrategyKind::Evolution => "evolution",
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown strategy `{s}`: use exhaustive, random, hill or evolution")
            })
    }
}

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

/// One search until the target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trial {
    pub strategy: StrategyKind,
    pub seeded: bool,
    pub seed: u64,
    /// Evaluations until the best was within the target (None: never).
    pub evaluations: Option<usize>,
    /// Seconds until then: device seconds of a replay, or the wall clock of a live run.
    pub seconds: Option<f64>,
    pub total_evaluations: usize,
    pub total_seconds: f64,
    /// The best cost after each evaluation, in order (None until a point passed): the
    /// convergence curve. The trial stops at the target, so it is as long as
    /// `total_evaluations`.
    #[serde(default)]
    pub best_so_far: Vec<Option<f64>>,
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

/// The median of `v` (sorted in place; the mean of the two middle values when there is an
/// even number of them), or None when `v` is empty. The statistic of the rows' medians.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn strategy_names_round_trip() {
        for k in StrategyKind::ALL {
            assert_eq!(k.name().parse::<StrategyKind>(), Ok(k));
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
        assert!("annealing".parse::<StrategyKind>().is_err());
    }
}
