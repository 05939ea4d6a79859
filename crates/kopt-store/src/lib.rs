//! kopt's store: everything between a verified candidate and a committed variant, and
//! what kopt remembers across runs.
//!
//! - [`pending`]: the optimisation loop's winners, waiting for review in
//!   `<target>/kopt/pending/<package>/<kernel>/<arch>/`, one per kernel and architecture.
//! - [`accept`]: accepting a pending variant into the crate's committed `kopt/` files (the
//!   lock file is the commit point), rejecting it, and re-activating an earlier variant.
//! - [`review`]: what a reviewer is shown: the plan of an accept and a source diff.
//! - [`gc`]: the variant folders no lock entry names (`cargo kopt gc`).
//! - [`evidence`]: assembling a variant's [`Rationale`](kopt_spec::files::Rationale) from
//!   structured evidence, checking that the evidence supports it.
//! - [`journal`]: the append-only journal and artefacts of an optimisation run, under
//!   `<target>/kopt/runs/<run-id>/`, with secrets redacted.
//! - [`merge`]: pending variants and case libraries brought back from other machines
//!   (`cargo kopt merge`), refusing conflicts.
//! - [`cases`]: the case library, an SQLite database of past diagnoses and their outcomes,
//!   and retrieval of the cases most similar to a new kernel.
//! - [`features`]: lexical features of a kernel's source (structural summary, tokens,
//!   kind) shared by the case library and its importer.
//!
//! The crate knows the committed formats only through `kopt-spec` (one parser, one hash
//! function, one decision of what the build may use: `kopt_spec::selection::resolve`). It
//! knows nothing of the GPU: the verification engine hands it plain data.

pub mod accept;
pub mod cases;
pub mod evidence;
pub mod features;
mod fsx;
pub mod gc;
pub mod journal;
pub mod layout;
pub mod merge;
pub mod pending;
pub mod review;

pub use layout::KoptDir;

use std::path::Path;

/// What can go wrong in the store. Every message names what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Input that cannot be used as it is.
    #[error("{0}")]
    Invalid(String),
    /// A pending variant verified against another reference or annotation than today's.
    #[error("{0}")]
    Stale(String),
    /// Doing it would overwrite or lose something that must be kept.
    #[error("{0}")]
    Conflict(String),
    /// Something asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error("case library {path}: {message}")]
    Cases { path: String, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps an I/O error with the path it concerns.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}
