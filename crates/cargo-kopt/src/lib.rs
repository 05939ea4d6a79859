//! `cargo kopt`'s presentation, tested without the CLI: the tables and text the
//! subcommands print. The product is in `kopt_workspace` (the workspace model) and
//! `kopt_loop` (the loop over the engine).
//!
//! - [`render`]: the commands' tables;
//! - [`review`]: the interactive review of pending variants;
//! - [`store_cli`]: the store commands' arguments and their rendering;
//! - [`table`]: plain-text tables for people.

pub mod mcp;
pub mod render;
pub mod review;
pub mod search_progress;
pub mod store_cli;
pub mod style;
pub mod table;
