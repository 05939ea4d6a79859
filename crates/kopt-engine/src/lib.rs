//! kopt's evaluation engine. Every candidate, whoever proposed it, goes through here.
//!
//! - [`job`]: what to evaluate (candidate vs reference, shapes, seeds, timing policy),
//!   held-out shapes;
//! - [`protocol`]: the versioned parent/worker protocol and the report types;
//! - [`worker`]: the worker process (CUDA backend, and a fake device for tests);
//! - [`parent`]: starting and watching workers (hang watchdog, restarts);
//! - [`pool`]: one engine per selected GPU and the scheduler of independent work items;
//! - [`inputs`], [`compare`]: seeded inputs, poison, comparison (each element against its
//!   row's scale and a rounding-noise floor);
//! - [`stats`]: timing statistics, stopping rule, watchdog, outliers;
//! - [`verdict`]: fences and figures from a report;
//! - [`precompile`]: the compile on the CPU before any worker sees a version, and the
//!   comparison of a compile with a variant's recorded figures;
//! - [`ceilings`], [`cache`], [`sanitizer`].

pub mod cache;
pub mod ceilings;
pub mod compare;
pub mod engine;
pub mod inputs;
pub mod job;
mod jsonf;
pub mod parent;
pub mod pool;
pub mod precompile;
pub mod protocol;
pub mod sanitizer;
pub mod stats;
pub mod verdict;
pub mod worker;
