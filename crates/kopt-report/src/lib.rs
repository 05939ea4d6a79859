//! `cargo kopt report`: one self-contained HTML file (inline CSS, hand-written SVG, no
//! JavaScript, no external resources) that shows, from the evidence kopt keeps and the
//! measurement files it is given:
//!
//! - per kernel and shape, the reference's time against the active version's, and the
//!   share of the roofline (measured copy bandwidth or matrix peak) it reaches;
//! - a roofline plot (log-log: arithmetic intensity against achieved FLOP/s, under the
//!   measured bandwidth and matrix ceilings);
//! - the search's convergence (best-so-far cost against evaluations, median over seeds);
//! - the verification evidence of committed and pending variants.
//!
//! A section without data says so and says which file would fill it: the report never
//! shows a figure that is not in its inputs. The output is deterministic (no clock is
//! read; inputs are rendered in a stable order), so it is snapshot-tested.

pub mod html;
pub mod input;
pub mod svg;

pub use html::{gaps, render};
pub use input::{BenchFile, BenchRow, Committed, Report, SearchBenchFile};
