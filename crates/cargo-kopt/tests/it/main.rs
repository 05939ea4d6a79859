//! The integration tests of `cargo kopt` that need its binary (as the command line, or as
//! the engine's worker), one test binary. `devices.rs` (which sets `KOPT_FAKE_DEVICES` for
//! its whole process) and `book.rs` (`cargo test --test book`) are binaries of their own.

mod agent_loop;
mod capture_cli;
mod cli;
mod engine;
mod gpu_catalogue;
mod mcp;
mod profile;
mod report_cli;
mod search_cli;
mod store_cli;
