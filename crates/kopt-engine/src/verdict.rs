//! Turning what the worker reported (or failed to) into a verdict: which fences failed,
//! on which shapes, and the figures of the shapes that were measured.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::parent::WorkerFailure;
use crate::protocol::*;
use crate::stats::{self, Outlier, ShapeComparison};

/// The fences a candidate must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fence {
    Compile,
    /// Illegal address, launch failure... (the worker's context was poisoned).
    Fault,
    /// Never finished: the watchdog killed the worker.
    Hang,
    /// The worker process died.
    Crash,
    /// Bad launch geometry or a launch the driver refused.
    Launch,
    /// Outputs differ from the reference on a declared shape.
    Numerics,
    /// Outputs differ on a held-out shape only.
    HeldOut,
    /// Outputs differ in the re-check after the timing loop.
    AfterTiming,
    /// An input buffer was changed (only `inout` may change).
    InputModified,
    /// A figure above the measured ceiling: a measurement error, not a win.
    Roofline,
    /// Slower than the current best beyond the threshold.
    Watchdog,
    /// compute-sanitizer found errors.
    Sanitizer,
}

impl Fence {
    pub fn name(self) -> &'static str {
        match self {
            Fence::Compile => "compile",
            Fence::Fault => "fault",
            Fence::Hang => "hang",
            Fence::Crash => "crash",
            Fence::Launch => "launch",
            Fence::Numerics => "numerics",
            Fence::HeldOut => "held-out",
            Fence::AfterTiming => "after-timing",
            Fence::InputModified => "input-modified",
            Fence::Roofline => "roofline",
            Fence::Watchdog => "watchdog",
            Fence::Sanitizer => "sanitizer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub fence: Fence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    pub message: String,
}

/// Figures of one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeFigures {
    /// The shape's label (`cols=4096 rows=4096`; a held-out one says so).
    pub shape: String,
    /// Drawn by the engine, never shown to the agent: checked, not timed.
    pub held_out: bool,
    /// The reference's median time, µs (timed shapes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_us: Option<f64>,
    /// The candidate's median time, µs, measured in the same job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_us: Option<f64>,
    /// Reference time over candidate time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    /// Candidate's effective bandwidth over the copy ceiling, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_pct: Option<f64>,
    /// The reference's, on the same ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_copy_bandwidth_pct: Option<f64>,
    /// Declared FLOPs over the candidate's time, percent of the matrix peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_pct: Option<f64>,
    /// The relative spread of the candidate's timing samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// How it was timed (`graph of 32 launches ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// How the candidate was timed, chosen from its measured launch time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_plan: Option<crate::job::TimingPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy_pct: Option<f64>,
    /// Largest errors over every check of this shape.
    pub max_abs_error: f64,
    pub max_rel_error: f64,
    /// The largest `|got - want| / allowed` over every check and output of this shape
    /// (see [`crate::compare::compare`]): at most 1 when they pass, so it says how close
    /// a pass came to failing. Absent without checks, and in verdicts written before it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::jsonf::option"
    )]
    pub max_error_ratio: Option<f64>,
    /// Per output buffer: the largest absolute and relative errors over the checks.
    #[serde(default)]
    pub outputs: BTreeMap<String, (f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub accepted: bool,
    pub failures: Vec<Failure>,
    pub shapes: Vec<ShapeFigures>,
    /// Shapes on which the candidate beats the current best (for proposing a region).
    pub wins: Vec<String>,
    pub comparisons: Vec<ShapeComparison>,
    pub outliers: Vec<Outlier>,
    pub notes: Vec<String>,
    /// The candidate's compile log (warnings and errors, verbatim).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub compile_log: String,
    /// Seeds of every input set the checks drew.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// compute-sanitizer's pass over the candidate, where one ran (winners of the loop,
    /// `verify`): its errors are among `failures` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sanitizer: Option<crate::sanitizer::SanitizerRun>,
}

impl Verdict {
    pub(crate) fn rejected(fence: Fence, message: String) -> Self {
        Verdict {
            accepted: false,
            failures: vec![Failure {
                fence,
                shape: None,
                message,
            }],
            shapes: vec![],
            wins: vec![],
            comparisons: vec![],
            outliers: vec![],
            notes: vec![],
            compile_log: String::new(),
            seeds: vec![],
            sanitizer: None,
        }
    }

    /// A candidate that cannot be launched as asked (a region that does not parse against
    /// the annotation): the launch fence failed, and nothing ran.
    pub fn not_launched(message: &str) -> Self {
        Verdict::rejected(Fence::Launch, format!("{message}; nothing ran"))
    }

    /// A version the parent's compile on the CPU refused ([`crate::precompile`]): the
    /// compile fence failed with the compiler's message, and no worker ran it.
    pub fn compile_rejected(log: &str) -> Self {
        let mut v = Verdict::rejected(
            Fence::Compile,
            format!(
                "{}\n(refused by NVRTC on the CPU: no GPU worker ran it)",
                first_lines(log, 12)
            ),
        );
        v.compile_log = log.to_string();
        v
    }

    /// Whether every fence but perhaps the watchdog passed: the results are right and only
    /// the time may be wanting, so the times mean something.
    pub fn correct(&self) -> bool {
        self.failures.iter().all(|f| f.fence == Fence::Watchdog)
    }

    /// The candidate's median time per shape label, on every shape where it was timed.
    pub fn candidate_times(&self) -> BTreeMap<String, f64> {
        self.shapes
            .iter()
            .filter_map(|s| Some((s.shape.clone(), s.candidate_us?)))
            .collect()
    }

    /// The main reason, for one-line tables.
    pub fn summary(&self) -> String {
        match self.failures.first() {
            None => "accepted".into(),
            Some(f) => format!(
                "{}{}: {}",
                f.fence.name(),
                f.shape
                    .as_ref()
                    .map(|s| format!(" [{s}]"))
                    .unwrap_or_default(),
                f.message
            ),
        }
    }

    pub fn fences(&self) -> Vec<Fence> {
        let mut v: Vec<Fence> = self.failures.iter().map(|f| f.fence).collect();
        v.sort();
        v.dedup();
        v
    }
}

/// What the verdict compares against.
#[derive(Debug, Clone, Default)]
pub struct Judge {
    pub ceilings: Option<Ceilings>,
    /// Current best time per shape label; absent: the reference timed in the same job.
    pub best_us: Option<BTreeMap<String, f64>>,
    /// Tolerated slowdown against the best (0.03 = 3%).
    pub threshold: f64,
}

impl Judge {
    pub fn new(ceilings: Option<Ceilings>) -> Self {
        Judge {
            ceilings,
            best_us: None,
            threshold: 0.03,
        }
    }

    pub fn judge(&self, outcome: &Result<EvalReport, WorkerFailure>) -> Verdict {
        let report = match outcome {
            Ok(r) => r,
            Err(WorkerFailure::Hang { .. }) => {
                return Verdict::rejected(Fence::Hang, outcome.as_ref().unwrap_err().to_string())
            }
            Err(e) => return Verdict::rejected(Fence::Crash, e.to_string()),
        };
        let mut v = Verdict::rejected(Fence::Compile, String::new());
        v.failures.clear();
        v.compile_log = report.candidate.log.clone();
        if !report.reference.ok {
            v.failures.push(Failure {
                fence: Fence::Compile,
                shape: None,
                message: format!(
                    "the reference does not compile: {}",
                    first_lines(&report.reference.log, 6)
                ),
            });
        }
        if !report.candidate.ok {
            v.failures.push(Failure {
                fence: Fence::Compile,
                shape: None,
                message: first_lines(&report.candidate.log, 12),
            });
        }
        if let Some(f) = &report.fault {
            v.failures.push(Failure {
                fence: Fence::Fault,
                shape: report.shapes.last().map(|s| s.label.clone()),
                message: f.clone(),
            });
        }
        let copy = self
            .ceilings
            .as_ref()
            .map(|c| c.copy_gbs)
            .filter(|c| c.is_finite() && *c > 0.0);
        let peak = self.ceilings.as_ref().and_then(|c| c.matmul_peak_tflops());
        let l2 = report.device.l2_bytes;
        let mut timed: Vec<(String, f64, f64)> = Vec::new();
        let mut curve: Vec<(String, f64, f64)> = Vec::new();
        for s in &report.shapes {
            if let Some(e) = &s.error {
                v.failures.push(Failure {
                    fence: Fence::Launch,
                    shape: Some(s.label.clone()),
                    message: e.clone(),
                });
            }
            for c in &s.checks {
                for o in c.outputs.iter().filter(|o| !o.passed()) {
                    let fence = if c.phase == Phase::AfterTiming {
                        Fence::AfterTiming
                    } else if s.held_out {
                        Fence::HeldOut
                    } else {
                        Fence::Numerics
                    };
                    if v.failures
                        .iter()
                        .any(|f| f.fence == fence && f.shape.as_deref() == Some(&s.label))
                    {
                        continue;
                    }
                    v.failures.push(Failure {
                        fence,
                        shape: Some(s.label.clone()),
                        message: format!(
                            "{} ({} inputs, seed {}, {:?})",
                            o.describe(),
                            c.variation.name(),
                            c.seed,
                            c.phase
                        ),
                    });
                }
            }
            for b in &s.inputs_modified {
                v.failures.push(Failure {
                    fence: Fence::InputModified,
                    shape: Some(s.label.clone()),
                    message: format!(
                        "input `{b}` was written (declare it `inout` if that is intended)"
                    ),
                });
            }
            let max_abs = s
                .checks
                .iter()
                .flat_map(|c| &c.outputs)
                .map(|o| o.max_abs_error)
                .fold(0.0, f64::max);
            let max_rel = s
                .checks
                .iter()
                .flat_map(|c| &c.outputs)
                .map(|o| o.max_rel_error)
                .fold(0.0, f64::max);
            let max_error_ratio = s
                .checks
                .iter()
                .flat_map(|c| &c.outputs)
                .map(|o| o.max_error_ratio)
                .reduce(f64::max);
            let rt = s.reference.as_ref().and_then(|l| l.timing.as_ref());
            let ct = s.candidate.as_ref().and_then(|l| l.timing.as_ref());
            let bw = |t: f64| copy.map(|c| 100.0 * (s.bytes as f64 / (t * 1e-6) / 1e9) / c);
            let flops_pct = match (ct, s.flops, peak) {
                (Some(t), Some(f), Some(p)) => {
                    Some(100.0 * f as f64 / (t.median_us * 1e-6) / (p * 1e12))
                }
                _ => None,
            };
            if let Some(t) = ct {
                let from_dram = t.method.contains("L2 cold") || s.bytes > 2 * l2;
                if let Some(p) = bw(t.median_us) {
                    if p > kopt_spec::files::COPY_BANDWIDTH_PLAUSIBLE_PCT && from_dram {
                        v.failures.push(Failure {
                            fence: Fence::Roofline,
                            shape: Some(s.label.clone()),
                            message: format!("{p:.0}% of the measured copy bandwidth: a measurement error (or the kernel skips work), not a win"),
                        });
                    } else if p > 100.0 {
                        v.notes.push(format!(
                            "{}: {p:.0}% of copy bandwidth with the data L2-resident ({} timing)",
                            s.label, t.method
                        ));
                    }
                }
                if let Some(p) = flops_pct.filter(|p| *p > 100.0) {
                    v.failures.push(Failure {
                        fence: Fence::Roofline,
                        shape: Some(s.label.clone()),
                        message: format!(
                            "{p:.0}% of the measured matrix peak: a measurement error, not a win"
                        ),
                    });
                }
                let best = self
                    .best_us
                    .as_ref()
                    .and_then(|b| b.get(&s.label).copied())
                    .or(rt.map(|r| r.median_us));
                if let Some(b) = best {
                    timed.push((s.label.clone(), b, t.median_us));
                }
                curve.push((s.label.clone(), s.bytes as f64, t.median_us));
            }
            let cand = s.candidate.as_ref();
            if let Some(note) = cand
                .filter(|_| !s.held_out)
                .and_then(|c| cluster_waves_note(&s.label, c))
            {
                v.notes.push(note);
            }
            v.notes.extend(scaled_timing_note(s));
            let mut outputs: BTreeMap<String, (f64, f64)> = BTreeMap::new();
            for c in &s.checks {
                if !v.seeds.contains(&c.seed) {
                    v.seeds.push(c.seed);
                }
                for o in &c.outputs {
                    let e = outputs.entry(o.buffer.clone()).or_insert((0.0, 0.0));
                    e.0 = e.0.max(o.max_abs_error);
                    e.1 = e.1.max(o.max_rel_error);
                }
            }
            v.shapes.push(ShapeFigures {
                shape: s.label.clone(),
                held_out: s.held_out,
                reference_us: rt.map(|t| t.median_us),
                candidate_us: ct.map(|t| t.median_us),
                speedup: rt.zip(ct).map(|(r, c)| r.median_us / c.median_us),
                copy_bandwidth_pct: ct.and_then(|t| bw(t.median_us)),
                reference_copy_bandwidth_pct: rt.and_then(|t| bw(t.median_us)),
                flops_pct,
                spread: ct.map(|t| t.spread),
                method: ct.map(|t| t.method.clone()),
                timing_plan: cand.and_then(|c| c.timing_plan.clone()),
                registers: report.candidate.attributes.map(|a| a.registers),
                occupancy_pct: cand.and_then(|c| c.occupancy).map(|o| o.percent()),
                max_abs_error: max_abs,
                max_rel_error: max_rel,
                max_error_ratio,
                outputs,
            });
        }
        v.comparisons = stats::watchdog(&timed, self.threshold);
        for c in &v.comparisons {
            if c.regression {
                v.failures.push(Failure {
                    fence: Fence::Watchdog,
                    shape: Some(c.shape.clone()),
                    message: format!(
                        "{:.2} µs against the best {:.2} µs ({:+.1}%, threshold {:.0}%)",
                        c.candidate_us,
                        c.best_us,
                        100.0 * (c.candidate_us / c.best_us - 1.0),
                        100.0 * self.threshold
                    ),
                });
            }
        }
        v.wins = v
            .comparisons
            .iter()
            .filter(|c| c.speedup > 1.0 + self.threshold)
            .map(|c| c.shape.clone())
            .collect();
        v.outliers = stats::outliers(&curve, 2.0);
        if let Some(a) = report.candidate.attributes.filter(|a| a.local_bytes > 0) {
            v.notes.push(format!(
                "the candidate uses {} bytes of local memory per thread (spills or local arrays)",
                a.local_bytes
            ));
        }
        v.accepted = v.failures.is_empty();
        v
    }
}

fn first_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = lines.iter().take(n).copied().collect::<Vec<_>>().join("\n");
    if lines.len() > n {
        out.push_str(&format!("\n... ({} more lines)", lines.len() - n));
    }
    out
}

/// A note when a version was timed otherwise than by the policy because its launches are
/// long (launch by launch, a shorter graph, fewer samples): how, and why, so that a
/// figure of a slow kernel is read as what it is.
pub fn scaled_timing_note(s: &ShapeReport) -> Option<String> {
    fn figures(
        l: &Option<LaunchFigures>,
    ) -> Option<(&crate::stats::Timing, &crate::job::TimingPlan)> {
        l.as_ref()
            .and_then(|l| Some((l.timing.as_ref()?, l.timing_plan.as_ref()?)))
            .filter(|(_, p)| p.scaled)
    }
    let how = |t: &crate::stats::Timing, p: &crate::job::TimingPlan| {
        format!(
            "{}, {} samples ({})",
            if p.per_launch {
                "launch by launch".to_string()
            } else {
                format!("in graphs of {} launches", p.graph_launches)
            },
            t.samples,
            p.reason
        )
    };
    let text = match (figures(&s.reference), figures(&s.candidate)) {
        (None, None) => return None,
        (Some((rt, rp)), Some((ct, cp))) if how(rt, rp) == how(ct, cp) => {
            format!("reference and candidate timed {}", how(ct, cp))
        }
        (r, c) => r
            .map(|(t, p)| format!("reference timed {}", how(t, p)))
            .into_iter()
            .chain(c.map(|(t, p)| format!("candidate timed {}", how(t, p))))
            .collect::<Vec<_>>()
            .join("; "),
    };
    Some(format!("{}: {text}", s.label))
}

/// A note when a launch's clusters do not all fit on the device at once: the rest of the
/// grid waits for the first clusters to finish, which no block-level occupancy figure
/// shows (on the H200, 16 clusters of 8 blocks of 192 KB ran a GQA decode 44% slower
/// than 8 clusters: the device holds 15; docs/runs/2026-11-29-h200-dsmem-merge).
pub fn cluster_waves_note(shape: &str, launch: &LaunchFigures) -> Option<String> {
    let (per_cluster, clusters) = launch.geometry.clusters();
    let resident = launch.occupancy?.max_active_clusters?;
    (per_cluster > 1 && clusters > resident as u64).then(|| {
        format!(
            "{shape}: {clusters} clusters of {per_cluster} blocks, of which the device holds {resident} at once: {:.2} waves of clusters",
            clusters as f64 / resident.max(1) as f64
        )
    })
}
