//! `cargo kopt`: library code behind the subcommands, tested without the CLI.
//!
//! - [`gather`]: find the annotated kernels of a workspace (cargo metadata + syn + the
//!   macro's own parser) and resolve their committed files;
//! - [`commands`]: `list`, `check`, `pin`, `revert` as functions returning data;
//! - [`table`]: plain-text tables for people.

pub mod commands;
pub mod gather;
pub mod table;
