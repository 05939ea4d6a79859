//! The versioned protocol between the parent and a worker process: one JSON object per
//! line, requests on the worker's stdin, messages on its stdout.
//!
//! A worker owns one CUDA context. It answers `Hello` first (protocol version, backend,
//! device), streams `Progress` before every GPU step so the parent's watchdog can tell a
//! hang from a long job (with the step's expected duration once the reference's launch
//! time is known, so that a slow reference is given the time it needs), and exits after
//! reporting a fault that poisoned its context.

use serde::{Deserialize, Serialize};

use crate::compare::OutputComparison;
use crate::inputs::Variation;
use crate::job::{EvalJob, Geometry, TimingPlan};
use crate::stats::Timing;

/// Bumped on any incompatible change of the messages below. 3: a job's geometry carries
/// the cluster set at launch, which a worker of version 2 would ignore and launch without.
/// 4: the timing policy's minimum graph length, which a worker of version 3 would ignore.
/// 5: progress carries the step's expected duration, from which the parent sets the hang
/// limit; a worker of version 4 would never send it, and slow kernels would be killed.
pub const PROTOCOL_VERSION: u32 = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Request {
    Hello {
        version: u32,
    },
    /// Measure (or re-measure) the device's ceilings.
    Ceilings,
    Evaluate {
        job: Box<EvalJob>,
    },
    /// Time a one-launch device copy moving each of these byte counts (read plus
    /// written), by the method kernels are timed with.
    CopyTimes {
        bytes: Vec<u64>,
    },
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Message {
    Hello {
        version: u32,
        backend: String,
        device: DeviceInfo,
    },
    Progress {
        step: String,
        /// How long the step should take, in seconds, where the worker can tell: the
        /// reference's measured launch time times the launches of the step (a candidate's
        /// launch counted as one of the reference's). The parent waits
        /// [`crate::parent::HANG_FACTOR`] times this, and never less than its step
        /// timeout, before it calls the step a hang.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect_s: Option<f64>,
    },
    Ceilings {
        ceilings: Ceilings,
    },
    Report {
        report: Box<EvalReport>,
    },
    CopyTimes {
        copies: Vec<CopyTime>,
    },
    /// The request could not be served (bad request, or the device failed outside a job).
    Error {
        message: String,
    },
}

/// A GPU, as the driver describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub uuid: String,
    pub compute_capability: (u32, u32),
    pub arch: String,
    pub multiprocessors: u32,
    pub l2_bytes: u64,
    pub memory_bytes: u64,
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_api: u32,
    pub max_threads_per_block: u32,
    pub max_shared_per_block_optin: u32,
    pub max_warps_per_sm: u32,
    pub registers_per_sm: u32,
}

impl DeviceInfo {
    /// The key under which ceilings and evaluations are cached.
    pub fn identity(&self) -> String {
        format!("{}|{}|driver-{}", self.uuid, self.name, self.driver_api)
    }
}

/// What the device can do at best, measured on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    pub device: String,
    pub identity: String,
    /// Device-to-device copy, bytes read plus bytes written per second, in GB/s.
    pub copy_gbs: f64,
    /// Matrix-multiply peaks through cuBLAS, TFLOP/s (absent where it could not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_bf16_tflops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_f16_tflops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_f32_tflops: Option<f64>,
    /// How each figure was measured.
    pub method: String,
}

impl Ceilings {
    /// The highest matrix peak, the roof for FLOP figures.
    pub fn matmul_peak_tflops(&self) -> Option<f64> {
        [
            self.matmul_bf16_tflops,
            self.matmul_f16_tflops,
            self.matmul_f32_tflops,
        ]
        .into_iter()
        .flatten()
        .reduce(f64::max)
    }
}

/// A one-launch copy kernel moving `bytes` (half read, half written), timed like a
/// kernel: the best a single launch moving that many bytes does on this device, launch
/// and latency included. Small shapes are judged against it, not against the bandwidth
/// of a 1 GiB copy they could never reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyTime {
    pub bytes: u64,
    pub timing: Timing,
}

/// Registers, shared and local memory of a compiled function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionAttributes {
    pub registers: u32,
    pub static_shared_bytes: u32,
    /// Per-thread local memory: spills and local arrays.
    pub local_bytes: u32,
    pub max_threads_per_block: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileReport {
    pub ok: bool,
    /// NVRTC's full log (file names and lines from the `#line` markers).
    pub log: String,
    pub options: Vec<String>,
    /// Served from the worker's module cache (same source and options).
    pub cached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<FunctionAttributes>,
}

/// Theoretical occupancy of a launch, from the driver's occupancy calculator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Occupancy {
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    pub max_warps_per_sm: u32,
    /// With a cluster set at launch: how many such clusters the device holds at once
    /// (`cuOccupancyMaxActiveClusters`). Fewer than blocks per SM times SMs would suggest:
    /// a cluster needs its SMs in one GPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_clusters: Option<u32>,
}

impl Occupancy {
    pub fn percent(&self) -> f64 {
        100.0 * self.warps_per_sm as f64 / self.max_warps_per_sm.max(1) as f64
    }

    /// How many times over the grid of `g` fills the device: its clusters over the
    /// clusters resident at once when it is launched with a cluster and that figure is
    /// known, else its blocks over the blocks all `multiprocessors` hold at once.
    pub fn waves(&self, g: &Geometry, multiprocessors: u32) -> Option<f64> {
        let (per_cluster, clusters) = g.clusters();
        match self.max_active_clusters {
            Some(n) if per_cluster > 1 && n > 0 => Some(clusters as f64 / n as f64),
            _ => {
                let slots = self.blocks_per_sm as f64 * multiprocessors as f64;
                (slots > 0.0).then(|| (per_cluster * clusters) as f64 / slots)
            }
        }
    }
}

/// When in the sequence a check ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The candidate before the reference ran on these inputs.
    BeforeReference,
    /// The candidate again, after the reference.
    AfterReference,
    /// Fresh inputs after the timing loop.
    AfterTiming,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub phase: Phase,
    pub variation: Variation,
    pub seed: u64,
    pub outputs: Vec<OutputComparison>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(|o| o.passed())
    }
}

/// A version's launch on one shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchFigures {
    pub geometry: Geometry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<Occupancy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// How `timing` was taken, chosen from the version's measured launch time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_plan: Option<TimingPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeReport {
    pub label: String,
    pub held_out: bool,
    /// Ideal bytes and FLOPs of this shape, from the spec.
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<u64>,
    /// Why the shape could not be run (bad geometry, a launch error...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub checks: Vec<CheckReport>,
    /// Input buffers the candidate changed (only `inout` may change).
    pub inputs_modified: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<LaunchFigures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<LaunchFigures>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub device: DeviceInfo,
    pub reference: CompileReport,
    pub candidate: CompileReport,
    pub shapes: Vec<ShapeReport>,
    /// A CUDA error that poisoned the context (illegal address, launch failure...): the
    /// worker exits after sending this report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::Occupancy;
    use crate::job::Geometry;

    fn occupancy(blocks_per_sm: u32, max_active_clusters: Option<u32>) -> Occupancy {
        Occupancy {
            blocks_per_sm,
            warps_per_sm: blocks_per_sm * 8,
            max_warps_per_sm: 64,
            max_active_clusters,
        }
    }

    #[test]
    fn waves_count_clusters_when_the_launch_has_them() {
        let plain = Geometry::plain([264, 1, 1], [256, 1, 1], 0);
        assert_eq!(occupancy(1, None).waves(&plain, 132), Some(2.0));
        // GQA decode at batch 1 with two clusters of 8 a work item: 16 clusters, of which
        // the H200 holds 15 (1 block an SM would suggest 16.5).
        let clustered = Geometry {
            cluster: [8, 1, 1],
            ..Geometry::plain([16, 8, 1], [256, 1, 1], 196608)
        };
        let w = occupancy(1, Some(15)).waves(&clustered, 132).unwrap();
        assert!((w - 16.0 / 15.0).abs() < 1e-12, "{w}");
        // The cluster figure unknown (an older worker): blocks over slots.
        let w = occupancy(1, None).waves(&clustered, 132).unwrap();
        assert!((w - 128.0 / 132.0).abs() < 1e-12, "{w}");
        assert_eq!(occupancy(0, None).waves(&plain, 132), None);
    }
}
