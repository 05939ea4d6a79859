//! `cargo kopt`'s rendering, tested without the CLI: the tables and text the subcommands
//! print. The product is in `kopt_workspace` (the workspace model) and `kopt_loop` (the
//! loop over the engine); the commands, the review and the MCP transport are the binary's.
//!
//! - [`render`]: the commands' tables;
//! - [`style`]: the few styles of kopt's output;
//! - [`table`]: plain-text tables for people.

pub mod render;
pub mod style;
pub mod table;
