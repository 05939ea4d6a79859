//! What can go wrong in the loop: one error for the whole crate, its variants by what
//! failed (the request, the machine, the worker, the store, a file, the kernel, the
//! search driver, a winner's evidence). Every message names what to do about it; the
//! binary turns it into text only at its edge.

use std::path::PathBuf;

use kopt_engine::parent::WorkerFailure;
use kopt_workspace::commands::EditError;

/// A cause carried under [`Error::File`]: an `io::Error`, a parser's error, an agent
/// backend's.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request cannot be done as asked: an agent, variant, shape or device list that
    /// does not exist, GPUs of several architectures, a run resumed by another command
    /// than the one that started it, hints of another kernel.
    #[error("{0}")]
    Invalid(String),
    /// The machine lacks what the command needs: no usable GPU or CUDA driver, this
    /// binary cannot be located (the worker is started from it), the GPUs cannot be
    /// counted, `KOPT_FAKE_DEVICES` is not a count.
    #[error("{0}")]
    Environment(String),
    /// The device's worker failed: it hung, died, refused a request or would not start.
    #[error(transparent)]
    Worker(#[from] WorkerFailure),
    /// The store failed: the run journal, an artefact, a pending variant (a winner the
    /// store refuses is [`Error::Refused`]).
    #[error(transparent)]
    Store(#[from] kopt_store::Error),
    /// The kernel asked for is not in the workspace, or is in several of its packages.
    #[error(transparent)]
    Workspace(#[from] EditError),
    /// A file that could not be read, parsed or written: a configuration layer, a loop
    /// record cited by the journal, `--hints` or `--matrix`, an agent's recorded session,
    /// the profile's output. `message` is the whole sentence (it names `path` and the
    /// cause); `source` is the cause itself, where there is one.
    #[error("{message}")]
    File {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The kernel fails where it must pass: its reference does not compile or does not
    /// pass its own evaluation, its tunables give no space to search, a point does not
    /// compile (the compiler's log), no point passed.
    #[error("{0}")]
    Kernel(String),
    /// The search driver's journal could not be created, resumed, read or written, or a
    /// parameter matrix does not fit the space (`kopt_search` reports these as text).
    #[error("{0}")]
    Search(String),
    /// A winner was not made a pending variant: its evidence does not support the
    /// rationale, or the pending variant it would be does not validate.
    #[error(transparent)]
    Refused(kopt_store::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A file's error with its cause kept as the source.
    pub(crate) fn file(
        path: impl Into<PathBuf>,
        message: String,
        source: impl Into<Cause>,
    ) -> Self {
        Error::File {
            path: path.into(),
            message,
            source: Some(source.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_missing_file_keeps_its_io_error_as_the_source() {
        let d = tempfile::tempdir().unwrap();
        let e = crate::loop_record::RunRecord::read(
            &[kopt_store::journal::Entry {
                seq: 1,
                at: String::new(),
                event: kopt_store::journal::Event::KernelStarted {
                    kernel: "k".into(),
                    device: String::new(),
                    artefacts: vec!["artefacts/loop/k-start.json".into()],
                },
            }],
            d.path(),
        )
        .unwrap_err();
        let path = d.path().join("artefacts/loop/k-start.json");
        assert!(
            matches!(&e, Error::File { path: p, .. } if *p == path),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with(&format!("{} cannot be read (", path.display())));
        let io = e
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io::Error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }
}
