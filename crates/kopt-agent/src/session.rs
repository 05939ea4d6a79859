//! Recorded sessions: every request and reply of a backend, redacted, one JSON object a
//! line; the replay backend that answers from such a file, offline and in order, so
//! that a recorded run reproduces its verdicts; and the backend of a resumed run, which
//! answers from the run's own session while the requests are the recorded ones, then
//! goes live.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kopt_redact::Redactor;
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

    fn last_from_record(&self) -> bool {
        self.inner.last_from_record()
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
        if let Some(what) = divergence(&self.redactor, req, &e.request) {
            return Err(BackendError::Fatal(format!(
                "replay of {} diverged at exchange {}: {what}",
                self.path.display(),
                self.next
            )));
        }
        self.next += 1;
        recorded_answer(e)
    }
}

/// How `req` (redacted as the recording was) differs from the recorded request, if it
/// does: its purpose, else the first message (or system prompt) that differs and where.
fn divergence(redactor: &Redactor, req: &ChatRequest, recorded: &ChatRequest) -> Option<String> {
    let mut now = serde_json::to_value(req).expect("serialises");
    redactor.redact_json(&mut now);
    let then = serde_json::to_value(recorded).expect("serialises");
    if now == then {
        return None;
    }
    if req.purpose != recorded.purpose {
        return Some(format!(
            "a `{}` request where the recording has `{}`",
            req.purpose, recorded.purpose
        ));
    }
    let now: ChatRequest = serde_json::from_value(now).expect("redaction keeps the shape");
    let texts = |r: &ChatRequest| -> Vec<String> {
        std::iter::once(r.system.clone())
            .chain(r.messages.iter().map(|m| m.content.clone()))
            .collect()
    };
    let (a, b) = (texts(&now), texts(recorded));
    let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) else {
        return Some(
            "a request whose settings (tokens, temperature) differ from the recording".into(),
        );
    };
    let what = if i == 0 {
        "the system prompt".to_string()
    } else {
        format!("message {i}")
    };
    match (a.get(i), b.get(i)) {
        (Some(x), Some(y)) => {
            let at = x
                .char_indices()
                .zip(y.chars())
                .find(|((_, c), d)| c != d)
                .map(|((k, _), _)| k)
                .unwrap_or(x.len().min(y.len()));
            let line = x[..at].matches('\n').count() + 1;
            let near = |t: &str| -> String {
                let start = t[..at.min(t.len())]
                    .char_indices()
                    .rev()
                    .nth(20)
                    .map_or(0, |(k, _)| k);
                t[start..]
                    .chars()
                    .take(60)
                    .collect::<String>()
                    .replace('\n', "⏎")
            };
            Some(format!(
                "{what} differs from line {line}: now `{}`, recorded `{}`",
                near(x),
                near(y)
            ))
        }
        (Some(_), None) => Some(format!("{what} is new (the recording has fewer messages)")),
        _ => Some(format!(
            "{what} is missing (the recording has more messages)"
        )),
    }
}

/// A recorded exchange's answer: its reply, or its error (transient ones as such, so that
/// the client retries as it did when it was recorded).
fn recorded_answer(e: &Exchange) -> Result<ChatResponse, BackendError> {
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

/// What a resumed session did: how many recorded exchanges it answered, and where and why
/// the live backend took over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResumeReport {
    /// Exchanges the session file held when the run resumed.
    pub recorded: usize,
    /// Of those, answered from the file.
    pub replayed: usize,
    /// The exchange from which the live backend answers, and why (`None`: it has not had
    /// to yet).
    pub live_from: Option<(usize, String)>,
    /// Where the recorded exchanges that no longer applied were kept (the session file
    /// itself goes on from the last replayed exchange).
    pub kept_in: Option<PathBuf>,
}

/// A handle on a [`Resume`]'s report, readable while the backend is in use.
#[derive(Debug, Clone, Default)]
pub struct ResumeLog(Arc<Mutex<ResumeReport>>);

impl ResumeLog {
    pub fn get(&self) -> ResumeReport {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut ResumeReport)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// The backend of a resumed run: answers from the run's recorded session, in order, while
/// each request is the recorded one at its position; from the first request that differs
/// (the context changed: another best, a changed source, another similar case), the
/// first recorded error that ended an exchange, or the end of the recording, the live
/// backend answers, recorded into the same file ([`Recorder`]). Recorded exchanges that
/// no longer apply are moved out of the file into `<name>.superseded-N.jsonl` beside it,
/// so that the file stays the session this run had, and a later resume replays it.
pub struct Resume {
    path: PathBuf,
    name: String,
    /// The recorded exchanges and their lines as written.
    recorded: Vec<(Exchange, String)>,
    /// Bytes after the last whole line (a line cut short by a kill).
    torn: String,
    next: usize,
    live: Option<Box<dyn Backend>>,
    recorder: Option<Recorder>,
    redactor: Redactor,
    last_from_record: bool,
    log: ResumeLog,
}

impl Resume {
    /// Reads the session at `path` (none yet: every request goes live) to answer from it
    /// before `live`. A line that is not an exchange is an error unless it is the last,
    /// cut short.
    pub fn open(path: &Path, live: Box<dyn Backend>, redactor: Redactor) -> Result<Self, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read the session {}: {e}", path.display())),
        };
        let mut recorded = Vec::new();
        let mut torn = String::new();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Exchange>(line.trim_end()) {
                Ok(e) if line.ends_with('\n') => recorded.push((e, line.to_string())),
                _ if i + 1 == lines.len() => torn = line.to_string(),
                Err(e) => {
                    return Err(format!(
                        "{}:{}: not a recorded exchange ({e}): the session was edited or damaged; move it aside to resume without it",
                        path.display(),
                        i + 1
                    ))
                }
                Ok(_) => unreachable!("a line with its newline"),
            }
        }
        let log = ResumeLog::default();
        log.update(|r| r.recorded = recorded.len());
        Ok(Resume {
            path: path.to_path_buf(),
            name: live.name(),
            recorded,
            torn,
            next: 0,
            live: Some(live),
            recorder: None,
            redactor,
            last_from_record: false,
            log,
        })
    }

    /// What the session has done so far, readable while the loop runs.
    pub fn log(&self) -> ResumeLog {
        self.log.clone()
    }

    /// Hands over to the live backend from exchange `self.next`: the session file keeps
    /// the replayed exchanges, the rest is kept beside it.
    fn go_live(&mut self, why: String) -> Result<(), BackendError> {
        let fail = |e: String| {
            BackendError::Fatal(format!(
                "cannot go on with the session {}: {e}",
                self.path.display()
            ))
        };
        let rest: String = self.recorded[self.next..]
            .iter()
            .map(|(_, l)| l.as_str())
            .chain(std::iter::once(self.torn.as_str()))
            .collect();
        let mut kept_in = None;
        if !rest.is_empty() {
            let stem = self
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "session".into());
            let dir = self.path.parent().unwrap_or(Path::new("."));
            let aside = (1..)
                .map(|n| dir.join(format!("{stem}.superseded-{n}.jsonl")))
                .find(|p| !p.exists())
                .expect("some name is free");
            kopt_spec::files::write_atomic(&aside, rest.as_bytes())
                .map_err(|e| fail(e.to_string()))?;
            let kept: String = self.recorded[..self.next]
                .iter()
                .map(|(_, l)| l.as_str())
                .collect();
            kopt_spec::files::write_atomic(&self.path, kept.as_bytes())
                .map_err(|e| fail(e.to_string()))?;
            kept_in = Some(aside);
        }
        let live = self.live.take().expect("goes live once");
        self.recorder = Some(
            Recorder::new(live, &self.path, self.redactor.clone())
                .map_err(|e| fail(e.to_string()))?,
        );
        let at = self.next;
        self.log.update(|r| {
            r.live_from = Some((at, why));
            r.kept_in = kept_in;
        });
        Ok(())
    }
}

impl Backend for Resume {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn complete(&mut self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        if self.recorder.is_none() {
            let why = match self.recorded.get(self.next) {
                None => Some(format!(
                    "the recording ends after {} exchange(s)",
                    self.recorded.len()
                )),
                Some((e, _)) => match divergence(&self.redactor, req, &e.request) {
                    Some(what) => Some(format!("the context changed: {what}")),
                    None if e.response.is_none() && !e.transient => Some(format!(
                        "the recorded exchange failed ({}): the agent is asked again",
                        e.error.as_deref().unwrap_or("no reply")
                    )),
                    None => None,
                },
            };
            match why {
                None => {
                    let answer = recorded_answer(&self.recorded[self.next].0);
                    self.next += 1;
                    self.last_from_record = true;
                    let n = self.next;
                    self.log.update(|r| r.replayed = n);
                    return answer;
                }
                Some(why) => self.go_live(why)?,
            }
        }
        self.last_from_record = false;
        self.recorder
            .as_mut()
            .expect("live from here")
            .complete(req)
    }

    fn last_from_record(&self) -> bool {
        self.last_from_record
    }
}
