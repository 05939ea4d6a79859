//! Timing statistics, the sampling stopping rule, the performance watchdog and the
//! per-shape outlier check.

use serde::{Deserialize, Serialize};

/// How a version was timed on one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// How the samples were taken: a CUDA graph of `launches_per_sample` launches,
    /// replayed (`graph of 32 launches over 5 input set(s), L2 cold`), or, for launches
    /// too long to replay in a graph, each launch between two CUDA events (`each launch
    /// timed alone between events ...`, `launches_per_sample` 1).
    pub method: String,
    pub launches_per_sample: u32,
    pub samples: u32,
    #[serde(with = "crate::jsonf")]
    pub median_us: f64,
    #[serde(with = "crate::jsonf")]
    pub min_us: f64,
    #[serde(with = "crate::jsonf")]
    pub max_us: f64,
    /// Interquartile range over the median.
    #[serde(with = "crate::jsonf")]
    pub spread: f64,
}

/// A duration given in µs, in the unit that reads best: `4.34 µs`, `412.3 ms`, `8.25 s`.
pub fn duration_text(us: f64) -> String {
    let a = us.abs();
    if !a.is_finite() || a < 1e3 {
        format!("{us:.2} µs")
    } else if a < 1e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// Summarises per-launch sample times (µs).
pub fn summarise(method: &str, launches_per_sample: u32, samples: &[f64]) -> Timing {
    let mut s: Vec<f64> = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    Timing {
        method: method.to_string(),
        launches_per_sample,
        samples: s.len() as u32,
        median_us: quantile(&s, 0.5),
        min_us: s.first().copied().unwrap_or(f64::NAN),
        max_us: s.last().copied().unwrap_or(f64::NAN),
        spread: relative_spread(&s),
    }
}

/// Linear-interpolated quantile of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// (Q3 - Q1) / median of sorted values.
pub fn relative_spread(sorted: &[f64]) -> f64 {
    let m = quantile(sorted, 0.5);
    if m.is_nan() || m <= 0.0 {
        return f64::NAN;
    }
    (quantile(sorted, 0.75) - quantile(sorted, 0.25)) / m
}

/// The stopping rule: at least `min` samples; then stop when the relative spread is under
/// `target`, or at `max` samples, or when the time budget is spent.
pub fn should_stop(
    samples: &[f64],
    min: u32,
    max: u32,
    target: f64,
    elapsed_s: f64,
    budget_s: f64,
) -> bool {
    let n = samples.len() as u32;
    if n < min {
        return false;
    }
    if n >= max || elapsed_s >= budget_s {
        return true;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    relative_spread(&s) <= target
}

/// The watchdog's finding on one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeComparison {
    pub shape: String,
    pub best_us: f64,
    pub candidate_us: f64,
    /// best / candidate: above 1 is a win.
    pub speedup: f64,
    /// Slower than the best by more than the threshold.
    pub regression: bool,
}

/// Compares a candidate with the current best, shape by shape. `threshold` is the
/// tolerated slowdown (0.03 = 3%).
pub fn watchdog(shapes: &[(String, f64, f64)], threshold: f64) -> Vec<ShapeComparison> {
    shapes
        .iter()
        .map(|(shape, best, cand)| ShapeComparison {
            shape: shape.clone(),
            best_us: *best,
            candidate_us: *cand,
            speedup: best / cand,
            regression: *cand > best * (1.0 + threshold),
        })
        .collect()
}

/// A shape whose time departs from the curve the other shapes draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outlier {
    pub shape: String,
    pub measured_us: f64,
    pub expected_us: f64,
}

/// How far apart two shapes' work may be for one to predict the other's time: across a
/// wider span, fixed launch and memory-latency costs make time far from proportional to
/// work (on an H200, softmax 8x50257 moves 3.2 MB in 4.3 µs and 4096x4096 moves 134 MB in
/// 34 µs: 42 times the bytes in 8 times the time).
pub const OUTLIER_WORK_SPAN: f64 = 8.0;

/// Time against work: each shape's time is compared with what the time per unit of work
/// of the *other* shapes within [`OUTLIER_WORK_SPAN`] of its work (their median, so one
/// odd shape cannot skew the rest) predicts for its work; a time off by more than `factor`
/// either way is reported. A shape is judged only against at least two such others, so
/// a kernel needs three shapes of comparable work for the check to say anything.
pub fn outliers(points: &[(String, f64, f64)], factor: f64) -> Vec<Outlier> {
    let pts: Vec<&(String, f64, f64)> = points
        .iter()
        .filter(|(_, w, t)| *w > 0.0 && *t > 0.0)
        .collect();
    let mut out = Vec::new();
    for (i, (shape, work, time)) in pts.iter().map(|p| (&p.0, p.1, p.2)).enumerate() {
        let mut rates: Vec<f64> = pts
            .iter()
            .enumerate()
            .filter(|(j, p)| {
                *j != i && p.1 <= work * OUTLIER_WORK_SPAN && p.1 * OUTLIER_WORK_SPAN >= work
            })
            .map(|(_, p)| p.2 / p.1)
            .collect();
        if rates.len() < 2 {
            continue;
        }
        rates.sort_by(|a, b| a.total_cmp(b));
        let expected = quantile(&rates, 0.5) * work;
        if time > expected * factor || time < expected / factor {
            out.push(Outlier {
                shape: shape.clone(),
                measured_us: time,
                expected_us: expected,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_spread() {
        let t = summarise("events", 1, &[10.0, 11.0, 9.0, 10.5, 9.5]);
        assert_eq!(t.median_us, 10.0);
        assert_eq!((t.min_us, t.max_us), (9.0, 11.0));
        assert!((t.spread - 0.1).abs() < 1e-12, "{}", t.spread);
    }

    #[test]
    fn durations_read_in_their_unit() {
        assert_eq!(duration_text(4.339), "4.34 µs");
        assert_eq!(duration_text(999.994), "999.99 µs");
        assert_eq!(duration_text(412_345.0), "412.3 ms");
        assert_eq!(duration_text(8_250_000.0), "8.25 s");
    }

    #[test]
    fn stopping_rule() {
        let tight = vec![10.0; 20];
        assert!(
            !should_stop(&tight[..5], 10, 100, 0.02, 0.0, 1.0),
            "minimum first"
        );
        assert!(should_stop(&tight, 10, 100, 0.02, 0.0, 1.0), "tight enough");
        let noisy: Vec<f64> = (0..20)
            .map(|i| if i % 2 == 0 { 10.0 } else { 13.0 })
            .collect();
        assert!(!should_stop(&noisy, 10, 100, 0.02, 0.0, 1.0));
        assert!(should_stop(&noisy, 10, 20, 0.02, 0.0, 1.0), "maximum");
        assert!(should_stop(&noisy, 10, 100, 0.02, 1.5, 1.0), "budget");
    }

    #[test]
    fn watchdog_flags_regressions_beyond_threshold() {
        let r = watchdog(
            &[
                ("a".into(), 100.0, 102.0),
                ("b".into(), 100.0, 104.0),
                ("c".into(), 100.0, 50.0),
            ],
            0.03,
        );
        assert_eq!(
            r.iter().map(|c| c.regression).collect::<Vec<_>>(),
            vec![false, true, false]
        );
        assert_eq!(r[2].speedup, 2.0);
    }

    #[test]
    fn outlier_against_the_curve_of_the_others() {
        // time proportional to work, except one shape three times slower.
        let pts = vec![
            ("s1".into(), 1e6, 10.0),
            ("s2".into(), 2e6, 20.0),
            ("s3".into(), 4e6, 120.0),
            ("s4".into(), 8e6, 80.0),
        ];
        let o = outliers(&pts, 2.0);
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!(o[0].shape, "s3");
        assert!(outliers(&pts[..2], 2.0).is_empty(), "too few shapes");
    }

    #[test]
    fn latency_bound_small_shapes_are_not_judged_by_large_ones() {
        // softmax's accepted variant on an H200 (cargo kopt verify): bytes, µs. Time is not
        // proportional to bytes from 3 MB to 268 MB, and no shape is odd within its own
        // range; a proportional fit over all four flagged every one of them.
        let pts = vec![
            ("4096x4096".into(), 134_217_728.0, 34.46),
            ("16x65536".into(), 8_388_608.0, 5.81),
            ("32768x1024".into(), 268_435_456.0, 64.34),
            ("8x50257".into(), 3_216_448.0, 4.34),
        ];
        assert!(outliers(&pts, 2.0).is_empty());
        // A shape three times slower than its neighbours of comparable work still shows.
        let mut slow = pts.clone();
        slow.push(("8192x4096".into(), 268_435_456.0, 64.5));
        slow.push(("4096x8192".into(), 268_435_456.0, 200.0));
        let o = outliers(&slow, 2.0);
        assert_eq!(
            o.iter().map(|o| o.shape.as_str()).collect::<Vec<_>>(),
            ["4096x8192"]
        );
    }
}
