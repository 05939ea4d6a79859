//! `cargo kopt`: library code behind the subcommands, tested without the CLI.
//!
//! - [`gather`]: find the annotated kernels of a workspace (cargo metadata + syn + the
//!   macro's own parser) and resolve their committed files;
//! - [`commands`]: `list`, `check`, `pin`, `revert` as functions returning data;
//! - [`compile_check`]: `check`'s compile fence, every reference and accepted variant
//!   through NVRTC on the CPU;
//! - [`eval`]: `verify` and `bench` through the evaluation engine;
//! - [`render`]: their tables;
//! - [`loop_record`]: the optimisation loop's record in the run journal, and resuming it;
//! - [`profile`]: `cargo kopt profile`, the bottleneck snapshot of a kernel (issue 5);
//! - [`store`]: `pending`, `accept`, `reject`, `revert --to`, `cases` over `kopt_store`;
//! - [`report`]: `cargo kopt report`, the inputs of `kopt_report`'s HTML report;
//! - [`review`]: the interactive review of pending variants;
//! - [`mcp`]: `cargo kopt mcp`, the verified loop as MCP tools for a coding agent (issue 8);
//! - [`partition`]: `--partition slice:M/N|hash:M/N`, a deterministic share of the kernels;
//! - [`search`]: `search` and `search-bench` over `kopt-search` and the engine;
//! - [`store_cli`]: the store commands' arguments and their rendering;
//! - [`table`]: plain-text tables for people.

pub mod commands;
pub mod compile_check;
pub mod eval;
pub mod gather;
pub mod loop_record;
pub mod mcp;
pub mod optimize;
pub mod partition;
pub mod profile;
pub mod render;
pub mod report;
pub mod review;
pub mod search;
pub mod store;
pub mod store_cli;
pub mod style;
pub mod table;
