//! The workspace model of `cargo kopt`: what a cargo workspace holds for kopt, and the
//! operations on its committed files, as functions returning data.
//!
//! - [`gather`]: find the annotated kernels of a workspace (cargo metadata + syn + the
//!   macro's own parser) and resolve their committed files;
//! - [`partition`]: `--partition slice:M/N|hash:M/N`, a deterministic share of the kernels;
//! - [`commands`]: `list`, `check`, `pin`, `revert`;
//! - [`compile_check`]: `check`'s compile fence, every reference and accepted variant
//!   through NVRTC on the CPU;
//! - [`store`]: `pending`, `accept`, `reject`, `revert --to`, `cases` over `kopt_store`;
//! - [`report`]: the inputs of `kopt_report`'s HTML report.
//!
//! It knows no command line, no terminal and no GPU: nothing here prints, and nothing
//! here starts a worker.

pub mod commands;
pub mod compile_check;
pub mod gather;
pub mod partition;
pub mod report;
pub mod store;
