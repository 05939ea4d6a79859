//! Interesting points: a point that is not faster than the best so far, but moved one of
//! the snapshot's metrics strongly in the right direction (wider loads on a kernel with
//! narrow ones, more occupancy on an occupancy-limited one, fewer spills...), is kept in
//! the neighbourhood for a few rounds instead of being dropped: strategies explore
//! around it (hill climbing restarts from it, evolution breeds from it, random sampling
//! draws near it) while it lives.
//!
//! "Strongly" is a relative change of at least the goal's `min_change` against the
//! baseline: the best point's value of that metric when the best has it, else the
//! snapshot's. A point slower than `max_slowdown` times the best is never kept (a broken
//! configuration that happens to have high occupancy is not a lead). At most `max_kept`
//! points are kept at once: a newcomer that moved its metric more strongly (|ln| of the
//! ratio) replaces the weakest, and strategies see the strongest first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    Up,
    Down,
}

/// A metric and the direction the snapshot says it should move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricGoal {
    /// An outcome metric: `occupancy_pct`, `registers`, `global_load_bytes`,
    /// `local_bytes`, `grid_blocks_per_sm`, `copy_bandwidth_pct`.
    pub metric: String,
    pub direction: Direction,
    /// Relative change that counts as strong (0.25: 25%).
    pub min_change: f64,
    pub reason: String,
}

impl MetricGoal {
    pub fn new(metric: &str, direction: Direction, min_change: f64, reason: &str) -> Self {
        MetricGoal {
            metric: metric.into(),
            direction,
            min_change,
            reason: reason.into(),
        }
    }

    /// Whether `value` moved strongly the right way from `baseline`.
    pub fn moved(&self, baseline: f64, value: f64) -> bool {
        match self.direction {
            Direction::Up => {
                value > baseline.max(0.0) * (1.0 + self.min_change) && value > baseline
            }
            Direction::Down => {
                if baseline <= 0.0 {
                    false
                } else {
                    value < baseline * (1.0 - self.min_change)
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub id: usize,
    /// The last round it is kept in.
    pub until: usize,
    pub why: String,
    /// |ln(value / baseline)| of the metric that moved.
    pub strength: f64,
    /// Order of arrival.
    pub seq: usize,
}

/// The interesting points of a run.
#[derive(Debug, Clone)]
pub struct Interesting {
    goals: Vec<MetricGoal>,
    baseline: BTreeMap<String, f64>,
    /// Rounds a point is kept for.
    pub keep_rounds: usize,
    /// Slower than this times the best: never kept.
    pub max_slowdown: f64,
    /// Points kept at once; a stronger newcomer replaces the weakest.
    pub max_kept: usize,
    kept: Vec<Kept>,
    arrivals: usize,
}

impl Interesting {
    pub fn new(
        goals: Vec<MetricGoal>,
        baseline: BTreeMap<String, f64>,
        keep_rounds: usize,
    ) -> Self {
        Interesting {
            goals,
            baseline,
            keep_rounds,
            max_slowdown: 2.0,
            max_kept: 4,
            kept: Vec::new(),
            arrivals: 0,
        }
    }

    /// No goals: nothing is ever interesting.
    pub fn none() -> Self {
        Self::new(Vec::new(), BTreeMap::new(), 0)
    }

    /// Looks at an evaluated point in round `round`: keeps it (and says why) when it is not
    /// better than the best, not far slower, and moved a goal metric strongly.
    pub fn observe(
        &mut self,
        round: usize,
        id: usize,
        cost: Option<f64>,
        metrics: &BTreeMap<String, f64>,
        best: Option<(f64, &BTreeMap<String, f64>)>,
    ) -> Option<String> {
        if self.keep_rounds == 0 || self.goals.is_empty() {
            return None;
        }
        let cost = cost?;
        let (best_cost, best_metrics) = best?;
        if cost < best_cost || cost > best_cost * self.max_slowdown {
            return None;
        }
        for g in &self.goals {
            let Some(v) = metrics.get(&g.metric) else {
                continue;
            };
            let Some(base) = best_metrics
                .get(&g.metric)
                .or_else(|| self.baseline.get(&g.metric))
            else {
                continue;
            };
            if g.moved(*base, *v) {
                let strength = (v.max(1e-9) / base.max(1e-9)).ln().abs();
                self.kept.retain(|k| k.id != id);
                if self.kept.len() >= self.max_kept {
                    let weakest = self
                        .kept
                        .iter()
                        .enumerate()
                        .min_by(|a, b| {
                            a.1.strength
                                .total_cmp(&b.1.strength)
                                .then(a.1.seq.cmp(&b.1.seq))
                        })
                        .map(|(i, k)| (i, k.strength))
                        .expect("not empty");
                    if weakest.1 >= strength {
                        return None;
                    }
                    self.kept.remove(weakest.0);
                }
                let why = format!(
                    "{} {} -> {} ({}), {:.1}% slower than the best",
                    g.metric,
                    fmt(*base),
                    fmt(*v),
                    g.reason,
                    100.0 * (cost / best_cost - 1.0)
                );
                self.arrivals += 1;
                self.kept.push(Kept {
                    id,
                    until: round + self.keep_rounds,
                    why: why.clone(),
                    strength,
                    seq: self.arrivals,
                });
                return Some(why);
            }
        }
        None
    }

    /// Drops the points whose time is up.
    pub fn expire(&mut self, round: usize) {
        self.kept.retain(|k| k.until >= round);
    }

    /// The points kept now, the strongest moves first (the newest first among equals).
    pub fn live(&self) -> Vec<usize> {
        let mut k: Vec<&Kept> = self.kept.iter().collect();
        k.sort_by(|a, b| b.strength.total_cmp(&a.strength).then(b.seq.cmp(&a.seq)));
        k.into_iter().map(|k| k.id).collect()
    }

    pub fn kept(&self) -> &[Kept] {
        &self.kept
    }
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// In round 0, point `id` of `cost` with one metric, against a best of cost 1.0 with
    /// the metrics `best`.
    fn observe(
        i: &mut Interesting,
        id: usize,
        cost: f64,
        metric: (&str, f64),
        best: &BTreeMap<String, f64>,
    ) -> Option<String> {
        i.observe(0, id, Some(cost), &m(&[metric]), Some((1.0, best)))
    }

    #[test]
    fn kept_for_n_rounds_only_when_not_faster_and_moved_strongly() {
        let goals = vec![MetricGoal::new(
            "global_load_bytes",
            Direction::Up,
            0.5,
            "narrow loads",
        )];
        let mut i = Interesting::new(goals, m(&[("global_load_bytes", 4.0)]), 2);
        let best = m(&[("global_load_bytes", 4.0)]);
        // Faster than the best: a new best, not "interesting".
        assert!(observe(&mut i, 1, 0.9, ("global_load_bytes", 16.0), &best).is_none());
        // Not faster, metric barely moved.
        assert!(observe(&mut i, 2, 1.1, ("global_load_bytes", 5.0), &best).is_none());
        // Far slower: not a lead.
        assert!(observe(&mut i, 3, 2.5, ("global_load_bytes", 16.0), &best).is_none());
        // Not faster, loads 4x wider: kept.
        let why = observe(&mut i, 4, 1.2, ("global_load_bytes", 16.0), &best).unwrap();
        assert!(why.contains("global_load_bytes 4 -> 16"), "{why}");
        assert_eq!(i.live(), vec![4]);
        i.expire(1);
        i.expire(2);
        assert_eq!(i.live(), vec![4], "kept through round 0 + 2");
        i.expire(3);
        assert!(i.live().is_empty(), "dropped after its rounds");
    }

    #[test]
    fn down_goals_and_the_baseline_of_the_best() {
        let goals = vec![MetricGoal::new(
            "registers",
            Direction::Down,
            0.2,
            "occupancy",
        )];
        let mut i = Interesting::new(goals, m(&[("registers", 128.0)]), 3);
        // The best has 64 registers: 60 is not a strong move from there.
        let best = m(&[("registers", 64.0)]);
        assert!(observe(&mut i, 1, 1.05, ("registers", 60.0), &best).is_none());
        assert!(observe(&mut i, 2, 1.05, ("registers", 40.0), &best).is_some());
        // Without the metric on the best, the snapshot's baseline counts.
        let best = m(&[]);
        assert!(observe(&mut i, 3, 1.05, ("registers", 96.0), &best).is_some());
        assert!(observe(&mut Interesting::none(), 1, 1.0, ("registers", 1.0), &best).is_none());
    }
}
