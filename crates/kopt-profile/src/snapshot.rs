//! The bottleneck snapshot: a compact structured record of one version of a kernel on one
//! shape and device: which collectors ran (and why the others did not), the
//! classification with its confidence, the ranked findings with their evidence, the
//! figures, and the metric vector the case library retrieves by.
//!
//! # The metric vector
//!
//! [`Snapshot::metrics`] uses the case library's names (`kopt_store::cases`; the committed
//! rationales' `snapshots.*.metrics`), each only when measured, rounded to 2 decimals;
//! [`Snapshot::metric_sources`] says where each came from:
//!
//! | name | from |
//! | --- | --- |
//! | `duration_us` | the engine's median time (ncu's single launch without the engine) |
//! | `launch_overhead_pct` | 1.24 µs (the H200 launch floor) over the time |
//! | `dram_throughput_pct` | ncu's DRAM throughput % of peak; without ncu, the engine's ideal bytes over time as % of the measured copy bandwidth (a different ceiling: see `metric_sources`) |
//! | `l2_hit_rate_pct` | `lts__t_sector_hit_rate.pct` |
//! | `sm_throughput_pct` | `sm__throughput.avg.pct_of_peak_sustained_elapsed` |
//! | `achieved_occupancy_pct` | `sm__warps_active.avg.pct_of_peak_sustained_active` |
//! | `waves_per_sm` | blocks over the blocks all SMs hold at once |
//! | `registers_per_thread` | the function's registers |
//! | `spilled_bytes` | local memory per thread (spills and local arrays) |
//! | `stall_long_scoreboard_pct`, `stall_short_scoreboard_pct`, `stall_barrier_pct` | share of warp cycles per issued instruction |
//! | `bank_conflicts_per_request` | shared-memory wavefronts beyond the ideal, per ideal wavefront |
//! | `atomic_throughput_pct` | `lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed` |
//! | `tensor_pipe_pct` | `sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active` |

use std::collections::BTreeMap;

use kopt_store::cases::{self, CaseLibrary, Query};
use serde::{Deserialize, Serialize};

use crate::classify::{self, fmt_num, Classification, Finding};
use crate::figures::EngineFigures;
use crate::measure::{self, Measurements};
use crate::ncu::{Collection, NcuKernel};
use crate::sass::CodeSummary;
use crate::structure::Structure;

pub const FORMAT: u32 = 1;

/// Whether a collector ran, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ran,
    /// Not attempted: something it needs is missing (the detail says what).
    Skipped,
    /// Attempted, and it failed (the detail says how).
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectorStatus {
    /// `engine`, `ncu`, `ptx`, `sass`, `structure`.
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// Files it left in the run folder (relative to it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artefacts: Vec<String>,
}

/// How sure the classification is, and on what that rests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confidence {
    /// 0 to 1.
    pub score: f64,
    /// `case-library` (similarity to past cases of the same class) or `rules-margin`
    /// (the winning class's score minus the runner-up's).
    pub source: String,
    /// The past cases it rests on, nearest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cases: Vec<String>,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: u32,
    pub kernel: String,
    /// `reference` or the variant's name.
    pub version: String,
    pub shape: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub collectors: Vec<CollectorStatus>,
    /// `None` when nothing could be measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<Confidence>,
    pub findings: Vec<Finding>,
    /// The case library's metric vector.
    pub metrics: BTreeMap<String, f64>,
    pub metric_sources: BTreeMap<String, String>,
    /// Every figure, with its source.
    pub measurements: Measurements,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ncu_collection: Option<Collection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structure: Option<Structure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sass: Option<CodeSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<CodeSummary>,
}

/// What the collectors produced.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub kernel: String,
    pub version: String,
    pub shape: String,
    pub engine: Option<EngineFigures>,
    pub ncu: Option<NcuKernel>,
    pub ncu_collection: Option<Collection>,
    pub sass: Option<CodeSummary>,
    pub ptx: Option<CodeSummary>,
    pub structure: Option<Structure>,
    pub collectors: Vec<CollectorStatus>,
}

/// The case library's names, and the measurement each comes from.
pub const VECTOR: &[(&str, &str)] = &[
    ("duration_us", "duration_us"),
    ("launch_overhead_pct", "launch_overhead_pct"),
    ("dram_throughput_pct", "dram_pct"),
    ("l2_hit_rate_pct", "l2_hit_pct"),
    ("sm_throughput_pct", "sm_sol_pct"),
    ("achieved_occupancy_pct", "occupancy_achieved_pct"),
    ("waves_per_sm", "waves"),
    ("registers_per_thread", "registers"),
    ("spilled_bytes", "local_bytes"),
    ("stall_long_scoreboard_pct", "stall_long_scoreboard_pct"),
    ("stall_short_scoreboard_pct", "stall_short_scoreboard_pct"),
    ("stall_barrier_pct", "stall_barrier_pct"),
    ("bank_conflicts_per_request", "shared_excess_wavefronts"),
    ("atomic_throughput_pct", "atomic_pct"),
    ("tensor_pipe_pct", "tensor_pipe_pct"),
];

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Builds the snapshot from what was collected (confidence from the rules' margin; see
/// [`Snapshot::use_case_library`]).
pub fn build(c: Collected) -> Snapshot {
    let measurements = measure::collect(measure::Inputs {
        engine: c.engine.as_ref(),
        ncu: c.ncu.as_ref(),
        sass: c.sass.as_ref(),
        ptx: c.ptx.as_ref(),
        structure: c.structure.as_ref(),
    });
    let classification = classify::classify(&measurements);
    let findings = classify::findings(&measurements);
    let mut metrics = BTreeMap::new();
    let mut metric_sources = BTreeMap::new();
    for (name, key) in VECTOR {
        let m = measurements.get(*key).or_else(|| {
            (*name == "dram_throughput_pct")
                .then(|| measurements.get("copy_bw_pct"))
                .flatten()
        });
        if let Some(m) = m {
            metrics.insert(name.to_string(), round2(m.value));
            metric_sources.insert(name.to_string(), format!("{}: {}", m.source.name(), m.from));
        }
    }
    let confidence = classification.as_ref().map(|cl| Confidence {
        score: cl.margin.clamp(0.0, 1.0),
        source: "rules-margin".into(),
        cases: vec![],
        note: match &cl.runner_up {
            Some(r) => format!(
                "no case library: the rules' margin, {} {:.2} over {} {:.2}",
                cl.class,
                cl.score,
                r,
                cl.scores.get(1).map_or(0.0, |s| s.score)
            ),
            None => format!(
                "no case library: the rules' margin, {} {:.2} and no other class above 0",
                cl.class, cl.score
            ),
        },
    });
    let device = c.engine.as_ref().map(|e| {
        format!(
            "{} ({}, {} SMs, driver API {}.{})",
            e.device.name,
            e.device.arch,
            e.device.multiprocessors,
            e.device.driver_api / 1000,
            e.device.driver_api % 1000 / 10
        )
    });
    Snapshot {
        format: FORMAT,
        kernel: c.kernel,
        version: c.version,
        shape: c.shape,
        device,
        arch: c.engine.as_ref().map(|e| e.device.arch.clone()),
        collectors: c.collectors,
        classification,
        confidence,
        findings,
        metrics,
        metric_sources,
        measurements,
        ncu_collection: c.ncu_collection,
        structure: c.structure,
        sass: c.sass,
        ptx: c.ptx,
    }
}

impl Snapshot {
    /// Replaces the margin-based confidence with the similarity of the nearest accepted
    /// past case of the same class (`kopt_store::cases::confidence`), when the library
    /// holds one. `kind` is the kernel's kind, `text` its structural summary and source
    /// tokens. Returns whether the library decided.
    pub fn use_case_library(
        &mut self,
        lib: &CaseLibrary,
        kind: &str,
        text: &str,
    ) -> Result<bool, String> {
        let Some(cl) = &self.classification else {
            return Ok(false);
        };
        if cl.class == "unclassified" {
            return Ok(false);
        }
        let q = Query {
            kind: Some(kind.to_string()).filter(|k| kopt_store::features::is_kind(k)),
            metrics: self.metrics.clone(),
            text: format!("{} {text}", cl.class),
            ..Default::default()
        };
        let neighbours = lib.search(&q, 5).map_err(|e| e.to_string())?;
        let c = cases::confidence(&neighbours, &cl.class);
        if c.cases.is_empty() {
            if let Some(conf) = &mut self.confidence {
                conf.note = format!(
                    "{}; the case library at {} has no accepted {kind} case diagnosed {} among the {} nearest",
                    conf.note.trim_start_matches("no case library: "),
                    lib.path(),
                    cl.class,
                    neighbours.len()
                );
            }
            return Ok(false);
        }
        self.confidence = Some(Confidence {
            score: c.score,
            source: "case-library".into(),
            note: format!(
                "similarity to the nearest accepted past case diagnosed {} in {} (rules' margin {:.2})",
                cl.class,
                lib.path(),
                cl.margin
            ),
            cases: c.cases,
        });
        Ok(true)
    }

    /// The snapshot in the form a rationale records (`kopt_spec::files::BottleneckSnapshot`).
    pub fn for_rationale(&self) -> kopt_spec::files::BottleneckSnapshot {
        kopt_spec::files::BottleneckSnapshot {
            classification: self
                .classification
                .as_ref()
                .map_or("unclassified".to_string(), |c| c.class.clone()),
            text: self.render(5),
            metrics: self.metrics.clone(),
        }
    }

    /// A short text rendering: the verdict, the top `findings` with their evidence, the
    /// key figures, and the collectors.
    pub fn render(&self, findings: usize) -> String {
        let mut out = Vec::new();
        out.push(format!(
            "{} ({}) on {}{}",
            self.kernel,
            self.version,
            self.shape,
            self.device
                .as_ref()
                .map(|d| format!(", {d}"))
                .unwrap_or_default()
        ));
        match (&self.classification, &self.confidence) {
            (Some(c), Some(conf)) => out.push(format!(
                "bottleneck: {}; confidence {:.2} ({})",
                c.label(),
                conf.score,
                if conf.source == "case-library" {
                    format!("case library: {}", conf.cases.join(", "))
                } else {
                    format!(
                        "rules' margin: {} {:.2}{}",
                        c.class,
                        c.score,
                        c.runner_up
                            .as_ref()
                            .map(|r| format!(
                                " vs {r} {:.2}",
                                c.scores.get(1).map_or(0.0, |s| s.score)
                            ))
                            .unwrap_or_default()
                    )
                }
            )),
            _ => out.push(
                "bottleneck: not classified: nothing was measured (see the collectors below)"
                    .into(),
            ),
        }
        if let Some(c) = &self.classification {
            for e in c.evidence() {
                out.push(format!("  because {}", e.render()));
            }
        }
        if !self.findings.is_empty() {
            out.push("findings:".into());
            for f in self.findings.iter().take(findings) {
                out.push(format!(
                    "{:>3}. {} [weight {:.2}]",
                    f.rank, f.claim, f.weight
                ));
                for e in &f.evidence {
                    out.push(format!("       {}", e.render()));
                }
            }
        }
        let figure = |k: &str, label: &str, unit: &str| {
            self.measurements
                .get(k)
                .map(|m| format!("{label} {}{unit}", fmt_num(round2(m.value))))
        };
        let figures: Vec<String> = [
            figure("duration_us", "time", " µs"),
            figure("copy_bw_pct", "copy bandwidth", "%"),
            figure("dram_pct", "DRAM", "%"),
            figure("l2_pct", "L2", "%"),
            figure("l1_pct", "L1", "%"),
            figure("sm_sol_pct", "SM", "%"),
            figure("issue_pct", "issue", "%"),
            figure("occupancy_achieved_pct", "occupancy", "%"),
            figure("occupancy_theoretical_pct", "theoretical", "%"),
            figure("waves", "waves", ""),
            figure("registers", "registers", ""),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !figures.is_empty() {
            out.push(format!("figures: {}", figures.join(", ")));
        }
        if let Some(s) = &self.structure {
            out.push(format!("source: {}", s.summary));
            if self.classification.is_none() {
                // Without measurements the source is most of what there is to show.
                out.extend(s.render().lines().map(|l| format!("  {l}")));
            }
        }
        for code in [&self.sass, &self.ptx].into_iter().flatten() {
            out.push(format!("{}: {}", code.kind, code.one_line()));
        }
        out.push("collectors:".into());
        for c in &self.collectors {
            let status = match c.status {
                Status::Ran => "ran",
                Status::Skipped => "skipped",
                Status::Failed => "failed",
            };
            out.push(format!("  {:<9} {status}: {}", c.name, c.detail));
        }
        out.join("\n")
    }
}
