//! kopt's search over launch geometry, tunable defines and compile options.
//!
//! - [`space`]: the points (tunable values and compile-option choices), pruned by the
//!   spec's constraints on every declared shape and by the device's limits before
//!   anything is compiled;
//! - [`seed`]: the heuristic that turns a bottleneck snapshot ([`seed::SnapshotHints`])
//!   into a prioritised [`seed::ParameterMatrix`] (an agent may supply one too) and the
//!   [`seed::Guide`] strategies follow;
//! - [`strategy`]: exhaustive, random, hill climbing (variable neighbourhoods) and
//!   evolutionary search, deterministic under a seed;
//! - [`interesting`]: points that moved a snapshot metric strongly in the right direction
//!   without being faster, kept in the neighbourhood for a few rounds;
//! - [`run`]: the driver: budgets, the CPU compile pool that compiles candidates while
//!   the device measures, the fast-math drop, the history, resumption;
//! - [`journal`]: the run's record in `kopt_store`'s journal, and resuming from it;
//! - [`bench`]: the convergence benchmark (evaluations and time to come within a target
//!   of the exhaustive best);
//! - [`synthetic`]: objective functions over spaces, for tests and demonstrations;
//! - [`rng`]: the generator every strategy draws from.
//!
//! The crate knows no CUDA and no cargo: it evaluates through the [`run::Evaluator`]
//! trait, which `cargo kopt` implements over the evaluation engine.

pub mod bench;
pub mod interesting;
pub mod journal;
pub mod rng;
pub mod run;
pub mod seed;
pub mod space;
pub mod strategy;
pub mod synthetic;

pub use run::{Budget, Evaluator, PointOutcome, Settings};
pub use seed::{Bottleneck, Guide, ParameterMatrix, SnapshotHints};
pub use space::{OptionAxes, Space};
pub use strategy::StrategyKind;
