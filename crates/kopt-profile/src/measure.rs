//! The data layer's figures under one set of names ([`KEYS`]), each with its source and
//! the metric (or formula over metrics) it comes from: what the rules read, and what a
//! finding cites as its evidence.
//!
//! Where two collectors give a figure, the engine's is preferred for time and what the
//! driver reports (registers, occupancy), ncu's for hardware counters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::figures::EngineFigures;
use crate::metrics::STALL_REASONS;
use crate::ncu::NcuKernel;
use crate::sass::CodeSummary;
use crate::structure::Structure;

/// The collector a figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Engine,
    Ncu,
    Sass,
    Ptx,
    Structure,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Engine => "engine",
            Source::Ncu => "ncu",
            Source::Sass => "sass",
            Source::Ptx => "ptx",
            Source::Structure => "structure",
        }
    }
}

/// One figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    pub value: f64,
    pub unit: String,
    pub source: Source,
    /// The metric as its source names it (`lts__t_sector_hit_rate.pct`, `timing.median_us`),
    /// or the formula over such names for a derived figure.
    pub from: String,
}

pub type Measurements = BTreeMap<String, Measure>;

/// The launch floor: the shortest per-launch time kopt measured on the H200 (reduce_sum,
/// n = 1000, a kernel with next to no work: 1.24 µs per launch in CUDA-graph replay,
/// the bench in `docs/runs/2026-11-29-h200-evaluation/README.md`). A kernel's share of
/// time that is launch cost is estimated as this over its time.
pub const LAUNCH_FLOOR_US: f64 = 1.24;

/// Every key, its unit and meaning.
pub const KEYS: &[(&str, &str, &str)] = &[
    (
        "duration_us",
        "µs",
        "time per launch: the engine's median, else ncu's one launch",
    ),
    (
        "launch_overhead_pct",
        "%",
        "share of the time a launch costs even with no work: LAUNCH_FLOOR_US / duration_us",
    ),
    (
        "copy_bw_pct",
        "%",
        "ideal bytes / time, % of the device's measured copy bandwidth (engine)",
    ),
    (
        "flops_pct",
        "%",
        "declared FLOPs / time, % of the measured matrix peak (engine)",
    ),
    (
        "mem_sol_pct",
        "%",
        "memory speed of light: the busiest of DRAM, L2, L1, % of peak",
    ),
    ("dram_pct", "%", "DRAM throughput, % of peak"),
    ("l2_pct", "%", "L2 throughput, % of peak"),
    (
        "l1_pct",
        "%",
        "L1/TEX throughput, % of peak (active cycles)",
    ),
    ("l2_hit_pct", "%", "L2 hit rate"),
    ("l1_hit_pct", "%", "L1 hit rate"),
    (
        "sm_sol_pct",
        "%",
        "compute speed of light: the busiest SM pipe, % of peak",
    ),
    ("issue_pct", "%", "issue slots used, %"),
    ("ipc", "inst/cycle", "instructions per active cycle per SM"),
    (
        "eligible_warps",
        "warp",
        "eligible warps per scheduler per cycle",
    ),
    (
        "active_warps",
        "warp",
        "resident warps per scheduler per cycle",
    ),
    ("occupancy_achieved_pct", "%", "achieved occupancy"),
    ("occupancy_theoretical_pct", "%", "theoretical occupancy"),
    (
        "occupancy_limit_registers",
        "block",
        "blocks per SM the registers allow",
    ),
    (
        "occupancy_limit_shared_mem",
        "block",
        "blocks per SM shared memory allows",
    ),
    (
        "occupancy_limit_warps",
        "block",
        "blocks per SM the warp slots allow",
    ),
    (
        "occupancy_limit_blocks",
        "block",
        "blocks per SM the block slots allow",
    ),
    (
        "occupancy_limit_barriers",
        "block",
        "blocks per SM the barriers allow",
    ),
    ("waves", "", "blocks over the blocks all SMs hold at once (clusters over the clusters held at once, for a launch with a cluster)"),
    ("blocks", "block", "blocks in the grid"),
    ("block_threads", "thread", "threads per block"),
    (
        "sm_active_pct",
        "%",
        "share of the launch an average SM had work",
    ),
    ("registers", "register", "registers per thread"),
    (
        "local_bytes",
        "byte",
        "local memory per thread (spills, local arrays)",
    ),
    (
        "spill_insts",
        "inst",
        "executed instructions that spill or fill registers",
    ),
    (
        "warp_cycles_per_issue",
        "cycle",
        "warp cycles per issued instruction (all states)",
    ),
    (
        "shared_excess_wavefronts",
        "",
        "shared-memory wavefronts beyond the conflict-free ideal, per ideal wavefront",
    ),
    (
        "global_sectors_excess",
        "x",
        "L2 sectors global accesses touch over the coalesced ideal",
    ),
    (
        "global_sectors_per_request",
        "sector",
        "L2 sectors per L1 tag request of global accesses (4 = a full 128-byte line)",
    ),
    ("atomic_pct", "%", "L2 atomic unit busy, % of peak"),
    ("tensor_pipe_pct", "%", "tensor pipe active, % of peak"),
    ("pipe_alu_pct", "%", "ALU pipe, % of peak"),
    ("pipe_fma_pct", "%", "FMA pipe, % of peak"),
    ("pipe_fp16_pct", "%", "fp16 FMA pipe, % of peak"),
    ("pipe_fp64_pct", "%", "fp64 pipe, % of peak"),
    ("pipe_lsu_pct", "%", "load/store pipe, % of peak"),
    ("pipe_xu_pct", "%", "special-function pipe, % of peak"),
    (
        "branch_uniform_pct",
        "%",
        "branches all of whose threads went the same way",
    ),
    (
        "global_load_bits",
        "bit",
        "width most global loads have (SASS, else PTX, else the source's element type)",
    ),
    ("global_store_bits", "bit", "width most global stores have"),
    (
        "local_memory_ops",
        "inst",
        "static LDL/STL (ld.local/st.local) instructions",
    ),
    ("barrier_ops", "inst", "static block barriers in the code"),
    ("tensor_ops", "inst", "static tensor-core instructions"),
    (
        "read_passes",
        "",
        "loops that read the same global buffer (passes over it)",
    ),
    (
        "serial_loop_trips",
        "",
        "iterations per thread of the longest loop every thread runs whole, with global reads",
    ),
];

/// The unit and meaning of a key.
pub fn describe(key: &str) -> Option<(&'static str, &'static str)> {
    if let Some(reason) = key
        .strip_prefix("stall_")
        .and_then(|k| k.strip_suffix("_pct"))
    {
        return STALL_REASONS
            .iter()
            .find(|(r, _)| *r == reason)
            .map(|(_, m)| ("%", crate::metrics::meaning(m).unwrap_or("")));
    }
    KEYS.iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, u, m)| (*u, *m))
}

fn put(m: &mut Measurements, key: &str, value: f64, source: Source, from: impl Into<String>) {
    if !value.is_finite() || m.contains_key(key) {
        return;
    }
    let unit = describe(key).map(|(u, _)| u).unwrap_or("");
    m.insert(
        key.to_string(),
        Measure {
            value,
            unit: unit.to_string(),
            source,
            from: from.into(),
        },
    );
}

/// The inputs of [`collect`]: whatever the collectors produced.
#[derive(Default, Clone, Copy)]
pub struct Inputs<'a> {
    pub engine: Option<&'a EngineFigures>,
    pub ncu: Option<&'a NcuKernel>,
    pub sass: Option<&'a CodeSummary>,
    pub ptx: Option<&'a CodeSummary>,
    pub structure: Option<&'a Structure>,
}

/// The figures of everything collected, under [`KEYS`] (and `stall_<reason>_pct`).
pub fn collect(i: Inputs) -> Measurements {
    let mut m = Measurements::new();
    // Time: the engine's timing method (graph replay, cold L2) over ncu's single launch.
    if let Some(e) = i.engine {
        if let Some(t) = &e.timing {
            put(
                &mut m,
                "duration_us",
                t.median_us,
                Source::Engine,
                format!("timing.median_us ({})", t.method),
            );
        }
        if let Some(p) = e.copy_bandwidth_pct {
            put(
                &mut m,
                "copy_bw_pct",
                p,
                Source::Engine,
                "copy_bandwidth_pct (ideal bytes / median time, over the measured copy bandwidth)",
            );
        }
        if let Some(p) = e.flops_pct {
            put(
                &mut m,
                "flops_pct",
                p,
                Source::Engine,
                "flops_pct (declared FLOPs / median time, over the measured matrix peak)",
            );
        }
    }
    if let Some(k) = i.ncu {
        let v = |name: &str| k.value(name);
        let mut from_ncu = |key: &str, metric: &str, scale: f64| {
            if let Some(x) = v(metric) {
                put(&mut m, key, x * scale, Source::Ncu, metric);
            }
        };
        from_ncu("duration_us", "gpu__time_duration.sum", 1e-3);
        from_ncu(
            "mem_sol_pct",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            1.0,
        );
        from_ncu(
            "dram_pct",
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            1.0,
        );
        from_ncu(
            "l2_pct",
            "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            1.0,
        );
        from_ncu(
            "l1_pct",
            "l1tex__throughput.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu("l2_hit_pct", "lts__t_sector_hit_rate.pct", 1.0);
        from_ncu("l1_hit_pct", "l1tex__t_sector_hit_rate.pct", 1.0);
        from_ncu(
            "sm_sol_pct",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            1.0,
        );
        from_ncu(
            "issue_pct",
            "smsp__issue_active.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu("ipc", "sm__inst_executed.avg.per_cycle_active", 1.0);
        from_ncu(
            "eligible_warps",
            "smsp__warps_eligible.avg.per_cycle_active",
            1.0,
        );
        from_ncu(
            "active_warps",
            "smsp__warps_active.avg.per_cycle_active",
            1.0,
        );
        from_ncu(
            "occupancy_achieved_pct",
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "occupancy_limit_registers",
            "launch__occupancy_limit_registers",
            1.0,
        );
        from_ncu(
            "occupancy_limit_shared_mem",
            "launch__occupancy_limit_shared_mem",
            1.0,
        );
        from_ncu(
            "occupancy_limit_warps",
            "launch__occupancy_limit_warps",
            1.0,
        );
        from_ncu(
            "occupancy_limit_blocks",
            "launch__occupancy_limit_blocks",
            1.0,
        );
        from_ncu(
            "occupancy_limit_barriers",
            "launch__occupancy_limit_barriers",
            1.0,
        );
        from_ncu("spill_insts", "sass__inst_executed_register_spilling", 1.0);
        from_ncu(
            "atomic_pct",
            "lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed",
            1.0,
        );
        from_ncu(
            "tensor_pipe_pct",
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_alu_pct",
            "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_fma_pct",
            "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_fp16_pct",
            "sm__inst_executed_pipe_fma_type_fp16.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_fp64_pct",
            "sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_lsu_pct",
            "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "pipe_xu_pct",
            "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
            1.0,
        );
        from_ncu(
            "branch_uniform_pct",
            "smsp__sass_average_branch_targets_threads_uniform.pct",
            1.0,
        );
        // Stall reasons: each state's warp cycles per issued instruction over all of them.
        let total_metric = "smsp__average_warp_latency_per_inst_issued.ratio";
        let sum: f64 = STALL_REASONS.iter().filter_map(|(_, n)| v(n)).sum();
        let (total, total_from) = match v(total_metric) {
            Some(t) if t > 0.0 => (t, total_metric.to_string()),
            _ => (sum, "the sum of the stall reasons".to_string()),
        };
        if total > 0.0 {
            put(
                &mut m,
                "warp_cycles_per_issue",
                total,
                Source::Ncu,
                total_from.clone(),
            );
            for (reason, metric) in STALL_REASONS {
                if let Some(x) = v(metric) {
                    put(
                        &mut m,
                        &format!("stall_{reason}_pct"),
                        100.0 * x / total,
                        Source::Ncu,
                        format!("100 * {metric} / {total_from}"),
                    );
                }
            }
        }
        if let (Some(w), Some(ideal)) = (
            v("memory_l1_wavefronts_shared"),
            v("memory_l1_wavefronts_shared_ideal"),
        ) {
            if ideal > 0.0 {
                put(&mut m, "shared_excess_wavefronts", (w - ideal) / ideal, Source::Ncu, "(memory_l1_wavefronts_shared - memory_l1_wavefronts_shared_ideal) / memory_l1_wavefronts_shared_ideal");
            }
        }
        if let (Some(s), Some(ideal)) = (
            v("memory_l2_theoretical_sectors_global"),
            v("memory_l2_theoretical_sectors_global_ideal"),
        ) {
            if ideal > 0.0 {
                put(&mut m, "global_sectors_excess", s / ideal, Source::Ncu, "memory_l2_theoretical_sectors_global / memory_l2_theoretical_sectors_global_ideal");
            }
        }
        if let (Some(s), Some(req)) = (
            v("memory_l2_theoretical_sectors_global"),
            v("memory_l1_tag_requests_global"),
        ) {
            if req > 0.0 {
                put(
                    &mut m,
                    "global_sectors_per_request",
                    s / req,
                    Source::Ncu,
                    "memory_l2_theoretical_sectors_global / memory_l1_tag_requests_global",
                );
            }
        }
        if let (Some(a), Some(e)) = (v("sm__cycles_active.avg"), v("gpc__cycles_elapsed.max")) {
            if e > 0.0 {
                put(
                    &mut m,
                    "sm_active_pct",
                    100.0 * a / e,
                    Source::Ncu,
                    "100 * sm__cycles_active.avg / gpc__cycles_elapsed.max",
                );
            }
        }
    }
    // Occupancy and launch: the driver's (engine) first, ncu's otherwise.
    if let Some(e) = i.engine {
        if let Some(o) = e.occupancy {
            put(
                &mut m,
                "occupancy_theoretical_pct",
                o.percent(),
                Source::Engine,
                format!(
                    "occupancy ({} of {} warps per SM, {} blocks, from the driver)",
                    o.warps_per_sm, o.max_warps_per_sm, o.blocks_per_sm
                ),
            );
        }
        if let Some(w) = e.waves() {
            put(
                &mut m,
                "waves",
                w,
                Source::Engine,
                "waves (grid blocks / (blocks per SM * SMs))",
            );
        }
        if let Some(g) = e.geometry {
            put(
                &mut m,
                "blocks",
                g.grid.iter().map(|d| *d as f64).product(),
                Source::Engine,
                "geometry.grid (blocks)",
            );
            put(
                &mut m,
                "block_threads",
                g.block.iter().map(|d| *d as f64).product(),
                Source::Engine,
                "geometry.block (threads)",
            );
        }
        if let Some(a) = e.attributes {
            put(
                &mut m,
                "registers",
                a.registers as f64,
                Source::Engine,
                "attributes.registers",
            );
            put(
                &mut m,
                "local_bytes",
                a.local_bytes as f64,
                Source::Engine,
                "attributes.local_bytes",
            );
        }
    }
    if let Some(k) = i.ncu {
        let v = |name: &str| k.value(name);
        for (key, metric) in [
            (
                "occupancy_theoretical_pct",
                "sm__maximum_warps_per_active_cycle_pct",
            ),
            ("waves", "launch__waves_per_multiprocessor"),
            ("blocks", "launch__grid_size"),
            ("block_threads", "launch__block_size"),
            ("registers", "launch__registers_per_thread"),
        ] {
            if let Some(x) = v(metric) {
                put(&mut m, key, x, Source::Ncu, metric);
            }
        }
    }
    if let Some(d) = m.get("duration_us").filter(|d| d.value > 0.0).cloned() {
        put(
            &mut m,
            "launch_overhead_pct",
            100.0 * (LAUNCH_FLOOR_US / d.value).min(1.0),
            d.source,
            format!("100 * LAUNCH_FLOOR_US ({LAUNCH_FLOOR_US} µs) / duration_us"),
        );
    }
    // Code.
    for (code, source) in [(i.sass, Source::Sass), (i.ptx, Source::Ptx)] {
        let Some(c) = code else { continue };
        if let Some(b) = c.main_global_load_bits() {
            put(
                &mut m,
                "global_load_bits",
                b as f64,
                source,
                format!("the most frequent global load width in the {}", c.kind),
            );
        }
        if let Some(b) = c.main_global_store_bits() {
            put(
                &mut m,
                "global_store_bits",
                b as f64,
                source,
                format!("the most frequent global store width in the {}", c.kind),
            );
        }
        put(
            &mut m,
            "local_memory_ops",
            (c.local_loads + c.local_stores) as f64,
            source,
            format!("local loads + stores in the {}", c.kind),
        );
        put(
            &mut m,
            "barrier_ops",
            c.barriers as f64,
            source,
            format!("barriers in the {}", c.kind),
        );
        put(
            &mut m,
            "tensor_ops",
            c.tensor.values().sum::<usize>() as f64,
            source,
            format!("tensor-core instructions in the {}", c.kind),
        );
    }
    if let Some(s) = i.structure {
        // Without machine code, the width of the source's element type through which the
        // most-read buffer is read.
        if let Some(b) = s
            .buffers
            .iter()
            .filter(|b| b.reads > 0 && b.bits.is_some())
            .max_by_key(|b| (b.read_passes, b.reads))
        {
            put(
                &mut m,
                "global_load_bits",
                b.bits.unwrap_or(32) as f64,
                Source::Structure,
                format!("element type `{}` of `{}` in the source", b.element, b.name),
            );
        }
        if let Some((name, n)) = s.max_read_passes() {
            put(
                &mut m,
                "read_passes",
                n as f64,
                Source::Structure,
                format!("loops reading `{name}`"),
            );
        }
        if let Some(l) = s.longest_serial_loop() {
            put(
                &mut m,
                "serial_loop_trips",
                l.trips.unwrap_or(0) as f64,
                Source::Structure,
                format!("`{}` in {} ({})", l.condition, l.function, l.at),
            );
        }
    }
    m
}
