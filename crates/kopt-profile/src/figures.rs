//! Collector (a): kopt's own figures for one version on one shape, from one evaluation
//! through the engine (the same worker, checks and timing method as `cargo kopt bench`):
//! time, effective bandwidth and FLOP rate against the device's measured ceilings,
//! registers, shared and local memory, theoretical occupancy, waves.

use kopt_engine::engine::Engine;
use kopt_engine::job::{EvalJob, Geometry};
use kopt_engine::protocol::{Ceilings, DeviceInfo, EvalReport, FunctionAttributes, Occupancy};
use kopt_engine::stats::Timing;
use kopt_engine::verdict::{Fence, Judge};
use serde::{Deserialize, Serialize};

/// What the engine measured of the profiled version on the profiled shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineFigures {
    pub device: DeviceInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceilings: Option<Ceilings>,
    /// `reference` or the variant's name.
    pub version: String,
    pub shape: String,
    /// Ideal bytes and FLOPs of the shape, from the spec.
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geometry: Option<Geometry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// Whether every numeric check of the version against the reference passed.
    pub checks_passed: bool,
    /// Ideal bytes over the median time, % of the measured copy bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bandwidth_pct: Option<f64>,
    /// Declared FLOPs over the median time, % of the measured matrix peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<FunctionAttributes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<Occupancy>,
    /// What went wrong in the evaluation (failed checks, a fault), verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl EngineFigures {
    /// The figures of `shape` in a report whose candidate is the profiled version.
    pub fn from_report(
        report: &EvalReport,
        ceilings: Option<&Ceilings>,
        version: &str,
        shape: &str,
    ) -> Result<Self, String> {
        let s = report
            .shapes
            .iter()
            .find(|s| s.label == shape)
            .ok_or_else(|| format!("the engine's report has no shape `{shape}`"))?;
        let verdict = Judge::new(ceilings.cloned()).judge(&Ok(report.clone()));
        let figures = verdict.shapes.iter().find(|f| f.shape == shape);
        let launch = s.candidate.as_ref();
        let mut problems: Vec<String> = verdict
            .failures
            .iter()
            // The watchdog compares the version with the reference: not this record's business.
            .filter(|f| f.fence != Fence::Watchdog)
            .filter(|f| f.shape.as_deref().is_none_or(|x| x == shape))
            .map(|f| format!("{}: {}", f.fence.name(), f.message))
            .collect();
        if let Some(e) = &s.error {
            if !problems.iter().any(|p| p.contains(e.as_str())) {
                problems.push(e.clone());
            }
        }
        Ok(EngineFigures {
            device: report.device.clone(),
            ceilings: ceilings.cloned(),
            version: version.to_string(),
            shape: shape.to_string(),
            bytes: s.bytes,
            flops: s.flops,
            geometry: launch.map(|l| l.geometry),
            timing: launch.and_then(|l| l.timing.clone()),
            copy_bandwidth_pct: figures.and_then(|f| f.copy_bandwidth_pct),
            flops_pct: figures.and_then(|f| f.flops_pct),
            attributes: report.candidate.attributes,
            occupancy: launch.and_then(|l| l.occupancy),
            checks_passed: s.checks.iter().all(|c| c.passed()) && !s.checks.is_empty(),
            problems,
        })
    }

    /// Blocks of the grid over the blocks all SMs hold at once (clusters over the
    /// clusters the device holds at once, for a launch with a cluster).
    pub fn waves(&self) -> Option<f64> {
        self.occupancy?
            .waves(self.geometry.as_ref()?, self.device.multiprocessors)
    }
}

/// Runs collector (a): one evaluation of `job` (timed, the profiled version as the
/// candidate, the profiled shape only), then the figures of `shape`.
pub fn collect(
    engine: &mut Engine,
    job: &EvalJob,
    shape: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(EngineFigures, EvalReport), String> {
    let ceilings = match engine.ceilings(false) {
        Ok(c) => Some(c),
        Err(e) => {
            progress(&format!("ceilings unavailable: {e}"));
            None
        }
    };
    let ev = engine.evaluate(job, progress);
    let report = ev
        .report
        .map_err(|e| format!("the evaluation failed: {e}"))?;
    let figures = EngineFigures::from_report(&report, ceilings.as_ref(), &job.candidate.id, shape)?;
    Ok((figures, report))
}
