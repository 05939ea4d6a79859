//! The curated Nsight Compute metric set: what kopt asks ncu for, and what each metric
//! means. Every name is spelled as ncu spells it and appears in the H200 captures
//! committed as fixtures (`tests/fixtures/*.csv`, Nsight Compute on CUDA 13.0); a test
//! keeps it so.
//!
//! ncu's `derived__*` metrics (such as `derived__memory_l1_conflicts_shared_nway`) are
//! defined by its section files and cannot be collected with `--metrics`; kopt computes
//! what it needs of them from their inputs instead (see [`crate::measure`]). The kernel-wide
//! `derived__memory_l1_conflicts_shared_nway` is not used at all: it sums a per-instruction
//! average over the shared-memory instructions of the kernel (10 for the softmax
//! reference, whose excessive wavefronts are 0), so it does not measure conflicts.

/// What a metric tells about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// Speed of light: how close the busiest memory unit and the SM come to their peaks.
    SpeedOfLight,
    Dram,
    L2,
    L1,
    Occupancy,
    Launch,
    /// Where warps wait (cycles per issued instruction, by reason).
    Stalls,
    Issue,
    SharedMemory,
    /// Global memory access efficiency (sectors per request).
    GlobalAccess,
    InstructionMix,
    Atomics,
}

/// One metric of the curated set.
#[derive(Debug, Clone, Copy)]
pub struct Curated {
    pub name: &'static str,
    pub group: Group,
    pub meaning: &'static str,
}

const fn m(name: &'static str, group: Group, meaning: &'static str) -> Curated {
    Curated {
        name,
        group,
        meaning,
    }
}

use Group::*;

/// The curated metric set, in the order kopt reports them.
pub const CURATED: &[Curated] = &[
    m("gpu__time_duration.sum", SpeedOfLight, "duration of the profiled launch (ns; one launch, caches flushed by ncu)"),
    m("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", SpeedOfLight, "memory speed of light: the busiest of DRAM, L2 and L1, % of its peak"),
    m("sm__throughput.avg.pct_of_peak_sustained_elapsed", SpeedOfLight, "compute speed of light: the busiest SM unit or pipe, % of its peak"),
    m("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", Dram, "DRAM throughput, % of peak"),
    m("dram__bytes.sum.per_second", Dram, "DRAM bytes read and written per second"),
    m("lts__throughput.avg.pct_of_peak_sustained_elapsed", L2, "L2 throughput (busiest L2 sub-unit), % of peak"),
    m("lts__t_sector_hit_rate.pct", L2, "L2 hit rate over sectors, %"),
    m("lts__t_sectors.avg.pct_of_peak_sustained_elapsed", L2, "L2 sector traffic, % of peak"),
    m("l1tex__throughput.avg.pct_of_peak_sustained_active", L1, "L1/TEX throughput (busiest sub-unit), % of peak over active cycles"),
    m("l1tex__t_sector_hit_rate.pct", L1, "L1/TEX hit rate over sectors, %"),
    m("l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed", L1, "L1 data-stage wavefronts of load/store instructions, % of peak"),
    m("sm__warps_active.avg.pct_of_peak_sustained_active", Occupancy, "achieved occupancy: resident warps over the SM's maximum, %"),
    m("sm__maximum_warps_per_active_cycle_pct", Occupancy, "theoretical occupancy, %"),
    m("launch__occupancy_limit_registers", Occupancy, "blocks per SM the register file allows"),
    m("launch__occupancy_limit_shared_mem", Occupancy, "blocks per SM shared memory allows"),
    m("launch__occupancy_limit_warps", Occupancy, "blocks per SM the warp slots allow"),
    m("launch__occupancy_limit_blocks", Occupancy, "blocks per SM the block slots allow"),
    m("launch__occupancy_limit_barriers", Occupancy, "blocks per SM the barriers allow"),
    m("launch__registers_per_thread", Launch, "registers per thread"),
    m("launch__shared_mem_per_block_static", Launch, "static shared memory per block (bytes)"),
    m("launch__shared_mem_per_block_dynamic", Launch, "dynamic shared memory per block (bytes)"),
    m("launch__grid_size", Launch, "blocks in the grid"),
    m("launch__block_size", Launch, "threads per block"),
    m("launch__waves_per_multiprocessor", Launch, "waves: blocks over the blocks all SMs hold at once"),
    m("launch__sm_count", Launch, "multiprocessors"),
    m("smsp__average_warp_latency_per_inst_issued.ratio", Stalls, "warp cycles per issued instruction, all states (the sum of the reasons below)"),
    m("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", Stalls, "waiting on an L1TEX result: global, local or texture memory"),
    m("smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", Stalls, "waiting on an MIO result: shared memory, special functions, shuffles"),
    m("smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", Stalls, "waiting at a block barrier (__syncthreads)"),
    m("smsp__average_warps_issue_stalled_membar_per_issue_active.ratio", Stalls, "waiting on a memory barrier"),
    m("smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", Stalls, "MIO queue full: shared memory or special-function pressure"),
    m("smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio", Stalls, "local/global queue full: too many memory instructions"),
    m("smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio", Stalls, "texture queue full"),
    m("smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", Stalls, "a math pipe is busy"),
    m("smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", Stalls, "fixed-latency dependency wait"),
    m("smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio", Stalls, "waiting for a branch target"),
    m("smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio", Stalls, "dispatch stall"),
    m("smsp__average_warps_issue_stalled_drain_per_issue_active.ratio", Stalls, "draining memory at exit"),
    m("smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio", Stalls, "immediate-constant cache miss"),
    m("smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio", Stalls, "instruction cache miss or no instruction fetched"),
    m("smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio", Stalls, "eligible but another warp was selected (not a problem)"),
    m("smsp__average_warps_issue_stalled_selected_per_issue_active.ratio", Stalls, "selected: issuing (one cycle per instruction)"),
    m("smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio", Stalls, "sleeping (nanosleep, or a warp exited in a block that has not)"),
    m("smsp__average_warps_issue_stalled_misc_per_issue_active.ratio", Stalls, "miscellaneous"),
    m("smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio", Stalls, "waiting on a warpgroup matrix operation"),
    m("smsp__issue_active.avg.pct_of_peak_sustained_active", Issue, "issue slot utilisation: cycles an instruction was issued, %"),
    m("sm__inst_executed.avg.per_cycle_active", Issue, "instructions per cycle per SM (peak 4)"),
    m("smsp__warps_eligible.avg.per_cycle_active", Issue, "eligible warps per scheduler per cycle"),
    m("smsp__warps_active.avg.per_cycle_active", Issue, "resident warps per scheduler per cycle"),
    m("memory_l1_wavefronts_shared", SharedMemory, "L1 wavefronts of shared-memory instructions"),
    m("memory_l1_wavefronts_shared_ideal", SharedMemory, "the same without bank conflicts"),
    m("memory_l1_tag_requests_global", GlobalAccess, "L1 tag requests of global memory instructions"),
    m("memory_l2_theoretical_sectors_global", GlobalAccess, "L2 sectors global memory instructions touch"),
    m("memory_l2_theoretical_sectors_global_ideal", GlobalAccess, "the same if every access were coalesced"),
    m("smsp__inst_executed.sum", InstructionMix, "warp instructions executed"),
    m("smsp__inst_executed_op_branch.sum", InstructionMix, "branch instructions executed"),
    m("smsp__thread_inst_executed_per_inst_executed.ratio", InstructionMix, "active threads per executed instruction (32 = no divergence)"),
    m("smsp__sass_average_branch_targets_threads_uniform.pct", InstructionMix, "branches whose threads all went the same way, %"),
    m("sass__inst_executed_register_spilling", InstructionMix, "instructions executed that spill or fill registers"),
    m("sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", InstructionMix, "ALU pipe (integer, logic, fp32 compare), % of peak"),
    m("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", InstructionMix, "FMA pipe (fp32 multiply-add, integer multiply), % of peak"),
    m("sm__inst_executed_pipe_fma_type_fp16.avg.pct_of_peak_sustained_active", InstructionMix, "fp16 FMA pipe, % of peak"),
    m("sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active", InstructionMix, "fp64 pipe, % of peak"),
    m("sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", InstructionMix, "load/store pipe, % of peak"),
    m("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", InstructionMix, "special-function pipe (exp, rsqrt, conversions), % of peak"),
    m("sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active", InstructionMix, "uniform pipe, % of peak"),
    m("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", InstructionMix, "tensor pipe cycles active, % of peak (on Hopper it shares cycles with fp16 math, so it is not proof of HMMA/HGMMA: the SASS is)"),
    m("sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active", InstructionMix, "warpgroup matrix (HGMMA) instructions, % of peak"),
    m("lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed", Atomics, "L2 atomic unit busy, % of peak"),
    m("sm__cycles_active.avg", Launch, "cycles an SM had work, average over SMs"),
    m("gpc__cycles_elapsed.max", Launch, "cycles the launch took"),
];

/// The sections the H200 captures in `tests/fixtures` were made with: the fallback when
/// an ncu refuses a name of [`CURATED`] (`Failed to find metric`).
pub const SECTIONS: &[&str] = &[
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "MemoryWorkloadAnalysis",
    "SchedulerStats",
    "InstructionStats",
    "ComputeWorkloadAnalysis",
    "SourceCounters",
];

/// `--metrics`'s argument: the curated names, comma-separated.
pub fn metrics_argument() -> String {
    CURATED.iter().map(|c| c.name).collect::<Vec<_>>().join(",")
}

/// What a curated metric means, when it is one.
pub fn meaning(name: &str) -> Option<&'static str> {
    CURATED.iter().find(|c| c.name == name).map(|c| c.meaning)
}

/// The stall reasons kopt reports, as (short name, ncu metric).
pub const STALL_REASONS: &[(&str, &str)] = &[
    (
        "long_scoreboard",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    ),
    (
        "short_scoreboard",
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    ),
    (
        "barrier",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    ),
    (
        "membar",
        "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    ),
    (
        "mio_throttle",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    ),
    (
        "lg_throttle",
        "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    ),
    (
        "tex_throttle",
        "smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio",
    ),
    (
        "math_pipe_throttle",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    ),
    (
        "wait",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    ),
    (
        "branch_resolving",
        "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    ),
    (
        "dispatch_stall",
        "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    ),
    (
        "drain",
        "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
    ),
    (
        "imc_miss",
        "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    ),
    (
        "no_instruction",
        "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    ),
    (
        "not_selected",
        "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    ),
    (
        "selected",
        "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
    ),
    (
        "sleeping",
        "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    ),
    (
        "misc",
        "smsp__average_warps_issue_stalled_misc_per_issue_active.ratio",
    ),
    (
        "gmma",
        "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_stalls_are_curated() {
        let mut names: Vec<&str> = CURATED.iter().map(|c| c.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a metric is listed twice");
        for (_, metric) in STALL_REASONS {
            assert!(meaning(metric).is_some(), "{metric} is not curated");
        }
        assert!(!metrics_argument().contains("derived__"));
    }
}
