//! kopt's profile data layer and bottleneck snapshot (`cargo kopt profile`).
//!
//! Everything measured or read about one version of a kernel on one shape, brought under
//! one set of names, ranked and classified:
//!
//! - [`figures`]: collector (a), the engine's own figures (time, % of the measured copy
//!   bandwidth and matrix peak, registers, shared and local memory, occupancy, waves);
//! - [`ncu`]: collector (b), Nsight Compute run on the kopt worker in oneshot mode, its CSV
//!   (raw and details pages) parsed with units normalised, its error lines explained;
//!   [`metrics`]: the curated metric set it asks for, each name as ncu spells it and
//!   present in the H200 captures of `tests/fixtures`;
//! - [`sass`]: collector (c), static summaries of SASS (`cuobjdump -sass`, `nvdisasm`) and
//!   PTX (NVRTC): instruction classes, global load/store widths, local memory (spills),
//!   tensor-core instructions, barriers;
//! - [`structure`]: collector (d), a lexical structural summary of the CUDA source: loops
//!   with their trip counts for the launch, memory by space, shared arrays and their
//!   indices, atomics, synchronisation (built on `kopt_store::features`);
//! - [`collect`]: runs the collectors that can run, keeps every raw artefact in the run
//!   folder, and records why each of the others was skipped;
//! - [`measure`]: the figures of all collectors under one set of keys, each with its source
//!   and the metric (or formula) it comes from;
//! - [`classify`]: the classification rules and the ranked findings, each with evidence;
//! - [`snapshot`]: the bottleneck snapshot record, its text rendering, the case library's
//!   metric vector, and the confidence (from past cases when the case library has them,
//!   else from the rules' margin).
//!
//! # The classification rules
//!
//! Each class gets a score in `[0, 1]`; the highest wins (ties to the more specific class),
//! and the margin over the runner-up is the confidence when no case library decides.
//! `ramp(x, a, b)` is 0 at `a`, 1 at `b`. The rules, in short (the full table and the
//! reasons are in [`classify`]):
//!
//! - **launch-bound**: `ramp(launch share of the time, 20 %, 60 %)`, the launch share being
//!   1.24 µs (the H200's shortest measured launch) over the time per launch;
//! - **compute-bound**: `ramp(max(SM %, issue %), 50, 80)`;
//! - **memory-bound**: at the roof, `ramp(max(DRAM %, L2 %, copy %), 40, 75)`; or below it,
//!   long-scoreboard share × `ramp(achieved occupancy, 25, 50)` × `ramp(bandwidth, 10, 25)`
//!   (a full GPU waiting on memory that moves a real share of the roof); or the L1;
//! - **latency-bound**: too little parallelism, `ramp(theoretical − achieved occupancy,
//!   10, 40)`; or dependency stalls while no unit is busy;
//! - **occupancy-limited**: `ramp(60 − theoretical occupancy, 0, 30)` × `ramp(latency
//!   share, 30, 60)`;
//! - **shared-memory-bank-bound**: `ramp(excess shared wavefronts per ideal, 0.5, 2)` × the
//!   shared-memory stalls or L1 load.
//!
//! On the H200 captures of the example kernels (2026-11-29) they give: the softmax
//! reference, rmsnorm and reduce_sum memory-bound below the bandwidth roof (70 %, 68 % and
//! 93 % of warp cycles waiting on memory at 49.5 %, 35.7 % and 54.5 % of copy bandwidth),
//! the online-vec4 softmax memory-bound at the roof (L2 81 %, 82 % of copy bandwidth), and
//! gqa_decode latency-bound for lack of parallelism (0.16 waves, 12 % achieved occupancy,
//! DRAM 3 %); `tests/classify.rs` holds them to it.

pub mod classify;
pub mod collect;
pub mod figures;
pub mod measure;
pub mod metrics;
pub mod ncu;
pub mod sass;
pub mod snapshot;
pub mod structure;
pub mod tools;
