//! The loop of `cargo kopt` over the evaluation engine: everything that judges a kernel
//! version on a device, and what is made of the verdicts.
//!
//! - [`error`]: [`Error`], what any of it returns when it fails;
//! - [`budget`]: the budgets of `optimize` as written on its command line;
//! - [`captured`]: a program's capture (`KOPT_CAPTURE`) as evaluation cases, and its
//!   kernels' shares of the program's time;
//! - [`eval`]: `verify` and `bench` through the engine (jobs, the worker to start, the
//!   device pool);
//! - [`optimize`]: the optimisation loop's start (`settle_start`), its evaluator
//!   (`LoopEvaluator`), and a winner turned into a pending variant (`pending_variant`);
//! - [`loop_record`]: the loop's record in the run journal, and resuming it;
//! - [`search`]: the search driver's evaluator and compiler over the engine
//!   (`EngineEvaluator`, `NvrtcCompiler`), `search` and `search-bench`;
//! - [`profile`]: the bottleneck snapshot of a kernel;
//! - [`session`]: the MCP server's session, its state and its tools' logic.
//!
//! It knows no command line and no terminal: what it reports while it runs goes to an
//! observer ([`search::SearchObserver`]), what it finds is returned as data.

pub mod budget;
pub mod captured;
pub mod error;
pub mod eval;
pub mod loop_record;
pub mod optimize;
pub mod profile;
pub mod search;
pub mod session;

pub use error::{Error, Result};
