//! `cargo kopt`: library code behind the subcommands, tested without the CLI.
//!
//! - [`gather`]: find the annotated kernels of a workspace (cargo metadata + syn + the
//!   macro's own parser) and resolve their committed files;
//! - [`commands`]: `list`, `check`, `pin`, `revert` as functions returning data;
//! - [`eval`]: `verify` and `bench` through the evaluation engine;
//! - [`render`]: their tables;
//! - [`table`]: plain-text tables for people.

pub mod commands;
pub mod eval;
pub mod gather;
pub mod render;
pub mod table;
