//! Recorded sessions: every request and reply of a backend, redacted, one JSON object a
//! line; and the replay backend that answers from such a file, offline and in order, so
//! that a recorded run reproduces its verdicts.

use std::io::Write;
use std::path::{Path, PathBuf};

use kopt_store::redact::Redactor;
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendError};
use crate::chat::{ChatRequest, ChatResponse};

/// One exchange, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub index: u64,
    pub backend: String,
    pub request: ChatRequest,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ChatResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error was worth retrying (the client retried it): a replay returns it as such,
    /// so the replayed client retries too and stays in step with the recording.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

/// Wraps a backend and appends every exchange to `path` (secrets redacted, each line
/// synced before the reply is used).
pub struct Recorder {
    inner: Box<dyn Backend>,
    path: PathBuf,
    redactor: Redactor,
    next: u64,
}

impl Recorder {
    pub fn new(
        inner: Box<dyn Backend>,
        path: impl Into<PathBuf>,
        redactor: Redactor,
    ) -> std::io::Result<Self> {
        let path = path.into();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let next = std::fs::read_to_string(&path)
            .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count() as u64)
            .unwrap_or(0);
        Ok(Recorder {
            inner,
            path,
            redactor,
            next,
        })
    }

    fn append(&mut self, mut e: Exchange) -> std::io::Result<()> {
        let mut v = serde_json::to_value(&e).expect("serialises");
        self.redactor.redact_json(&mut v);
        e = serde_json::from_value(v).expect("redaction keeps the shape");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        writeln!(f, "{}", serde_json::to_string(&e).expect("serialises"))?;
        f.sync_data()
    }
}

impl Backend for Recorder {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let result = self.inner.complete(req);
        let e = Exchange {
            index: self.next,
            backend: self.inner.name(),
            request: req.clone(),
            response: result.as_ref().ok().cloned(),
            error: result.as_ref().err().map(|e| e.to_string()),
            transient: result.as_ref().err().is_some_and(|e| e.is_transient()),
        };
        self.next += 1;
        self.append(e).map_err(|err| {
            BackendError::Fatal(format!(
                "cannot record the session in {}: {err}",
                self.path.display()
            ))
        })?;
        result
    }
}

/// Answers from a recorded session. Requests must come in the recorded order with the
/// recorded purposes and contents (after redaction); a divergence is an error that says
/// where, so a replayed run either reproduces the original or stops.
pub struct Replay {
    path: PathBuf,
    exchanges: Vec<Exchange>,
    next: usize,
    redactor: Redactor,
}

impl Replay {
    pub fn open(path: &Path) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BackendError::Fatal(format!("cannot read the session {}: {e}", path.display()))
        })?;
        let mut exchanges = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let e: Exchange = serde_json::from_str(line).map_err(|e| {
                BackendError::Fatal(format!(
                    "{}:{}: not a recorded exchange: {e}",
                    path.display(),
                    i + 1
                ))
            })?;
            exchanges.push(e);
        }
        Ok(Replay {
            path: path.to_path_buf(),
            exchanges,
            next: 0,
            redactor: Redactor::from_env(),
        })
    }

    /// Exchanges not replayed yet.
    pub fn remaining(&self) -> usize {
        self.exchanges.len() - self.next
    }
}

impl Backend for Replay {
    fn name(&self) -> String {
        format!("replay:{}", self.path.display())
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let Some(e) = self.exchanges.get(self.next) else {
            return Err(BackendError::Fatal(format!(
                "the session {} has no exchange {} (it recorded {})",
                self.path.display(),
                self.next,
                self.exchanges.len()
            )));
        };
        let mut now = serde_json::to_value(req).expect("serialises");
        self.redactor.redact_json(&mut now);
        let then = serde_json::to_value(&e.request).expect("serialises");
        if now != then {
            let what = if req.purpose != e.request.purpose {
                format!(
                    "a `{}` request where the recording has `{}`",
                    req.purpose, e.request.purpose
                )
            } else {
                "a request whose content differs from the recording".to_string()
            };
            return Err(BackendError::Fatal(format!(
                "replay of {} diverged at exchange {}: {what}",
                self.path.display(),
                self.next
            )));
        }
        self.next += 1;
        match (&e.response, &e.error) {
            (Some(r), _) => Ok(r.clone()),
            (None, Some(err)) if e.transient => Err(BackendError::Transient {
                status: 0,
                message: format!("(recorded) {err}"),
                retry_after: Some(std::time::Duration::ZERO),
            }),
            (None, Some(err)) => Err(BackendError::Fatal(format!("(recorded) {err}"))),
            (None, None) => Err(BackendError::Fatal(
                "a recorded exchange without a reply".into(),
            )),
        }
    }
}
